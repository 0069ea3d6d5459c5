"""The compact record format of generated data (jsonl.gz shards), and byte-reproducible writing.

A generated P record keeps the ranked analysis and the display order of its moves; an A record keeps
its prompt (without `A: `), the arbiter's target and the case. A record of a sample that comes from a
game also keeps the game's id (`g`, loaded as meta.game; splits.py splits by it); records without one
(older data, synthetic A cases) load as before. Everything else (prompt and target text, phase, move
number) is rebuilt on load, which keeps the embedded dataset a few MB.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rookworld import text
from rookworld.analysis import Analysis
from rookworld.data.position import position_meta
from rookworld.data.record import Sample, p_sample


def is_compact(record: Mapping[str, Any]) -> bool:
    return "t" in record


def record_fen(record: Mapping[str, Any]) -> str | None:
    """The position a compact record asks about, read without decoding it (None if it has none)."""
    if record.get("t") == "A" and isinstance(record.get("p"), str):
        return record["p"].split("+", 1)[0]
    fen = record.get("fen")
    return fen if isinstance(fen, str) else None


def record_game(record: Mapping[str, Any]) -> str | None:
    """The game id of a compact record (None if it has none)."""
    game = record.get("g")
    return None if game is None else str(game)


def encode(sample: Sample, order: list[int] | None = None) -> dict[str, Any]:
    """The compact record of a generated sample; `order` is the display order of a P sample's moves."""
    if sample.task == "P":
        analysis = sample.analysis
        if analysis is None:
            raise ValueError("a P sample needs its analysis to be stored")
        order = order if order is not None else list(range(len(analysis.moves)))
        record: dict[str, Any] = {"t": "P", "fen": analysis.fen, "m": list(analysis.moves),
                                  "e": list(analysis.evals), "s": order, "l": analysis.limit}
    else:
        record = {"t": "A", "p": sample.prompt[len(text.A_PREFIX):], "y": sample.target, "c": sample.meta["case"]}
    if sample.meta.get("game") is not None:
        record["g"] = str(sample.meta["game"])
    return record


def decode(record: Mapping[str, Any]) -> Sample:
    """Raises KeyError/ValueError/TypeError for a record that is not a valid compact record."""
    game = record_game(record)
    extra = {"game": game} if game is not None else {}
    if record["t"] == "P":
        analysis = Analysis.from_json({"fen": record["fen"], "moves": record["m"], "evals": record["e"],
                                       "limit": record["l"]})
        return p_sample(analysis, order=[int(i) for i in record["s"]], meta=extra)
    if record["t"] == "A":
        prompt = text.A_PREFIX + record["p"]
        fen = record["p"].split("+", 1)[0]
        return Sample("A", prompt, str(record["y"]), None, {**position_meta(fen), "case": str(record["c"]), **extra})
    raise ValueError(f"unknown record type {record['t']!r}")


def dumps(record: Mapping[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False)


def write_jsonl_gz(path: Path, records: Iterable[Mapping[str, Any]]) -> None:
    """Write atomically (temp file, then rename) and reproducibly (no timestamp or name in the header)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as handle:
        for record in records:
            handle.write((dumps(record) + "\n").encode())
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
