"""TargetLM: greedy continuations and the loss of y, checked against plain HF calls."""

import json
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def target(test_world):
    from mia_ray.actors.target import TargetLM

    return TargetLM(test_world["targets"]["tiny"]["model"], torch_threads=1)


@pytest.fixture(scope="module")
def pairs(test_world, target):
    from mia_ray.data.pairs import make_pairs

    docs = [json.loads(x) for x in Path(test_world["documents"]).read_text().splitlines()]
    manifest = json.loads(Path(test_world["targets"]["tiny"]["manifest"]).read_text())
    p = make_pairs([(d["id"], d["text"]) for d in docs], target.tok, 16, 16)
    p["label"] = p["doc_id"].map(manifest)
    return p


def test_batched_greedy_equals_one_at_a_time_and_hf_generate(target, pairs):
    import torch

    rows = pairs.head(4)
    ctx = target.contexts(["", "Once upon a time", "x", ""], list(rows["x_ids"]))
    together = target.generate(ctx, 8)
    for c, got in zip(ctx, together, strict=True):
        assert target.generate([c], 8)[0] == got
        ids = torch.tensor([c])
        ref = target.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=8,
            min_new_tokens=8,
            do_sample=False,
            pad_token_id=target.pad,
        )
        assert ref[0, len(c) :].tolist() == got


def test_loss_is_the_teacher_forced_mean_nll_of_y(target, pairs):
    import torch

    rows = pairs.head(3)
    ctx = target.contexts(["a prompt", "", "another one here"], list(rows["x_ids"]))
    got = target.loss(ctx, list(rows["y_ids"]))
    for c, y, g in zip(ctx, rows["y_ids"], got, strict=True):
        ids = torch.tensor([c + list(y)])
        with torch.inference_mode():
            logp = torch.log_softmax(target.model(ids).logits[0, :-1], -1)
        nll = -logp[len(c) - 1 :].gather(-1, ids[0, len(c) :, None]).mean().item()
        assert g == pytest.approx(nll, rel=1e-4)


def test_rows_carry_mu_and_loss_and_members_have_the_lower_loss(target, pairs):
    from mia_ray.features.lcss import lcss

    res = target(pairs.assign(prompt=""))
    assert (res["out_ids"].map(len) == 16).all() and np.isfinite(res["loss"]).all()
    for _, r in res.head(20).iterrows():
        assert r["mu"] == lcss(r["out_ids"], r["y_ids"]) / 16
    # The test world's tiny memorised its members' likelihoods (loss), though its greedy
    # continuations do not reproduce them verbatim (mu ~0.07 for members and non-members).
    mem = res.loc[res["label"] == 1, "loss"].mean()
    non = res.loc[res["label"] == 0, "loss"].mean()
    assert mem < non - 0.5, (mem, non)


def test_prompt_ids_are_the_context_as_given(target, pairs):
    rows = pairs.head(3)
    texts = ["a prompt", "", "another one here"]
    ids = [target.tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    by_text = target(rows.assign(prompt=texts))
    by_ids = target(rows.assign(prompt_ids=ids))
    assert list(by_text["mu"]) == list(by_ids["mu"])
    assert np.allclose(by_text["loss"], by_ids["loss"])


def test_gcg_step_never_raises_the_loss_and_swaps_at_most_one_allowed_token(target, pairs):
    row = pairs.iloc[0]
    x, y = list(row["x_ids"]), list(row["y_ids"])
    allowed = target.allowed_tokens()
    assert target.tok.eos_token_id not in set(allowed)
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.choice(allowed, 6)]
    start = target.loss([prompt + x], [y])[0]
    losses = [start]
    for _ in range(4):
        new, loss = target.gcg_step(prompt, x, y, 16, 12, rng, allowed)
        assert sum(a != b for a, b in zip(new, prompt, strict=True)) <= 1
        assert set(new) <= set(allowed.tolist())
        assert loss == pytest.approx(target.loss([new + x], [y])[0], rel=1e-5)
        losses.append(loss)
        prompt = new
    assert all(b <= a + 1e-6 for a, b in zip(losses, losses[1:], strict=False))
    assert losses[-1] < start  # four steps of 12 candidates find something better


