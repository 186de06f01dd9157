"""`mia-ray demo`: build (or check) the offline demo world: corpora, split, manifests, targets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mia_ray.config import DemoWorldJobConfig
from mia_ray.registry import pipeline


@pipeline("demo", DemoWorldJobConfig, help="build the offline demo world")
def run(cfg: DemoWorldJobConfig, out_dir: Path) -> dict[str, Any]:
    """Build what is missing for ``cfg.targets`` and summarise the world.

    Trainings run as Ray tasks when the CLI has connected to Ray (each asks for
    ``resources.num_cpus`` CPUs, 0 = a whole node), else in this process.
    """
    from mia_ray.demo.world import ensure_world

    world = ensure_world(cfg.world, list(cfg.targets), num_cpus=cfg.resources.num_cpus)
    meta = json.loads(Path(world["world_json"]).read_text("utf-8"))
    keys = ("steps", "tokens", "final_loss", "elapsed_s", "wall_s", "threads", "weights_sha256")
    return {
        "world": world,
        "scale": meta["scale"],
        "seed": meta["seed"],
        "fingerprint": meta["fingerprint"],
        "sizes": meta["sizes"],
        "split_rule": meta["split_rule"],
        "elapsed_s": meta["elapsed_s"],
        "models": {
            name: {k: step.get(k) for k in keys}
            for name, step in meta["steps"].items()
            if name != "corpora"
        },
    }
