"""The Stockfish pool with the real engine: answers, determinism, caches, and surviving dead or hung engines."""

import json
import os
import signal
import sqlite3
import threading
import time

import chess
import pytest

from rookworld import stockfish
from rookworld.analysis import mate_to_pawns
from rookworld.errors import InvalidPromptError, UserError
from rookworld.stockfish import LABEL_LIMIT, Limit, StockfishError, StockfishPool, find_stockfish
from rookworld.text import parse_p_line

pytestmark = pytest.mark.stockfish

START = chess.STARTING_FEN
MATE_IN_ONE = "6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 30"  # a1a8#
FOOLS_MATE = "rnb1kbnr/pppp1ppp/8/4p3/6Pq/5P2/PPPPP2P/RNBQKBNR w KQkq - 1 3"  # white is mated
STALEMATE = "7k/8/6Q1/8/8/8/8/6K1 b - - 1 50"
FAST = Limit(depth=7)


@pytest.fixture
def real_fens(fixtures_dir):
    """Ten middlegame and endgame positions from RookWorld's validation set."""
    lines = (fixtures_dir / "rook_val_sample.txt").read_text().splitlines()
    return [parse_p_line(line).fen for line in lines[:10]]


# --- limits and the binary ---------------------------------------------------------------------

def test_limit_keys_and_validation():
    assert LABEL_LIMIT.key() == "depth=10"
    assert Limit(nodes=1000).key() == "nodes=1000"
    assert Limit(depth=8, nodes=5000).key() == "depth=8,nodes=5000"
    for bad in (Limit, lambda: Limit(depth=0), lambda: Limit(nodes=-5), lambda: Limit(depth=2.5)):
        with pytest.raises(UserError, match="positive depth"):
            bad()


def test_find_stockfish_order(tmp_path, monkeypatch):
    engine = tmp_path / "my-stockfish"
    engine.write_text("#!/bin/sh\n")
    engine.chmod(0o755)
    monkeypatch.setenv(stockfish.ENV_VAR, str(engine))
    assert find_stockfish(stockfish.DEBIAN_PATH) == stockfish.DEBIAN_PATH  # the flag first
    assert find_stockfish() == str(engine)                                 # then the variable
    monkeypatch.delenv(stockfish.ENV_VAR)
    on_path = tmp_path / "bin"
    on_path.mkdir()
    (on_path / "stockfish").symlink_to(engine)
    monkeypatch.setenv("PATH", str(on_path))
    assert find_stockfish() == str(on_path / "stockfish")                  # then PATH
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(stockfish, "DEBIAN_PATH", str(engine))
    assert find_stockfish() == str(engine)                                 # then the Debian path


def test_find_stockfish_errors_name_every_place(tmp_path, monkeypatch):
    with pytest.raises(UserError, match="nowhere/stockfish.*--stockfish"):
        find_stockfish(str(tmp_path / "nowhere" / "stockfish"))
    monkeypatch.setenv(stockfish.ENV_VAR, str(tmp_path / "missing"))
    with pytest.raises(UserError, match=r"\$ROOKWORLD_STOCKFISH"):
        find_stockfish()
    monkeypatch.delenv(stockfish.ENV_VAR)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(stockfish, "DEBIAN_PATH", str(tmp_path / "games" / "stockfish"))
    with pytest.raises(UserError) as error:
        find_stockfish()
    for place in ("--stockfish", "$ROOKWORLD_STOCKFISH", "PATH", "games/stockfish"):
        assert place in str(error.value)


@pytest.mark.stockfish
def test_a_binary_that_is_no_engine_fails_clearly():
    with pytest.raises(StockfishError, match="could not start Stockfish '/bin/true'"):
        StockfishPool(processes=1, binary="/bin/true")


# --- answers -----------------------------------------------------------------------------------

@pytest.mark.stockfish
def test_analyse_real_positions(real_fens):
    with StockfishPool(processes=2) as pool:
        analyses = pool.analyse(real_fens + [real_fens[0]], FAST)
    assert [a.fen for a in analyses] == real_fens + [real_fens[0]]
    assert analyses[-1] == analyses[0]
    for analysis in analyses:
        board = chess.Board(analysis.fen)
        assert len(analysis.moves) == min(5, board.legal_moves.count())
        assert all(chess.Move.from_uci(move) in board.legal_moves for move in analysis.moves)
        assert list(analysis.evals) == sorted(analysis.evals, reverse=True)  # best first
        assert analysis.limit == "depth=7"


@pytest.mark.stockfish
def test_analyse_mates_and_game_ends():
    with StockfishPool(processes=1) as pool:
        mate, mated, stalemate = pool.analyse([MATE_IN_ONE, FOOLS_MATE, STALEMATE], FAST, multipv=3)
    assert mate.best == "a1a8" and mate.evals[0] == mate_to_pawns(1) == 999.99
    assert len(mate.moves) == 3 and mate.evals[1] < 100
    assert (mated.moves, stalemate.moves) == ((), ())


