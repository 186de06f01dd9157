"""MemHunter's (x, y) pairs and their document-grouped splits, with a real BPE tokenizer."""

import pandas as pd
import pytest

from mia_ray.data.pairs import make_pairs, split_pairs
from mia_ray.errors import MiaError


@pytest.fixture(scope="module")
def tok():
    from mia_ray.demo.world import gpt2_bpe_tokenizer

    return gpt2_bpe_tokenizer(4000)


def _doc(n_words: int, tag: str) -> str:
    return " ".join(f"{tag}{i}" for i in range(n_words))


def test_pairs_are_consecutive_windows_of_the_document(tok):
    text = _doc(200, "w")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    pairs = make_pairs([("d1", text)], tok, prefix_tokens=8, target_tokens=5, per_doc=3)
    assert pairs["pair_id"].tolist() == ["d1#0", "d1#1", "d1#2"]
    for k, row in pairs.iterrows():
        assert row["x_ids"] == ids[13 * k : 13 * k + 8]
        assert row["y_ids"] == ids[13 * k + 8 : 13 * k + 13]
        assert row["x"] == tok.decode(row["x_ids"]) and row["y"] == tok.decode(row["y_ids"])


def test_short_documents_give_fewer_or_no_pairs(tok):
    short, mid = "a b c", _doc(12, "z")
    n_mid = len(tok(mid, add_special_tokens=False)["input_ids"])
    pairs = make_pairs([("s", short), ("m", mid)], tok, prefix_tokens=4, target_tokens=4, per_doc=5)
    assert set(pairs["doc_id"]) == {"m"} and len(pairs) == n_mid // 8
    with pytest.raises(MiaError, match="no document has 64 tokens"):
        make_pairs([("s", short)], tok, prefix_tokens=32, target_tokens=32)
    with pytest.raises(MiaError, match="must be at least 1"):
        make_pairs([("m", mid)], tok, prefix_tokens=0)


def test_splits_keep_each_document_on_one_side_and_are_seeded(tok):
    docs = [(f"d{i:02d}", _doc(60, f"t{i}")) for i in range(20)]
    pairs = make_pairs(docs, tok, prefix_tokens=8, target_tokens=8, per_doc=2)
    a = split_pairs(pairs, seed=0)
    assert a.groupby("doc_id")["split"].nunique().max() == 1
    per_doc = a.drop_duplicates("doc_id")["split"].value_counts().to_dict()
    assert per_doc == {"train": 12, "test": 4, "val": 4}
    pd.testing.assert_frame_equal(a, split_pairs(pairs, seed=0))
    assert not a["split"].equals(split_pairs(pairs, seed=1)["split"])


def test_split_errors(tok):
    pairs = make_pairs([("a", _doc(40, "a")), ("b", _doc(40, "b"))], tok, 4, 4)
    with pytest.raises(MiaError, match="2 documents cannot fill train, test and val"):
        split_pairs(pairs)
    with pytest.raises(MiaError, match="three positive shares summing to 1"):
        split_pairs(pairs, fractions=(0.5, 0.5, 0.5))
