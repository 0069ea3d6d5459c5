"""`rookworld data generate --out DIR --p-positions N --a-samples M --seed S`: make a RookWorld dataset.

Positions come from the user's PGN files or, by default, from Stockfish self-play (selfplay.py). P samples are
positions labelled by the engine pool (multipv 5; `B:` is the rank-1 move; M and E shuffled together with the
seed, or with --order best-first listed in the engine's ranking); A samples are moves of the same games plus
rare cases (a_mix.py). Positions with fewer than 5 legal moves list all of them (Stockfish's multipv returns
that many). Every record of a sample from a game stores the game's id (`g`: seed-shard-game), by which
splits.py splits the data. `--side train|eval` makes one side of that split only: the ids of the other side's
games are skipped before a game is played, and samples without a game (synthetic cases, split by position) are
kept only on that side. The embedded set is made so: its held-out games are fresh games of another seed, which
the embedded model never trained on (Makefile `embedded-data`).

The work is cut into shards (about `shard_size` samples each), each with its own random stream (seed, shard),
written atomically as `shard-NNNNN.jsonl.gz` (compact records, store.py) and recorded in `progress.json`;
rerunning the same command skips finished shards, so an interrupted run continues and the data files are
byte-identical to an uninterrupted run with the same seed. Shards run one after another (positions already used are
skipped by later shards); the engine pool parallelizes within one. At the end `manifest.json` records the
counts, Stockfish version and limits, seed, time and command.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from itertools import chain, count, islice
from pathlib import Path
from typing import Any

import chess
import numpy as np
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from rookworld.data import store
from rookworld.data.a_mix import RARE_SHARES, AMixer
from rookworld.data.cases import mating_moves
from rookworld.data.games import Game, Ply, plies, read_pgn_games
from rookworld.data.position import position_key
from rookworld.data.record import ORDERS, Sample, display_order, p_sample
from rookworld.data.selfplay import SelfPlayConfig, play_games
from rookworld.data.splits import EVAL_FRACTION, SPLITS, Split, split_for
from rookworld.errors import UserError
from rookworld.fsutil import output_dir
from rookworld.stockfish import LABEL_LIMIT, Limit, StockfishPool

log = logging.getLogger(__name__)

FORMAT = "rookworld-compact-1"
PROGRESS = "progress.json"
MANIFEST = "manifest.json"
MULTIPV = 5
P_KEEP = 0.4  # chance that a new game position becomes a P candidate: spreads P positions over many games
# Which game positions may become P samples (--p-select): a random share (P_KEEP) of all of them, or every
# position whose side to move can mate at once (about 1% of self-play positions: a held-out mate-in-one set).
P_SELECT = {"any": P_KEEP, "mate-in-one": 0.01}  # the share of positions kept, to size each round's games
# Game moves fill the A samples that rare cases leave (about 75%); the margin covers repeated prompts.
A_PLIES = 1.0 - sum(RARE_SHARES.values()) + 0.05
# Settings a data job's fingerprint names only when they differ from the default (so that older runs resume)
OPTIONAL_FIELDS = ("side", "p_select", "order", "random_move_rate", "max_opening_plies", "p_keep_check")
MAX_GAMES_PER_ROUND = 16  # games played in lockstep (a fixed count: the data must not depend on --processes)
PLIES_PER_GAME = 100  # a rough mean, to play about as many games as a shard still needs
LABEL_CHUNK = 32  # positions per pool call while labelling (progress granularity)


@dataclass
class GenerateConfig:
    out: str = field(default="", metadata={"help": "output directory, required; rerun the same command to resume"})
    p_positions: int = field(default=1000, metadata={"help": "P samples (distinct positions) to make"})
    a_samples: int = field(default=3000, metadata={"help": "A samples to make"})
    seed: int = field(default=0, metadata={"help": "seed of all random choices (same seed: same bytes)"})
    pgn: list[str] = field(default_factory=list, metadata={"help": "PGN files to take games from instead of "
                                                           "Stockfish self-play"})
    depth: int | None = field(default=None, metadata={"help": f"label search depth; unset: {LABEL_LIMIT.depth} "
                                                       "unless --nodes"})
    nodes: int | None = field(default=None, metadata={"help": "label search nodes (instead of --depth)"})
    processes: int | None = field(default=None, metadata={"help": "Stockfish processes; unset: one per CPU"})
    selfplay_nodes: int = field(default=1000, metadata={"help": "search nodes per self-play move"})
    temperature: float = field(default=0.3, metadata={"help": "self-play softmax temperature over multipv "
                                                      "evals, in pawns (0: best move)"})
    random_move_rate: float = field(default=0.0, metadata={"help": "chance that a self-play move after the opening "
                                                           "is a uniformly random legal move (weaker play)"})
    max_opening_plies: int = field(default=8, metadata={"help": "self-play games open with 2 to this many uniformly "
                                                        "random plies"})
    p_keep_check: float = field(default=P_KEEP, metadata={"help": "chance that a position in check becomes a P "
                                                          f"sample (other positions: {P_KEEP}; with --p-select any)"})
    shard_size: int = field(default=4000, metadata={"help": "samples per shard (the unit of resuming)"})
    side: str = field(default="all", metadata={"help": "make only the train or eval side of the split by game "
                                                "(all: both)"})
    p_select: str = field(default="any", metadata={"help": "P positions: any (a random share of every game's "
                                                    "positions) or mate-in-one (only, and all, positions whose "
                                                    "side to move can mate at once)"})
    order: str = field(default="shuffled", metadata={"help": "how P targets list their M:/E: candidates: shuffled "
                                                      "(RookWorld's data) or best-first (the engine's ranking, "
                                                      "B: = the first M:)"})
    stockfish: str | None = field(default=None, metadata={"help": "Stockfish binary; unset: $ROOKWORLD_STOCKFISH, PATH "
                                                     "or /usr/games/stockfish"})

    def __post_init__(self) -> None:
        if not self.out:
            raise ValueError("--out DIR is required")
        if self.order not in ORDERS:
            raise ValueError(f"--order {self.order!r}: choose one of {', '.join(ORDERS)}")
        if self.p_positions < 0 or self.a_samples < 0 or self.p_positions + self.a_samples == 0:
            raise ValueError("--p-positions and --a-samples must be >= 0, and not both 0")
        label_limit(self.depth, self.nodes)
        if self.shard_size < 1 or self.selfplay_nodes < 1 or not 0 <= self.temperature < math.inf:
            raise ValueError(f"--shard-size and --selfplay-nodes must be >= 1, --temperature finite and >= 0; got "
                             f"{self.shard_size}, {self.selfplay_nodes}, {self.temperature}")
        if self.seed < 0:
            raise ValueError(f"--seed {self.seed}: must be >= 0")
        if not 0 <= self.random_move_rate <= 1 or not 0 <= self.p_keep_check <= 1:
            raise ValueError(f"--random-move-rate and --p-keep-check are chances from 0 to 1; got "
                             f"{self.random_move_rate}, {self.p_keep_check}")
        if self.max_opening_plies < SelfPlayConfig.min_random_plies:
            raise ValueError(f"--max-opening-plies {self.max_opening_plies}: must be >= "
                             f"{SelfPlayConfig.min_random_plies}")
        if self.pgn and (self.random_move_rate or self.max_opening_plies != SelfPlayConfig.max_random_plies):
            raise ValueError("--random-move-rate and --max-opening-plies shape self-play games; drop them with --pgn")
        if self.side not in SPLITS:
            raise ValueError(f"--side {self.side!r}: choose one of {', '.join(SPLITS)}")
        if self.p_select not in P_SELECT:
            raise ValueError(f"--p-select {self.p_select!r}: choose one of {', '.join(P_SELECT)}")
        missing = [p for p in self.pgn if not Path(p).is_file()]
        if missing:
            raise ValueError(f"--pgn {' '.join(missing)}: not an existing file")

    @property
    def label_limit(self) -> Limit:
        return label_limit(self.depth, self.nodes)

    @property
    def selfplay(self) -> SelfPlayConfig:
        return SelfPlayConfig(limit=Limit(nodes=self.selfplay_nodes), temperature=self.temperature,
                              max_random_plies=self.max_opening_plies, random_move_rate=self.random_move_rate)

    @property
    def shards(self) -> int:
        return max(1, math.ceil((self.p_positions + self.a_samples) / self.shard_size))

    def fingerprint(self) -> dict[str, Any]:
        """Everything that decides the data (not --out, --processes or the binary's path)."""
        pgn = [{"path": str(Path(p).resolve()), "bytes": Path(p).stat().st_size} for p in self.pgn]
        # absent at their defaults, so that older runs resume
        optional = self.changed(OPTIONAL_FIELDS)
        return {"format": FORMAT, "p_positions": self.p_positions, "a_samples": self.a_samples, "seed": self.seed,
                "pgn": pgn, "label_limit": self.label_limit.key(), "selfplay_limit": self.selfplay.limit.key(),
                "temperature": self.temperature, "shard_size": self.shard_size, "rare_shares": RARE_SHARES, **optional}

    def command(self) -> str:
        parts = ["rookworld data generate", f"--out {self.out}", f"--p-positions {self.p_positions}",
                 f"--a-samples {self.a_samples}", f"--seed {self.seed}"]
        parts += [f"--pgn {p}" for p in self.pgn]
        parts += [f"--depth {self.depth}"] if self.depth is not None else []
        parts += [f"--nodes {self.nodes}"] if self.nodes is not None else []
        parts += [f"--processes {self.processes}"] if self.processes is not None else []
        changed = self.changed(("selfplay_nodes", "temperature", "shard_size", *OPTIONAL_FIELDS))
        parts += [f"--{name.replace('_', '-')} {value}" for name, value in changed.items()]
        return " ".join(parts)

    def changed(self, names: tuple[str, ...]) -> dict[str, Any]:
        """The fields among `names` that differ from their defaults, with their values."""
        defaults = GenerateConfig(out=self.out)
        return {name: getattr(self, name) for name in names if getattr(self, name) != getattr(defaults, name)}


def label_limit(depth: int | None, nodes: int | None) -> Limit:
    """The P label search of --depth / --nodes (LABEL_LIMIT when neither); raises ValueError for a bad pair."""
    if depth is not None and nodes is not None:
        raise ValueError("give --depth or --nodes, not both")
    if (depth is not None and depth < 1) or (nodes is not None and nodes < 1):
        raise ValueError("--depth and --nodes must be >= 1")
    if nodes is not None:
        return Limit(nodes=nodes)
    return Limit(depth=depth) if depth is not None else LABEL_LIMIT


def progress_bar() -> Progress:
    """The bar of a long data job: description, bar, done/total, elapsed time, ETA."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("ETA"), TimeRemainingColumn(), transient=False)


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.jsonl.gz"


def game_id(seed: int, shard: int, game: int) -> str:
    """The id of a shard's game (its index among the shard's games): unique within the dataset and
    different between seeds; stored with every sample of the game (splits.py splits by it)."""
    return f"{seed}-{shard}-{game}"


def game_ids(seed: int, shard: int, side: Split) -> Iterator[str]:
    """A shard's game ids in order: all of them, or those on `side` of the split by game."""
    for index in count():
        gid = game_id(seed, shard, index)
        if side == "all" or split_for("", gid) == side:
            yield gid


