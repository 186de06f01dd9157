"""GPU check of the one model key (issue 28): does ``dtype: auto`` change a model's numbers
between a CPU actor and a GPU actor, and do the keys tell the two apart?

Run on a machine with a CUDA GPU (no Ray needed: the Scorer is a plain class):

    PYTHONPATH=. python3 bench/gpu_key_check.py MODEL_FOLDER TEXTS.json > gpu_key_check.json

It scores the texts with the same weights three ways (CPU float32 as ``auto`` resolves on a
CPU actor, GPU as ``auto`` resolves there, GPU float32) and prints the largest per-text
differences of the mean NLL, the dtypes the models loaded in, and ``models.identity.model_key``
for an actor without and with a GPU.
"""

from __future__ import annotations

import json
import sys
import time


def main(model: str, texts_path: str) -> dict:
    import numpy as np
    import pandas as pd
    import torch

    from mia_ray.actors.scorer import Scorer
    from mia_ray.config import ModelConfig
    from mia_ray.models.identity import model_key, resolved_precision

    texts = json.load(open(texts_path))
    rows = pd.DataFrame({"snippet_id": [f"s{i}" for i in range(len(texts))], "text": texts})
    out: dict = {"n_texts": len(texts), "gpu": torch.cuda.get_device_name(0)}
    losses = {}
    for name, device, dtype in (
        ("cpu_auto", "cpu", "auto"),
        ("gpu_auto", "cuda", "auto"),
        ("gpu_float32", "cuda", "float32"),
    ):
        s = Scorer(model, device=device, dtype=dtype, max_length=256, lowercase=False)
        t0 = time.perf_counter()
        got = pd.concat([s(rows.iloc[i : i + 16]) for i in range(0, len(rows), 16)])
        out[f"{name}_seconds"] = round(time.perf_counter() - t0, 3)
        out[f"{name}_loaded_dtype"] = str(next(s.model.parameters()).dtype)
        losses[name] = got.set_index("snippet_id").loc[rows["snippet_id"], "loss"].to_numpy()
    cpu = losses["cpu_auto"]
    for name in ("gpu_auto", "gpu_float32"):
        d = np.abs(losses[name] - cpu)
        out[f"max_abs_loss_diff_{name}_vs_cpu"] = float(d.max())
        out[f"mean_abs_loss_diff_{name}_vs_cpu"] = float(d.mean())
    cfg = ModelConfig(name_or_path=model)
    out["key_cpu_actor"] = model_key(cfg, False)
    out["key_gpu_actor"] = model_key(cfg, True)
    out["resolved_cpu_actor"] = resolved_precision("auto", "auto", False)
    out["resolved_gpu_actor"] = resolved_precision("auto", "auto", True)
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2]), indent=1))