@pytest.mark.stockfish
def test_the_same_position_gives_the_same_analysis_whatever_came_before(real_fens):
    with StockfishPool(processes=1, cache_size=0) as pool:
        forward = pool.analyse(real_fens, FAST)
        backward = pool.analyse(real_fens[::-1], FAST)[::-1]
    with StockfishPool(processes=2, cache_size=0) as pool:
        parallel = pool.analyse(real_fens, FAST)
    assert forward == backward == parallel


@pytest.mark.stockfish
def test_evaluate_moves():
    scandinavian = "rnbqkbnr/ppp1pppp/8/3p4/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 2"
    castle = "r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 20"
    with StockfishPool(processes=2) as pool:
        evals = pool.evaluate_moves([(MATE_IN_ONE, "a1a8"), (scandinavian, "e4d5"), (scandinavian, "d1g4"),
                                     (START, "e2e5"), (START, "0000"), (START, "Nf3"), (FOOLS_MATE, "e1f2"),
                                     (castle, "e1g1"), (castle, "e1h1")])
    assert evals[0] == 999.99
    assert -1.0 < evals[1] < 1.5  # exd5, the normal move
    assert evals[2] < -5          # Qg4?? Bxg4 wins the queen
    assert evals[3:7] == [None, None, None, None]
    assert evals[7] == evals[8] is not None  # king-takes-rook castling is the same move


@pytest.mark.stockfish
def test_bad_input_is_refused(tmp_path):
    not_sqlite = tmp_path / "cache.sqlite"
    not_sqlite.write_text("these are not the bytes of a database " * 100)
    with pytest.raises(UserError, match="not a usable SQLite file"):
        StockfishPool(processes=1, cache_path=not_sqlite)
    with StockfishPool(processes=1) as pool:
        with pytest.raises(InvalidPromptError, match="FEN"):
            pool.analyse([START, "not a fen"])
        with pytest.raises(InvalidPromptError, match="FEN"):
            pool.evaluate_moves([("8/8/8/8/8/8/8/8 w - - 0 1", "e2e4")])
        with pytest.raises(UserError, match="multipv"):
            pool.analyse([START], multipv=0)
    with pytest.raises(UserError, match="processes"):
        StockfishPool(processes=0)


# --- caches ------------------------------------------------------------------------------------

def stop_engines(pool: StockfishPool) -> None:
    """Freeze every engine: from now on, any search would time out and restart an engine."""
    for pid in pool.pids:
        os.kill(pid, signal.SIGSTOP)


@pytest.mark.stockfish
def test_memory_cache_is_lru_and_keyed_by_limit_and_multipv(real_fens):
    with StockfishPool(processes=1, timeout=1.0, cache_size=2) as pool:
        first = pool.analyse(real_fens[:2], FAST)
        stop_engines(pool)
        assert pool.analyse(real_fens[:2], FAST) == first and pool.restarts == 0
        assert len(pool.analyse(real_fens[:1], FAST, multipv=2)[0].moves) == 2  # a new search
        assert pool.restarts == 1
        stop_engines(pool)
        assert pool.analyse(real_fens[1:2], FAST) == first[1:] and pool.restarts == 1
        assert pool.analyse(real_fens[:1], FAST) == first[:1]  # evicted by the multipv=2 entry: searched again
        assert pool.restarts == 2


@pytest.mark.stockfish
def test_disk_cache_is_read_back(tmp_path, real_fens):
    path = tmp_path / "cache" / "stockfish.sqlite"
    with StockfishPool(processes=2, cache_path=path) as pool:
        first = pool.analyse(real_fens[:3], FAST)
        pool.evaluate_moves([(START, "e2e4")], FAST)
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM results").fetchone() == (4,)
        # Mark one row, to see that a new pool answers from the file rather than from an engine.
        db.execute("""UPDATE results SET value='{"moves": ["a1a1"], "evals": [1.23]}' WHERE fen=?""",
                   (real_fens[0],))
    with StockfishPool(processes=1, cache_path=path) as pool:
        again = pool.analyse(real_fens[:3], FAST)
        assert pool.evaluate_moves([(START, "e2e4")], FAST) != [None]
    assert (again[0].moves, again[0].evals) == (("a1a1",), (1.23,))
    assert again[1:] == first[1:]


