"""The Scorer actor pool under Ray Data: ids survive, one pass gives what every attack needs."""

import numpy as np
import pandas as pd
import pytest

from mia_ray.features.attacks import vocab_moments_np

pytestmark = pytest.mark.ray


def test_scorer_pool_matches_a_direct_forward_pass(ray_local, test_world):
    import torch

    from mia_ray.actors.scorer import Scorer
    from mia_ray.models.hf import load_causal_lm

    ray = ray_local
    texts = [
        f"Snippet {i}: To be, or not to be, that is the Question {i} of the day." for i in range(10)
    ]
    texts[3] = "A much longer snippet " + "with many repeated words " * 12
    df = pd.DataFrame({"snippet_id": [f"d{i}#0" for i in range(10)], "text": texts})
    out = (
        ray.data.from_pandas(df)
        .map_batches(
            Scorer,
            fn_constructor_kwargs={
                "model": str(test_world["model"]),
                "device": "cpu",
                "torch_threads": 1,
            },
            batch_size=4,
            batch_format="pandas",
            compute=ray.data.ActorPoolStrategy(size=2),
            num_cpus=0.5,
        )
        .to_pandas()
        .set_index("snippet_id")
    )
    assert sorted(out.index) == sorted(df["snippet_id"])  # every id once, whatever the order

    model, tok, _ = load_causal_lm(str(test_world["model"]), "cpu", "float32")
    for sid, text in zip(df["snippet_id"], texts, strict=True):
        ids = tok(text, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            logits = model(ids).logits[0, :-1].double().numpy()
        logp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
        tok_lp = logp[np.arange(len(logp)), ids[0, 1:].numpy()]
        mu, sigma = vocab_moments_np(logits)
        row = out.loc[sid]
        assert row["n_tokens"] == ids.shape[1]
        np.testing.assert_allclose(row["token_logprobs"], tok_lp, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(row["mu"], mu, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(row["sigma"], sigma, rtol=1e-4, atol=1e-4)
        assert row["loss"] == pytest.approx(-tok_lp.mean(), abs=1e-4)
        low = tok(text.lower(), return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            low_loss = float(model(low, labels=low).loss)
        assert row["lower_loss"] == pytest.approx(low_loss, abs=1e-4)


def test_reference_role_emits_only_prefixed_losses(ray_local, test_world):
    from mia_ray.actors.scorer import Scorer

    scorer = Scorer(
        str(test_world["reference"]),
        device="cpu",
        lowercase=False,
        token_stats=False,
        prefix="ref_",
    )
    res = scorer(
        pd.DataFrame(
            {"snippet_id": ["a", "b"], "text": ["Hello there friend.", "Good night, sweet prince."]}
        )
    )
    assert list(res.columns) == ["snippet_id", "ref_loss", "ref_n_tokens"]
    assert (res["ref_loss"] > 0).all()


def test_a_snippets_score_does_not_depend_on_its_batch(test_world):
    """A tokenizer that pads on the left (many Llama-family ones do) must not shift the
    absolute positions of a short snippet batched with a long one."""
    from mia_ray.actors.scorer import Scorer

    scorer = Scorer(str(test_world["model"]), device="cpu", dtype="float32", torch_threads=1)
    scorer.tok.padding_side = "left"
    short = "To be, or not to be, that is the question."
    long = "A much longer snippet " + "with many repeated words " * 12
    alone = scorer._pass([short], True)[0]
    batched = scorer._pass([short, long], True)[0]
    assert batched["n_tokens"] == alone["n_tokens"]
    np.testing.assert_allclose(batched["token_logprobs"], alone["token_logprobs"], atol=1e-5)
    np.testing.assert_allclose(batched["mu"], alone["mu"], atol=1e-5)
    assert batched["loss"] == pytest.approx(alone["loss"], abs=1e-5)


def test_a_prefix_read_once_scores_as_each_snippet_read_after_it_whole(test_world):
    """ReCaLL's pass: rows that fit the whole context run on from its cache, computed once;
    each row's NLL must equal the same tokens read from the start in one plain forward pass
    (written here from the definition), whichever path the row took, with or without a
    leading special token."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mia_ray.actors.scorer import Scorer

    path = str(test_world["model"])
    context = "Enter the ghost, and then the king, and all the lords of Denmark. " * 3
    scorer = Scorer(path, device="cpu", dtype="float32", torch_threads=1, context=context)
    eos = scorer.tok.eos_token
    texts = ["To be, or not to be, that is the question.",
             eos + "Whether 'tis nobler in the mind to suffer",
             "A much longer snippet " + "with many repeated words " * 60,  # fills the window
             "A middling snippet " + "of some words " * 30,  # leaves room for part of it
             "The slings and arrows of outrageous fortune"]  # fmt: skip
    got = scorer._conditioned(texts)

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    window = model.config.n_positions
    ctx = tok(context, add_special_tokens=False)["input_ids"]
    for text, row in zip(texts, got, strict=True):
        own = tok(text)["input_ids"][:window]  # the Scorer crops to the window
        lead = 1 if own[0] == tok.eos_token_id else 0
        room = max(0, window - len(own))
        ids = own[:lead] + ctx[max(0, len(ctx) - room) :] + own[lead:]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].double()
        lp = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
        want = -float(lp[len(ids) - len(own) :].mean())
        assert row["loss"] == pytest.approx(want, abs=1e-5), text[:20]
        assert row["n_tokens"] == len(own) and row["context_tokens"] == min(room, len(ctx))
    assert [r["context_tokens"] for r in got][:2] == [len(ctx)] * 2 and got[4][
        "context_tokens"
    ] == len(ctx)
    assert got[2]["context_tokens"] == 0 and 0 < got[3]["context_tokens"] < len(ctx)
    # Both leads (none, and the EOS the second text starts with) were read once, and cached.
    assert set(scorer._prefixes) == {(), (tok.eos_token_id,)}
    assert all(v is not None for v in scorer._prefixes.values())


def test_vocab_moments_give_no_nan_for_a_ruled_out_token():
    import torch

    from mia_ray.actors.scorer import vocab_moments

    # p = (1/2, 1/2, 0): the third token's logit is -inf (a masked or banned token).
    logp = torch.log_softmax(torch.tensor([[0.0, 0.0, -float("inf")]]), dim=-1)
    mu, sigma = vocab_moments(logp)
    assert mu.item() == pytest.approx(np.log(0.5))
    assert sigma.item() == pytest.approx(0.0, abs=1e-7)
    # In every float type the scorer may run in.
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        mu, sigma = vocab_moments(logp.to(dtype))
        assert torch.isfinite(mu).all() and torch.isfinite(sigma).all(), dtype
    # And a row with three live tokens: mu = sum p log p, sigma^2 = sum p (log p)^2 - mu^2.
    p = np.array([0.5, 0.25, 0.25])
    mu, sigma = vocab_moments(torch.tensor(np.log(p))[None])
    assert mu.item() == pytest.approx(float((p * np.log(p)).sum()))
    assert sigma.item() == pytest.approx(
        float(np.sqrt((p * np.log(p) ** 2).sum() - (p * np.log(p)).sum() ** 2))
    )


def _row_by_row(logits, ids, mask):
    """Each row alone, at its real positions (the definition row_stats must keep)."""
    import torch

    from mia_ray.actors.scorer import vocab_moments

    rows = []
    for i in range(ids.shape[0]):
        pos = mask[i].nonzero().squeeze(-1)
        logp = torch.log_softmax(logits[i, pos[:-1]].float(), dim=-1)
        lp = logp.gather(-1, ids[i, pos[1:], None]).squeeze(-1)
        mu, sigma = vocab_moments(logp)
        rows.append((float(-lp.mean()), len(pos), lp.numpy(), mu.numpy(), sigma.numpy()))
    return rows


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_row_stats_keeps_each_rows_numbers_bit_for_bit(side, dtype):
    import torch

    from mia_ray.actors.scorer import row_stats

    g = torch.Generator().manual_seed(0)
    n = [7, 3, 5, 7]
    B, T, V = len(n), max(n), 50
    mask = torch.zeros(B, T, dtype=torch.long)
    for i, k in enumerate(n):
        mask[i, :k] = 1
    if side == "left":
        mask = mask.flip(1)
    ids = torch.randint(0, V, (B, T), generator=g) * mask
    logits = (3 * torch.randn(B, T, V, generator=g)).to(getattr(torch, dtype))
    got = row_stats(logits, ids, mask, ["x"] * B, True)
    for row, (loss, k, lp, mu, sigma) in zip(got, _row_by_row(logits, ids, mask), strict=True):
        assert row["loss"] == loss and row["n_tokens"] == k
        for key, want in (("token_logprobs", lp), ("mu", mu), ("sigma", sigma)):
            assert row[key].dtype == np.float32 and row[key].shape == (k - 1,)
            np.testing.assert_array_equal(row[key], want)
    short = row_stats(logits, ids, mask, ["x"] * B, False)
    assert [r["loss"] for r in short] == [r["loss"] for r in got]
    assert all(set(r) == {"loss", "n_tokens"} for r in short)
    logprobs = row_stats(logits, ids, mask, ["x"] * B, True, moments=False)
    assert all(set(r) == {"loss", "n_tokens", "token_logprobs", "token_ids"} for r in logprobs)
    for a, b in zip(logprobs, got, strict=True):
        assert a["loss"] == b["loss"]
        np.testing.assert_array_equal(a["token_logprobs"], b["token_logprobs"])
        np.testing.assert_array_equal(a["token_ids"], b["token_ids"])


def test_row_stats_refuses_a_mask_with_gaps_and_a_one_token_row():
    import torch

    from mia_ray.actors.scorer import row_stats
    from mia_ray.errors import MiaError

    logits, ids = torch.zeros(1, 4, 5), torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(MiaError, match="the attention mask has gaps inside a row: pad on one"):
        row_stats(logits, ids, torch.tensor([[1, 0, 1, 1]]), ["x"], True)
    with pytest.raises(
        MiaError, match="a snippet has fewer than 2 tokens after tokenization: 'ab'"
    ):
        row_stats(logits, ids, torch.tensor([[0, 0, 0, 1]]), ["ab"], True)