def quota(total: int, shards: int, index: int) -> int:
    """Shard `index`'s even part of `total`."""
    return total * (index + 1) // shards - total * index // shards


@dataclass
class ShardResult:
    records: list[dict[str, Any]]
    stats: dict[str, Any]


class _Run:
    """One generation run: the pool, the progress bar, and what earlier shards used."""

    def __init__(self, config: GenerateConfig, pool: StockfishPool, progress: Progress, task_id: Any,
                 seen_positions: set[str], seen_prompts: set[str], pgn_games: Iterator[Game] | None) -> None:
        self.config = config
        self.pool = pool
        self.progress = progress
        self.task_id = task_id
        self.seen_positions = seen_positions
        self.seen_prompts = seen_prompts
        self.pgn_games = pgn_games

    def _games(self, rng: np.random.Generator, count: int) -> list[Game]:
        if self.pgn_games is not None:
            return list(islice(self.pgn_games, count))
        return play_games(self.pool, count, rng, self.config.selfplay)

    def _p_candidate(self, fen: str, rng: np.random.Generator) -> bool:
        if self.config.p_select == "mate-in-one":
            return bool(mating_moves(chess.Board(fen)))
        keep = self.config.p_keep_check if self.config.p_keep_check != P_KEEP and chess.Board(fen).is_check() \
            else P_KEEP
        return rng.random() < keep

    def _collect(self, rng: np.random.Generator, shard: int, n_p: int, n_a: int,
                 label: str) -> tuple[list[list[Ply]], list[tuple[str, str]]]:
        """Games until there are `n_p` new P positions and enough plies for `n_a` A samples (or the PGN
        games run out); each round plays about as many games as still needed, at most 16. Returns the
        games' plies (each with its game's id) and the P positions as (FEN, id of the game in which it
        was picked; a position is picked once per dataset)."""
        ids = game_ids(self.config.seed, shard, self.config.side)  # type: ignore[arg-type]
        games: list[list[Ply]] = []
        fens: list[tuple[str, str]] = []
        keys: set[str] = set()
        n_plies = 0
        while len(fens) < n_p or n_plies < A_PLIES * n_a:
            missing = max((n_p - len(fens)) / P_SELECT[self.config.p_select], A_PLIES * n_a - n_plies)
            batch = self._games(rng, min(MAX_GAMES_PER_ROUND, max(2, math.ceil(missing / PLIES_PER_GAME))))
            if not batch:
                break
            for game in batch:
                gid = next(ids)
                game_plies = list(plies(game, gid))
                games.append(game_plies)
                n_plies += len(game_plies)
                for ply in game_plies:
                    key = position_key(ply.fen)
                    if key not in self.seen_positions and key not in keys and self._p_candidate(ply.fen, rng):
                        keys.add(key)
                        fens.append((ply.fen, gid))
            self.progress.update(self.task_id, description=f"{label}: games ({len(games)} games, {n_plies} plies)")
        return games, fens[:n_p]

    def _label(self, rng: np.random.Generator, fens: list[tuple[str, str]],
               label: str) -> list[tuple[Sample, list[int]]]:
        self.progress.update(self.task_id, description=f"{label}: labelling P positions")
        labelled: list[tuple[Sample, list[int]]] = []
        for start in range(0, len(fens), LABEL_CHUNK):
            chunk = fens[start:start + LABEL_CHUNK]
            analyses = self.pool.analyse([fen for fen, _ in chunk], self.config.label_limit, MULTIPV)
            for analysis, (_, game) in zip(analyses, chunk):
                if analysis.moves:  # a position before a game move always has one; guard a bad PGN
                    # drawn in both orders, so that both make the same games and positions
                    order = display_order(rng.permutation(len(analysis.moves)), self.config.order)
                    labelled.append((p_sample(analysis, order, {"game": game}), order))
            self.progress.advance(self.task_id, len(chunk))
        return labelled

    def shard(self, index: int) -> ShardResult:
        config = self.config
        label = f"shard {index + 1}/{config.shards}"
        rng = np.random.default_rng([config.seed, index])
        n_p = quota(config.p_positions, config.shards, index)
        n_a = quota(config.a_samples, config.shards, index)
        started = time.perf_counter()
        games, fens = self._collect(rng, index, n_p, n_a, label)
        collected = time.perf_counter()
        labelled = self._label(rng, fens, label)
        labelled_at = time.perf_counter()
        self.progress.update(self.task_id, description=f"{label}: A samples")
        a_samples = AMixer(rng, self.seen_prompts, config.side).build(games, n_a)  # type: ignore[arg-type]
        self.progress.advance(self.task_id, len(a_samples))
        done = time.perf_counter()
        self.seen_positions.update(position_key(sample.fen) for sample, _ in labelled)
        records = [store.encode(sample, order) for sample, order in labelled] + [store.encode(s) for s in a_samples]
        cases: dict[str, int] = {}
        for sample in a_samples:
            cases[sample.meta["case"]] = cases.get(sample.meta["case"], 0) + 1
        stats = {"P": len(labelled), "A": len(a_samples), "cases": dict(sorted(cases.items())), "games": len(games),
                 "plies": sum(len(g) for g in games), "seconds": {"games": round(collected - started, 2),
                 "label": round(labelled_at - collected, 2), "A": round(done - labelled_at, 2)}}
        return ShardResult(records, stats)


