"""BLoB: LoRA whose A matrix has a learned Gaussian posterior, injectable into any HF model.

Wang et al., "BLoB: Bayesian Low-Rank Adaptation by Backpropagation for Large Language
Models", NeurIPS 2024 (arXiv:2406.11675; reference code github.com/Wang-ML-Lab/bayesian-peft,
``modelwrappers/blob.py``). Only A is Bayesian ("asymmetric Bayesianization"); B stays a point
estimate. For a wrapped layer with input width ``in`` and output width ``out``::

    A = M + sigma * E,  sigma = G ** 2 (elementwise),  E ~ N(0, I)    M, G, E: (r, in)
    y = base(x) + (x @ A.T @ B.T) * (alpha / r)                        B: (out, r)

``sigma = G**2`` is the reference code's parametrisation for ``bayes_eps >= 0`` (its default;
a negative ``bayes_eps`` switches it to softplus, which we do not offer). The loss adds the
closed-form KL(q(A) || N(0, prior_std**2 I)) summed over every element of every wrapped A
(:func:`blob_kl`).

Defaults and where they come from (bayesian-peft, ``modelwrappers/blob.py`` argument defaults
and ``scripts/blob/blob-llama-all.sh``):

* ``r = 8``, ``alpha = 16``: ``--lora-r 8 --lora-alpha 16`` in the published BLoB scripts.
* ``prior_std = 0.2``: ``--bayes-beta`` (default 0.2, scripts ``beta=0.2``), the prior std.
* ``init_std = 0.0025``: the reference draws ``G ~ U(eps/sqrt(2), eps)`` with ``--bayes-eps``
  ``eps = 0.05``, so its initial sigma = G**2 lies in ``[eps**2/2, eps**2] = [0.00125, 0.0025]``.
  We initialise G to the constant ``sqrt(init_std)`` so that sigma = ``init_std`` exactly, and
  take the upper end of that range as the default (M is random already, so G needs no jitter).
* ``kl_weight = 1.0``: see "KL weighting" below.

KL weighting. :func:`blob_kl` returns ``kl_weight * KL`` (KL summed over all wrapped layers).
With one optimiser, the minibatch ELBO (Bayes by Backprop, Blundell et al. 2015, which BLoB
follows) divided by the training-set size ``N`` gives the per-step loss
``ce_mean_over_batch + blob_kl(model) / N``: that is what a trainer should use, with
``kl_weight < 1`` as an optional tempering knob. The reference code is different and not a
single loss: it steps the batch-mean NLL with the main AdamW optimiser and, separately,
``KL * pi`` with its own SGD optimiser (``--bayes-kllr``: 0.02 default, 0.01 in the scripts),
where ``pi = 1 / len(train_loader)`` (one over the number of batches per epoch) or, with
``--bayes-klreweighting`` as in the published scripts, a cyclic ``2**i / (2**(M+1) - 1)``
schedule with ``M`` derived from ``--bayes-gamma 8``. (With a mean NLL, ``1 / n_batches`` is
``batch_size`` times the ELBO's ``1 / N``; the separate learning rate is what keeps it mild.)
CopyCheck's trainer (:func:`mia_ray.train.copycheck.blob_kl_pi`) takes ``pi = 1 / optimizer
steps per epoch``: the reference's value with one worker and no gradient accumulation, and
the same KL pressure per epoch with them (the KL step runs once per optimizer step).

Noise. In "train" mode one E is drawn per forward pass and shared by every example and token of
the batch (the simple, flipout-free estimator). The reference code uses Flipout: random sign
vectors per token decorrelate the noise across examples for lower-variance gradients. We do not,
because the sampler needs one weight sample per draw, identical for every snippet whatever the
batching ("fixed" mode), and we keep train and sample paths the same.

Files (peft-style): ``adapter_config.json`` (``"peft_type": "BLOB"`` + the :class:`BlobConfig`
fields) and ``adapter_model.safetensors`` with only ``<module name>.lora_A_mean``,
``<module name>.lora_A_g`` and ``<module name>.lora_B`` per wrapped module.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from mia_ray.errors import MiaError

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
PEFT_TYPE = "BLOB"
MODES = ("train", "fixed", "mean")
_PARAM_NAMES = ("lora_A_mean", "lora_A_g", "lora_B")


@dataclass(frozen=True)
class BlobConfig:
    """BLoB adapter settings; defaults follow the BLoB reference code (see the module docstring).

    ``target_modules`` are module-name suffixes: ``"c_attn"`` matches ``transformer.h.0.attn.c_attn``
    (a dotted suffix such as ``"attn.c_proj"`` narrows the match). ``init_std`` is the initial
    posterior std sigma of every element of A; ``kl_weight`` multiplies the KL in
    :func:`blob_kl` (the trainer still divides by the training-set size).
    """

    r: int = 8
    alpha: int = 16
    target_modules: tuple[str, ...] = ("c_attn",)
    prior_std: float = 0.2
    init_std: float = 0.0025
    kl_weight: float = 1.0

    def __post_init__(self):
        tm = self.target_modules
        if isinstance(tm, str):
            tm = (tm,)
        object.__setattr__(self, "target_modules", tuple(tm))  # lists come from YAML/JSON
        if not isinstance(self.r, int) or isinstance(self.r, bool) or self.r < 1:
            raise MiaError(f"blob.r must be a positive integer, not {self.r!r}")
        if not self.alpha > 0:
            raise MiaError(f"blob.alpha must be > 0, not {self.alpha!r}")
        if not self.target_modules or not all(
            isinstance(s, str) and s for s in self.target_modules
        ):
            raise MiaError(
                f"blob.target_modules must be non-empty module-name suffixes, not {tm!r}"
            )
        for key in ("prior_std", "init_std"):
            value = getattr(self, key)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise MiaError(f"blob.{key} must be a finite number > 0, not {value!r}")
        if not (
            isinstance(self.kl_weight, (int, float))
            and math.isfinite(self.kl_weight)
            and self.kl_weight >= 0
        ):
            raise MiaError(f"blob.kl_weight must be a finite number >= 0, not {self.kl_weight!r}")


def _in_out(module: nn.Module) -> tuple[int, int]:
    """(in_features, out_features) of an nn.Linear or a GPT-2 Conv1D (weight stored (in, out))."""
    if isinstance(module, Conv1D):
        n_in, n_out = module.weight.shape
        return int(n_in), int(n_out)
    return int(module.in_features), int(module.out_features)


class BlobLinear(nn.Module):
    """A frozen nn.Linear / Conv1D plus a BLoB adapter: ``y = base(x) + x A^T B^T alpha/r``.

    Parameters: ``lora_A_mean`` M (r, in), kaiming-uniform(a=sqrt(5)) as peft initialises
    LoRA's A; ``lora_A_g`` G (r, in), constant sqrt(init_std) so sigma = G**2 = init_std;
    ``lora_B`` B (out, r), zeros, so an untrained adapter leaves the base output unchanged.
    Adapter parameters are float32 when the base weight is fp16/bf16 (as peft's default
    ``autocast_adapter_dtype``): a sigma of ~1e-3 and small optimiser steps need the precision.

    ``mode``: "train" draws a fresh E (global torch RNG, on the parameters' device and dtype)
    every forward pass, shared across the batch; "fixed" uses the E set by :func:`resample_blob`;
    "mean" uses A = M. The mode is independent of ``module.training``.
    """

    def __init__(self, base_layer: nn.Module, cfg: BlobConfig):
        super().__init__()
        if not isinstance(base_layer, (nn.Linear, Conv1D)):
            raise MiaError(
                f"BLoB wraps nn.Linear or Conv1D layers, not {type(base_layer).__name__}"
            )
        self.base_layer = base_layer
        self.in_features, self.out_features = _in_out(base_layer)
        self.r = cfg.r
        self.alpha = cfg.alpha
        self.scaling = cfg.alpha / cfg.r
        self.prior_std = float(cfg.prior_std)
        self.kl_weight = float(cfg.kl_weight)
        self.mode = "train"
        w = base_layer.weight
        dtype = torch.float32 if w.dtype in (torch.float16, torch.bfloat16) else w.dtype
        kw = {"device": w.device, "dtype": dtype}
        self.lora_A_mean = nn.Parameter(torch.empty(self.r, self.in_features, **kw))
        nn.init.kaiming_uniform_(self.lora_A_mean, a=math.sqrt(5))
        self.lora_A_g = nn.Parameter(
            torch.full((self.r, self.in_features), math.sqrt(cfg.init_std), **kw)
        )
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, self.r, **kw))
        # Not persistent: a draw is state of the sampler, not of the adapter.
        self.register_buffer("eps", None, persistent=False)

    @property
    def weight(self) -> torch.Tensor:
        """The base layer's weight, for model code that reads ``layer.weight`` (as peft does)."""
        return self.base_layer.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base_layer.bias

    @property
    def sigma(self) -> torch.Tensor:
        """Posterior std of A, G**2 elementwise: (r, in)."""
        return self.lora_A_g * self.lora_A_g

    def lora_A(self) -> torch.Tensor:
        """The A used by the next forward pass in the current mode: (r, in)."""
        if self.mode == "mean":
            return self.lora_A_mean
        if self.mode == "train":
            e = torch.randn_like(self.lora_A_mean)
        else:
            if self.eps is None:
                raise MiaError(
                    "BLoB layer is in 'fixed' mode but no weight sample was drawn: call "
                    "resample_blob(model, seed) first (or set_blob_mode(model, 'mean'))"
                )
            e = self.eps
        return self.lora_A_mean + self.sigma * e

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base_layer(x)
        a = self.lora_A()
        h = nn.functional.linear(x.to(a.dtype), a)  # (..., r): the cheap side of x A^T B^T
        delta = nn.functional.linear(h, self.lora_B) * self.scaling
        return out + delta.to(out.dtype)

    def kl(self) -> torch.Tensor:
        """KL(N(M, sigma^2) || N(0, prior_std^2)) summed over A's elements (scalar, >= float32).

        Per element: log(prior_std / sigma) + (sigma^2 + M^2) / (2 prior_std^2) - 1/2. Unlike the
        reference (float64 with 1e-6 added inside logs and denominators) this is the exact formula.
        """
        dtype = torch.promote_types(self.lora_A_mean.dtype, torch.float32)
        mu = self.lora_A_mean.to(dtype)
        sigma = self.sigma.to(dtype)
        p = self.prior_std
        kl = math.log(p) - torch.log(sigma) + (sigma * sigma + mu * mu) / (2 * p * p) - 0.5
        return kl.sum()

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, r={self.r}, "
            f"alpha={self.alpha}, prior_std={self.prior_std}, mode={self.mode!r}"
        )


