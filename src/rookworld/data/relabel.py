"""`rookworld data relabel --data DIR --out NEW [--depth D | --nodes N]`: a generated dataset, P labels searched again.

The positions, A samples, game ids (so the train/eval split) and record order stay; every P record gets the
engine's multipv-5 analysis at the new limit. Its display order (`s`, how `M:` and `E:` are listed) is kept: a
random permutation stays random against the new ranking, best-first stays best first; a shuffled position
whose line count changed (a Stockfish version that returns fewer lines) gets a permutation drawn from the
position itself, so a rerun gives the same bytes. Like `generate`, the work goes shard by shard, each written
atomically and recorded in `progress.json`, so an interrupted run continues where it stopped. The new
`manifest.json` is the source's with the new label limit and a `relabel` entry naming the source and its old
limit.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from rookworld.data import store
from rookworld.data.generate import LABEL_CHUNK, MANIFEST, MULTIPV, PROGRESS, label_limit, load_progress, progress_bar
from rookworld.data.position import position_key
from rookworld.data.sources import BadRow, file_rows
from rookworld.data.splits import stable_hash
from rookworld.errors import UserError
from rookworld.stockfish import LABEL_LIMIT, Limit, StockfishPool


@dataclass
class RelabelConfig:
    data: str = field(default="", metadata={"help": "a `rookworld data generate` directory (with manifest.json), "
                                            "required"})
    out: str = field(default="", metadata={"help": "output directory, required; rerun the same command to resume"})
    depth: int | None = field(default=None, metadata={"help": f"label search depth; unset: {LABEL_LIMIT.depth} "
                                                       "unless --nodes"})
    nodes: int | None = field(default=None, metadata={"help": "label search nodes (instead of --depth)"})
    processes: int | None = field(default=None, metadata={"help": "Stockfish processes; unset: one per CPU"})
    cache: str | None = field(default=None, metadata={"help": "SQLite file of Stockfish results to reuse and fill "
                                                      "(the one `rookworld eval --cache` uses)"})
    stockfish: str | None = field(default=None, metadata={"help": "Stockfish binary; unset: $ROOKWORLD_STOCKFISH, "
                                                          "PATH or /usr/games/stockfish"})

    def __post_init__(self) -> None:
        check_copy_paths(self.data, self.out)
        label_limit(self.depth, self.nodes)

    @property
    def label_limit(self) -> Limit:
        return label_limit(self.depth, self.nodes)

    def command(self) -> str:
        parts = ["rookworld data relabel", f"--data {self.data}", f"--out {self.out}"]
        parts += [f"--{name} {getattr(self, name)}" for name in ("depth", "nodes", "processes", "cache")
                  if getattr(self, name) is not None]
        return " ".join(parts)


def read_records(path: Path) -> list[dict[str, Any]]:
    """The compact records of a source shard; UserError naming the shard (and line) that cannot be read."""
    records = []
    for where, row in file_rows(path):
        if isinstance(row, BadRow):
            raise UserError(f"{where}: {row.reason}; generate the source again")
        records.append(row)
    return records


def check_copy_paths(data: str, out: str) -> None:
    """--data and --out of a command that writes a changed copy of generated data: both given, and apart."""
    if not data or not out:
        raise ValueError("--data DIR and --out DIR are required")
    if Path(data).resolve() == Path(out).resolve():
        raise ValueError("--out must differ from --data: the source stays as it is")


def position_permutation(fen: str, n: int) -> list[int]:
    """A shuffled display order of `n` candidates drawn from the position itself (the same on every run)."""
    return [int(i) for i in np.random.default_rng(stable_hash(position_key(fen))).permutation(n)]


def _order(fen: str, old: list[int], n: int, order: str = "shuffled") -> list[int]:
    """The display order of a relabelled P record: the old one when the line count is unchanged; else, in data of
    the `order` best-first, the ranking, or a new permutation."""
    if sorted(old) == list(range(n)):
        return old
    return list(range(n)) if order == "best-first" else position_permutation(fen, n)


def read_source(data: Path) -> tuple[dict[str, Any], list[Path]]:
    """The source's manifest and shard files; UserError when `data` is not generated data."""
    if not (data / MANIFEST).is_file():
        raise UserError(f"{data} is not a `rookworld data generate` directory (no {MANIFEST}); relabel and render "
                        "work on generated data, whose P records keep their position and analysis")
    shards = sorted(data.glob("shard-*.jsonl.gz"))
    if not shards:
        raise UserError(f"{data} has no shard-*.jsonl.gz files")
    return _manifest(data / MANIFEST), shards


