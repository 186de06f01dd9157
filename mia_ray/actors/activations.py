"""ActivationReader: the model role that turns samples into per-layer mean hidden states (LUMIA).

One forward pass per sample; a hook on every transformer block averages the block's output
over the sample's real tokens (LUMIA eq. 1: A_l(x) = 1/n sum_j a_l(t_j)), so only a
(hidden,) vector per layer leaves the forward pass, never the (tokens, hidden) states.
Samples longer than the model's context are cropped to it, as in the paper (§3.2.1).

Vision-language models (HF LLaVA family) get hooks on the vision encoder's blocks (part
``vision``, averaged over every patch of the sample's image crops) and on the language
model's blocks (part ``language``, averaged over the real tokens, image tokens included).
Text models have one part, ``text``. Layers are 1-based: layer l is the output of block l.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pandas as pd

from mia_ray.errors import MiaError


def column(part: str, layer: int) -> str:
    """Parquet column of one layer's mean activations, e.g. ``text.3``."""
    return f"{part}.{layer}"


def parse_column(name: str) -> tuple[str, int] | None:
    part, _, layer = name.rpartition(".")
    return (part, int(layer)) if part and layer.isdigit() else None


def block_lists(model) -> dict[str, object]:
    """The ModuleLists holding the transformer blocks, by part.

    Found by length (the config's number of layers) rather than by attribute path, so that
    any architecture transformers loads works (GPT-2 ``transformer.h``, Llama
    ``model.layers``, LLaVA's ``vision_tower...layers`` and ``language_model.layers``).
    """
    import torch

    cfg = model.config
    vision_cfg = getattr(cfg, "vision_config", None)
    text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    n_text = getattr(text_cfg, "num_hidden_layers", None)
    n_vision = getattr(vision_cfg, "num_hidden_layers", None) if vision_cfg else None
    found: dict[str, object] = {}
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.ModuleList) or not len(module):
            continue
        is_vision = "vision" in name or "visual" in name
        if vision_cfg is not None and is_vision and len(module) == n_vision:
            found.setdefault("vision", module)
        elif not is_vision and len(module) == n_text:
            found.setdefault("language" if vision_cfg is not None else "text", module)
    want = ["vision", "language"] if vision_cfg is not None else ["text"]
    missing = [p for p in want if p not in found]
    if missing:
        raise MiaError(
            f"cannot find the transformer blocks ({', '.join(missing)}) of a "
            f"{type(model).__name__}: no list of {n_text} blocks in the model"
        )
    return found