def _blob_layers(model: nn.Module) -> list[tuple[str, BlobLinear]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, BlobLinear)]


def _require_layers(model: nn.Module, what: str) -> list[tuple[str, BlobLinear]]:
    layers = _blob_layers(model)
    if not layers:
        raise MiaError(
            f"{what}: the model has no BLoB adapters (call add_blob_adapters or load_blob first)"
        )
    return layers


def _find_targets(model: nn.Module, suffixes: tuple[str, ...]) -> list[tuple[str, nn.Module]]:
    """Modules whose name ends with one of ``suffixes`` (at a dot boundary), in model order."""
    if _blob_layers(model):
        raise MiaError(
            "the model already has BLoB adapters; inject or load adapters into a fresh base model"
        )
    matched = []
    for name, module in model.named_modules():
        if not name or not any(name == s or name.endswith("." + s) for s in suffixes):
            continue
        if not isinstance(module, (nn.Linear, Conv1D)):
            raise MiaError(
                f"BLoB target module {name!r} is a {type(module).__name__}, not an nn.Linear or "
                "Conv1D: name the projection layers inside it instead"
            )
        matched.append((name, module))
    if matched:
        return matched
    linear = [n for n, m in model.named_modules() if isinstance(m, (nn.Linear, Conv1D))]
    if not linear:
        raise MiaError(
            f"BLoB target_modules {list(suffixes)} match no module: "
            f"{type(model).__name__} has no nn.Linear or Conv1D layers"
        )
    ends = sorted({n.rsplit(".", 1)[-1] for n in linear})
    shown = ", ".join(ends[:12]) + (", ..." if len(ends) > 12 else "")
    raise MiaError(
        f"BLoB target_modules {list(suffixes)} match no module of {type(model).__name__}; "
        f"its nn.Linear/Conv1D layers are named ...{shown} (e.g. {linear[0]!r})"
    )


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def add_blob_adapters(model: nn.Module, cfg: BlobConfig) -> list[str]:
    """Wrap every nn.Linear/Conv1D whose name ends with a ``cfg.target_modules`` suffix, in place.

    Freezes every parameter of ``model`` except the adapters' M, G and B. New layers start in
    "train" mode. Returns the wrapped module names in model order. MiaError when nothing
    matches (naming the suffixes and the layer names that exist), when a match is not a
    Linear/Conv1D, or when the model already has BLoB adapters.
    """
    targets = _find_targets(model, cfg.target_modules)
    for p in model.parameters():
        p.requires_grad_(False)
    for name, module in targets:
        _replace(model, name, BlobLinear(module, cfg))
    return [name for name, _ in targets]