def _manifest(path: Path) -> dict[str, Any]:
    """A generated dataset's manifest, which must hold its counts by task; UserError otherwise."""
    try:
        manifest = store.read_json(path)
        counts = manifest.get("counts") if isinstance(manifest, dict) else None
        if not isinstance(counts, dict) or not isinstance(counts.get("task"), dict):
            raise ValueError("no counts by task")
    except (OSError, ValueError) as exc:  # unreadable, not UTF-8, not JSON, or not a manifest
        raise UserError(f"{path} is not a `rookworld data generate` manifest ({exc}); relabel generated data") from None
    return manifest


def relabel(config: RelabelConfig) -> dict[str, Any]:
    """Write (or finish) the relabelled copy of config.data in config.out; returns its manifest."""
    data, out = Path(config.data), Path(config.out)
    source_manifest, shards = read_source(data)
    limit = config.label_limit
    fingerprint = {"format": source_manifest.get("format"), "source": str(data.resolve()),
                   "source_created": source_manifest.get("created"), "label_limit": limit.key(),
                   "multipv": MULTIPV}
    state = load_progress(out, fingerprint)
    out.mkdir(parents=True, exist_ok=True)
    done: dict[str, Any] = state["shards"]
    started = state.setdefault("started", datetime.now(UTC).isoformat(timespec="seconds"))
    total = source_manifest["counts"]["task"].get("P", 0)
    order = source_manifest.get("order", "shuffled")
    with StockfishPool(processes=config.processes, binary=config.stockfish, cache_path=config.cache) as pool, \
            progress_bar() as bar:
        task = bar.add_task("P positions", total=total, completed=sum(s["P"] for s in done.values()))
        for path in shards:
            if path.name in done:
                continue
            began = time.perf_counter()
            records = read_records(path)
            p_rows = [r for r in records if r.get("t") == "P"]
            bar.update(task, description=f"{path.name}: labelling")
            for start in range(0, len(p_rows), LABEL_CHUNK):
                chunk = p_rows[start:start + LABEL_CHUNK]
                for record, analysis in zip(chunk, pool.analyse([r["fen"] for r in chunk], limit, MULTIPV)):
                    record.update(m=list(analysis.moves), e=list(analysis.evals), l=analysis.limit,
                                  s=_order(record["fen"], record["s"], len(analysis.moves), order))
                bar.advance(task, len(chunk))
            store.write_jsonl_gz(out / path.name, records)
            done[path.name] = {"P": len(p_rows), "A": len(records) - len(p_rows),
                               "seconds": round(time.perf_counter() - began, 2)}
            store.write_json(out / PROGRESS, state)
        engine = pool.engine_name
    old_stockfish = source_manifest.get("stockfish", {})
    manifest = {**source_manifest, "command": config.command(),
                "stockfish": {**old_stockfish, "engine": engine, "label_limit": limit.key(), "multipv": MULTIPV},
                "relabel": {"source": str(data), "source_command": source_manifest.get("command"),
                            "source_label_limit": old_stockfish.get("label_limit"),
                            "source_engine": old_stockfish.get("engine"), "started": started,
                            "finished": datetime.now(UTC).isoformat(timespec="seconds"),
                            "seconds": round(sum(s["seconds"] for s in done.values()), 1),
                            "config": asdict(config)}}
    store.write_json(out / MANIFEST, manifest)
    return manifest
