"""Load samples from a source: the embedded dataset, local files, or a Hugging Face hub dataset.

    load_source("embedded", "train")              the dataset shipped in rookworld/assets/data
    load_source("data/games.jsonl.gz", "eval")    a file: .txt, .jsonl, .parquet, .txt.gz, .jsonl.gz
    load_source("runs/gen", "all")                a directory: all of its data files
    load_source("jrahn/rookworld_7m", "eval")     a hub dataset id (streamed; eval = its `test` split)

Rows that cannot be used are counted and skipped; the first few are logged with their line numbers.
"""

from __future__ import annotations

import gzip
import itertools
import json
import logging
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from rookworld.data import rows, store
from rookworld.data.record import Sample
from rookworld.data.splits import EVAL_FRACTION, HUB_SPLITS, Split, check_split, in_split, sample_split
from rookworld.errors import UserError

log = logging.getLogger(__name__)

EMBEDDED = "embedded"
DATA_SUFFIXES = (".txt", ".txt.gz", ".jsonl", ".jsonl.gz", ".parquet")
SHOWN_SKIPS = 5


class HubLoadError(UserError):
    """A hub dataset that `datasets` could not open (unknown id, offline, no such split)."""


@dataclass(frozen=True)
class BadRow:
    """A row that could not even be read (e.g. invalid JSON), passed on to be counted with its place."""

    reason: str


Row = str | Mapping[str, Any] | BadRow


@dataclass
class LoadReport:
    """What happened to the rows read from a source: samples of the split, rows of the other split (by
    game or position, splits.py), rows skipped as unparseable (the first few kept), and A rows whose
    stated target the arbiter overruled."""

    source: str
    samples: int = 0
    other_split: int = 0
    skipped: int = 0
    skip_examples: list[str] = field(default_factory=list)
    overruled_targets: int = 0

    def skip(self, where: str, reason: str) -> None:
        self.skipped += 1
        if len(self.skip_examples) < SHOWN_SKIPS:
            self.skip_examples.append(f"{where}: {reason}")

    def log(self) -> None:
        if self.skipped:
            log.warning("%s: skipped %d unparseable rows, e.g.\n  %s", self.source, self.skipped,
                        "\n  ".join(self.skip_examples))
        if self.overruled_targets:
            log.warning("%s: %d A rows state a target that the arbiter disagrees with; kept the arbiter's",
                        self.source, self.overruled_targets)


@dataclass
class SampleSet:
    source: str
    split: Split
    samples: list[Sample]
    report: LoadReport
    eval_fraction: float | None  # of the split by game or position; None for hub data (split by the hub)


def embedded_path() -> Path:
    return Path(str(resources.files("rookworld") / "assets" / "data"))


def data_files(path: Path) -> list[Path]:
    """`path` itself, or the data files under a directory (sorted, so the order is reproducible)."""
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(DATA_SUFFIXES))
    if not path.name.endswith(DATA_SUFFIXES):
        raise UserError(f"{path}: unknown data file type; expected one of {', '.join(DATA_SUFFIXES)}")
    return [path]


def file_rows(path: Path) -> Iterator[tuple[str, Row]]:
    """(where, row) for each non-blank row of a data file (where = "file:line"); UserError naming the file
    when it cannot be read as its type (not UTF-8, not gzip, truncated, not parquet)."""
    if path.name.endswith(".parquet"):
        import pyarrow

        rows_, errors = _parquet_rows(path), (pyarrow.ArrowException, OSError)
    else:
        rows_, errors = _text_rows(path), (UnicodeDecodeError, OSError, EOFError, zlib.error)
    try:
        yield from rows_
    except errors as exc:
        raise UserError(f"{path}: {_unreadable(exc)}; fix or remove this file") from None


def _unreadable(exc: BaseException) -> str:
    """What a reading error says about the file."""
    if isinstance(exc, UnicodeDecodeError):
        return f"not valid UTF-8 text ({exc.reason})"
    if isinstance(exc, gzip.BadGzipFile | zlib.error):
        return f"not a valid gzip file ({exc})"
    if isinstance(exc, EOFError):
        return "truncated: the compressed data ends early"
    if isinstance(exc, OSError):
        return f"cannot be read ({exc.strerror or exc})"
    return f"not a readable parquet file ({exc})"  # pyarrow's own errors


def _parquet_rows(path: Path) -> Iterator[tuple[str, Row]]:
    import pyarrow.parquet as pq

    number = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
        for record in batch.to_pylist():
            number += 1
            yield f"{path}:{number}", record


def _text_rows(path: Path) -> Iterator[tuple[str, Row]]:
    is_json = path.name.endswith((".jsonl", ".jsonl.gz"))
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            if is_json:
                try:
                    yield f"{path}:{number}", json.loads(line)
                except json.JSONDecodeError as exc:
                    yield f"{path}:{number}", BadRow(f"invalid JSON ({exc.msg}): {line[:80]!r}")
            else:
                yield f"{path}:{number}", line


