"""CopyCheck's answer prompt: one answer token each for 0 and 1, padding that changes nothing."""

import pytest
import torch

from mia_ray.errors import MiaError
from mia_ray.models.prompt import PromptEncoder, answer_logits


@pytest.fixture(scope="module")
def tiny(test_world):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = test_world["model"]
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def test_answer_tokens_are_the_last_token_of_the_answer(tiny):
    _, tok = tiny
    enc = PromptEncoder(tok, "Q: {text}\nA:", max_length=64)
    for digit, token in zip("01", enc.answer_ids, strict=True):
        full = tok.encode("Q: hi\nA: " + digit, add_special_tokens=False)
        assert full[-1] == token
        assert enc.encode(["hi"])[0] == full[:-1]


def test_snippet_is_cropped_never_the_instruction(tiny):
    _, tok = tiny
    enc = PromptEncoder(tok, "Question {text} Answer:", max_length=40)
    (ids,) = enc.encode(["word " * 200])
    assert len(ids) == 40
    assert ids[: len(enc.head)] == enc.head and ids[-len(enc.tail) :] == enc.tail


def test_left_padding_gives_the_same_logits_as_no_padding(tiny):
    model, tok = tiny
    enc = PromptEncoder(tok, max_length=128)
    seqs = enc.encode(["a short one", "a much longer snippet of text " * 5])
    with torch.no_grad():
        both = answer_logits(model, enc.collate(seqs), enc.answer_ids)
        alone = answer_logits(model, enc.collate(seqs[:1]), enc.answer_ids)
    assert both.shape == (2, 2)
    torch.testing.assert_close(both[0], alone[0], rtol=1e-4, atol=1e-4)


def test_bad_templates_fail_clearly(tiny):
    _, tok = tiny
    with pytest.raises(MiaError, match=r"contain \{text\} exactly once"):
        PromptEncoder(tok, "no placeholder")
    with pytest.raises(MiaError, match="leaves .* tokens for the snippet"):
        PromptEncoder(tok, "{text} " + "long instruction " * 30, max_length=32)
