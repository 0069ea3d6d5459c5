"""Move readouts on the P positions of the embedded set's eval split (with --split train, its training side, the
positions GRPO trains on): the greedy `B:` move, the vote of K sampled `B:` moves, the first-candidate
readout (readout.py), and two references: a uniformly random legal move and Stockfish at skill 0.

Each move is judged as `rookworld eval` judges `B:` moves: best-move (the label's rank-1 move), top-5 (among the
label's five), legal, ACPL (pawns, an illegal or missing move at the 10-pawn cap) and expected-score loss, each
± one SE clustered by game. Truth: the split's depth-10 labels; moves outside them are searched at depth 10
(cached in --cache). Every model after the first also gets each readout's change from the first model's,
paired by position (NAME/delta ± NAME/delta/se, clustered by game).

    python experiments/readout.py --model src/rookworld/assets/model --out runs/readout/base.json \
        [--limit N] [--votes 8] [--references] [--cache runs/sf.sqlite] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import chess

from rookworld.arbiter import legal_move
from rookworld.data.sources import load_source
from rookworld.data.splits import sample_game
from rookworld.metrics import DELTA_SUFFIX, SE_SUFFIX, flatten, paired_delta, summarize
from rookworld.player import ModelPlayer
from rookworld.quality import judge_moves
from rookworld.readout import best_first_candidate, first_candidate_scores
from rookworld.stockfish import SkillEngine, StockfishPool
from rookworld.text import parse_p_completion

BATCH = 64


def judged(pool, samples, moves: list[str | None]) -> list[dict[str, list[float]]]:
    """The metrics of one move per sample (None: illegal or missing), one dict per sample."""
    qualities = judge_moves(pool, [(s.fen, m) for s, m in zip(samples, moves)], analyses=[s.analysis for s in samples])
    per_prompt = []
    for sample, move, quality in zip(samples, moves, qualities):
        ranked = list(sample.analysis.moves)
        per_prompt.append({"best_move": [float(move == ranked[0])], "top5": [float(move in ranked)],
                           "legal": [float(quality.legal)], "acpl": [quality.loss],
                           "expected_score_loss": [quality.score_loss]})
    return per_prompt


def model_moves(player: ModelPlayer, samples, votes: int) -> dict[str, list[str | None]]:
    """For each sample: the greedy B: move, the vote's B: move (votes > 1) and the first-candidate move."""
    boards = [chess.Board(s.fen) for s in samples]
    out: dict[str, list[str | None]] = {"greedy": [], "first": []}
    if votes > 1:
        out[f"vote{votes}"] = []
    for start in range(0, len(boards), BATCH):
        batch = boards[start:start + BATCH]
        player.votes = 1
        for board, completion in zip(batch, player.complete(batch)):
            move = legal_move(board, parse_p_completion(completion).best)
            out["greedy"].append(move.uci() if move else None)
        if votes > 1:
            player.votes = votes
            for board, completion in zip(batch, player.complete(batch)):
                move = legal_move(board, parse_p_completion(completion).best)
                out[f"vote{votes}"].append(move.uci() if move else None)
        for scores in first_candidate_scores(player.model, player.tokenizer, batch):
            out["first"].append(best_first_candidate(scores).uci())
        print(f"  {min(start + BATCH, len(boards))}/{len(boards)} positions", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", default=[], help="checkpoint directory (repeatable)")
    parser.add_argument("--out", required=True, help="JSON file of the results")
    parser.add_argument("--split", choices=("eval", "train"), default="eval",
                        help="the embedded set's side: eval (held out) or train (GRPO's P prompts)")
    parser.add_argument("--limit", type=int, default=None, help="the first N P positions of the split")
    parser.add_argument("--votes", type=int, default=1, help="also the vote of K samples (K > 1)")
    parser.add_argument("--references", action="store_true", help="also a random legal move and Stockfish skill 0")
    parser.add_argument("--cache", default=None, help="SQLite cache of Stockfish results")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    samples = [s for s in load_source("embedded", args.split).samples if s.task == "P"][:args.limit]
    print(f"{len(samples)} P positions of the embedded {args.split} split", flush=True)
    games = [sample_game(s) for s in samples]

    def summary(values: list[dict[str, list[float]]]) -> dict[str, float]:
        return flatten(summarize(values, games))

    results: dict[str, dict[str, float]] = {}
    first_model: dict[str, list[dict[str, list[float]]]] = {}
    with StockfishPool(processes=args.threads, cache_path=args.cache) as pool:
        for name in args.model:
            player = ModelPlayer.load(name, threads=args.threads, seed=args.seed)
            print(f"{name}:", flush=True)
            for readout, moves in model_moves(player, samples, args.votes).items():
                values = judged(pool, samples, moves)
                results[f"{name} | {readout}"] = summary(values)
                if readout in first_model:
                    results[f"{name} | {readout}"].update(paired_delta(values, first_model[readout], games))
                first_model.setdefault(readout, values)
        if args.references:
            rng = random.Random(f"{args.seed}/random")
            results["random legal move"] = summary(judged(pool, samples, [
                rng.choice(list(chess.Board(s.fen).legal_moves)).uci() for s in samples]))
            with SkillEngine(0) as engine:
                results["Stockfish skill 0"] = summary(judged(pool, samples, [
                    engine.play(chess.Board(s.fen)).uci() for s in samples]))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    metrics = ("best_move", "top5", "legal", "acpl", "expected_score_loss")
    for name, values in results.items():
        print(f"{name:60s} " + "  ".join(f"{k} {values[k]:.3f} ± {values[k + SE_SUFFIX]:.3f}" for k in metrics))
        if metrics[0] + DELTA_SUFFIX in values:
            print(f"{'  paired with the first --model':60s} " + "  ".join(
                f"Δ{k} {values[k + DELTA_SUFFIX]:+.3f} ± {values[k + DELTA_SUFFIX + SE_SUFFIX]:.3f}" for k in metrics))


if __name__ == "__main__":
    main()
