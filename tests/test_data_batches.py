"""The P:A sampler: mix, filters, determinism by seed, and exact resume from a saved state."""

import json

import numpy as np
import pytest

from rookworld.data.batches import SampleFilter, TaskSampler
from rookworld.data.sources import load_files
from rookworld.errors import UserError


@pytest.fixture(scope="module")
def samples(hub_rows, tmp_path_factory):
    path = tmp_path_factory.mktemp("rows") / "rows.txt"
    path.write_text("\n".join(hub_rows) + "\n")
    return load_files(path, "all").samples


def _ids(batches):
    return [[s.prompt for s in batch] for batch in batches]


def test_batches_have_the_configured_mix(samples):
    sampler = TaskSampler(samples, p_fraction=0.3, seed=0)
    batches = [sampler.next(7) for _ in range(200)]
    counts = [sum(s.task == "P" for s in batch) for batch in batches]
    assert set(counts) <= {2, 3}  # 7 * 0.3 = 2.1: within one of it in every batch
    assert abs(sum(counts) / len(counts) - 2.1) < 0.1
    for batch in batches:  # P first, then A
        tasks = [s.task for s in batch]
        assert tasks == sorted(tasks, key=lambda t: t != "P")


def test_each_task_is_visited_in_epochs_without_repeats(samples):
    sampler = TaskSampler(samples, p_fraction=1.0, seed=1)
    n_p = sum(s.task == "P" for s in samples)
    first_epoch = [s.prompt for s in sampler.next(n_p)]
    assert len(set(first_epoch)) == n_p
    second_epoch = [s.prompt for s in sampler.next(n_p)]
    assert set(second_epoch) == set(first_epoch) and second_epoch != first_epoch


def test_same_seed_same_batches_other_seed_other_batches(samples):
    run = lambda seed: _ids(TaskSampler(samples, 0.5, seed=seed).next(8) for _ in range(10))  # noqa: E731
    assert run(3) == run(3)
    assert run(3) != run(4)


def test_restored_state_continues_identically(samples):
    sampler = TaskSampler(samples, p_fraction=0.4, seed=7)
    for _ in range(60):  # past the end of the first P epoch (250 P samples)
        sampler.next(9)
    state = json.loads(json.dumps(sampler.state_dict()))  # survives a JSON checkpoint
    expected = _ids(sampler.next(9) for _ in range(40))
    restored = TaskSampler(samples, p_fraction=0.4, seed=7)
    restored.load_state_dict(state)
    assert _ids(restored.next(9) for _ in range(40)) == expected


def test_restoring_into_other_data_or_settings_is_refused(samples):
    state = TaskSampler(samples, 0.5, seed=0).state_dict()
    with pytest.raises(UserError, match="same data"):
        TaskSampler(samples[:-1], 0.5, seed=0).load_state_dict(state)
    with pytest.raises(UserError, match="same data"):
        TaskSampler(samples, 0.25, seed=0).load_state_dict(state)


def test_filters_by_phase_move_number_and_task(samples):
    endgames = TaskSampler(samples, 1.0, seed=0, sample_filter=SampleFilter(phases=("endgame",)))
    assert all(s.meta["phase"] == "endgame" for s in endgames.next(50))
    late = TaskSampler(samples, 0.5, seed=0, sample_filter=SampleFilter(min_move=3, max_move=30))
    assert all(3 <= s.meta["move_number"] <= 30 for s in late.next(60))
    only_a = TaskSampler(samples, 0.0, seed=0, sample_filter=SampleFilter(tasks=("A",)))
    assert {s.task for s in only_a.next(30)} == {"A"}


def test_a_mix_that_the_filter_cannot_serve_is_an_error(samples):
    with pytest.raises(UserError, match="needs P samples"):
        TaskSampler(samples, 0.5, seed=0, sample_filter=SampleFilter(tasks=("A",)))
    with pytest.raises(UserError, match="unknown task or phase"):
        SampleFilter(phases=("endspiel",))
    with pytest.raises(UserError, match="p_fraction"):
        TaskSampler(samples, 1.5)


@pytest.fixture(scope="module")
def shard_samples():
    """A real embedded shard: 919 P and 3,064 A samples of all nine A cases."""
    from rookworld.data.sources import embedded_path

    return load_files(embedded_path() / "train" / "shard-00000.jsonl.gz", "all").samples


