"""LocalHFBackend against a forward pass computed by hand on the tiny model."""

import numpy as np
import pytest
import torch

from mia_ray.backends import LoglikRequest, choice_logprobs
from mia_ray.backends.local import LocalHFBackend
from mia_ray.errors import MiaError


def _reference(backend, ids: list[int], n: int) -> list[float]:
    """Log-probs of the last ``n`` of ``ids`` from one unpadded forward pass."""
    with torch.inference_mode():
        logits = backend.model(input_ids=torch.tensor([ids])).logits[0]
    logp = torch.log_softmax(logits.float(), dim=-1)
    return [float(logp[i - 1, ids[i]]) for i in range(len(ids) - n, len(ids))]


def _ids(backend, text: str) -> list[int]:
    return backend.tokenizer(text, add_special_tokens=False)["input_ids"]


def test_logprobs_match_a_forward_pass_by_hand(local):
    bos = local.tokenizer.eos_token_id
    reqs = [
        LoglikRequest("The k", "ing said unto them"),  # boundary between two tokens of a word
        LoglikRequest("To be or no", "t to be"),  # " not" merges across the boundary
        LoglikRequest("", "Hello world"),  # scored from BOS
        LoglikRequest("Answer:", " 0"),
        LoglikRequest("To be, or not to be, that is the question:", " whether"),
    ]
    # Batches of 2 with rows of different lengths: padding must not change a number.
    results = local.loglikelihood(reqs)
    assert [r.tokens for r in results] == [
        ["ing", " said", " unt", "o", " them"],
        [" to", " be"],
        ["H", "ell", "o", " world"],
        [" 0"],
        [" whether"],
    ]
    expected = [
        _reference(local, _ids(local, "The king said unto them"), 5),
        _reference(local, _ids(local, "To be or not to be"), 2),
        _reference(local, [bos] + _ids(local, "Hello world"), 4),
        _reference(local, _ids(local, "Answer: 0"), 1),
        _reference(local, _ids(local, reqs[4].context + reqs[4].continuation), 1),
    ]
    for res, exp in zip(results, expected, strict=True):
        np.testing.assert_allclose(res.logprobs, exp, rtol=0, atol=1e-5)
    # Alone, each request gives the same numbers as in the batch (order is preserved).
    for req, res in zip(reqs, results, strict=True):
        np.testing.assert_allclose(local.loglikelihood([req])[0].logprobs, res.logprobs, atol=1e-5)


def test_a_shared_few_shot_prefix_runs_once_and_changes_no_number(local):
    from mia_ray.backends.local import SHARED_PREFIX_MIN, shared_prefix

    shots = "".join(f"Text: line {i} of the play\nAnswer: {i % 2}\n\n" for i in range(6))
    queries = ["To be or not to be", "The king", "Exit, pursued by a bear and three more"]
    reqs = [LoglikRequest(f"{shots}Text: {q}\nAnswer:", o) for q in queries for o in (" 1", " 0")]
    encoded = local.encode(reqs)
    shared = shared_prefix([e[0] for e in encoded], [e[1] for e in encoded])
    assert shared >= SHARED_PREFIX_MIN  # so loglikelihood takes the cached-prefix path
    assert shared == len(_ids(local, shots + "Text:"))  # the rows part at the query
    got = local.loglikelihood(reqs)
    for req, res, (ids, n) in zip(reqs, got, encoded, strict=True):
        assert res.tokens == [req.continuation]
        np.testing.assert_allclose(res.logprobs, _reference(local, ids, n), rtol=0, atol=1e-4)
    # A row whose context ends where the prefix would: the prefix stops one token short.
    assert shared_prefix([[1, 2, 3, 4], [1, 2, 3, 5]], [1, 1]) == 2
    assert shared_prefix([[1, 2, 3, 4], [1, 2, 9, 4, 5]], [1, 2]) == 2


def test_greedy_flag(local):
    ctx = "To be or not to be"
    ids = _ids(local, ctx)
    with torch.inference_mode():
        out = local.model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=2,  # more would be "\n\n", which BPE re-merges
        )[0, len(ids) :].tolist()
    greedy_text = local.tokenizer.decode(out)
    assert _ids(local, ctx + greedy_text)[len(ids) :] == out  # re-tokenises to the same ids
    res = local.loglikelihood([LoglikRequest(ctx, greedy_text), LoglikRequest(ctx, " the king")])
    assert res[0].greedy is True
    assert res[1].greedy is False
    # Only the first token of the greedy text, then a token the model did not pick.
    first = local.tokenizer.decode(out[:1])
    assert local.loglikelihood([LoglikRequest(ctx, first + " zebra")])[0].greedy is False


