"""`rookworld data render --data DIR --out NEW --order best-first|shuffled [--tasks A]`: a generated dataset with
its P targets listing their candidates in another order, or with one task's records only.

A generated P record keeps the ranked analysis and its display order (`s`), so no engine runs: every P
record's order becomes the ranking (best-first: `B:` repeats the first `M:` move) or a permutation drawn from
the position itself (shuffled, as RookWorld's data lists them; the same bytes on every run). Positions,
analyses, A samples and game ids (so the split) stay as they are. `--tasks` keeps the records of the tasks it
names (`--tasks A`: the A records alone, e.g. to pair them with P positions of other games). The new
`manifest.json` is the source's with the new order, the kept records' counts and a `render` entry naming the source.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rookworld.data import store
from rookworld.data.generate import MANIFEST
from rookworld.data.record import ORDERS, TASKS
from rookworld.data.relabel import check_copy_paths, position_permutation, read_records, read_source
from rookworld.data.splits import EVAL_FRACTION
from rookworld.data.stats import tally
from rookworld.errors import UserError
from rookworld.fsutil import output_dir


@dataclass
class RenderConfig:
    data: str = field(default="", metadata={"help": "a `rookworld data generate` directory (with manifest.json), "
                                            "required"})
    out: str = field(default="", metadata={"help": "output directory (new or empty), required"})
    order: str = field(default="best-first", metadata={"help": "how P targets list their M:/E: candidates: "
                                                        "best-first (the engine's ranking) or shuffled"})
    tasks: str = field(default="P,A", metadata={"help": "the tasks whose records to keep, comma-separated: P,A (all), "
                                                "P or A"})

    def __post_init__(self) -> None:
        check_copy_paths(self.data, self.out)
        if self.order not in ORDERS:
            raise ValueError(f"--order {self.order!r}: choose one of {', '.join(ORDERS)}")
        if not self.kept_tasks or not set(self.kept_tasks) <= set(TASKS):
            raise ValueError(f"--tasks {self.tasks!r}: name one or both of {', '.join(TASKS)}, e.g. --tasks A")

    @property
    def kept_tasks(self) -> list[str]:
        return [task.strip() for task in self.tasks.split(",") if task.strip()]


def _ordered(record: dict[str, Any], order: str) -> dict[str, Any]:
    if record.get("t") != "P":
        return record
    n = len(record["m"])
    return {**record, "s": list(range(n)) if order == "best-first" else position_permutation(record["fen"], n)}


def render(config: RenderConfig) -> dict[str, Any]:
    """Write the re-rendered copy of config.data in config.out; returns its manifest."""
    data, out = Path(config.data), Path(config.out)
    source_manifest, shards = read_source(data)
    output_dir(out, "--out")
    if out.exists() and any(out.iterdir()):
        raise UserError(f"--out {out} is not empty; render into a new or empty directory")
    out.mkdir(parents=True, exist_ok=True)
    tasks, kept = config.kept_tasks, []
    for path in shards:
        records = [_ordered(r, config.order) for r in read_records(path) if r.get("t") in tasks]
        if records:
            store.write_jsonl_gz(out / path.name, records)
            kept += [store.decode(r) for r in records]
    if not kept:
        raise UserError(f"{data} holds no {' or '.join(tasks)} records; choose other --tasks")
    eval_fraction = source_manifest.get("eval_fraction", EVAL_FRACTION)
    command = f"rookworld data render --data {config.data} --out {config.out} --order {config.order}"
    manifest = {**source_manifest, "order": config.order, "tasks": tasks, "counts": tally(kept, eval_fraction),
                "command": command + ("" if set(tasks) == set(TASKS) else f" --tasks {','.join(tasks)}"),
                "render": {"source": str(data), "source_command": source_manifest.get("command"),
                           "source_order": source_manifest.get("order", "shuffled")}}
    store.write_json(out / MANIFEST, manifest)
    return manifest