@pytest.mark.stockfish
def test_node_limited_lines_are_ranked_best_first_fresh_and_cached(tmp_path, real_fens):
    """Under a node limit Stockfish lists some positions' multipv lines out of eval order; the analysis ranks
    them (a stable sort), fresh or read back from the cache, which keeps the lines as the engine gave them.
    Depth-limited lines come ranked and stay exactly as the engine gave them."""
    path = tmp_path / "stockfish.sqlite"
    nodes = Limit(nodes=2000)
    with StockfishPool(processes=1, cache_path=path) as pool:
        fresh = pool.analyse(real_fens, nodes) + pool.analyse(real_fens, FAST)
    with sqlite3.connect(path) as db:
        engine_lines = {(fen, search): json.loads(value)
                        for fen, search, value in db.execute("SELECT fen, search, value FROM results")}
    out_of_order = []
    for index, analysis in enumerate(fresh):
        lines = engine_lines[analysis.fen, analysis.limit]
        engine_order = list(zip(lines["moves"], lines["evals"]))
        assert list(zip(analysis.moves, analysis.evals)) == sorted(engine_order, key=lambda line: -line[1])
        if engine_order != list(zip(analysis.moves, analysis.evals)):
            out_of_order.append((analysis.limit, index))
    # Stockfish 15.1 here: 3 of the 10 positions; the depth-limited lines never
    assert out_of_order and {limit for limit, _ in out_of_order} == {"nodes=2000"}
    assert all(list(a.evals) == sorted(a.evals, reverse=True) for a in fresh)
    with StockfishPool(processes=1, cache_path=path) as pool:
        assert pool.analyse(real_fens, nodes) == fresh[:len(real_fens)]  # from the file, ranked the same way


@pytest.mark.stockfish
def test_disk_cache_shared_by_concurrent_pools(tmp_path, real_fens):
    path = tmp_path / "shared.sqlite"
    results = {}

    def work(name, fens):
        with StockfishPool(processes=1, cache_path=path) as pool:
            results[name] = pool.analyse(fens, Limit(depth=5))

    threads = [threading.Thread(target=work, args=(i, real_fens[i::2])) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results[0]) + len(results[1]) == len(real_fens)
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM results").fetchone() == (len(set(real_fens)),)


def test_a_new_cache_file_opened_by_many_at_once_is_set_up_once(tmp_path):
    # SQLite answers "database is locked" at once (no busy wait) to some of several connections switching a
    # new file to WAL together; before the retry this failed in about 1 of 8 rounds
    from rookworld.stockfish import _Cache

    def open_cache(path, barrier, errors):
        barrier.wait()
        try:
            _Cache(10, path).close()
        except Exception as error:  # noqa: BLE001 - collected for the assertion below
            errors.append(error)

    for round_ in range(30):
        path = tmp_path / f"cache-{round_}.sqlite"
        barrier, errors = threading.Barrier(6), []
        threads = [threading.Thread(target=open_cache, args=(path, barrier, errors)) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        with sqlite3.connect(path) as db:
            assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


# --- failures ----------------------------------------------------------------------------------

def run_in_background(pool, fens, limit):
    out = {}
    thread = threading.Thread(target=lambda: out.update(result=pool.analyse(fens, limit)))
    thread.start()
    return thread, out


@pytest.mark.stockfish
def test_a_killed_engine_is_restarted_and_the_batch_completes(real_fens):
    limit = Limit(depth=9)
    with StockfishPool(processes=2, cache_size=0) as pool:
        started = time.perf_counter()
        clean = pool.analyse(real_fens, limit)
        duration = time.perf_counter() - started
        victim = pool.pids[0]
        thread, out = run_in_background(pool, real_fens, limit)
        time.sleep(duration / 3)
        assert thread.is_alive(), "the batch ended before the kill"
        os.kill(victim, signal.SIGKILL)
        thread.join()
        assert out["result"] == clean
        assert pool.restarts == 1 and victim not in pool.pids


@pytest.mark.stockfish
def test_a_hung_engine_is_killed_after_the_timeout(real_fens):
    limit = Limit(depth=8)
    with StockfishPool(processes=2, cache_size=0, timeout=2.0) as pool:
        clean = pool.analyse(real_fens[:6], limit)
        victim = pool.pids[1]
        thread, out = run_in_background(pool, real_fens[:6], limit)
        os.kill(victim, signal.SIGSTOP)
        thread.join()
        assert out["result"] == clean
        assert pool.restarts == 1 and victim not in pool.pids


@pytest.mark.stockfish
def test_a_search_that_always_times_out_gives_up_with_a_clear_error():
    with StockfishPool(processes=1, timeout=0.3) as pool:
        with pytest.raises(StockfishError, match="failed 3 times.*longer than 0.3 s"):
            pool.analyse([START], Limit(depth=60))
        assert pool.restarts == 2
        assert pool.analyse([MATE_IN_ONE], FAST)[0].best == "a1a8"  # the pool still works


@pytest.mark.stockfish
def test_close_ends_the_processes():
    pool = StockfishPool(processes=2)
    pids = pool.pids
    pool.close()
    pool.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{pid}") for pid in pids):
        time.sleep(0.05)
    assert not any(os.path.exists(f"/proc/{pid}") for pid in pids)