def load_progress(out: Path, fingerprint: dict[str, Any]) -> dict[str, Any]:
    """The progress record of a resumable data job in `out` (new if none); raises UserError when `out`
    holds another job's output or other files."""
    output_dir(out, "--out")
    path = out / PROGRESS
    if path.exists():
        progress = store.read_json(path)
        if progress.get("fingerprint") != fingerprint:
            raise UserError(f"{out} holds a data job with other settings ({path}); use another --out, "
                            "or delete that directory to start over")
        return progress
    if out.exists() and any(out.iterdir()):
        raise UserError(f"{out} exists and is not a generation or relabelling directory (no {PROGRESS}); choose an "
                        "empty or new --out")
    return {"fingerprint": fingerprint, "shards": {}}


def _seen(out: Path, done: dict[str, Any]) -> tuple[set[str], set[str]]:
    """Positions (P) and prompts (A) of the finished shards, so that later shards do not repeat them."""
    from rookworld.data.sources import load_files

    positions: set[str] = set()
    prompts: set[str] = set()
    for index in sorted(done, key=int):
        if not done[index]["P"] + done[index]["A"]:
            continue
        for sample in load_files(out / shard_name(int(index)), "all").samples:
            if sample.task == "P":
                positions.add(position_key(sample.fen))
            else:
                prompts.add(sample.prompt)
    return positions, prompts


