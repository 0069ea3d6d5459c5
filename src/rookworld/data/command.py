"""`rookworld data generate|relabel|render|stats|export ...`: make, relabel, re-render, count and export datasets.

    rookworld data generate --out DIR --p-positions N --a-samples M --seed S [--pgn FILE ...] [--depth D | --nodes N]
        [--order shuffled|best-first]
    rookworld data relabel --data DIR --out NEW [--depth D | --nodes N] [--cache FILE]
    rookworld data render --data DIR --out NEW --order best-first|shuffled [--tasks A]
    rookworld data stats [SOURCE] [--split all|train|eval]
    rookworld data export --source SOURCE --split train|eval|all --out FILE.jsonl

SOURCE is `embedded` (the default), a local file or directory, or a hub dataset id.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
from pathlib import Path

from rookworld.config import add_config_arguments, build_config
from rookworld.data.sources import EMBEDDED, SampleSet, load_source
from rookworld.data.splits import SPLITS
from rookworld.errors import UserError
from rookworld.fsutil import output_file

EXPORT_SUFFIXES = (".jsonl", ".jsonl.gz")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from rookworld.data.generate import GenerateConfig
    from rookworld.data.relabel import RelabelConfig
    from rookworld.data.render import RenderConfig

    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    generate = actions.add_parser("generate", conflict_handler="resolve",
                                  help="positions -> Stockfish P labels + python-chess A transitions")
    add_config_arguments(generate, GenerateConfig)
    generate.add_argument("--pgn", nargs="+", action="extend", default=None, metavar="FILE",
                          help="PGN files to take games from instead of Stockfish self-play")

    relabel = actions.add_parser("relabel", help="a generated dataset with its P labels searched again (e.g. deeper); "
                                 "positions, A samples and splits unchanged")
    add_config_arguments(relabel, RelabelConfig)

    render = actions.add_parser("render", help="a generated dataset with its P targets' candidates listed in another "
                                "order (best-first or shuffled), or one task's records only; no engine runs")
    add_config_arguments(render, RenderConfig)

    stats = actions.add_parser("stats", help="counts by task, A case, game phase and split, and eval samples whose "
                               "position the train split also has")
    stats.add_argument("source", nargs="?", default=EMBEDDED, help="embedded, a local path or a hub id")
    stats.add_argument("--split", choices=SPLITS, default="all")
    stats.add_argument("--limit", type=int, default=None, help="count only the first N samples")

    export = actions.add_parser("export", help="samples as JSON lines (task, prompt, target, analysis, meta)")
    export.add_argument("--source", default=EMBEDDED, help="embedded, a local path or a hub id")
    export.add_argument("--split", choices=SPLITS, default="all")
    export.add_argument("--out", required=True, help="FILE.jsonl (or .jsonl.gz)")
    export.add_argument("--limit", type=int, default=None, help="export only the first N samples")


def run(args: argparse.Namespace) -> int:
    if args.action == "generate":
        return _generate(args)
    if args.action == "relabel":
        return _relabel(args)
    if args.action == "render":
        return _render(args)
    if args.limit is not None and args.limit < 1:
        raise UserError(f"--limit must be >= 1, got {args.limit}")
    if args.action == "stats":
        return _stats(load_source(args.source, args.split, limit=args.limit))
    out = _export_path(args.out)  # before the source is read, which can take long
    return _export(load_source(args.source, args.split, limit=args.limit), out)


def _generate(args: argparse.Namespace) -> int:
    from rich import print as rich_print

    from rookworld.data.generate import GenerateConfig, generate

    manifest = generate(build_config(GenerateConfig, args))
    rich_print(f"wrote {manifest['counts']['task']} to {args.out} "
               f"(samples/s: {manifest['samples_per_second']}); see {args.out}/manifest.json")
    return 0


def _relabel(args: argparse.Namespace) -> int:
    from rich import print as rich_print

    from rookworld.data.relabel import RelabelConfig, relabel

    manifest = relabel(build_config(RelabelConfig, args))
    rich_print(f"relabelled {manifest['counts']['task'].get('P', 0)} P positions of {args.data} at "
               f"{manifest['stockfish']['label_limit']} into {args.out} in {manifest['relabel']['seconds']} s; "
               f"see {args.out}/manifest.json")
    return 0


def _render(args: argparse.Namespace) -> int:
    from rookworld.data.render import RenderConfig, render

    manifest = render(build_config(RenderConfig, args))
    print(f"rendered {manifest['counts']['task']} of {args.data} ({manifest['order']}) into {args.out}; see "
          f"{args.out}/manifest.json")
    return 0


def _stats(samples: SampleSet) -> int:
    from rich.console import Console
    from rich.table import Table

    from rookworld.data.stats import tally

    counts = tally(samples.samples, samples.eval_fraction)
    console = Console()
    console.print(f"{samples.source} ({samples.split} split)")
    table = Table()
    for column in ("by", "value", "samples"):
        table.add_column(column, justify="right" if column == "samples" else "left")
    for key, n in counts["task"].items():
        table.add_row("task", key, str(n))
    for key, n in counts["case"].items():
        table.add_row("A case", key, str(n))
    for task, phases in counts["phase"].items():
        for key, n in phases.items():
            table.add_row(f"{task} phase", key, str(n))
    for split, tasks in counts.get("split", {}).items():
        for key, n in tasks.items():
            table.add_row(f"{split} split", key, str(n))
    if samples.split == "all":  # the train positions are only known when both splits were read
        for key, n in counts.get("eval_positions_in_train", {}).items():
            table.add_row("eval, position in train", key, str(n))
    console.print(table)
    report = samples.report
    console.print(f"rows read: {report.samples} in the split, {report.other_split} in the other split, "
                  f"{report.skipped} skipped as unparseable; A targets overruled by the arbiter: "
                  f"{report.overruled_targets}")
    return 0


def _export_path(out: str) -> Path:
    """The --out of `export`: a JSON-lines file name (a data source that loads back); UserError otherwise."""
    if not out.endswith(EXPORT_SUFFIXES):  # before output_file makes its directory
        raise UserError(f"--out {out}: export writes JSON lines; name the file *{' or *'.join(EXPORT_SUFFIXES)}")
    return output_file(Path(out), "--out")


def _export(samples: SampleSet, out: Path) -> int:
    tmp = out.with_name(out.name + ".tmp")
    opener = gzip.open if out.name.endswith(".gz") else open
    with opener(tmp, "wt", encoding="utf-8") as handle:
        for sample in samples.samples:
            handle.write(json.dumps(sample.to_json(), ensure_ascii=False) + "\n")
    os.replace(tmp, out)
    print(f"wrote {len(samples.samples)} samples ({samples.split} split of {samples.source}) to {out}")
    return 0