def test_balanced_a_cases_come_equally_often(shard_samples):
    from collections import Counter

    mixed = Counter(s.meta["case"] for s in TaskSampler(shard_samples, p_fraction=0.0, seed=0).next(2700))
    balanced = TaskSampler(shard_samples, p_fraction=0.0, seed=0, a_cases="balanced")
    counts = Counter(s.meta["case"] for s in balanced.next(2700))
    assert balanced.cases == {"A": sorted(counts)} and len(counts) == 9
    assert all(240 <= n <= 360 for n in counts.values()), counts  # 300 each, about 5 SE apart at most
    assert mixed["normal"] > 1400 and mixed["first_move"] < 80  # the data's own mix
    # each case's pool is visited in epochs: its first epoch shows all of its samples once
    pool = sum(s.task == "A" and s.meta["case"] == "first_move" for s in shard_samples)  # 41
    drawn = [s.prompt for s in TaskSampler(shard_samples, p_fraction=0.0, seed=3, a_cases="balanced").next(700)
             if s.meta["case"] == "first_move"]
    assert len(drawn) > pool and len(set(drawn[:pool])) == pool and set(drawn) == set(drawn[:pool])
    # the case stream is the sampler's generator drawing uniform integers (after the batch's P count), as it was
    # before 'sqrt' existed: a seed draws the rows that earlier balanced runs drew
    rng = np.random.default_rng(0)
    rng.random()
    assert [s.meta["case"] for s in TaskSampler(shard_samples, p_fraction=0.0, seed=0, a_cases="balanced").next(50)] \
        == [balanced.cases["A"][rng.integers(len(balanced.cases["A"]))] for _ in range(50)]


def test_balanced_sampler_resumes_exactly_and_refuses_an_unbalanced_state(shard_samples):
    sampler = TaskSampler(shard_samples, p_fraction=0.25, seed=5, a_cases="balanced")
    sampler.next(40)
    state = json.loads(json.dumps(sampler.state_dict()))
    expected = _ids([sampler.next(16) for _ in range(5)])
    again = TaskSampler(shard_samples, p_fraction=0.25, seed=5, a_cases="balanced")
    again.load_state_dict(state)
    assert _ids([again.next(16) for _ in range(5)]) == expected
    for other in ("mix", "sqrt"):
        with pytest.raises(UserError, match="--a-cases"):
            TaskSampler(shard_samples, p_fraction=0.25, seed=5, a_cases=other).load_state_dict(state)
    del state["a_cases"]  # a state saved before the key existed: its case pools say balanced
    legacy = TaskSampler(shard_samples, p_fraction=0.25, seed=5, a_cases="balanced")
    legacy.load_state_dict(state)
    assert _ids([legacy.next(16) for _ in range(5)]) == expected


def test_sqrt_a_cases_come_in_proportion_to_the_root_of_their_counts(shard_samples):
    from collections import Counter

    pools = Counter(s.meta["case"] for s in shard_samples if s.task == "A")
    root = {case: n ** 0.5 / sum(m ** 0.5 for m in pools.values()) for case, n in pools.items()}
    sampler = TaskSampler(shard_samples, p_fraction=0.0, seed=1, a_cases="sqrt")
    assert dict(zip(sampler.cases["A"], sampler.case_p["A"])) == pytest.approx(root)
    counts = Counter(s.meta["case"] for s in sampler.next(4000))
    for case, share in root.items():  # within 4.5 standard errors of the expected count
        assert abs(counts[case] - 4000 * share) <= 4.5 * (4000 * share * (1 - share)) ** 0.5, (case, counts)
    natural = pools["normal"] / pools.total()
    assert root["first_move"] > pools["first_move"] / pools.total() and 1 / 9 < root["normal"] < natural
    with pytest.raises(UserError, match="a_cases must be one of"):
        TaskSampler(shard_samples, a_cases="uniform")


def test_illegal2_draws_illegal_moves_twice_as_often_and_keeps_the_other_cases_mix(shard_samples):
    from collections import Counter

    pools = Counter(s.meta["case"] for s in shard_samples if s.task == "A")
    weight = {case: n * (2 if case == "illegal" else 1) for case, n in pools.items()}
    expected = {case: w / sum(weight.values()) for case, w in weight.items()}
    sampler = TaskSampler(shard_samples, p_fraction=0.0, seed=2, a_cases="illegal2")
    assert dict(zip(sampler.cases["A"], sampler.case_p["A"])) == pytest.approx(expected)
    assert expected["illegal"] > 1.8 * pools["illegal"] / pools.total()
    counts = Counter(s.meta["case"] for s in sampler.next(4000))
    for case, share in expected.items():  # within 4.5 standard errors of the expected count
        assert abs(counts[case] - 4000 * share) <= 4.5 * (4000 * share * (1 - share)) ** 0.5, (case, counts)