def _rate(count: int, seconds: float) -> float | None:
    """Samples per second; None when the work took under the 0.1 s that the shard timings resolve."""
    return round(count / seconds, 2) if seconds >= 0.1 else None


def _manifest(config: GenerateConfig, progress: dict[str, Any], engine: str, started: str) -> dict[str, Any]:
    from rookworld.data.sources import load_files
    from rookworld.data.stats import tally

    shards = progress["shards"]
    seconds = {part: round(sum(s["seconds"][part] for s in shards.values()), 1) for part in ("games", "label", "A")}
    counts = tally(load_files(Path(config.out), "all").samples, EVAL_FRACTION)
    return {
        "format": FORMAT, "command": config.command(), "seed": config.seed, "created": started,
        "finished": datetime.now(UTC).isoformat(timespec="seconds"),
        "counts": counts, "eval_fraction": EVAL_FRACTION, "side": config.side, "order": config.order,
        "games": sum(s["games"] for s in shards.values()), "plies": sum(s["plies"] for s in shards.values()),
        "positions_from": "pgn" if config.pgn else "stockfish self-play",
        "stockfish": {"engine": engine, "label_limit": config.label_limit.key(), "multipv": MULTIPV,
                      "selfplay_limit": config.selfplay.limit.key(), "selfplay_temperature": config.temperature,
                      "selfplay_random_move_rate": config.random_move_rate,
                      "selfplay_opening_plies": [SelfPlayConfig.min_random_plies, config.max_opening_plies]},
        "p_keep": P_KEEP, "p_keep_check": config.p_keep_check,
        "a_rare_shares": RARE_SHARES, "seconds": seconds,
        # P: per second of labelling, A: per second of building; overall: all samples per second of all work
        "samples_per_second": {"P": _rate(counts["task"].get("P", 0), seconds["label"]),
                               "A": _rate(counts["task"].get("A", 0), seconds["A"]),
                               "overall": _rate(sum(counts["task"].values()), sum(seconds.values()))},
        "config": asdict(config),
    }


