"""Samplers: n predictions p("1") per snippet, the same whatever the batching or placement."""

import json

import numpy as np
import pandas as pd
import pytest

from mia_ray.actors.sampler import Sampler, snippet_seed
from mia_ray.train.config import FinetuneConfig
from mia_ray.train.copycheck import train_member

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def adapters(test_world, tmp_path_factory):
    """MC dropout, BLoB and two ensemble members, fine-tuned briefly on the test world."""
    root = tmp_path_factory.mktemp("adapters")
    texts = [f"line {i} " + "the king and the queen " * (1 + i % 3) for i in range(16)]
    labels = [i % 2 for i in range(16)]
    spec = FinetuneConfig(lr=5e-3, batch_size=4, max_length=96)
    out = {}
    for name in ("mcd", "blob", "ens-0", "ens-1"):
        rec = train_member(
            name, test_world["model"], texts, labels, root / name, spec, threads=1, fingerprint="t"
        )
        assert rec["steps"] == 4 and rec["n_train"] == 16
        out[name] = str(root / name / "adapter")
    return test_world["model"], out, spec


def _batch(n=6):
    return pd.DataFrame(
        {
            "snippet_id": [f"s{i}" for i in range(n)],
            "text": [f"text number {i} " * 4 for i in range(n)],
        }
    )


def _run(sampler, df, sizes):
    parts, start = [], 0
    for size in sizes:
        parts.append(sampler(df.iloc[start : start + size].reset_index(drop=True)))
        start += size
    got = pd.concat(parts).set_index("snippet_id")
    return {sid: np.asarray(p) for sid, p in got["p"].items()}


@pytest.mark.parametrize("kind", ["mcd", "blob"])
def test_stochastic_samplers_are_reproducible_whatever_the_batching(adapters, kind):
    base, paths, spec = adapters
    kw = dict(base=base, kind=kind, adapters=[paths[kind]], column="p", n_samples=5, seed=3,
              template=spec.template, max_length=spec.max_length, torch_threads=1)  # fmt: skip
    df = _batch()
    one = _run(Sampler(**kw), df, [6])
    again = _run(Sampler(**kw), df.iloc[::-1].reset_index(drop=True), [1, 2, 3])
    for sid in one:
        assert one[sid].shape == (5,)
        assert np.all((one[sid] > 0) & (one[sid] < 1))
        np.testing.assert_allclose(one[sid], again[sid], rtol=0, atol=1e-6)
    # The passes are draws, not copies: predictions vary within a snippet ...
    assert max(np.ptp(p) for p in one.values()) > 1e-5
    # ... and another seed draws other ones.
    other = _run(Sampler(**{**kw, "seed": 4}), df, [6])
    assert any(np.abs(other[s] - one[s]).max() > 1e-6 for s in one)


def test_ensemble_switching_adapters_equals_one_actor_per_member(adapters):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mia_ray.models.prompt import PromptEncoder, answer_logits

    base, paths, spec = adapters
    common = dict(base=base, kind="ensemble", template=spec.template,
                  max_length=spec.max_length, torch_threads=1)  # fmt: skip
    df = _batch(4)
    both = _run(
        Sampler(adapters=[paths["ens-0"], paths["ens-1"]], column="p", **common), df, [3, 1]
    )
    for j, name in enumerate(("ens-0", "ens-1")):
        alone = Sampler(adapters=[paths[name]], column="p", scalar=True, **common)(df)
        np.testing.assert_allclose(
            [both[s][j] for s in df["snippet_id"]], alone["p"], rtol=0, atol=1e-6
        )
        # The prediction is softmax over the logits of "0" and "1" only, member j alone.
        tok = AutoTokenizer.from_pretrained(base)
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), paths[name])
        enc = PromptEncoder(tok, spec.template, spec.max_length)
        with torch.no_grad():
            z = answer_logits(model.eval(), enc.collate(enc.encode(df["text"])), enc.answer_ids)
        expect = 1 / (1 + np.exp(-(z[:, 1] - z[:, 0]).numpy()))
        np.testing.assert_allclose(alone["p"], expect, rtol=1e-5)
    assert any(abs(both[s][0] - both[s][1]) > 1e-6 for s in both)  # members differ


@pytest.fixture(scope="module")
def dropout_base(adapters, tmp_path_factory):
    """The test world's target with dropout 0.1 in its own layers (same weights)."""
    import shutil

    base, _, _ = adapters
    out = tmp_path_factory.mktemp("dropout-base") / "tiny"
    shutil.copytree(base, out)
    conf = json.loads((out / "config.json").read_text())
    conf.update(attn_pdrop=0.1, resid_pdrop=0.1, embd_pdrop=0.1)
    (out / "config.json").write_text(json.dumps(conf))
    return str(out)