def test_gcg_run_returns_each_budgets_snapshot_in_the_order_given(target, pairs):
    row = pairs.iloc[0]
    allowed = target.allowed_tokens()
    start = [int(t) for t in allowed[:4]]
    # Budgets out of order (a larger batch of trials can take less time than a smaller one).
    run = target.gcg_run(start, row["x_ids"], row["y_ids"], [0.6, 0.0, 0.3], 8, 4, seed=0)
    assert len(run["snapshots"]) == len(run["snapshot_steps"]) == 3
    at = run["snapshot_steps"]
    assert at[1] == 0 and at[1] <= at[2] <= at[0] == run["steps"]
    assert run["snapshots"][1] == start  # nothing has run at 0 s
    # The steps replay: the same seed passes through the same prompts, and each snapshot is
    # the prompt after as many steps as it says.
    rng = np.random.default_rng(0)
    seen = [start]
    for _ in range(run["steps"]):
        seen.append(target.gcg_step(seen[-1], row["x_ids"], row["y_ids"], 8, 4, rng, allowed)[0])
    assert [seen[n] for n in at] == run["snapshots"]


def _with_bos(src, dest):
    """A copy of the model at ``src`` whose tokenizer puts its BOS before every text, as a
    Llama-family tokenizer does."""
    import shutil

    from transformers import AutoTokenizer

    shutil.copytree(src, dest)
    AutoTokenizer.from_pretrained(dest, add_bos_token=True).save_pretrained(dest)
    return str(dest)


@pytest.fixture(scope="module")
def bos_target(test_world, tmp_path_factory):
    from mia_ray.actors.target import TargetLM

    path = _with_bos(test_world["targets"]["tiny"]["model"], tmp_path_factory.mktemp("b") / "m")
    return TargetLM(path, torch_threads=1)


def test_bos_prefix_is_what_the_tokenizer_puts_before_a_text(target, bos_target):
    from mia_ray.data.pairs import bos_prefix

    assert target.bos == bos_prefix(target.tok) == []  # GPT-2's tokenizer adds none
    bos = bos_target.tok.bos_token_id
    assert bos_prefix(bos_target.tok) == [bos]
    assert bos_target.tok("a b")["input_ids"] == [bos, *bos_target.tok("a b")["input_ids"][1:]]


def test_contexts_start_with_the_bos_the_model_was_trained_with(bos_target, pairs):
    import torch

    bos = bos_target.tok.bos_token_id
    rows = pairs.head(3)
    texts = ["a prompt", "", "another one here"]
    ctx = bos_target.contexts(texts, list(rows["x_ids"]))
    for c, t, x in zip(ctx, texts, rows["x_ids"], strict=True):
        assert c == [bos, *bos_target.tok(t, add_special_tokens=False)["input_ids"], *x]
    res = bos_target(rows.assign(prompt=texts))
    for c, y, loss, out in zip(ctx, rows["y_ids"], res["loss"], res["out_ids"], strict=True):
        # Loss and greedy continuation are the model's own on BOS + p + x.
        ids = torch.tensor([c + list(y)])
        with torch.inference_mode():
            logp = torch.log_softmax(bos_target.model(ids).logits[0, :-1], -1)
        nll = -logp[len(c) - 1 :].gather(-1, ids[0, len(c) :, None]).mean().item()
        assert loss == pytest.approx(nll, rel=1e-4)
        ref = bos_target.model.generate(
            torch.tensor([c]), attention_mask=torch.ones(1, len(c), dtype=torch.long),
            max_new_tokens=len(y), min_new_tokens=len(y), do_sample=False,
            pad_token_id=bos_target.pad,
        )  # fmt: skip
        assert ref[0, len(c) :].tolist() == list(out)
    # GCG's prompts (target tokens, no BOS of their own) get the same context.
    ids = bos_target.encode(texts)
    assert all(bos not in p for p in ids)
    by_ids = bos_target(rows.assign(prompt_ids=ids))
    assert list(by_ids["mu"]) == list(res["mu"]) and np.allclose(by_ids["loss"], res["loss"])
    allowed = bos_target.allowed_tokens()
    p0 = [int(t) for t in allowed[:4]]
    x, y = list(rows.iloc[0]["x_ids"]), list(rows.iloc[0]["y_ids"])
    new, loss = bos_target.gcg_step(p0, x, y, 8, 4, np.random.default_rng(0), allowed)
    assert loss == pytest.approx(bos_target.loss([[bos, *new, *x]], [y])[0], rel=1e-5)
