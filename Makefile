# make setup | make train | make test   (see README)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STOCKFISH_HINT := install Stockfish (Debian/Ubuntu: apt-get install stockfish; macOS: brew install stockfish) or set ROOKWORLD_STOCKFISH=/path/to/stockfish

.PHONY: setup train test test-integration lint stockfish selfplay-data embedded-data embedded-model sft-data

setup: $(BIN)/.installed stockfish

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

stockfish:
	@if [ -n "$$ROOKWORLD_STOCKFISH" ]; then \
		[ -x "$$ROOKWORLD_STOCKFISH" ] || { echo "ROOKWORLD_STOCKFISH=$$ROOKWORLD_STOCKFISH is not an executable file: $(STOCKFISH_HINT)" >&2; exit 1; }; \
	elif command -v stockfish >/dev/null 2>&1 || [ -x /usr/games/stockfish ]; then \
		exit 0; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && apt-get install -y -qq stockfish; \
	elif command -v apt-get >/dev/null 2>&1 && command -v sudo >/dev/null 2>&1; then \
		sudo apt-get update -qq && sudo apt-get install -y -qq stockfish; \
	else \
		echo "Stockfish not found: $(STOCKFISH_HINT)" >&2; exit 1; \
	fi

train: setup
	HF_HUB_OFFLINE=1 $(BIN)/rookworld train --out runs/grpo-$$(date +%Y%m%d-%H%M%S)

# The fast tier (pytest's default: not `integration`, not `slow`); PYTEST_ARGS adds flags, e.g. --durations=25.
# Both tiers run on TEST_WORKERS pytest-xdist workers (default: one per core), each kept to its own cores.
# pytest's exit code 5 (no test selected) is no failure.
TEST_WORKERS ?= auto
test: setup
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) $(PYTEST_ARGS) || [ $$? -eq 5 ]

# The long end-to-end runs (games, sweeps, train runs beyond one per command). The `slow` tests (kills mid-save,
# full disks, the 124M-shape parity) run apart: `.venv/bin/python -m pytest -m slow`.
test-integration: setup
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m integration $(PYTEST_ARGS) || [ $$? -eq 5 ]

lint: setup
	$(BIN)/ruff check .

# The self-play games of seed 0 labelled at depth 10 (28,500 P positions, 95,000 A samples, less the 5% of game
# ids on the eval side): the embedded model's SFT games. Their A samples are the embedded set's; their P positions
# are SFT data. About 20 min on 2 cores; rerun to resume.
SELFPLAY := runs/embedded-data/selfplay
selfplay-data: setup
	$(BIN)/rookworld data generate --out $(SELFPLAY) --p-positions 28500 --a-samples 95000 --seed 0 --depth 10 --side train

# Remakes the embedded dataset (src/rookworld/assets/data), split by game. The eval side: fresh self-play games of
# seed 2, which the embedded model never saw. The training side, what `make train` learns from: the A samples of
# `selfplay-data`, and as P prompts 4,000 positions of 300 games the embedded model played against itself as a match
# plays it (both sides avoiding repetitions at 1 pawn, game seed 100), labelled at depth 10 best-first with every
# position in check kept (docs/results.md: why). About 45 min on 2 cores.
GAMES := runs/embedded-data/games.pgn
embedded-data: selfplay-data
	rm -rf src/rookworld/assets/data
	$(BIN)/rookworld data generate --out src/rookworld/assets/data/eval --p-positions 1500 --a-samples 5000 --seed 2 --depth 10 --side eval
	$(BIN)/rookworld data render --data $(SELFPLAY) --out src/rookworld/assets/data/train/arbiter --tasks A
	$(BIN)/rookworld play --model src/rookworld/assets/model --opponent model --avoid-repetition 1 --opponent-avoid-repetition 1 --games 300 --seed 100 --pgn $(GAMES)
	$(BIN)/rookworld data generate --pgn $(GAMES) --out src/rookworld/assets/data/train/games --p-positions 4000 --a-samples 0 --seed 100 --depth 10 --order best-first --p-keep-check 1 --side train

# Retrains the embedded default model (src/rookworld/assets/model): self-play games of seeds 0 and 1 labelled at
# depth 7 (none of the embedded eval side's seed-2 games; about 40 min on 2 cores, 8 on 12), two SFT stages on them,
# then 40,000 more positions of seed 1 labelled at depth 10 and a third stage on those and `selfplay-data`, then a
# fourth on the best-first data of `sft-data` (docs/models.md: the stages' times; days on a
# CPU). The seed-0 data of the first stages had no game ids when they were trained: SFT held out 5% of its positions
# instead of 5% of its games.
embedded-model: setup sft-data
	$(BIN)/rookworld data generate --out runs/sft-data/embedded --p-positions 30000 --a-samples 100000 --seed 0 --depth 7
	$(BIN)/rookworld data generate --out runs/sft-data/gen --p-positions 19000 --a-samples 57000 --seed 1 --depth 7
	$(BIN)/rookworld sft --config src/rookworld/assets/sft_stage1.toml
	$(BIN)/rookworld sft --config src/rookworld/assets/sft_stage2.toml
	$(BIN)/rookworld data generate --out runs/sft-data10/gen1 --p-positions 40000 --a-samples 40000 --seed 1 --depth 10
	mkdir -p runs/sft-data10/emb && cp $(SELFPLAY)/shard-*.jsonl.gz runs/sft-data10/emb/
	$(BIN)/rookworld sft --config src/rookworld/assets/sft_stage3.toml
	$(BIN)/rookworld sft --config src/rookworld/assets/sft_stage4.toml

# The SFT data for a best-first base: 520,000 P positions labelled at depth 10 (multipv 5, B: = the first M:) and
# 160,000 A samples from self-play of seeds 10-13 (none of them the embedded eval side's seed 2); seeds 11 and 13
# play weaker games, as the model's own games are (a random move 15% of the time, openings of up to 16 random
# plies), and keep every position in check. Then `selfplay-data`, re-rendered best-first. About
# 10 labels a second per core: 7 hours on 2 cores. Each command resumes where it stopped: rerun `make sft-data`.
SFT_DATA := runs/sft-data-bf
WEAKER := --random-move-rate 0.15 --max-opening-plies 16 --p-keep-check 1
sft-data: selfplay-data
	$(BIN)/rookworld data generate --out $(SFT_DATA)/s10 --p-positions 130000 --a-samples 40000 --seed 10 --depth 10 --order best-first
	$(BIN)/rookworld data generate --out $(SFT_DATA)/s11 --p-positions 130000 --a-samples 40000 --seed 11 --depth 10 --order best-first $(WEAKER)
	$(BIN)/rookworld data generate --out $(SFT_DATA)/s12 --p-positions 130000 --a-samples 40000 --seed 12 --depth 10 --order best-first
	$(BIN)/rookworld data generate --out $(SFT_DATA)/s13 --p-positions 130000 --a-samples 40000 --seed 13 --depth 10 --order best-first $(WEAKER)
	test -f $(SFT_DATA)/embedded/manifest.json || $(BIN)/rookworld data render --data $(SELFPLAY) --out $(SFT_DATA)/embedded --order best-first