def hub_rows(name: str, split: Split, data_files: Any = None) -> Iterator[tuple[str, Row]]:
    """Rows of a hub dataset, streamed; `eval` reads the dataset's own `test` split.

    `name` and `data_files` go to `datasets.load_dataset` as they are (so `("parquet", {"train": ...,
    "test": ...})` reads local files exactly the way a hub dataset is read).
    """
    import datasets

    for hub_split in HUB_SPLITS[split]:
        try:
            dataset = datasets.load_dataset(name, split=hub_split, streaming=True, data_files=data_files)
        except Exception as exc:  # datasets raises many types (connection, not found, bad split)
            raise HubLoadError(f"cannot load hub dataset {name!r} (split {hub_split!r}): {exc}. Check the id and "
                               "the network; with HF_HUB_OFFLINE=1 only datasets in the local cache load") from None
        for number, record in enumerate(dataset, start=1):
            yield f"{name}[{hub_split}]:{number}", record


def _samples(rows_: Iterator[tuple[str, Row]], report: LoadReport, split: Split,
             eval_fraction: float | None) -> Iterator[Sample]:
    """The samples of the rows in `split` (splits.py: by game, else by position); `eval_fraction` None: no
    split here (hub data)."""
    splitting = eval_fraction is not None and split != "all"
    for where, row in rows_:
        if isinstance(row, BadRow):
            report.skip(where, row.reason)
            continue
        if splitting and isinstance(row, Mapping) and store.is_compact(row):
            fen = store.record_fen(row)  # generated data: split before the (costlier) decoding
            if fen is not None and not in_split(fen, split, eval_fraction, store.record_game(row)):
                report.other_split += 1
                continue
        try:
            sample = rows.from_line(row) if isinstance(row, str) else rows.from_record(row)
        except (ValueError, KeyError, TypeError) as exc:  # rows are untrusted input of any shape
            report.skip(where, f"{type(exc).__name__}: {exc}")
            continue
        if splitting and sample_split(sample, eval_fraction) != split:
            report.other_split += 1
            continue
        report.samples += 1
        report.overruled_targets += "stated_target" in sample.meta
        yield sample


def _collect(name: str, split: Split, samples: Iterator[Sample], report: LoadReport, limit: int | None,
             eval_fraction: float | None) -> SampleSet:
    chosen = list(itertools.islice(samples, limit))
    report.log()
    if not chosen and report.other_split:
        raise UserError(f"{name}: {report.other_split} usable rows but none in the {split} split; "
                        "use a larger source or --split all")
    if not chosen:
        raise UserError(f"{name}: no usable row (skipped {report.skipped}); "
                        + ("; ".join(report.skip_examples) or "the source is empty"))
    return SampleSet(name, split, chosen, report, eval_fraction)


def load_hub(name: str, split: Split = "train", *, limit: int | None = None, data_files: Any = None) -> SampleSet:
    split = check_split(split)
    report = LoadReport(name)
    return _collect(name, split, _samples(hub_rows(name, split, data_files), report, split, None), report, limit, None)


def load_files(path: str | Path, split: Split = "train", *, limit: int | None = None,
               eval_fraction: float = EVAL_FRACTION, name: str | None = None) -> SampleSet:
    """Samples of local data files, split by game where a sample records one, else by position (splits.py)."""
    split = check_split(split)
    path = Path(path)
    name = name or str(path)
    files = data_files(path)
    if not files:
        raise UserError(f"{name}: no data files ({', '.join(DATA_SUFFIXES)}) in this directory")
    report = LoadReport(name)
    rows_ = itertools.chain.from_iterable(file_rows(f) for f in files)
    return _collect(name, split, _samples(rows_, report, split, eval_fraction), report, limit, eval_fraction)


def load_source(source: str = EMBEDDED, split: Split = "train", *, limit: int | None = None,
                eval_fraction: float = EVAL_FRACTION) -> SampleSet:
    """Samples of `source`: "embedded", a local file or directory, or a hub dataset id (see module doc).

    `limit` keeps the first samples of the split (hub datasets are streamed, so a limit reads only that
    far); local data and the embedded set are split by game or position with `eval_fraction` held out.
    """
    if source == EMBEDDED:
        return load_files(embedded_path(), split, limit=limit, eval_fraction=eval_fraction, name=EMBEDDED)
    path = Path(source).expanduser()
    if path.exists():
        return load_files(path, split, limit=limit, eval_fraction=eval_fraction)
    from rookworld.hub import is_hub_id  # torch with it: only for a source that is no local path

    if is_hub_id(source) and not source.endswith(DATA_SUFFIXES):
        try:
            return load_hub(source, split, limit=limit)
        except HubLoadError as error:  # an id shaped like `dir/name` may have been meant as a local path
            raise UserError(f"{error}; no local file or directory {source!r} exists either") from None
    raise UserError(f"data source {source!r} is not a file or directory here, nor a hub dataset id "
                    f"(owner/name); use '{EMBEDDED}', a local path or e.g. jrahn/rookworld_7m")