def blob_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The trainable adapter parameters (M, G, B of every wrapped layer), in model order."""
    layers = _require_layers(model, "blob_parameters")
    return [getattr(layer, p) for _, layer in layers for p in _PARAM_NAMES]


def blob_kl(model: nn.Module) -> torch.Tensor:
    """``kl_weight * sum over wrapped layers of KL(q(A) || N(0, prior_std^2))``: a scalar.

    Differentiable in M and G. A trainer adds ``blob_kl(model) / n_train_examples`` to the
    batch-mean cross-entropy (the ELBO / N; the module docstring compares the reference code).
    """
    total = None
    for _, layer in _require_layers(model, "blob_kl"):
        kl = layer.kl_weight * layer.kl()
        total = kl if total is None else total + kl.to(total.device)
    return total


def resample_blob(model: nn.Module, seed: int) -> None:
    """Draw E for every wrapped layer from one ``torch.Generator`` seeded with ``seed``.

    Layers draw in model order, on the CPU in float32, then move to the adapter's device and
    dtype, so sample ``seed`` is the same weight sample on CPU and GPU. The draw is kept until
    the next call and used by layers in "fixed" mode: one weight sample for a whole batch, the
    same for every snippet whatever the batching.
    """
    gen = torch.Generator().manual_seed(int(seed))
    for _, layer in _require_layers(model, "resample_blob"):
        m = layer.lora_A_mean
        e = torch.randn(tuple(m.shape), generator=gen, dtype=torch.float32)
        layer.eps = e.to(device=m.device, dtype=m.dtype)


def set_blob_mode(model: nn.Module, mode: str) -> None:
    """Set every wrapped layer's mode: "train", "fixed" or "mean" (see :class:`BlobLinear`).

    "train": a fresh E every forward pass; "fixed": the last :func:`resample_blob` draw;
    "mean": A = M, no noise.
    """
    if mode not in MODES:
        raise MiaError(f"BLoB mode must be one of {', '.join(MODES)}, not {mode!r}")
    for _, layer in _require_layers(model, "set_blob_mode"):
        layer.mode = mode


def _atomic_write(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_blob(model: nn.Module, out_dir: str | os.PathLike, cfg: BlobConfig) -> None:
    """Write ``adapter_config.json`` and ``adapter_model.safetensors`` (adapter tensors only).

    Each file is written to a temp file in ``out_dir`` and renamed into place, weights first,
    so a reader never sees a half-written file. ``cfg`` must be the config the adapters were
    built with (r and alpha are checked against the layers).
    """
    from safetensors.torch import save_file

    layers = _require_layers(model, "save_blob")
    for name, layer in layers:
        if layer.r != cfg.r or layer.alpha != cfg.alpha:
            raise MiaError(
                f"save_blob: layer {name!r} has r={layer.r}, alpha={layer.alpha} but the config "
                f"says r={cfg.r}, alpha={cfg.alpha}; pass the config the adapters were built with"
            )
    tensors = {
        f"{name}.{p}": getattr(layer, p).detach().to("cpu").contiguous()
        for name, layer in layers
        for p in _PARAM_NAMES
    }
    meta = asdict(cfg)
    meta["target_modules"] = list(cfg.target_modules)
    base = getattr(getattr(model, "config", None), "_name_or_path", "") or None
    config = {
        "peft_type": PEFT_TYPE,
        **meta,
        "base_model_name_or_path": base,
        "wrapped_modules": [name for name, _ in layers],
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _atomic_write(
        out / WEIGHTS_NAME, lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"})
    )
    text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    _atomic_write(out / CONFIG_NAME, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def _read_config(adapter_dir: Path) -> BlobConfig:
    path = adapter_dir / CONFIG_NAME
    if not path.is_file():
        raise MiaError(f"BLoB adapter {str(adapter_dir)!r} has no {CONFIG_NAME}")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MiaError(f"{path} is not readable JSON: {e}") from None
    if not isinstance(raw, dict) or raw.get("peft_type") != PEFT_TYPE:
        got = raw.get("peft_type") if isinstance(raw, dict) else type(raw).__name__
        raise MiaError(f"{path} is not a BLoB adapter: peft_type is {got!r}, not {PEFT_TYPE!r}")
    known = {f.name for f in fields(BlobConfig)}
    try:
        return BlobConfig(**{k: v for k, v in raw.items() if k in known})
    except TypeError as e:
        raise MiaError(f"{path}: bad BLoB config: {e}") from None


def load_blob(model: nn.Module, adapter_dir: str | os.PathLike) -> BlobConfig:
    """Inject the adapters described by ``adapter_dir`` into a base model and load their tensors.

    Strict: the file must hold exactly M, G and B for every module the config's
    ``target_modules`` match, with this model's shapes; otherwise MiaError names what is
    missing, unexpected or mis-shaped, and the model is left untouched. Loaded layers are in
    "fixed" mode with no draw yet: call :func:`resample_blob` (or :func:`set_blob_mode`) before
    the first forward pass, so a sampler cannot silently run on fresh or no noise.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    adapter_dir = Path(adapter_dir)
    cfg = _read_config(adapter_dir)
    weights = adapter_dir / WEIGHTS_NAME
    if not weights.is_file():
        raise MiaError(f"BLoB adapter {str(adapter_dir)!r} has no {WEIGHTS_NAME}")
    try:
        tensors = load_file(weights)
    except (OSError, SafetensorError) as e:
        raise MiaError(f"{weights} does not load: {e}") from None

    expected = {}
    for name, module in _find_targets(model, cfg.target_modules):
        n_in, n_out = _in_out(module)
        expected[f"{name}.lora_A_mean"] = (cfg.r, n_in)
        expected[f"{name}.lora_A_g"] = (cfg.r, n_in)
        expected[f"{name}.lora_B"] = (n_out, cfg.r)
    missing = sorted(expected.keys() - tensors.keys())
    unexpected = sorted(tensors.keys() - expected.keys())
    if missing or unexpected:
        raise MiaError(
            f"BLoB adapter {str(adapter_dir)!r} does not fit this {type(model).__name__}: "
            f"{len(missing)} missing tensor(s) {missing[:3]}, "
            f"{len(unexpected)} unexpected tensor(s) {unexpected[:3]}"
        )
    bad = [
        (k, tuple(tensors[k].shape), want)
        for k, want in expected.items()
        if tuple(tensors[k].shape) != want
    ]
    if bad:
        key, got, want = bad[0]
        raise MiaError(
            f"BLoB adapter {str(adapter_dir)!r} does not fit this {type(model).__name__}: "
            f"{key} has shape {got} in the file but the model needs {want} "
            f"({len(bad)} tensor(s) differ); was it trained on a different base model?"
        )

    add_blob_adapters(model, cfg)
    with torch.no_grad():
        for name, layer in _blob_layers(model):
            for p in _PARAM_NAMES:
                getattr(layer, p).copy_(tensors[f"{name}.{p}"])
            layer.mode = "fixed"
    return cfg