class ActivationReader:
    """``Dataset.map_batches(ActivationReader, fn_constructor_kwargs=..., batch_format="pandas")``.

    Input rows carry ``snippet_id``, ``text`` and, for a vision-language model, ``image``
    (a path, or the image file's bytes). Output rows carry ``snippet_id``, ``n_tokens`` and one float32 (hidden,)
    array per part and layer, in column ``{part}.{layer}``. With ``token_stats`` (text
    models) they also carry what the Scorer's target pass gives every classic attack
    (``loss``, ``token_logprobs``, ``mu``, ``sigma``), from the logits of the same pass.
    """

    def __init__(
        self,
        model: str,
        device: str = "auto",
        dtype: str = "auto",
        max_length: int = 512,
        revision: str = "",
        trust_remote_code: bool = False,
        torch_threads: int = 0,
        token_stats: bool = False,
    ):
        from mia_ray.models.hf import load_activation_model, set_torch_threads

        set_torch_threads(torch_threads)
        self.model, self.processor, self.tok, self.device = load_activation_model(
            model, device, dtype, revision, trust_remote_code
        )
        self.multimodal = self.processor is not None
        text_cfg = self.model.config.get_text_config()
        ctx = getattr(text_cfg, "max_position_embeddings", None) or getattr(
            text_cfg, "n_positions", None
        )
        self.max_length = min(max_length, ctx) if ctx else max_length
        self.tok.padding_side = "right"  # causal attention: real tokens never see right pads
        self._mask = None
        self._sums: dict[str, list] = {}
        self.token_stats = token_stats and not self.multimodal
        # Only hidden states are read: project just one position onto the vocabulary
        # (unless the attacks' token statistics come from this pass too).
        params = inspect.signature(self.model.forward).parameters
        keep_one = "logits_to_keep" in params and not self.token_stats
        self._extra = {"logits_to_keep": 1} if keep_one else {}
        self.layers: dict[str, int] = {}
        for part, blocks in block_lists(self.model).items():
            self.layers[part] = len(blocks)
            for i, block in enumerate(blocks):
                block.register_forward_hook(self._hook(part, i + 1))

    def _hook(self, part: str, layer: int):
        def hook(_module, _inputs, output):
            if self._mask is None:  # a forward pass that is not ours (e.g. a caller's own)
                return
            h = output[0] if isinstance(output, tuple) else output
            h = h.float()
            if part == "vision":
                # Every patch of every crop of the one image in this pass is real.
                vec = h.reshape(-1, h.shape[-1]).mean(0, keepdim=True)
            else:
                m = self._mask
                if m.shape != h.shape[:2]:
                    raise MiaError(
                        f"block {layer} returned {tuple(h.shape[:2])} positions for an "
                        f"attention mask of {tuple(m.shape)}"
                    )
                m = m.to(h.dtype)[..., None]
                vec = (h * m).sum(1) / m.sum(1).clamp_min(1.0)
            self._sums[column(part, layer)] = vec.cpu().numpy().astype(np.float32)

        return hook

    def _forward(self, enc: dict):
        """One forward pass; the hooks fill the per-layer means (masked by ``enc``'s mask).
        Returns them and the model's logits."""
        import torch

        self._mask, self._sums = enc["attention_mask"], {}
        try:
            with torch.inference_mode():
                logits = self.model(**enc, **self._extra).logits
        finally:
            self._mask = None
        return dict(self._sums), logits

    def _text_pass(self, texts: list[str]) -> tuple[list[int], dict[str, np.ndarray], list]:
        """Token counts, per-layer means and (with ``token_stats``) the Scorer's row stats."""
        from mia_ray.actors.scorer import row_stats

        enc = self.tok(
            texts, return_tensors="pt", padding=True, truncation=True, max_length=self.max_length
        )
        enc = {k: v.to(self.device) for k, v in enc.items() if k in ("input_ids", "attention_mask")}
        sums, logits = self._forward(enc)
        rows = []
        if self.token_stats:
            rows = row_stats(logits, enc["input_ids"], enc["attention_mask"], texts, True)
        return enc["attention_mask"].sum(1).tolist(), sums, rows

    def _crop(self, text: str) -> str:
        ids = self.tok(text, add_special_tokens=False, truncation=True, max_length=self.max_length)
        return self.tok.decode(ids["input_ids"])

    def _image_text_pass(self, text: str, image: str | bytes) -> tuple[int, dict[str, np.ndarray]]:
        """One sample: LLaVA-OneVision splits an image into a variable number of crops, so
        samples are not batched (each vision pass then belongs to exactly one sample).
        ``image``: a path, or the file's bytes (read where the file is, on a cluster)."""
        import io

        from PIL import Image

        token = getattr(self.processor, "image_token", "<image>")
        text = self._crop(text)
        prompt = text if token in text else f"{token}\n{text}"
        try:
            with Image.open(io.BytesIO(image) if isinstance(image, bytes) else image) as im:
                pixels = im.convert("RGB")
        except (OSError, ValueError) as e:
            what = f"of {len(image)} bytes" if isinstance(image, bytes) else image
            raise MiaError(f"image {what} does not load: {e}") from None
        enc = self.processor(images=pixels, text=prompt, return_tensors="pt")
        enc = {k: (v.to(self.device) if hasattr(v, "to") else v) for k, v in enc.items()}
        if "pixel_values" in enc and enc["pixel_values"].is_floating_point():
            enc["pixel_values"] = enc["pixel_values"].to(self.model.dtype)
        return int(enc["attention_mask"].sum()), self._forward(enc)[0]

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        from mia_ray.actors import in_model_batches

        return in_model_batches(batch, self._read)

    def _read(self, batch: pd.DataFrame) -> pd.DataFrame:
        texts = [str(t) for t in batch["text"]]
        if self.multimodal:
            if "image" not in batch:
                raise MiaError(
                    "a vision-language model needs an image per sample (data.image_field)"
                )
            n_tokens, per_layer, rows = [], {}, []
            for text, image in zip(texts, batch["image"], strict=True):
                n, sums = self._image_text_pass(
                    text, image if isinstance(image, bytes) else str(image)
                )
                n_tokens.append(n)
                for key, vec in sums.items():
                    per_layer.setdefault(key, []).append(vec[0])
        else:
            n_tokens, sums, rows = self._text_pass(texts)
            per_layer = {key: list(vec) for key, vec in sums.items()}
        expected = [column(p, i + 1) for p, n in self.layers.items() for i in range(n)]
        missing = [c for c in expected if c not in per_layer]
        if missing:
            # e.g. LLaVA stops its vision tower at vision_feature_layer: those blocks never run.
            expected = [c for c in expected if c in per_layer]
        out = pd.DataFrame({"snippet_id": batch["snippet_id"].to_numpy(), "n_tokens": n_tokens})
        for key in expected:
            out[key] = per_layer[key]
        for key in ("loss", "token_logprobs", "mu", "sigma") if rows else ():
            out[key] = [r[key] for r in rows]
        return out


def load_layer(parts: list[Path], name: str) -> tuple[np.ndarray, np.ndarray]:
    """(snippet_ids (n,), activations (n, hidden) float32) of one layer column from parquet parts."""
    frames = [pd.read_parquet(p, columns=["snippet_id", name]) for p in parts]
    df = pd.concat(frames, ignore_index=True)
    return df["snippet_id"].to_numpy(), np.stack(df[name].to_numpy()).astype(np.float32)
