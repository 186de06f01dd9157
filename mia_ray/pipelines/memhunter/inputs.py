"""MemHunter's inputs: the demo world, the member and non-member (x, y) pairs, the resources the pools need."""

from __future__ import annotations

import pandas as pd

from mia_ray.data.inputs import labelled_documents
from mia_ray.errors import MiaError
from mia_ray.pipelines.common import (
    check_model_early,
    check_target_early,
    fill_from_world,
    log,
    resolved,
)
from mia_ray.pipelines.memhunter.config import MemHunterJobConfig


def resolve_inputs(cfg: MemHunterJobConfig) -> MemHunterJobConfig:
    """Demo world: target, its reference and data from ``world.target``; the hunter defaults
    to the world's tiny-ref, a small GPT trained only on the reference pool (never on members).
    Returns the resolved copy (a config without a world target as it is)."""
    target = cfg.world.target
    if not target:
        return cfg
    import copy

    from mia_ray.demo.world import ensure_world

    cfg = copy.deepcopy(cfg)
    log(f"demo world at {cfg.world.resolved_root()} (target {target})")
    info = ensure_world(cfg.world, [target, "tiny"])
    fill_from_world(cfg, {**info["targets"][target], "documents": info["documents"]})
    cfg.hunter.model = cfg.hunter.model or info["targets"]["tiny"]["reference"]
    return resolved(cfg)


def check_models(cfg: MemHunterJobConfig) -> None:
    """The target and the hunter load, before any work (see ``check_target_early``)."""
    check_target_early(cfg.model)
    check_model_early(cfg.hunter.model, "hunter.model")


def read_pairs(cfg: MemHunterJobConfig, tok) -> tuple[pd.DataFrame, dict[int, list[str]]]:
    """Member pairs split train/test/val by document, plus non-member pairs (split
    ``nonmember``), each split cut to ``pairs.max_per_split`` (first ids); and the documents'
    texts by label (1: the target dataset, 0: outside it)."""
    from mia_ray.data.pairs import make_pairs, split_pairs

    ds, labels = labelled_documents(cfg.data)
    docs = ds.select_columns(["doc_id", "text"]).to_pandas().sort_values("doc_id")
    p = cfg.pairs
    rows = []
    for label in (1, 0):
        part = docs[docs["doc_id"].map(labels) == label]
        pairs = make_pairs(
            zip(part["doc_id"], part["text"], strict=True),
            tok,
            p.prefix_tokens,
            p.target_tokens,
            p.per_doc,
        )
        if label == 1:
            pairs = split_pairs(pairs, tuple(p.splits), p.seed)
        else:
            pairs["split"] = "nonmember"
        rows.append(pairs)
    pairs = pd.concat(rows, ignore_index=True).sort_values("pair_id", kind="stable")
    if p.max_per_split:
        pairs = pairs.groupby("split", sort=False).head(p.max_per_split)
    by_label = {
        y: docs.loc[docs["doc_id"].map(labels) == y, "text"].astype(str).tolist() for y in (1, 0)
    }
    return pairs.reset_index(drop=True), by_label


def check_resources(cfg: MemHunterJobConfig) -> None:
    """The target actors stay up while the hunter's fine-tune task runs: both must fit at once,
    or the fine-tune would wait for CPUs forever."""
    import ray

    res = cfg.resources
    total, where = ray.cluster_resources(), "Ray has"
    custom = res.custom_resources
    if custom:  # only the nodes that hold resources.custom_resources take the work
        total, where = {}, "the nodes with resources.custom_resources have"
        for n in ray.nodes():
            own = n.get("Resources", {})
            if n.get("Alive") and all(own.get(k, 0) >= v for k, v in custom.items()):
                for kind in ("CPU", "GPU"):
                    total[kind] = total.get(kind, 0) + own.get(kind, 0)
    sc, tr = res.scorer, res.trainer
    for kind, per_actor, train in (("CPU", sc.cpus, tr.cpus), ("GPU", sc.gpus, tr.gpus)):
        need = sc.actors * per_actor + train
        if need > total.get(kind, 0) + 1e-9:
            word = "cpus" if kind == "CPU" else "gpus"
            raise MiaError(
                f"resources: {sc.actors} target actors x {per_actor:g} {kind}s + "
                f"the hunter's fine-tune ({train:g}) need {need:g} {kind}s, but {where} "
                f"{total.get(kind, 0):g}: lower resources.scorer.actors, "
                f"resources.scorer.{word} or resources.trainer.{word}"
            )
