"""CopyCheck's inputs: the files of each experiment (suspected, surely unseen, their pseudo-labels) and their snippets."""

from __future__ import annotations

from typing import Any

import pandas as pd

from mia_ray.data.inputs import snippets_of
from mia_ray.errors import MiaError
from mia_ray.pipelines.copycheck.config import CopyCheckJobConfig


def read_side(path: str, data_cfg, prefix: str = "") -> pd.DataFrame:
    from mia_ray.data.readers import read_documents

    ds = read_documents(
        path,
        format=data_cfg.format,
        text_field=data_cfg.text_field,
        id_field=data_cfg.id_field,
        label_field=data_cfg.label_field,
        date_field=data_cfg.date_field,
        subset=data_cfg.subset,
        split=data_cfg.split,
    )
    df = ds.select_columns(["doc_id", "text"]).to_pandas()
    df["doc_id"] = prefix + df["doc_id"].astype(str)
    return df


def experiments_of(cfg: CopyCheckJobConfig) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """Documents (doc_id, text) and the experiments: name, n_unseen, suspected, unseen,
    pseudo_label, truth (empty when unknown)."""
    from mia_ray.data.readers import load_manifest
    from mia_ray.data.splits import copycheck_experiment

    ex = cfg.experiment
    if ex.mode == "audit":
        sus = read_side(ex.suspected, cfg.data, "suspected/")
        uns = read_side(ex.unseen, cfg.data, "unseen/")
        truth: dict[str, int] = {}
        if cfg.data.labels:
            known = load_manifest(cfg.data.labels)
            truth = {
                d: int(known[d.split("/", 1)[1]])
                for d in sus["doc_id"]
                if d.split("/", 1)[1] in known
            }
            truth |= {d: 0 for d in uns["doc_id"]}
        pseudo = {d: 1 for d in sus["doc_id"]} | {d: 0 for d in uns["doc_id"]}
        n_true_unseen = (
            sum(1 for d in sus["doc_id"] if truth.get(d) == 0) if len(truth) > len(uns) else None
        )
        exps = [
            {
                "name": "audit",
                "n_unseen": n_true_unseen,
                "suspected": sorted(sus["doc_id"]),
                "unseen": sorted(uns["doc_id"]),
                "pseudo_label": pseudo,
                "truth": truth,
            }
        ]
        return pd.concat([sus, uns], ignore_index=True), exps
    if not cfg.data.labels:
        raise MiaError("a sweep needs membership labels: set data.labels (doc_id -> 0/1 manifest)")
    docs = read_side(cfg.data.path, cfg.data)
    labels = load_manifest(cfg.data.labels)
    if ex.source:  # one source (the demo world's sweep: its books, as in the paper)
        docs = docs[docs["doc_id"].str.startswith(ex.source + "/")]
    docs = docs[docs["doc_id"].isin(labels.keys())].reset_index(drop=True)
    seen = [d for d in docs["doc_id"] if labels[d] == 1]
    unseen = [d for d in docs["doc_id"] if labels[d] == 0]
    exps = []
    for n in ex.n_unseen_in_suspected:
        split = copycheck_experiment(seen, unseen, ex.n_suspected, n, ex.n_unseen, seed=ex.seed)
        exps.append(
            {
                "name": f"n{n}",
                "n_unseen": n,
                "suspected": split.suspected,
                "unseen": split.unseen,
                "pseudo_label": split.pseudo_label,
                "truth": split.truth,
            }
        )
    return docs, exps


def snippets_for(cfg: CopyCheckJobConfig, docs: pd.DataFrame) -> pd.DataFrame:
    """Snippets (snippet_id, doc_id, text) of the documents, sorted by snippet id."""
    import ray

    snip = snippets_of(
        ray.data.from_pandas(docs[["doc_id", "text"]]), cfg.data, cfg.model.name_or_path
    )
    df = snip.select_columns(["snippet_id", "doc_id", "text"]).to_pandas()
    if df["snippet_id"].duplicated().any():
        raise MiaError("snippet ids are not unique: are document ids unique?")
    return df.sort_values("snippet_id").reset_index(drop=True)
