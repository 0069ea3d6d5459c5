"""`rookworld eval [--model M ...] [--data D] [--split eval|train|all] [--predictions FILE] [--limit N]
[--out metrics.json]`

Held-out metrics (see metrics.py), each with its standard error and count, of one or several models on
a split of the data (the eval split by default), or of given completions; each model after the first also
gets its paired change from the first on the same prompts (NAME/delta ± NAME/delta/se). Greedy by default;
`--samples k` draws k completions per prompt and adds best of k (pass@k, ACPL@k) and the pick of a vote among
them (NAME@vote: maj@k, the move `rookworld play --votes k` plays). With a Stockfish pool
the `B:` moves are judged (quality.py) in one batch per evaluation. `--self-play N` adds N greedy games of
each model against itself (play.py), reported as selfplay/legal_half_moves; `--world-games N` N such games in the
model's own world (world.py), reported as world/plies_to_divergence and world/a_exact. A model is also given each P
prompt's target up to `B:` (P/forced_choice: its choice from the truth's candidates). The GRPO trainer's periodic
evaluation calls `model_values` with the same settings, and logs each evaluation's paired change from its first.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rookworld.data.record import Sample
from rookworld.data.splits import SPLITS, sample_game
from rookworld.errors import UserError
from rookworld.fsutil import output_file

if TYPE_CHECKING:
    from rookworld.data.sources import SampleSet
    from rookworld.generation import FastDecoder
    from rookworld.quality import MoveQuality
    from rookworld.stockfish import Limit


@dataclass
class EvalConfig:
    batch_size: int = field(default=64, metadata={"help": "prompts per generation batch"})
    samples: int = field(default=1, metadata={"help": "completions per prompt; > 1 samples and adds pass@n"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature when --samples > 1"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus mass when --samples > 1"})
    seed: int = field(default=0, metadata={"help": "seed of the sampling stream when --samples > 1, of the "
                                                   "self-play openings and of the rows --limit draws"})
    self_play: int = field(default=0, metadata={
        "help": "also play N greedy games of the model against itself, each from seeded random opening plies and "
                "stopped at its first illegal move: selfplay/legal_half_moves (0: none)"})
    world_games: int = field(default=0, metadata={
        "help": "also play N greedy games of the model against itself in its own world (each move's next state from "
                "its A completion, checked by the arbiter), from the self-play openings: world/plies_to_divergence, "
                "world/a_exact (0: none)"})
    fast_decode: bool | None = field(default=None, metadata={
        "help": "decode in bf16 from a CUDA graph (default: on with CUDA; false: fp32 eager, as on CPU)"})
    draft_a: bool = field(default=True, metadata={
        "help": "decode A prompts speculatively with their label as the draft: the same completions (greedy) or "
                "the same distribution (sampled), and the rows that reproduce the label are never decoded "
                "(false: decode every row)"})

    def __post_init__(self) -> None:
        from rookworld.generation import check_sampling

        for name in ("batch_size", "samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("seed", "self_play", "world_games"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        check_sampling(self.temperature, self.top_p, "temperature, top_p")

    @property
    def greedy(self) -> bool:
        return self.samples == 1


def max_new_tokens(tokenizer, samples: Sequence[Sample]) -> dict[str, int]:
    """Per task, the longest target in tokens plus EOS and a margin: a right answer always fits."""
    from rookworld.generation import TARGET_MARGIN_TOKENS

    limits: dict[str, int] = {}
    for sample in samples:
        length = len(tokenizer.encode(sample.target)) + 1 + TARGET_MARGIN_TOKENS
        limits[sample.task] = max(limits.get(sample.task, 0), length)
    return limits


def label_drafts(tokenizer, samples: Sequence[Sample]) -> list[list[int] | None]:
    """Per sample, its label's token ids and EOS for an A prompt (the completion an A prompt's rows mostly
    decode to: a draft for `generation.generate_groups`), None for a P prompt."""
    return [tokenizer.encode(s.target) + [tokenizer.eos_id] if s.task == "A" else None for s in samples]


def complete(model, tokenizer, samples: Sequence[Sample], cfg: EvalConfig,
             decoder: FastDecoder | None = None) -> list[list[str]]:
    """cfg.samples completions of each sample's prompt (see `generate`); with cfg.draft_a, the A prompts' labels
    are the drafts."""
    limits = max_new_tokens(tokenizer, samples)
    drafts = label_drafts(tokenizer, samples) if cfg.draft_a else None
    return generate(model, tokenizer, tokenizer.encode_prompts([s.prompt for s in samples]),
                    [limits[s.task] for s in samples], cfg, decoder, drafts)


def generate(model, tokenizer, prompts: Sequence[list[int]], limits: Sequence[int], cfg: EvalConfig,
             decoder: FastDecoder | None = None, drafts: Sequence[list[int] | None] | None = None) -> list[list[str]]:
    """cfg.samples completions of each prompt (ids), of at most its limit's new tokens (and the context), in
    batches of cfg.batch_size prompts; sampled by `decoder` (the CUDA fast path, holding the model's weights)
    when given; `drafts` (per prompt, token ids or None) as in `generation.generate_groups`."""
    import torch

    from rookworld.generation import SamplingSettings, decoding, generate_groups

    context = model.config.n_positions
    device = model.wte.weight.device
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    out: list[list[str]] = []
    for start in range(0, len(prompts), cfg.batch_size):
        ids = prompts[start:start + cfg.batch_size]
        settings = [SamplingSettings(temperature=cfg.temperature, top_p=cfg.top_p,
                                     max_new_tokens=max(1, min(limit, context - len(p))))
                    for limit, p in zip(limits[start:start + cfg.batch_size], ids)]
        runner, step = decoding(model, decoder)
        generation = generate_groups(runner, ids, cfg.samples, settings, eos_id=tokenizer.eos_id,
                                     generator=generator, greedy=cfg.greedy, decode_step=step,
                                     drafts=None if drafts is None else drafts[start:start + cfg.batch_size])
        texts = tokenizer.decode_batch(generation.completions())
        out.extend(texts[i:i + cfg.samples] for i in range(0, len(texts), cfg.samples))
    return out


def score_completions(samples: Sequence[Sample], completions: Sequence[str], pool=None):
    from rookworld.rewards import score_batch

    return score_batch([(s.prompt, c, s.analysis) for s, c in zip(samples, completions)], pool)


def judge_best_moves(samples: Sequence[Sample], groups: Sequence[Sequence[str]], pool,
                     limit: Limit | None = None) -> list[list[MoveQuality]]:
    """The quality of each P completion's `B:` move (an empty list for an A prompt), judged in one batch
    at `limit` (default: the label limit); a sample's stored analysis is the truth when made there."""
    from rookworld import text
    from rookworld.quality import judge_moves

    p_groups = [(sample, group) for sample, group in zip(samples, groups) if sample.task == "P"]
    moves = [(sample.fen, text.parse_p_completion(c).best) for sample, group in p_groups for c in group]
    analyses = [sample.analysis for sample, group in p_groups for _ in group]
    judged = iter(judge_moves(pool, moves, limit, analyses) if moves else [])
    return [[next(judged) for _ in group] if sample.task == "P" else [] for sample, group in zip(samples, groups)]


def prompt_values(samples: Sequence[Sample], groups: Sequence[Sequence[str]], pool=None, *,
                  limit: Limit | None = None) -> list[dict[str, list[float]]]:
    """Each prompt's metric values over its completions (one group of >= 1 per sample): the metrics, the
    training reward, best of k (NAME@k) and the vote's pick (NAME@vote) when the groups hold several, and the
    move-quality metrics (P/acpl, P/acpl_legal, P/expected_score_loss, P/band/...) when a Stockfish `pool` is
    given, judged at `limit` (default: the label limit); NAME/check repeats some P metrics on the positions in
    check."""
    from rookworld import metrics

    flat_samples = [s for s, group in zip(samples, groups) for _ in group]
    scores = iter(score_completions(flat_samples, [c for group in groups for c in group], pool))
    per_prompt = [metrics.group_values(sample, group, [next(scores) for _ in group])
                  for sample, group in zip(samples, groups)]
    if pool is not None:
        for values, qualities in zip(per_prompt, judge_best_moves(samples, groups, pool, limit)):
            for quality in qualities:
                for name, value in metrics.quality_metrics(quality).items():
                    values[name].append(value)
    for sample, values, group in zip(samples, per_prompt, groups):
        metrics.add_check_metrics(sample, values)
        if len(group) > 1:
            metrics.add_best_of(values, len(group))
            metrics.add_vote(sample, group, values)
    return per_prompt


def summary(samples: Sequence[Sample], groups: Sequence[Sequence[str]],
            per_prompt: Sequence[dict[str, list[float]]]) -> dict[str, float]:
    """NAME (the mean over all completions), NAME/se (clustered by prompt and game) and NAME/n of each
    metric (see metrics.estimate), and count/P, count/A."""
    from rookworld import metrics

    result = metrics.flatten(metrics.summarize(per_prompt, [sample_game(s) for s in samples]))
    for task in ("P", "A"):
        result[f"count/{task}"] = float(sum(s.task == task for s, group in zip(samples, groups) for _ in group))
    return result


def evaluate_completions(samples: Sequence[Sample], groups: Sequence[Sequence[str]], pool=None, *,
                         limit: Limit | None = None) -> dict[str, float]:
    """The summary of given completions' metrics (see prompt_values and summary)."""
    return summary(samples, groups, prompt_values(samples, groups, pool, limit=limit))


@contextmanager
def inference(model) -> Iterator[None]:
    """`model` in eval mode without gradients; its mode is restored after."""
    import torch

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def model_completions(model, tokenizer, samples: Sequence[Sample], cfg: EvalConfig,
                      decoder: FastDecoder | None = None) -> list[list[str]]:
    """`model`'s completions of `samples` (see `inference`), decoded by `decoder` when given (it must hold the
    model's current weights)."""
    with inference(model):
        return complete(model, tokenizer, samples, cfg, decoder)


def forced_choice_values(model, tokenizer, samples: Sequence[Sample], cfg: EvalConfig,
                         decoder: FastDecoder | None = None) -> list[dict[str, list[float]]]:
    """Per sample, `P/forced_choice` where it applies: a P sample whose target is a whole answer (M:, E: and a
    B: move) is given to the model up to `B:`, the truth's candidates and evals in its context (teacher-forced),
    and scores 1.0 when the model's greedy move is the target's. The target's B: is its best-rated candidate, so
    this measures choosing from a list apart from finding the moves and rating them."""
    from dataclasses import replace

    from rookworld import text

    forced: dict[int, tuple[str, str]] = {}  # sample index: (the target up to B:, its B: move)
    for i, sample in enumerate(samples):
        starts = text.p_field_starts(sample.target) if sample.task == "P" else None
        best = text.parse_p_completion(sample.target).best if starts else None
        if best is not None:
            forced[i] = (sample.target[:starts[-1] + len(text.P_MARKERS[-1])], best)
    prompts = tokenizer.encode_prompts([samples[i].prompt for i in forced])
    prompts = [ids + tokenizer.encode(head) for ids, (head, _) in zip(prompts, forced.values())]
    limits = [len(tokenizer.encode(f" {best}")) + 1 for _, best in forced.values()]  # the move and EOS
    with inference(model):
        said = generate(model, tokenizer, prompts, limits, replace(cfg, samples=1), decoder)
    out: list[dict[str, list[float]]] = [{} for _ in samples]
    for (i, (_, best)), (completion,) in zip(forced.items(), said):
        out[i]["P/forced_choice"] = [float(completion.split()[:1] == [best])]
    return out


def _self_play(model, tokenizer, cfg: EvalConfig, games: int, in_world: bool):
    """`games` greedy games of `model` against itself (play.py: seeded by cfg.seed, from the default random
    opening, to the ply limit), in the rules' world or in the model's own (world.py)."""
    from rookworld import play
    from rookworld.player import ModelPlayer
    from rookworld.world import World

    with inference(model):
        return play.play_games(ModelPlayer(model, tokenizer, cfg.seed), None, games, play.MAX_PLIES,
                               opening_plies=play.GREEDY_OPENING_PLIES, seed=cfg.seed,
                               world=World(model, tokenizer) if in_world else None)


def self_play_values(model, tokenizer, cfg: EvalConfig) -> list[dict[str, list[float]]]:
    """Per game of cfg.self_play games in the rules' world (`_self_play`, each stopped at the first illegal move),
    its self-play metrics; then per game of cfg.world_games games in the model's world, its world metrics
    (world.line_values); none of either when its count is 0."""
    from rookworld import play
    from rookworld.world import line_values

    rules = play.per_game_values(_self_play(model, tokenizer, cfg, cfg.self_play, False)) if cfg.self_play else []
    world = (line_values([game.world for game in _self_play(model, tokenizer, cfg, cfg.world_games, True)])
             if cfg.world_games else [])
    return rules + world


@dataclass
class Values:
    """A model's metric values on one evaluation: per prompt (prompt_values) and per self-play game
    (self_play_values); what its summary and its paired change from another model are made of."""

    per_prompt: list[dict[str, list[float]]]
    per_game: list[dict[str, list[float]]]


def model_values(model, tokenizer, samples: Sequence[Sample], cfg: EvalConfig, pool=None,
                 decoder: FastDecoder | None = None) -> tuple[dict[str, float], Values]:
    """Metrics of `model` on `samples` (see model_completions and summary), its choice given the truth's
    candidates (forced_choice_values) and its self-play metrics, with the values they summarise."""
    from rookworld import metrics

    groups = model_completions(model, tokenizer, samples, cfg, decoder)
    values = Values(prompt_values(samples, groups, pool), self_play_values(model, tokenizer, cfg))
    for prompt, forced in zip(values.per_prompt, forced_choice_values(model, tokenizer, samples, cfg, decoder)):
        prompt.update(forced)
    return summary(samples, groups, values.per_prompt) | metrics.flatten(metrics.summarize(values.per_game)), values


def evaluate_model(model, tokenizer, samples: Sequence[Sample], cfg: EvalConfig, pool=None,
                   decoder: FastDecoder | None = None) -> dict[str, float]:
    """The metrics of `model_values`."""
    return model_values(model, tokenizer, samples, cfg, pool, decoder)[0]


def paired_change(values: Values, first: Values, samples: Sequence[Sample]) -> dict[str, float]:
    """NAME/delta and NAME/delta/se: the change from `first` (another model, or the same model earlier) on the
    same prompts, clustered by game, and on the same self-play openings (metrics.paired_delta)."""
    from rookworld.metrics import paired_delta

    return (paired_delta(values.per_prompt, first.per_prompt, [sample_game(s) for s in samples])
            | paired_delta(values.per_game, first.per_game))


# ---------------------------------------------------------------- command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from rookworld.config import add_config_arguments

    parser.add_argument("--model", action="append", help="checkpoint directory or hub id; repeat to compare "
                        "(default: the embedded model)")
    parser.add_argument("--data", default="embedded", help="data source: embedded, a local path or a hub id "
                        "(default: embedded)")
    parser.add_argument("--split", choices=SPLITS, help="rows of --data to score: eval (the default: the held-out "
                        "5%% of a local source, a hub dataset's test split), train or all")
    parser.add_argument("--predictions", help="JSONL with prompt, completion (optional target): score these "
                        "completions instead of a model's")
    parser.add_argument("--limit", type=int, help="score N rows drawn at random (by --seed) from the split or "
                        "the predictions, each task in its share of them (default: every row)")
    parser.add_argument("--out", help="write the metrics as JSON to this file")
    parser.add_argument("--markdown", help="write the metrics table as Markdown to this file")
    parser.add_argument("--device", help="torch device (default: cuda when available, else cpu)")
    parser.add_argument("--threads", type=int,
                        help="CPU threads for torch (default: the cores; 1 beside other busy jobs)")
    parser.add_argument("--processes", type=int, help="Stockfish processes for moves outside the stored "
                        "analysis (default: one per core)")
    parser.add_argument("--cache", help="SQLite file caching Stockfish results across runs: a repeated eval of "
                        "the same data skips the searches it already made")
    add_config_arguments(parser, EvalConfig)


def _prediction_samples(path: str) -> tuple[list[Sample], list[str]]:
    """Samples and completions from a predictions JSONL; P truth is Stockfish's (computed), A truth the arbiter's."""
    from rookworld import arbiter, text
    from rookworld.data.record import a_sample

    samples: list[Sample] = []
    completions: list[str] = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UserError(f"--predictions {path}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise UserError(f"--predictions {path}: not UTF-8 text; give a JSONL file of prompt/completion lines") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            prompt, completion = str(row["prompt"]), str(row["completion"])
            task = text.task_of(prompt)
            if task == "A":
                sample = a_sample(prompt)
                if "target" in row and row["target"] != sample.target:
                    raise ValueError(f"target {row['target']!r} disagrees with the rules of chess "
                                     f"({sample.target!r})")
            elif task == "P":
                arbiter.parse_fen(prompt[len(text.P_PREFIX):].strip())
                sample = Sample("P", prompt, str(row.get("target", "")), None, {})
            else:
                raise ValueError(f"not a P or A prompt: {prompt[:60]!r}")
        except (ValueError, KeyError, TypeError) as exc:
            raise UserError(f"--predictions {path} line {number}: {exc}") from None
        samples.append(sample)
        completions.append(completion)
    if not samples:
        raise UserError(f"--predictions {path}: no rows; expected JSON lines with prompt and completion")
    return samples, completions


def _with_analyses(samples: list[Sample], pool) -> list[Sample]:
    from dataclasses import replace

    missing = [s for s in samples if s.task == "P" and s.analysis is None]
    if not missing:
        return samples
    found = dict(zip((s.fen for s in missing), pool.analyse([s.fen for s in missing], progress=True)))
    return [replace(s, analysis=found[s.fen]) if s.task == "P" and s.analysis is None else s for s in samples]


def _cell(result: dict[str, float], name: str) -> str:
    """`mean ± se (n=N)` of a metric (with `Δ delta ± se` after it when paired with a first model, and the
    number of paired prompts when fewer), the bare value of one without a standard error (the counts)."""
    from rookworld.metrics import DELTA_SUFFIX, N_SUFFIX, SE_SUFFIX

    if name not in result:
        return "-"
    if name + SE_SUFFIX not in result:
        return f"{result[name]:.4f}"
    cell = f"{result[name]:.4f} ± {result[name + SE_SUFFIX]:.4f} (n={result[name + N_SUFFIX]:.0f})"
    if name + DELTA_SUFFIX in result:  # a later model of several: its paired change from the first
        cell += f" Δ {result[name + DELTA_SUFFIX]:+.4f} ± {result[name + DELTA_SUFFIX + SE_SUFFIX]:.4f}"
        paired = result.get(name + DELTA_SUFFIX + N_SUFFIX, result[name + N_SUFFIX])
        if paired != result[name + N_SUFFIX]:  # a metric only some completions have: paired where both have it
            cell += f" (paired n={paired:.0f})"
    return cell


def _metric_names(results: dict[str, dict[str, float]]) -> list[str]:
    from rookworld.metrics import is_statistic

    return sorted({k for r in results.values() for k in r if not is_statistic(k)})


def _print_table(results: dict[str, dict[str, float]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("metric", *results)
    for name in _metric_names(results):
        table.add_row(name, *(_cell(r, name) for r in results.values()))
    Console().print(table)


def markdown_table(results: dict[str, dict[str, float]]) -> str:
    lines = ["| metric | " + " | ".join(results) + " |", "|---|" + "---|" * len(results)]
    lines += ["| " + name + " | " + " | ".join(_cell(r, name) for r in results.values()) + " |"
              for name in _metric_names(results)]
    return "\n".join(lines) + "\n"


def limited(samples: Sequence[Sample], limit: int | None, seed: int) -> list[int]:
    """Indices, in order, of the rows `--limit` scores: every row, or `limit` of them drawn at random (seeded)
    with each task in its share of the rows (batches.proportional_counts)."""
    from rookworld.data.batches import proportional_counts, task_picks

    tasks = [s.task for s in samples]
    if limit is None or limit >= len(tasks):
        return list(range(len(tasks)))
    return sorted(task_picks(tasks, proportional_counts(tasks, limit), seed))


def task_mix(samples: Sequence[Sample]) -> str:
    return " + ".join(f"{sum(s.task == task for s in samples):,} {task}" for task in ("P", "A"))


def drawn_line(scored: Sequence[Sample], rows: int, where: str, limit: int | None, seed: int) -> str:
    return (f"scoring {len(scored):,} of the {rows:,} rows of {where}, each task in its share "
            f"(--limit {limit}, --seed {seed}): {task_mix(scored)}")


def scope_line(found: SampleSet, scored: Sequence[Sample], limit: int | None, seed: int) -> str:
    """Which rows of the source are scored: of a local source, how many of the rows it holds; with --limit,
    how many of the split's rows were drawn, by which seed; then how many of each task."""
    n, report = len(found.samples), found.report
    if len(scored) < n:
        return drawn_line(scored, n, f"the {found.split} split of {found.source}", limit, seed)
    if found.eval_fraction is None:  # a hub dataset: its own split
        return f"scoring the {n:,} rows of the {found.split} split of {found.source}: {task_mix(scored)}"
    rows = report.samples + report.other_split + report.skipped
    which = "--split all" if found.split == "all" else f"the {found.split} split; --split all scores every row"
    return f"scoring {n:,} of {rows:,} rows of {found.source} ({which}): {task_mix(scored)}"


def _load_samples(args: argparse.Namespace, seed: int) -> list[Sample]:
    from rookworld.data.sources import load_source

    found = load_source(args.data, args.split or "eval")
    samples = [found.samples[i] for i in limited(found.samples, args.limit, seed)]
    print(scope_line(found, samples, args.limit, seed))
    return samples


def run(args: argparse.Namespace) -> int:
    from rookworld.config import build_config
    from rookworld.fsutil import jsonable
    from rookworld.stockfish import StockfishPool

    cfg = build_config(EvalConfig, args)
    if args.limit is not None and args.limit < 1:
        raise UserError(f"--limit {args.limit}: must be >= 1")
    if args.predictions and (args.model or args.split or cfg.self_play or cfg.world_games):
        raise UserError("--predictions scores given completions: leave out --model, --split, --self-play and "
                        "--world-games")
    for flag, path in (("--out", args.out), ("--markdown", args.markdown)):
        if path:
            output_file(Path(path), flag)
    results: dict[str, dict[str, float]] = {}
    with StockfishPool(processes=args.processes, cache_path=args.cache) as pool:
        if args.predictions:
            samples, completions = _prediction_samples(args.predictions)
            rows = limited(samples, args.limit, cfg.seed)
            if len(rows) < len(samples):
                print(drawn_line([samples[i] for i in rows], len(samples), args.predictions, args.limit, cfg.seed))
            samples, completions = [samples[i] for i in rows], [completions[i] for i in rows]
            samples = _with_analyses(samples, pool)
            results[Path(args.predictions).name] = evaluate_completions(samples, [[c] for c in completions], pool)
        else:
            from rookworld.generation import FastDecoder
            from rookworld.hub import load_model, resolve_default_model
            from rookworld.runtime import fast_path, pick_device

            samples = _load_samples(args, cfg.seed)
            device = pick_device(args.device, args.threads)
            fast = fast_path(cfg.fast_decode, device)
            first: Values | None = None
            for name in args.model or [str(resolve_default_model())]:
                model, tokenizer = load_model(name, device=device)
                results[name], values = model_values(model, tokenizer, samples, cfg, pool,
                                                     FastDecoder(model) if fast else None)
                if first is None:
                    first = values
                else:  # a later model: its change from the first, paired by prompt and by game (same openings)
                    results[name].update(paired_change(values, first, samples))
    _print_table(results)
    if args.out:
        Path(args.out).write_text(json.dumps(jsonable(results), indent=2) + "\n", encoding="utf-8")
    if args.markdown:
        Path(args.markdown).write_text(markdown_table(results), encoding="utf-8")
    return 0
