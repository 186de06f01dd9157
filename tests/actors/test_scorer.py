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
