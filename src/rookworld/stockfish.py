"""Stockfish, the P task's ground truth: the only module that starts engines.

A `StockfishPool` runs one single-threaded engine process per worker thread. Every search starts
from a cleared engine (`ucinewgame` empties the hash and the history tables), so the same FEN and
limit give the same answer whatever the engine searched before. Results are cached in memory (LRU)
and optionally in a SQLite file keyed by (FEN, limit, query). A search that outlives `timeout` gets
its engine killed; a dead engine is restarted and the search retried, a bounded number of times.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import CancelledError, ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import chess
import chess.engine

from rookworld.analysis import Analysis, mate_to_pawns
from rookworld.arbiter import legal_move, parse_fen
from rookworld.errors import UserError

ENV_VAR = "ROOKWORLD_STOCKFISH"
DEBIAN_PATH = "/usr/games/stockfish"
HASH_MB = 16  # cleared before every search, so a small table suffices and clears fast
RETRIES = 2   # restarts of an engine for one search before giving up
START_TIMEOUT = 30.0  # seconds for a process to start and answer "uci"; searches have their own timeout
DB_TIMEOUT = 60.0  # seconds a cache file may stay locked by other processes before an error


class StockfishError(RuntimeError):
    """An engine that keeps dying or hanging on one search, or that does not start."""


@dataclass(frozen=True)
class Limit:
    """A deterministic search limit: depth and/or nodes (never time, which varies with the load)."""

    depth: int | None = None
    nodes: int | None = None

    def __post_init__(self) -> None:
        values = [getattr(self, f.name) for f in fields(self)]
        if all(v is None for v in values) or any(v is not None and (not isinstance(v, int) or v < 1) for v in values):
            raise UserError(f"a Stockfish limit needs a positive depth and/or node count, got {self}")

    def key(self) -> str:
        """Its name in caches and in `Analysis.limit`: "depth=10", "nodes=1000", "depth=10,nodes=1000"."""
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self) if getattr(self, f.name) is not None)

    def for_engine(self) -> chess.engine.Limit:
        return chess.engine.Limit(depth=self.depth, nodes=self.nodes)


LABEL_LIMIT = Limit(depth=10)  # P labels
MOVE_LIMIT = Limit(depth=8)    # one given move scored on demand


def find_stockfish(explicit: str | None = None) -> str:
    """The Stockfish binary: `explicit` (a flag), else $ROOKWORLD_STOCKFISH, else `stockfish` on PATH,
    else /usr/games/stockfish. A given flag or variable that names no executable is an error."""
    for origin, candidate in (("--stockfish", explicit), (f"${ENV_VAR}", os.environ.get(ENV_VAR))):
        if candidate:
            found = shutil.which(candidate)
            if found is None:
                raise UserError(f"Stockfish binary {candidate!r} (from {origin}) is not an executable file")
            return found
    found = shutil.which("stockfish") or shutil.which(DEBIAN_PATH)
    if found is None:
        raise UserError(f"Stockfish not found: pass --stockfish PATH, set ${ENV_VAR}, put `stockfish` on PATH, "
                        f"or install it at {DEBIAN_PATH} (Debian/Ubuntu: apt install stockfish)")
    return found


def _pawns(score: chess.engine.Score) -> float:
    mate = score.mate()
    return mate_to_pawns(mate) if mate is not None else score.score() / 100.0


class _Engine:
    """One Stockfish process; `search` kills it when it outlives the timeout."""

    def __init__(self, binary: str, timeout: float) -> None:
        self.binary, self.timeout = binary, timeout
        self.engine = self._start()

    def _start(self) -> chess.engine.SimpleEngine:
        try:
            engine = chess.engine.SimpleEngine.popen_uci(self.binary, timeout=START_TIMEOUT)
            engine.configure({"Threads": 1, "Hash": HASH_MB})
        except (chess.engine.EngineError, OSError, TimeoutError) as error:
            raise StockfishError(f"could not start Stockfish {self.binary!r}: {error!r}") from None
        return engine

    @property
    def pid(self) -> int:
        return self.engine.transport.get_pid()

    def search(self, board: chess.Board, limit: Limit, multipv: int,
               root_moves: list[chess.Move] | None) -> list[chess.engine.InfoDict]:
        timed_out = threading.Event()

        def expire() -> None:
            timed_out.set()
            self.close()  # kills the process, which ends the search below with an error

        watchdog = threading.Timer(self.timeout, expire)
        watchdog.start()
        try:
            # A new `game` object makes python-chess send ucinewgame: a cleared engine, a reproducible search.
            return self.engine.analyse(board, limit.for_engine(), multipv=multipv, game=object(),
                                       root_moves=root_moves)
        except (chess.engine.EngineError, CancelledError) as error:
            if timed_out.is_set():
                raise TimeoutError(f"search took longer than {self.timeout} s") from error
            raise
        finally:
            watchdog.cancel()

    def restart(self) -> None:
        self.close()
        self.engine = self._start()

    def close(self) -> None:
        self.engine.close()  # kills the process at once: a polite "quit" would wait on a hung engine


class _Cache:
    """LRU in memory over an optional SQLite file (WAL, so several runs can share it); thread-safe."""

    def __init__(self, size: int, path: str | Path | None) -> None:
        self.size = size
        self.memory: OrderedDict[tuple[str, str, str], Any] = OrderedDict()
        self.lock = threading.Lock()
        self.db = None
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            try:
                self.db = sqlite3.connect(path, timeout=DB_TIMEOUT, check_same_thread=False, isolation_level=None)
                self._set_up(self.db)
            except sqlite3.DatabaseError as error:
                raise UserError(f"Stockfish cache {str(path)!r} is not a usable SQLite file: {error}") from None

    @staticmethod
    def _set_up(db: sqlite3.Connection) -> None:
        """WAL mode and the table. Two processes setting up a new file at once can get "database is locked"
        at once: SQLite skips its busy wait where waiting could deadlock. Such a clash is retried."""
        deadline = time.monotonic() + DB_TIMEOUT
        while True:
            try:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("CREATE TABLE IF NOT EXISTS results (fen TEXT, search TEXT, query TEXT, value TEXT, "
                           "PRIMARY KEY (fen, search, query)) WITHOUT ROWID")
                return
            except sqlite3.OperationalError as error:
                if "locked" not in str(error) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def get(self, key: tuple[str, str, str]) -> Any | None:
        with self.lock:
            if key in self.memory:
                self.memory.move_to_end(key)
                return self.memory[key]
            if self.db is None:
                return None
            row = self.db.execute("SELECT value FROM results WHERE fen=? AND search=? AND query=?", key).fetchone()
        if row is None:
            return None
        value = json.loads(row[0])
        self._remember(key, value)
        return value

    def put(self, key: tuple[str, str, str], value: Any) -> None:
        self._remember(key, value)
        if self.db is not None:
            with self.lock:
                self.db.execute("INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?)", (*key, json.dumps(value)))

    def _remember(self, key: tuple[str, str, str], value: Any) -> None:
        with self.lock:
            self.memory[key] = value
            self.memory.move_to_end(key)
            while len(self.memory) > self.size:
                self.memory.popitem(last=False)

    def close(self) -> None:
        if self.db is not None:
            self.db.close()


class StockfishPool:
    """`with StockfishPool() as pool: pool.analyse(fens)`: parallel, cached, self-healing Stockfish."""

    def __init__(self, processes: int | None = None, binary: str | None = None, cache_path: str | Path | None = None,
                 timeout: float = 30.0, cache_size: int = 100_000) -> None:
        processes = (os.cpu_count() or 1) if processes is None else processes
        if processes < 1 or timeout <= 0 or cache_size < 0:
            raise UserError(f"Stockfish pool needs processes >= 1, timeout > 0 and cache_size >= 0; got "
                            f"processes={processes}, timeout={timeout}, cache_size={cache_size}")
        binary = find_stockfish(binary)
        self.restarts = 0  # engines restarted after dying or hanging, for logs and tests
        self._restarts_lock = threading.Lock()
        self._cache = _Cache(cache_size, cache_path)
        self._executor = ThreadPoolExecutor(max_workers=processes, thread_name_prefix="stockfish")
        self._idle: queue.Queue[_Engine] = queue.Queue()
        self._engines: list[_Engine] = []
        failures = []
        for future in [self._executor.submit(_Engine, binary, timeout) for _ in range(processes)]:
            try:
                self._engines.append(future.result())
            except StockfishError as error:
                failures.append(error)
        if failures:
            self.close()
            raise failures[0]
        for engine in self._engines:
            self._idle.put(engine)

    def __enter__(self) -> StockfishPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def pids(self) -> list[int]:
        """The engine processes' ids (they change when an engine is restarted)."""
        return [engine.pid for engine in self._engines]

    @property
    def engine_name(self) -> str:
        """The engines' UCI id, e.g. "Stockfish 15.1" (recorded in data manifests)."""
        return str(self._engines[0].engine.id.get("name", "unknown"))

    def analyse(self, fens: Sequence[str], limit: Limit = LABEL_LIMIT, multipv: int = 5,
                progress: bool = False) -> list[Analysis]:
        """Stockfish's top `multipv` moves of each position, best first, evals in pawns from the side to move.

        A position without legal moves gets an empty analysis. Raises InvalidPromptError for a bad FEN."""
        if multipv < 1:
            raise UserError(f"multipv must be >= 1, got {multipv}")
        boards = {fen: parse_fen(fen) for fen in fens}

        def lines(engine: _Engine, fen: str) -> dict[str, list]:
            if not any(boards[fen].legal_moves):
                return {"moves": [], "evals": []}
            infos = engine.search(boards[fen], limit, multipv, None)
            scored = [(info["pv"][0].uci(), _pawns(info["score"].relative)) for info in infos if info.get("pv")]
            return {"moves": [move for move, _ in scored], "evals": [pawns for _, pawns in scored]}

        queries = {fen: ((fen, limit.key(), f"multipv={multipv}"), lambda engine, fen=fen: lines(engine, fen))
                   for fen in boards}
        found = self._run(queries, progress)
        # Under a node limit Stockfish can list the lines of an unfinished iteration, with older scores, out of eval
        # order: ranked here, fresh or cached (the cache keeps the engine's order; depth-limited lines come ranked)
        return [Analysis(fen, tuple(found[fen]["moves"]), tuple(found[fen]["evals"]), limit.key()).ranked()
                for fen in fens]

    def evaluate_moves(self, requests: Sequence[tuple[str, str]], limit: Limit = MOVE_LIMIT) -> list[float | None]:
        """The eval in pawns of each (fen, uci) move, from the side to move's view (as `Analysis.evals`):
        a search restricted to that move. None for a move that is not legal there or not UCI."""
        boards = {fen: parse_fen(fen) for fen, _ in requests}
        moves = {(fen, uci): legal_move(boards[fen], uci) for fen, uci in requests}

        def score(engine: _Engine, fen: str, move: chess.Move) -> float:
            infos = engine.search(boards[fen], limit, 1, [move])
            return _pawns(infos[0]["score"].relative)

        queries = {(fen, move): ((fen, limit.key(), f"move={move.uci()}"),
                                 lambda engine, fen=fen, move=move: score(engine, fen, move))
                   for (fen, _), move in moves.items() if move is not None}
        found = self._run(queries, progress=False)
        return [None if moves[request] is None else found[request[0], moves[request]] for request in requests]

    def _run(self, queries: dict[Any, tuple[tuple[str, str, str], Callable[[_Engine], Any]]],
             progress: bool) -> dict[Any, Any]:
        """Each query's value, from the cache or from an engine (in parallel); new values are cached."""
        results, todo = {}, {}
        for name, (key, job) in queries.items():
            cached = self._cache.get(key)
            if cached is None:
                todo[name] = (key, job)
            else:
                results[name] = cached
        futures = {self._executor.submit(self._with_engine, job): (name, key) for name, (key, job) in todo.items()}
        try:
            with _progress_bar(progress, len(futures)) as advance:
                for future in as_completed(futures):
                    name, key = futures[future]
                    results[name] = future.result()
                    self._cache.put(key, results[name])
                    advance()
        except BaseException:
            for future in futures:
                future.cancel()
            raise
        return results

    def _with_engine(self, job: Callable[[_Engine], Any]) -> Any:
        engine = self._idle.get()
        try:
            for attempt in range(RETRIES + 1):
                try:
                    return job(engine)
                except (chess.engine.EngineError, CancelledError, TimeoutError) as error:  # died, or hung
                    if attempt == RETRIES:
                        raise StockfishError(f"Stockfish failed {RETRIES + 1} times on one search (last: {error}); "
                                             f"if it timed out, raise the timeout or lower the limit") from None
                    with self._restarts_lock:
                        self.restarts += 1
                    engine.restart()
        finally:
            self._idle.put(engine)

    def close(self) -> None:
        """Stops the engines; idempotent."""
        self._executor.shutdown(wait=True, cancel_futures=True)
        for engine in self._engines:
            engine.close()
        self._engines = []
        self._cache.close()


