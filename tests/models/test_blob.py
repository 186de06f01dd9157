"""BLoB adapters: identity at init, sampling modes, moments, closed-form KL, training, files."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from mia_ray.errors import MiaError
from mia_ray.models.blob import (
    BlobConfig,
    BlobLinear,
    add_blob_adapters,
    blob_kl,
    blob_parameters,
    load_blob,
    resample_blob,
    save_blob,
    set_blob_mode,
)

GPT2_TARGETS = ("c_attn", "c_proj")


@pytest.fixture(autouse=True)
def one_thread():
    """These models are tiny: extra intra-op threads only spin, 100x slower on a busy CI box."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def tiny_gpt2(seed=0, n_embd=32):
    torch.manual_seed(seed)
    cfg = GPT2Config(n_layer=2, n_embd=n_embd, n_head=2, vocab_size=50, n_positions=32)
    return GPT2LMHeadModel(cfg).eval()


def token_ids(batch=3, length=10, seed=0):
    return torch.randint(0, 50, (batch, length), generator=torch.Generator().manual_seed(seed))


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def perturb(model, seed=0, sigma=(0.05, 0.3)):
    """Give every adapter a 'trained' state: B != 0, random M, sigma spread over ``sigma``."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, BlobLinear):
                m.lora_B.copy_(0.5 * torch.randn(m.lora_B.shape, generator=gen))
                m.lora_A_mean.copy_(0.3 * torch.randn(m.lora_A_mean.shape, generator=gen))
                s = torch.empty(m.lora_A_g.shape).uniform_(*sigma, generator=gen)
                m.lora_A_g.copy_(s.sqrt())


class Toy(nn.Module):
    """Two nn.Linear layers; ``out_proj`` checks that suffixes match at a dot boundary."""

    def __init__(self, n_in=8, hidden=16, n_out=3):
        super().__init__()
        self.proj = nn.Linear(n_in, hidden)
        self.out_proj = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, n_out)

    def forward(self, x):
        return self.head(torch.relu(self.out_proj(torch.relu(self.proj(x)))))


def blob_layers(model):
    return [m for m in model.modules() if isinstance(m, BlobLinear)]


def test_untrained_adapter_leaves_gpt2_logits_unchanged():
    model = tiny_gpt2()
    ids = token_ids()
    base = logits(model, ids)
    names = add_blob_adapters(model, BlobConfig(r=4, alpha=8, target_modules=GPT2_TARGETS))
    assert names == [
        f"transformer.h.{i}.{m}"
        for i in (0, 1)
        for m in ("attn.c_attn", "attn.c_proj", "mlp.c_proj")
    ]
    assert isinstance(model.transformer.h[0].mlp.c_fc, nn.Module)
    assert not isinstance(model.transformer.h[0].mlp.c_fc, BlobLinear)
    layer = model.transformer.h[0].attn.c_attn
    assert layer.lora_A_mean.shape == (4, 32) and layer.lora_B.shape == (96, 4)  # Conv1D (in, out)
    assert torch.all(layer.lora_B == 0)
    assert torch.allclose(layer.sigma, torch.full((4, 32), BlobConfig().init_std))
    resample_blob(model, 3)
    for mode in ("train", "fixed", "mean"):
        set_blob_mode(model, mode)
        assert torch.equal(logits(model, ids), base), mode


def test_linear_toy_wrapping_and_suffix_boundary():
    model = Toy()
    names = add_blob_adapters(model, BlobConfig(r=2, alpha=4, target_modules=("proj", "head")))
    assert names == ["proj", "head"]  # "out_proj" does not end with ".proj"
    assert isinstance(model.out_proj, nn.Linear)
    assert model.proj.lora_A_mean.shape == (2, 8) and model.proj.lora_B.shape == (16, 2)
    assert model.head.lora_A_mean.shape == (2, 16) and model.head.lora_B.shape == (3, 2)
    assert model.proj.weight is model.proj.base_layer.weight  # peft-style passthrough
    # y = base(x) + x A^T B^T alpha / r, by hand in "mean" mode (A = M)
    perturb(model)
    set_blob_mode(model, "mean")
    x = torch.randn(5, 8)
    layer = model.proj
    with torch.no_grad():
        want = layer.base_layer(x) + x @ layer.lora_A_mean.T @ layer.lora_B.T * (4 / 2)
        torch.testing.assert_close(layer(x), want)


def test_modes_mean_fixed_train_on_gpt2():
    model = tiny_gpt2()
    add_blob_adapters(model, BlobConfig(r=4, alpha=8, target_modules=GPT2_TARGETS))
    perturb(model)
    ids = token_ids()

    set_blob_mode(model, "mean")
    mean1 = logits(model, ids)
    resample_blob(model, 5)  # a draw must not leak into "mean"
    assert torch.equal(logits(model, ids), mean1)

    set_blob_mode(model, "fixed")
    resample_blob(model, 1)
    s1 = logits(model, ids)
    assert torch.equal(logits(model, ids), s1)  # the draw stays fixed across forwards
    resample_blob(model, 2)
    s2 = logits(model, ids)
    assert not torch.allclose(s1, s2, atol=1e-3)
    assert not torch.allclose(s1, mean1, atol=1e-3)
    resample_blob(model, 1)
    assert torch.equal(logits(model, ids), s1)
    layers = blob_layers(model)
    assert not torch.equal(layers[0].eps, layers[3].eps[: layers[0].eps.shape[0]])

    # One weight sample per draw: each row alone gives the same logits as in the batch.
    rows = torch.cat([logits(model, ids[i : i + 1]) for i in range(ids.shape[0])])
    torch.testing.assert_close(rows, s1, atol=1e-5, rtol=1e-5)

    set_blob_mode(model, "train")
    t1, t2 = logits(model, ids), logits(model, ids)
    assert not torch.allclose(t1, t2, atol=1e-3)

    with pytest.raises(MiaError, match="mode must be one of train, fixed, mean"):
        set_blob_mode(model, "sample")


def test_fixed_mode_without_a_draw_is_an_error():
    model = Toy()
    add_blob_adapters(model, BlobConfig(r=2, target_modules=("proj",)))
    set_blob_mode(model, "fixed")
    with pytest.raises(MiaError, match=r"resample_blob\(model, seed\)"):
        model(torch.zeros(1, 8))


@pytest.mark.parametrize("mode", ["fixed", "train"])
def test_samples_of_A_have_mean_M_and_variance_sigma_squared(mode):
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module("lin", nn.Linear(16, 4))
    add_blob_adapters(model, BlobConfig(r=4, target_modules=("lin",)))
    perturb(model, sigma=(0.05, 0.5))
    layer = model.lin
    set_blob_mode(model, mode)
    n = 4000
    draws = []
    with torch.no_grad():
        for i in range(n):
            if mode == "fixed":
                resample_blob(model, i)
            draws.append(layer.lora_A())
    a = torch.stack(draws).double()  # (n, r, in)
    m = layer.lora_A_mean.detach().double()
    s2 = layer.lora_A_g.detach().double() ** 4  # sigma = G^2, so sigma^2 = G^4
    # Mean: each element's sample mean has sd sigma/sqrt(n); 5 sd over 64 elements would
    # fail by chance with probability < 64 * 6e-7.
    assert torch.all((a.mean(0) - m).abs() <= 5 * s2.sqrt() / math.sqrt(n))
    # Variance: var_hat / sigma^2 ~ chi2(n-1)/(n-1), sd sqrt(2/(n-1)) = 0.022 per element;
    # 6 sd per element, and the mean ratio over the 64 elements within 4 of its sd (0.0028).
    # Confusing sigma with G (= sqrt(sigma)) or with sigma^2 would be off by far more.
    ratio = a.var(0) / s2
    sd = math.sqrt(2 / (n - 1))
    assert torch.all((ratio - 1).abs() <= 6 * sd)
    assert abs(ratio.mean().item() - 1) <= 4 * sd / math.sqrt(ratio.numel())


def test_kl_matches_hand_computed_closed_form():
    model = nn.Sequential()
    model.add_module("lin", nn.Linear(2, 3))
    add_blob_adapters(model, BlobConfig(r=1, prior_std=0.2, target_modules=("lin",)))
    layer = model.lin
    with torch.no_grad():
        layer.lora_A_mean.copy_(torch.tensor([[0.1, -0.3]]))
        layer.lora_A_g.copy_(torch.tensor([[0.1, 0.2]]).sqrt())  # sigma = G^2 = (0.1, 0.2)
    # KL_j = log(0.2 / s_j) + (s_j^2 + m_j^2) / (2 * 0.2^2) - 1/2
    # j=1 (m=0.1, s=0.1):  log 2 + (0.01 + 0.01) / 0.08 - 0.5 = 0.693147 + 0.25 - 0.5 = 0.443147
    # j=2 (m=-0.3, s=0.2): log 1 + (0.04 + 0.09) / 0.08 - 0.5 = 0 + 1.625 - 0.5      = 1.125
    kl = blob_kl(model)
    assert kl.ndim == 0 and kl.requires_grad
    assert kl.item() == pytest.approx(1.568147180559945, rel=1e-6)
    with torch.no_grad():
        layer.lora_A_mean.zero_()
        layer.lora_A_g.fill_(math.sqrt(0.2))  # q == prior
    assert abs(blob_kl(model).item()) < 1e-6


def test_kl_weight_scales_and_layers_sum():
    model = Toy()
    add_blob_adapters(model, BlobConfig(r=2, kl_weight=0.25, target_modules=("proj", "head")))
    per_layer = sum(m.kl() for m in blob_layers(model))
    assert blob_kl(model).item() == pytest.approx(0.25 * per_layer.item(), rel=1e-6)
    # Default init: sigma = 0.0025 against a 0.2 prior, so each element costs ~log(80) - 1/2.
    assert per_layer.item() > (2 * 8 + 2 * 16) * (math.log(80) - 0.5)


def test_gradients_reach_adapters_only():
    model = tiny_gpt2()
    add_blob_adapters(model, BlobConfig(r=4, alpha=8, target_modules=GPT2_TARGETS))
    perturb(model)
    ids = token_ids()
    out = model(input_ids=ids, labels=ids)
    (out.loss + blob_kl(model) / 100).backward()
    params = blob_parameters(model)
    assert len(params) == 3 * 6
    assert {id(p) for p in model.parameters() if p.requires_grad} == {id(p) for p in params}
    for p in params:
        assert p.grad is not None and p.grad.abs().sum() > 0
    for name, p in model.named_parameters():
        if not any(p is q for q in params):
            assert not p.requires_grad and p.grad is None, name


def test_a_few_steps_of_ce_plus_kl_reduce_the_loss():
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    y = (x @ torch.randn(8, 3)).argmax(1)  # a linear teacher the frozen base does not know
    model = Toy()
    add_blob_adapters(model, BlobConfig(r=4, alpha=8, target_modules=("proj", "head")))
    opt = torch.optim.Adam(blob_parameters(model), lr=1e-2)

    def ce_mean_mode():
        set_blob_mode(model, "mean")
        with torch.no_grad():
            ce = nn.functional.cross_entropy(model(x), y).item()
        set_blob_mode(model, "train")
        return ce

    ce0 = ce_mean_mode()
    losses = []
    for _ in range(30):  # full batch, "train" mode: a fresh A sample every step
        loss = nn.functional.cross_entropy(model(x), y) + blob_kl(model) / len(x)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) < 0.6 * sum(losses[:5])
    assert ce_mean_mode() < 0.85 * ce0  # the data term learned too, not only the KL


def test_save_load_round_trip(tmp_path):
    cfg = BlobConfig(r=4, alpha=8, target_modules=GPT2_TARGETS, prior_std=0.1, kl_weight=0.5)
    model = tiny_gpt2()
    names = add_blob_adapters(model, cfg)
    perturb(model, seed=1)
    ids = token_ids()
    set_blob_mode(model, "mean")
    want_mean = logits(model, ids)
    set_blob_mode(model, "fixed")
    resample_blob(model, 7)
    want_fixed = logits(model, ids)

    out = tmp_path / "adapter"
    save_blob(model, out, cfg)
    assert sorted(p.name for p in out.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    meta = json.loads((out / "adapter_config.json").read_text())
    assert meta["peft_type"] == "BLOB"
    assert meta["r"] == 4 and meta["alpha"] == 8 and meta["target_modules"] == list(GPT2_TARGETS)
    assert meta["prior_std"] == 0.1 and meta["kl_weight"] == 0.5
    assert meta["init_std"] == cfg.init_std and meta["wrapped_modules"] == names
    tensors = load_file(out / "adapter_model.safetensors")
    assert set(tensors) == {
        f"{n}.{p}" for n in names for p in ("lora_A_mean", "lora_A_g", "lora_B")
    }
    assert sum(t.numel() for t in tensors.values()) == sum(
        p.numel() for p in blob_parameters(model)
    )

    fresh = tiny_gpt2()
    assert load_blob(fresh, out) == cfg
    with pytest.raises(MiaError, match="resample_blob"):
        logits(fresh, ids)  # loaded in "fixed" mode, no draw yet
    resample_blob(fresh, 7)
    assert torch.equal(logits(fresh, ids), want_fixed)
    set_blob_mode(fresh, "mean")
    assert torch.equal(logits(fresh, ids), want_mean)
    assert [m.kl_weight for m in blob_layers(fresh)] == [0.5] * 6
    assert blob_kl(fresh).item() == pytest.approx(blob_kl(model).item(), rel=1e-6)


def test_save_blob_rejects_a_config_that_does_not_match_the_layers(tmp_path):
    model = Toy()
    add_blob_adapters(model, BlobConfig(r=2, target_modules=("proj",)))
    with pytest.raises(MiaError, match="r=2, alpha=16 but the config says r=8"):
        save_blob(model, tmp_path / "a", BlobConfig(target_modules=("proj",)))


def test_load_errors_are_clear_and_leave_the_model_untouched(tmp_path):
    cfg = BlobConfig(r=2, alpha=4, target_modules=GPT2_TARGETS)
    model = tiny_gpt2()
    add_blob_adapters(model, cfg)
    good = tmp_path / "good"
    save_blob(model, good, cfg)

    wider = tiny_gpt2(n_embd=48)
    with pytest.raises(MiaError, match=r"has shape \(2, 32\) in the file but the model needs"):
        load_blob(wider, good)
    assert not blob_layers(wider)

    tensors = load_file(good / "adapter_model.safetensors")
    for case, edit in {
        "missing": lambda t: t.pop("transformer.h.1.mlp.c_proj.lora_B"),
        "unexpected": lambda t: t.__setitem__("transformer.h.0.mlp.c_fc.lora_B", torch.zeros(2)),
    }.items():
        bad = tmp_path / case
        bad.mkdir()
        (bad / "adapter_config.json").write_text((good / "adapter_config.json").read_text())
        edited = dict(tensors)
        edit(edited)
        save_file(edited, bad / "adapter_model.safetensors")
        fresh = tiny_gpt2()
        with pytest.raises(MiaError, match=f"1 {case} tensor"):
            load_blob(fresh, bad)
        assert not blob_layers(fresh)

    lora = tmp_path / "lora"
    lora.mkdir()
    (lora / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    with pytest.raises(MiaError, match="peft_type is 'LORA', not 'BLOB'"):
        load_blob(tiny_gpt2(), lora)
    with pytest.raises(MiaError, match="has no adapter_config.json"):
        load_blob(tiny_gpt2(), tmp_path / "nowhere")
    with pytest.raises(MiaError, match="already has BLoB adapters"):
        load_blob(model, good)


def test_no_matching_module_names_the_suffixes_and_what_exists():
    model = tiny_gpt2()
    with pytest.raises(MiaError) as err:
        add_blob_adapters(model, BlobConfig(target_modules=("q_proj", "v_proj")))
    msg = str(err.value)
    assert "['q_proj', 'v_proj']" in msg and "c_attn" in msg and "c_fc" in msg
    assert not blob_layers(model)
    assert all(p.requires_grad for p in model.parameters())  # nothing frozen on failure
    with pytest.raises(MiaError, match="'transformer.h.0.attn' is a GPT2Attention"):
        add_blob_adapters(model, BlobConfig(target_modules=("attn",)))
    add_blob_adapters(model, BlobConfig())
    with pytest.raises(MiaError, match="already has BLoB adapters"):
        add_blob_adapters(model, BlobConfig())


def test_config_validation():
    assert BlobConfig(target_modules=["q_proj"]).target_modules == ("q_proj",)
    for bad in ({"r": 0}, {"prior_std": 0.0}, {"init_std": -1.0}, {"target_modules": ()}):
        with pytest.raises(MiaError, match="blob\\."):
            BlobConfig(**bad)


def test_half_precision_base_keeps_float32_adapters():
    model = Toy().to(torch.bfloat16)
    add_blob_adapters(model, BlobConfig(r=2, target_modules=("proj",)))
    assert model.proj.lora_A_mean.dtype == torch.float32
    resample_blob(model, 0)
    assert model.proj.eps.dtype == torch.float32
    set_blob_mode(model, "fixed")
    assert model(torch.randn(2, 8, dtype=torch.bfloat16)).dtype == torch.bfloat16