def test_mc_dropout_switches_on_every_dropout_by_default_or_only_lora(adapters, dropout_base):
    import torch

    from mia_ray.errors import MiaError
    from mia_ray.pipelines.copycheck.config import UncertaintyConfig

    base, paths, spec = adapters
    kw = dict(kind="mcd", adapters=[paths["mcd"]], column="p", n_samples=5, seed=3,
              template=spec.template, max_length=spec.max_length, torch_threads=1)  # fmt: skip
    assert UncertaintyConfig().mc_dropout == "all"  # the reference code's model.train()
    with pytest.raises(MiaError, match="uncertainty.mc_dropout must be all or lora"):
        UncertaintyConfig(mc_dropout="base").validate()
    every = Sampler(base=dropout_base, **kw)
    lora = Sampler(base=dropout_base, mc_dropout="lora", **kw)

    def on(s):
        return {
            n for n, m in s.model.named_modules() if isinstance(m, torch.nn.Dropout) and m.training
        }

    drops = {n for n, m in every.model.named_modules() if isinstance(m, torch.nn.Dropout)}
    assert on(every) == drops and every.model.training  # attention dropout reads .training
    assert on(lora) == {n for n in drops if "lora_dropout" in n} and not lora.model.training
    assert len(drops) > len(on(lora)) > 0
    df = _batch()
    p_every, p_lora = _run(every, df, [6]), _run(lora, df, [6])
    # The base model's own dropout draws too: the predictions spread wider.
    spread = lambda p: np.mean([np.ptp(v) for v in p.values()])  # noqa: E731
    assert spread(p_every) > spread(p_lora)
    again = _run(Sampler(base=dropout_base, **kw), df.iloc[::-1].reset_index(drop=True), [4, 2])
    for sid in p_every:  # still the same masks whatever the batching
        np.testing.assert_allclose(p_every[sid], again[sid], rtol=0, atol=1e-6)
    # A base without dropout of its own: both modes draw the same masks, the same predictions.
    plain_every, plain_lora = (
        _run(Sampler(base=base, mc_dropout=m, **kw), df, [6]) for m in ("all", "lora")
    )
    for sid in plain_every:
        np.testing.assert_allclose(plain_every[sid], plain_lora[sid], rtol=0, atol=1e-6)


def test_mc_dropout_needs_dropout(adapters, dropout_base, tmp_path):
    from mia_ray.errors import MiaError

    base, _, spec = adapters
    no_drop = FinetuneConfig(lr=5e-3, batch_size=4, max_length=96, lora_dropout=0.0)
    train_member(
        "mcd", base, ["a b c", "d e f"] * 2, [0, 1] * 2, tmp_path / "m", no_drop, threads=1
    )
    kw = dict(kind="mcd", adapters=[str(tmp_path / "m" / "adapter")], column="p")
    with pytest.raises(MiaError, match="no dropout, in the model or its LoRA, to sample"):
        Sampler(base=base, **kw)
    with pytest.raises(MiaError, match="no LoRA dropout to sample"):
        Sampler(base=dropout_base, mc_dropout="lora", **kw)
    Sampler(base=dropout_base, **kw)  # the model's own dropout is enough to sample


def test_finished_member_is_skipped_and_a_changed_one_retrained(adapters, tmp_path):
    base, _, spec = adapters
    args = (base, ["x y z", "u v w"] * 4, [0, 1] * 4, tmp_path / "ens-2", spec)
    first = train_member("ens-2", *args, threads=1, fingerprint="a")
    stamp = (tmp_path / "ens-2" / "adapter").stat().st_mtime_ns
    again = train_member("ens-2", *args, threads=1, fingerprint="a")
    assert again["skipped"] and (tmp_path / "ens-2" / "adapter").stat().st_mtime_ns == stamp
    assert first["seed"] == spec.seed + 3  # ensemble member i trains with seed + 1 + i
    changed = train_member("ens-2", *args, threads=1, fingerprint="b")
    assert "skipped" not in changed
    assert json.loads((tmp_path / "ens-2" / ".complete.json").read_text())["key"] == "b"


def test_snippet_seed_is_stable_and_distinct():
    assert snippet_seed(0, "a") == snippet_seed(0, "a")
    assert len({snippet_seed(0, "a"), snippet_seed(1, "a"), snippet_seed(0, "b")}) == 3
    assert (
        snippet_seed(0, "doc#0") == 7745207697048370300
    )  # pinned: reruns on any machine draw the same masks


def test_blob_trains_with_a_separate_kl_step_that_pulls_towards_the_prior(adapters, tmp_path):
    from transformers import AutoModelForCausalLM

    from mia_ray.models.blob import BlobConfig, add_blob_adapters, blob_kl

    base, _, spec = adapters
    fresh = AutoModelForCausalLM.from_pretrained(base)
    add_blob_adapters(
        fresh,
        BlobConfig(r=spec.lora_r, alpha=spec.lora_alpha, target_modules=("c_attn",),
                   prior_std=spec.blob_prior_std, init_std=spec.blob_init_std),
    )  # fmt: skip
    kl0 = float(blob_kl(fresh))
    texts, labels = ["a b c d", "e f g h"] * 8, [0, 1] * 8
    rec = train_member("blob", base, texts, labels, tmp_path / "b", spec, threads=1)
    strong = FinetuneConfig(**{**spec.__dict__, "blob_kl_lr": 0.1})
    rec_strong = train_member("blob", base, texts, labels, tmp_path / "s", strong, threads=1)
    assert 0 < rec["final_kl"] < kl0  # the KL step moved the posterior towards the prior
    assert rec_strong["final_kl"] < rec["final_kl"]  # and a larger KL step moves it further
    assert rec["steps"] == 4 and rec["kl_pi"] == 0.25  # 16 snippets, 4 a step: 1/4 each step
    # Accumulating 2 batches a step halves the steps, so each KL step weighs twice as much.
    accum = FinetuneConfig(**{**spec.__dict__, "grad_accum": 2})
    rec_accum = train_member("blob", base, texts, labels, tmp_path / "a", accum, threads=1)
    assert rec_accum["steps"] == 2 and rec_accum["kl_pi"] == 0.5
    assert rec_accum["warmup_steps"] == 1 and rec["warmup_steps"] == 1  # ceil(0.06 x steps)
