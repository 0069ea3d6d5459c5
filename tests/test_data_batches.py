"""The P:A sampler: mix, filters, determinism by seed, and exact resume from a saved state."""

import json

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
