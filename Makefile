# make setup | make train | make test   (see README)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STOCKFISH_HINT := install Stockfish (Debian/Ubuntu: apt-get install stockfish; macOS: brew install stockfish) or set ROOKWORLD_STOCKFISH=/path/to/stockfish

.PHONY: setup train test lint stockfish embedded-model

setup: $(BIN)/.installed stockfish

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

stockfish:
	@if [ -n "$$ROOKWORLD_STOCKFISH" ] || command -v stockfish >/dev/null 2>&1 || [ -x /usr/games/stockfish ]; then \
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

test: setup
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q

lint: setup
	$(BIN)/ruff check .

# Retrains the embedded default model (src/rookworld/assets/model): the extra data (19 shards, seed 1; about
# 8 min on 12 cores), then the two SFT stages (about 11 min on one H100; hours on a CPU). This is how the shipped model
# was made (its data then labelled at depth 7); the retrain on a split by game is pending (docs/experiments.md).
embedded-model: setup
	$(BIN)/rookworld data generate --out runs/sft-data/gen --p-positions 19000 --a-samples 57000 --seed 1 --depth 7
	rm -rf runs/sft-data/embedded && cp -r src/rookworld/assets/data runs/sft-data/embedded
	$(BIN)/rookworld sft --config src/rookworld/assets/sft_stage1.toml
	$(BIN)/rookworld sft --config src/rookworld/assets/sft_stage2.toml