def _pgn_games(paths: list[str], consumed: int) -> Iterator[Game]:
    """The games of the PGN files after the `consumed` ones that finished shards used; UserError when the
    files hold no usable game at all (checked before any shard is made)."""
    games = read_pgn_games(paths)
    first = next(games, None)
    if first is None:
        raise UserError(f"--pgn {' '.join(paths)}: no standard chess game with moves in these files; give PGN "
                        "files of standard games")
    return islice(chain([first], games), consumed, None)


def generate(config: GenerateConfig) -> dict[str, Any]:
    """Make (or finish) the dataset in config.out; returns the manifest."""
    out = Path(config.out)
    progress_state = load_progress(out, config.fingerprint())
    done: dict[str, Any] = progress_state["shards"]
    pgn_games = _pgn_games(config.pgn, sum(s["games"] for s in done.values())) if config.pgn else None
    out.mkdir(parents=True, exist_ok=True)
    started = progress_state.setdefault("started", datetime.now(UTC).isoformat(timespec="seconds"))
    seen_positions, seen_prompts = _seen(out, done)
    total = config.p_positions + config.a_samples
    with StockfishPool(processes=config.processes, binary=config.stockfish) as pool, progress_bar() as bar:
        task_id = bar.add_task("samples", total=total, completed=sum(s["P"] + s["A"] for s in done.values()))
        run = _Run(config, pool, bar, task_id, seen_positions, seen_prompts, pgn_games)
        for index in range(config.shards):
            if str(index) in done:
                continue
            result = run.shard(index)
            store.write_jsonl_gz(out / shard_name(index), result.records)
            done[str(index)] = result.stats
            store.write_json(out / PROGRESS, progress_state)
            bar.console.print(f"shard {index + 1}/{config.shards}: {result.stats['P']} P, {result.stats['A']} A "
                              f"in {sum(result.stats['seconds'].values()):.0f} s")
        engine = pool.engine_name
    manifest = _manifest(config, progress_state, engine, started)
    store.write_json(out / MANIFEST, manifest)
    return manifest