def test_unbalanced_sampling_is_unchanged_by_the_case_pools(shard_samples):
    # P rows and the P:A counts do not depend on balancing; only which A rows come does
    plain = TaskSampler(shard_samples, p_fraction=1.0, seed=2)
    balanced = TaskSampler(shard_samples, p_fraction=1.0, seed=2, a_cases="balanced")
    assert _ids([plain.next(9) for _ in range(4)]) == _ids([balanced.next(9) for _ in range(4)])


def test_p_cases_draw_positions_in_check_by_the_root_of_their_count(shard_samples):
    from collections import Counter

    from rookworld.data.cases import classify_p

    pools = Counter(classify_p(s.fen) for s in shard_samples if s.task == "P")
    assert 0.03 < pools["check"] / pools.total() < 0.12  # about 7% of the positions
    root = {case: n ** 0.5 / sum(m ** 0.5 for m in pools.values()) for case, n in pools.items()}
    sampler = TaskSampler(shard_samples, p_fraction=1.0, seed=1, p_cases="sqrt")
    assert sampler.cases == {"P": ["check", "normal"]}
    assert dict(zip(sampler.cases["P"], sampler.case_p["P"])) == pytest.approx(root)
    drawn = sampler.next(3000)
    checks = sum(classify_p(s.fen) == "check" for s in drawn)
    assert abs(checks - 3000 * root["check"]) <= 4.5 * (3000 * root["check"] * (1 - root["check"])) ** 0.5
    balanced = Counter(classify_p(s.fen) for s in TaskSampler(shard_samples, p_fraction=1.0, seed=1,
                                                               p_cases="balanced").next(1000))
    assert 430 <= balanced["check"] <= 570, balanced
    # A rows drawn as the data has them are the same rows whatever the P cases
    a_rows = lambda cases: [s.prompt for s in TaskSampler(shard_samples, seed=3, p_cases=cases).next(200)  # noqa: E731
                            if s.task == "A"]
    assert a_rows("sqrt") == a_rows("mix")
    state = json.loads(json.dumps(sampler.state_dict()))
    again = TaskSampler(shard_samples, p_fraction=1.0, seed=1, p_cases="sqrt")
    again.load_state_dict(state)
    assert _ids([again.next(16)]) == _ids([sampler.next(16)])
    with pytest.raises(UserError, match="--p-cases"):
        TaskSampler(shard_samples, p_fraction=1.0, seed=1).load_state_dict(state)
    with pytest.raises(UserError, match="p_cases one of"):
        TaskSampler(shard_samples, p_cases="illegal2")


def test_a_p_pool_revisits_the_same_positions_and_leaves_the_a_rows_alone(shard_samples):
    pooled = TaskSampler(shard_samples, p_fraction=0.5, seed=4, p_pool=5)
    plain = TaskSampler(shard_samples, p_fraction=0.5, seed=4)
    batches, plain_batches = [pooled.next(8) for _ in range(10)], [plain.next(8) for _ in range(10)]
    p_rows = [s.prompt for batch in batches for s in batch if s.task == "P"]
    assert len(p_rows) == 40 and len(set(p_rows)) == 5
    assert all(len(set(p_rows[i:i + 5])) == 5 for i in range(0, 40, 5))  # every position once per 5 P rows
    assert len({s.prompt for batch in plain_batches for s in batch if s.task == "P"}) == 40
    a_rows = lambda drawn: [[s.prompt for s in batch if s.task == "A"] for batch in drawn]  # noqa: E731
    assert a_rows(batches) == a_rows(plain_batches)
    again = {s.prompt for s in TaskSampler(shard_samples, p_fraction=1.0, seed=4, p_pool=5).next(5)}
    other = {s.prompt for s in TaskSampler(shard_samples, p_fraction=1.0, seed=5, p_pool=5).next(5)}
    assert again == set(p_rows) and other != again  # the seed picks the pool
    with pytest.raises(UserError, match="--p-pool"):
        TaskSampler(shard_samples, p_fraction=0.5, seed=4).load_state_dict(pooled.state_dict())
    for bad in (-1, 920):  # the shard has 919 P samples
        with pytest.raises(UserError, match="p_pool must be 0"):
            TaskSampler(shard_samples, p_pool=bad)