def test_choice_logprobs_sums_each_option(local):
    got = choice_logprobs(local, "Answer:", [" 0", " 1", " yes please"])
    parts = local.loglikelihood([LoglikRequest("Answer:", o) for o in [" 0", " 1", " yes please"]])
    np.testing.assert_allclose(got, [sum(p.logprobs) for p in parts], atol=1e-9)
    assert got.shape == (3,)
    # " 0" and " 1" are one token each after the same context: read from one row, they equal
    # the forward pass by hand; " yes please" runs a row of its own.
    ids = _ids(local, "Answer:")
    for opt, lp in zip([" 0", " 1"], got[:2], strict=True):
        assert lp == pytest.approx(_reference(local, ids + _ids(local, opt), 1)[0], abs=1e-5)
    assert got[2] == pytest.approx(
        sum(_reference(local, _ids(local, "Answer: yes please"), 2)), abs=1e-5
    )
    # Also with a shared few-shot prefix, and with the greedy flag of each answer.
    shots = "".join(f"Text: line {i} of the play\nAnswer: {i % 2}\n\n" for i in range(6))
    reqs = [
        LoglikRequest(f"{shots}Text: {q}\nAnswer:", o) for q in ("a", "bb") for o in (" 0", " 1")
    ]
    res = local.loglikelihood(reqs)
    for req, r in zip(reqs, res, strict=True):
        full = _ids(local, req.context + req.continuation)
        assert r.logprobs == pytest.approx(_reference(local, full, 1), abs=1e-4)
        with torch.inference_mode():
            best = int(local.model(input_ids=torch.tensor([full[:-1]])).logits[0, -1].argmax())
        assert r.greedy == (best == full[-1])


def test_long_context_is_cropped_from_the_left(tiny, local):
    assert local.max_length == 128  # the tiny model's n_positions
    short = LocalHFBackend(tiny, device="cpu", max_length=8)
    ctx = "To be, or not to be, that is the question: whether"
    ids = _ids(local, ctx + " the king")
    res = short.loglikelihood([LoglikRequest(ctx, " the king")])[0]
    assert res.tokens == [" the", " k", "ing"]
    np.testing.assert_allclose(res.logprobs, _reference(local, ids[-8:], 3), atol=1e-5)
    with pytest.raises(MiaError) as e:
        short.loglikelihood([LoglikRequest("Hi", " the king said unto them all")])
    assert str(e.value) == (
        "continuation ' the king said unto them all' is 8 tokens; with one context token it "
        "exceeds the model's maximum length 8"
    )
    assert LocalHFBackend(tiny, device="cpu", max_length=10_000).max_length == 128


def test_a_continuation_merged_into_the_context_is_an_error(local):
    with pytest.raises(MiaError) as e:
        local.loglikelihood([LoglikRequest("To b", "e")])
    assert str(e.value) == (
        "continuation 'e' has no token of its own after context ending 'To b': the tokenizer "
        "merges it into the context's last token; end the context at a word boundary"
    )
    assert local.loglikelihood([]) == []


def test_samples_follow_the_rule_and_do_not_depend_on_their_batch(
    local, monkeypatch, sample_by_hand
):
    from mia_ray import backends
    from mia_ray.backends import SampleRequest

    prompts = ["The old man walked slowly along the river bank and", "To be, or not",
               "She opened the letter, read it twice, then", "Exit"]  # fmt: skip
    reqs = [SampleRequest(p, 2 + i, 6 + 3 * i, 1000 + i) for i, p in enumerate(prompts)]
    together = local.sample(reqs, 1.0, 50)
    assert [len(t) for t in together] == [2, 3, 4, 5]
    for r, got in zip(reqs, together, strict=True):
        hand = sample_by_hand(local.model, local.tokenizer, r.prompt, r.n, r.max_tokens, r.seed, 50)
        assert got == hand
        assert local.sample([r], 1.0, 50)[0] == got  # alone
    # In another order, and with groups cut small (a request's rows stay together).
    monkeypatch.setattr(backends.local, "SAMPLE_ROWS", 4)
    assert local.sample(reqs[::-1], 1.0, 50)[::-1] == together
    # A prompt filling the window but for its 2 tokens, beside one that samples 40 tokens: the
    # first stays within the model's positions while the second goes on.
    long = SampleRequest("To be, or not to be, that is the question. " * 200, 2, 2, 3)
    both = local.sample([long, SampleRequest("Exit", 2, 40, 4)], 1.0, 50)
    assert both[0] == local.sample([long], 1.0, 50)[0]
    # Another seed, other texts.
    other = local.sample([SampleRequest(prompts[0], 2, 6, 7)], 1.0, 50)[0]
    assert other != together[0]


def test_sampled_first_tokens_follow_the_models_distribution(local):
    """2,000 one-token samples: each of the 5 likeliest tokens' frequency within 4 standard
    errors of the model's probability; with top_k=3 no other token is ever drawn."""
    from mia_ray.backends import SampleRequest

    prompt = "The king said unto them"
    with torch.inference_mode():
        logits = local.model(input_ids=torch.tensor([_ids(local, prompt)])).logits[0, -1]
    probs = torch.softmax(logits.float(), dim=-1).numpy()
    got = local.sample([SampleRequest(prompt, 2000, 1, 5)], 1.0, 0)[0]
    top = np.argsort(-probs)[:5]
    for t in top:
        text = local.tokenizer.decode([int(t)])
        freq = np.mean([g == text for g in got])
        se = np.sqrt(probs[t] * (1 - probs[t]) / len(got))
        assert abs(freq - probs[t]) < 4 * se + 1e-9, (text, freq, probs[t])
    allowed = {local.tokenizer.decode([int(t)]) for t in np.argsort(-probs)[:3]}
    assert set(local.sample([SampleRequest(prompt, 500, 1, 6)], 1.0, 3)[0]) <= allowed
