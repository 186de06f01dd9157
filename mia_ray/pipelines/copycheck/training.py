"""CopyCheck's fine-tunes: one job per member and experiment, trained as Ray Tune trials (``train.launch``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from mia_ray.data.snippets import text_key
from mia_ray.pipelines.common import fingerprint, log
from mia_ray.pipelines.copycheck.config import CopyCheckJobConfig


def member_names(cfg: CopyCheckJobConfig) -> list[str]:
    out = []
    if "mcd" in cfg.uncertainty.samplers:
        out.append("mcd")
    if "blob" in cfg.uncertainty.samplers:
        out.append("blob")
    if "ensemble" in cfg.uncertainty.samplers:
        out += [f"ens-{i}" for i in range(cfg.uncertainty.ensemble_size)]
    return out


def finetune_jobs(cfg: CopyCheckJobConfig, exps: list[dict], snippets: pd.DataFrame, out: Path):
    """Write each experiment's training snippets; return one job per (experiment, member).

    A job's fingerprint (its stage marker's key) covers what decides the adapter: the training
    snippets and pseudo-labels, the member and its seed, the recipe, the base model by
    content with its dtype and device, and the data-parallel worker count (steps, BLoB's pi)."""
    from dataclasses import asdict

    from mia_ray.models.identity import model_key
    from mia_ray.reports.io import write_parquet
    from mia_ray.train.copycheck import member_seed

    base_key = model_key(cfg.model, cfg.resources.trainer.gpus > 0)
    jobs = []
    for e in exps:
        part = snippets[snippets["doc_id"].isin(e["pseudo_label"].keys())].copy()
        part["label"] = part["doc_id"].map(e["pseudo_label"]).astype(int)
        edir = out / "train" / e["name"]
        edir.mkdir(parents=True, exist_ok=True)
        train_file = edir / "snippets.parquet"
        write_parquet(train_file, part[["snippet_id", "doc_id", "text", "label"]])
        n1 = int(part["label"].sum())
        log(f"{e['name']}: fine-tuning set of {len(part)} snippets ({n1} labelled 1)")
        data_fp = fingerprint(text_key(part), part["label"].tolist())
        for member in member_names(cfg):
            spec = asdict(cfg.finetune)
            jobs.append(
                {
                    "experiment": e["name"],
                    "member": member,
                    "base": cfg.model.name_or_path,
                    "train_file": str(train_file),
                    "out_dir": str(edir / member),
                    "spec": spec,
                    "device": cfg.model.device,
                    "dtype": cfg.model.dtype,
                    "fingerprint": fingerprint(
                        data_fp,
                        member,
                        member_seed(member, cfg.finetune.seed),
                        spec,
                        base_key,
                        cfg.resources.trainer.workers,
                        # A ZeRO config by content, not by its path (no part when unset, so
                        # other members keep their keys).
                        *([Path(spec["deepspeed"]).read_text()] if spec.get("deepspeed") else []),
                    ),
                }
            )
    return jobs


def finetune_members(cfg: CopyCheckJobConfig, exps: list[dict], snippets: pd.DataFrame, out: Path):
    from mia_ray.train.launch import train_members

    jobs = finetune_jobs(cfg, exps, snippets, out)
    tr = cfg.resources.trainer
    records = train_members(
        jobs,
        out / "tune",
        cpus=tr.cpus,
        gpus=tr.gpus,
        workers=tr.workers,
        max_concurrent=tr.concurrent,
        log=log,
        res_cfg=cfg.resources,
    )
    return jobs, records