PLAY_LIMIT = Limit(depth=10)  # an opponent's move in `rookworld play`
MAX_SKILL = 20  # UCI "Skill Level" 20 is full strength


class SkillEngine:
    """One Stockfish process playing moves at UCI "Skill Level" `skill` (0..20) within `limit`.

    Every move starts from a cleared engine, as in the pool. Below level 20 Stockfish picks among its
    top moves with a random generator that it seeds from the clock, so those games do not repeat."""

    def __init__(self, skill: int, limit: Limit = PLAY_LIMIT, binary: str | None = None,
                 timeout: float = 30.0) -> None:
        if not 0 <= skill <= MAX_SKILL:
            raise UserError(f"--skill {skill}: Stockfish's skill level is 0..{MAX_SKILL}")
        self.skill, self.limit = skill, limit
        self._engine = _Engine(find_stockfish(binary), timeout)
        self._engine.engine.configure({"Skill Level": skill})

    @property
    def name(self) -> str:
        return f"Stockfish skill {self.skill}"

    def __enter__(self) -> SkillEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def play(self, board: chess.Board) -> chess.Move:
        """Stockfish's move on `board` (which has a legal move); an engine that dies, or outlives the
        timeout and is killed, is a StockfishError."""
        watchdog = threading.Timer(self._engine.timeout, self._engine.close)
        watchdog.start()
        try:
            move = self._engine.engine.play(board, self.limit.for_engine(), game=object()).move
        except (chess.engine.EngineError, CancelledError) as error:
            raise StockfishError(f"Stockfish failed to play in {board.fen()!r} (timeout "
                                 f"{self._engine.timeout} s): {error!r}") from None
        finally:
            watchdog.cancel()
        if move is None:
            raise StockfishError(f"Stockfish returned no move in {board.fen()!r}")
        return move

    def close(self) -> None:
        self._engine.close()


@contextmanager
def _progress_bar(enabled: bool, total: int) -> Iterator[Callable[[], None]]:
    """`with _progress_bar(...) as advance: advance()`: a rich progress bar when asked for, else nothing."""
    if not (enabled and total):
        yield lambda: None
        return
    from rich.progress import Progress

    with Progress(transient=True) as bar:
        task = bar.add_task("Stockfish", total=total)
        yield lambda: bar.advance(task)
