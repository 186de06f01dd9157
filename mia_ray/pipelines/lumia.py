"""LUMIA: membership signal per layer from probes on mean hidden states (González-Manzano et al.).

samples → ActivationReader pool (one forward pass each, mean activation per block, parquet
parts) → per layer, one Ray task training the probes on repeated grouped 80/20 splits →
AUC by layer (mean ± std), best layer l* → the classic attacks and the blind baseline on the
very same test folds → n-gram overlap of members vs non-members → report.

Honest where the public code is not (../shared/methods/README.md): splits are seeded and
grouped by document, and early stopping / model selection use a validation fold carved
from the training part; the test part's labels only score the finished probe.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from mia_ray.config import LumiaJobConfig
from mia_ray.errors import MiaError
from mia_ray.pipelines.common import (
    check_target_early,
    fingerprint,
    labelled_documents,
    log,
    resolve_world,
    snippets_of,
)
from mia_ray.registry import pipeline
from mia_ray.runtime import describe
from mia_ray.stages import parts_stage, reuse_json, save_json

FPR = 0.01  # the report's TPR@FPR point (the paper reports AUC only)


def _image_paths(data_cfg, ids: set[str]) -> dict[str, str]:
    """doc_id -> absolute image path, from the jsonl/parquet records' ``image_field``."""
    from mia_ray.data.readers import resolve_inputs

    root = Path(data_cfg.path).expanduser().resolve()
    fmt, base, files = resolve_inputs(root, data_cfg.format)
    if fmt == "text":
        raise MiaError(
            "a vision-language model needs jsonl or parquet records with an image path "
            f"(field {data_cfg.image_field!r}); {data_cfg.path} is a folder of text files"
        )
    out: dict[str, str] = {}
    for rel, _ in files:
        path = base / rel
        if fmt == "jsonl":
            df = pd.read_json(path, lines=True, dtype=False)
        else:
            df = pd.read_parquet(path)
        for col in (data_cfg.id_field, data_cfg.image_field):
            if col not in df:
                raise MiaError(
                    f"{rel}: records have no {col!r} field (data.id_field / image_field)"
                )
        for doc_id, img in zip(
            df[data_cfg.id_field].astype(str), df[data_cfg.image_field], strict=True
        ):
            if doc_id in ids:
                p = Path(str(img)).expanduser()
                out[doc_id] = str(p if p.is_absolute() else (path.parent / p).resolve())
    missing = sorted(ids - set(out))
    if missing:
        raise MiaError(
            f"sample {missing[0]} has no image"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
        )
    absent = [p for p in out.values() if not Path(p).is_file()]
    if absent:
        raise MiaError(
            f"image not found: {absent[0]}"
            + (f" (and {len(absent) - 1} more)" if len(absent) > 1 else "")
        )
    return out


def _samples(cfg: LumiaJobConfig, multimodal: bool):
    """(samples: snippet_id, doc_id, text [, image], label, sorted by id (pandas); documents)."""

    docs, labels = labelled_documents(cfg.data)
    if multimodal:
        # One sample per record: the text is cropped to the context in the reader.
        meta = docs.select_columns(["doc_id", "text"]).to_pandas()
        meta["snippet_id"] = meta["doc_id"]
        images = _image_paths(cfg.data, set(meta["doc_id"]))
        meta["image"] = meta["doc_id"].map(images)
    else:
        snips = snippets_of(docs, cfg.data, cfg.model.name_or_path)
        meta = snips.select_columns(["snippet_id", "doc_id", "text"]).to_pandas()
    if meta["snippet_id"].duplicated().any():
        raise MiaError("sample ids are not unique: are doc ids unique?")
    meta["label"] = meta["doc_id"].map(labels).astype(int)
    meta = meta.sort_values("snippet_id").reset_index(drop=True)
    return meta, docs


def _extract(
    cfg: LumiaJobConfig, meta: pd.DataFrame, out: Path, token_stats: bool
) -> tuple[list[Path], float, str]:
    """Activation parts, the seconds they took, and the fingerprint they were keyed on.
    With ``token_stats`` the parts also hold the target's token statistics for the classic
    attacks, from the same forward pass (one target pass per sample in all)."""
    import ray

    from mia_ray import storage
    from mia_ray.actors import BATCH
    from mia_ray.actors.activations import ActivationReader
    from mia_ray.models.identity import tree_sha256
    from mia_ray.pipelines.attack import scorer_key
    from mia_ray.runtime import ray_options

    res = cfg.resources
    threads = res.torch_threads or max(1, int(np.ceil(res.cpus_per_actor)))
    fp = fingerprint(
        pd.util.hash_pandas_object(meta[["snippet_id", "text"]], index=False).sum(),
        len(meta),
        # The model by content (retrained in place = new activations), dtype and device.
        scorer_key(cfg.model, res),
        cfg.model.max_length,
        list(meta["image"]) if "image" in meta else None,
        # An image file rewritten under the same name changes the activations too.
        [tree_sha256(p) for p in meta["image"]] if "image" in meta else None,
        token_stats,
    )

    # The model folder and the images are on the driver's disk: the readers get the model
    # through storage and each image's bytes, read on the driver's node (on one node: paths).
    model = storage.stage(cfg.model.name_or_path)
    pinned = storage.node_affinity()

    def mapper(todo):
        cols = ["snippet_id", "text", BATCH] + (["image"] if "image" in meta else [])
        todo = todo.select_columns(cols)
        if "image" in meta and pinned:
            todo = todo.map_batches(_read_images, batch_format="pandas", **pinned)
        return todo.map_batches(
            ActivationReader,
            fn_constructor_kwargs={
                "model": model,
                "device": cfg.model.device,
                "dtype": cfg.model.dtype,
                "max_length": cfg.model.max_length,
                "revision": cfg.model.revision,
                "trust_remote_code": cfg.model.trust_remote_code,
                "torch_threads": threads,
                "token_stats": token_stats,
            },
            batch_size=None,  # whole blocks of whole model batches (model_blocks)
            batch_format="pandas",
            compute=ray.data.ActorPoolStrategy(size=res.scorer_actors),
            **ray_options(res, res.cpus_per_actor, res.gpus_per_actor),
        )

    t0 = time.time()
    cols = ["snippet_id", "text"] + (["image"] if "image" in meta else [])
    parts = parts_stage(
        out, "activations", fp, meta[cols], mapper, cfg.model.batch_size, load=False
    )
    return parts, time.time() - t0, fp


def _read_images(batch: pd.DataFrame) -> pd.DataFrame:
    """The ``image`` column's paths -> the files' bytes (in a task on the driver's node)."""
    return batch.assign(image=[Path(p).read_bytes() for p in batch["image"]])


def _probe_task(X, y, groups, splits, kinds, seed, val_fraction, mlp_params):
    from mia_ray.detectors.probes import probe_layer

    return probe_layer(
        X,
        y,
        groups,
        splits,
        kinds=kinds,
        fprs=(FPR,),
        val_fraction=val_fraction,
        seed=seed,
        mlp_params=mlp_params,
    )


def _train_probes(
    cfg: LumiaJobConfig, parts: list[Path], meta: pd.DataFrame, splits, out: Path, fp: str
) -> tuple[dict[str, dict], float]:
    """Per layer column, the probe results (``probe_layer``'s dict); cached per layer."""
    import pyarrow.parquet as pq
    import ray

    from mia_ray.actors.activations import load_layer, parse_column
    from mia_ray.runtime import ray_options

    names = [c for c in pq.read_schema(parts[0]).names if parse_column(c)]
    names.sort(key=lambda c: (parse_column(c)[0] != "vision", parse_column(c)))
    p = cfg.probe
    mlp_params = {
        "hidden": p.hidden,
        "dropout": p.dropout,
        "lr": p.lr,
        "max_epochs": p.max_epochs,
        "patience": p.patience,
        "batch_size": p.batch_size,
    }
    y = meta["label"].to_numpy()
    groups = meta["doc_id"].to_numpy()
    order = pd.Series(np.arange(len(meta)), index=meta["snippet_id"])
    # Each task gets its layer's arrays (object store) and returns its result: no files.
    task = ray.remote(_probe_task).options(**ray_options(cfg.resources, p.cpus_per_task))
    results: dict[str, dict] = {}
    pending: dict[Any, str] = {}
    t0 = time.time()
    for name in names:
        got = reuse_json(out, f"probes/{name}", fp)
        if got is not None:
            results[name] = got
            continue
        ids, X = load_layer(parts, name)
        if len(ids) != len(meta) or set(ids) != set(meta["snippet_id"]):
            raise MiaError(f"activations of {len(ids)} samples for {len(meta)} samples: rerun")
        X = X[np.argsort(order[ids].to_numpy())]  # rows in meta's (sorted id) order
        ref = task.remote(
            ray.put(X), y, groups, splits, list(p.kinds), p.seed, p.val_fraction, mlp_params
        )
        pending[ref] = name
        if not p.parallel:
            _collect(pending, results, out, fp, len(names))
    while pending:
        _collect(pending, results, out, fp, len(names))
    if len(results) < len(names):
        raise MiaError("probe training lost layers: rerun to resume")
    log(f"probes: {len(names)} layers done in {time.time() - t0:.1f} s")
    return {n: results[n] for n in names}, time.time() - t0


def _collect(pending: dict, results: dict, out: Path, fp: str, total: int) -> None:
    """The next finished layer's probes, kept as the stage ``probes/<layer>``."""
    import ray

    ready, _ = ray.wait(list(pending), num_returns=1)
    for ref in ready:
        name = pending.pop(ref)
        results[name] = save_json(out, f"probes/{name}", fp, ray.get(ref))
        log(f"probes: {len(results)}/{total} layers ({name})")


def _fold_metrics(scores, y: np.ndarray, splits) -> dict[str, Any]:
    """AUC and TPR@1%FPR on each repeat's test part: mean and std over repeats. ``scores``:
    one (n,) array for every repeat, or a list of (n,) arrays, one per repeat."""
    from mia_ray.stats.metrics import roc_auc, tpr_at_fpr

    per = scores if isinstance(scores, list) else [scores] * len(splits)
    tests = [test for _, test in splits]
    aucs = [roc_auc(s[t], y[t]) for s, t in zip(per, tests, strict=True)]
    tprs = [tpr_at_fpr(s[t], y[t], FPR) for s, t in zip(per, tests, strict=True)]
    return {
        "auc": float(np.mean(aucs)),
        "auc_std": float(np.std(aucs, ddof=1)) if len(aucs) > 1 else 0.0,
        "auc_repeats": [float(a) for a in aucs],
        "tpr_at_1pct_fpr": float(np.mean(tprs)),
    }


def _baseline_attacks(cfg: LumiaJobConfig) -> list[str]:
    return [a for a in cfg.attacks if a != "ref" or cfg.model.reference]


def _baselines(
    cfg: LumiaJobConfig, meta: pd.DataFrame, splits, out: Path, parts: list[Path]
) -> dict[str, dict]:
    """The classic attacks on the same samples and folds: the target's token statistics from
    the activation pass (``parts``), the reference model's loss from its own Scorer pass."""
    from mia_ray.features.attacks import score_table, stats_from_columns
    from mia_ray.pipelines.attack import score_pool, scorer_key

    attacks = _baseline_attacks(cfg)
    if not attacks:
        return {}
    cols = ["snippet_id", "token_logprobs", "mu", "sigma"]
    target = pd.concat([pd.read_parquet(p, columns=cols) for p in parts], ignore_index=True)
    m = meta[["snippet_id", "text"]].merge(target, on="snippet_id", validate="one_to_one")
    ref_loss = None
    if "ref" in attacks:
        log(f"scoring with reference {cfg.model.reference}")
        texts = meta[["snippet_id", "text"]]
        fp = fingerprint(
            pd.util.hash_pandas_object(texts, index=False).sum(),
            len(texts),
            cfg.model.max_length,
            scorer_key(cfg.model, cfg.resources, cfg.model.reference),
        )
        ref = score_pool(
            texts, cfg.model, cfg.resources, cfg.model.reference, "ref_", False, False,
            out / "rows" / "reference", fp,
        )  # fmt: skip
        m = m.merge(ref[["snippet_id", "ref_loss"]], on="snippet_id", validate="one_to_one")
        ref_loss = m["ref_loss"]
    if len(m) != len(meta):
        raise MiaError(f"scored {len(m)} of {len(meta)} samples: results are missing")
    stats = stats_from_columns(m["text"], m["token_logprobs"], m["mu"], m["sigma"], None, ref_loss)
    table = score_table(stats, attacks, [cfg.min_k_ratio], cfg.min_k_ratio)
    y = meta["label"].to_numpy()
    return {a: _fold_metrics(np.asarray(table[a], dtype=float), y, splits) for a in attacks}


def _blind(meta: pd.DataFrame, splits, seed: int) -> dict[str, Any]:
    """The blind bag-of-words baseline, trained on each repeat's training part."""
    from mia_ray.detectors.blind import BlindBagOfWords

    texts = meta["text"].astype(str).tolist()
    y = meta["label"].to_numpy()
    per_repeat = []
    for train, test in splits:
        model = BlindBagOfWords(seed=seed).fit([texts[i] for i in train], y[train])
        s = np.full(len(meta), np.nan)
        s[test] = model.score_samples([texts[i] for i in test])
        per_repeat.append(s)
    return {
        **_fold_metrics(per_repeat, y, splits),
        "method": "tfidf+logreg trained on each repeat's training part, scored on its test part",
    }


def _layer_rows(results: dict[str, dict]) -> list[dict]:
    from mia_ray.actors.activations import parse_column
    from mia_ray.detectors.probes import summarize_layer

    rows = []
    for name, res in results.items():
        part, layer = parse_column(name)
        for kind, summary in summarize_layer(res, fpr=FPR).items():
            rows.append(
                {
                    "part": part,
                    "probe": kind,
                    "layer": layer,
                    **summary,
                    "auc_repeats": [float(a) for a in res[kind]["auc"]],
                }
            )
    return rows


def _score_rows(results: dict[str, dict], meta: pd.DataFrame) -> pd.DataFrame:
    """Every test-part score of every probe: one row per (part, layer, probe, repeat, sample)."""
    from mia_ray.actors.activations import parse_column

    frames = []
    for name, res in results.items():
        part, layer = parse_column(name)
        for kind, r in res.items():
            for rep, (idx, scores) in enumerate(
                zip(r["test_index"], r["test_scores"], strict=True)
            ):
                frames.append(
                    pd.DataFrame(
                        {
                            "snippet_id": meta["snippet_id"].to_numpy()[idx],
                            "part": part,
                            "layer": layer,
                            "probe": kind,
                            "repeat": rep,
                            "score": scores,
                            "label": meta["label"].to_numpy()[idx],
                        }
                    )
                )
    return pd.concat(frames, ignore_index=True)


def _best(rows: list[dict]) -> tuple[dict, list[dict]]:
    """l* per (part, probe) and overall, chosen by the validation AUC (mean over repeats):
    picking the layer with the highest test AUC would select on the test part."""
    keys = ("part", "probe", "layer", "auc_mean", "auc_std", "tpr_at_1pct_fpr", "val_auc_mean")
    best_per: dict[tuple, dict] = {}
    for r in rows:
        k = (r["part"], r["probe"])
        # Ties go to the shallower layer: the earliest depth at which the signal is there.
        if k not in best_per or r["val_auc_mean"] > best_per[k]["val_auc_mean"]:
            best_per[k] = r
    best_layers = [{k: r[k] for k in keys} for r in best_per.values()]
    best = max(best_layers, key=lambda r: r["val_auc_mean"])
    return best, best_layers


def _comparison(best: dict, baselines: dict, blind: dict | None) -> list[dict]:
    """Paper Tables 1–2: improvement = (LUMIA - method) / method, in percent."""
    rows = []
    for name, m in [*baselines.items(), *([("blind", blind)] if blind else [])]:
        rows.append(
            {
                "method": name,
                "method_auc": m["auc"],
                "lumia_auc": best["auc_mean"],
                "improvement_pct": 100.0 * (best["auc_mean"] - m["auc"]) / m["auc"],
            }
        )
    return rows


def _run_target(cfg: LumiaJobConfig, name: str, out: Path) -> dict[str, Any]:
    from mia_ray.data.ngram import ngram_overlap_ds
    from mia_ray.detectors.probes import grouped_holdout_splits
    from mia_ray.models.hf import is_vision_language
    from mia_ray.reports.io import write_parquet

    resolve_world(cfg)
    check_target_early(cfg.model)
    multimodal = is_vision_language(
        cfg.model.name_or_path, cfg.model.revision, cfg.model.trust_remote_code
    )
    log(f"[{name}] model {cfg.model.name_or_path}" + (" (vision-language)" if multimodal else ""))
    meta, docs = _samples(cfg, multimodal)
    n_mem = int(meta["label"].sum())
    log(f"[{name}] {len(meta)} samples from {meta['doc_id'].nunique()} documents: {n_mem} members")
    y, groups = meta["label"].to_numpy(), meta["doc_id"].to_numpy()
    p = cfg.probe
    splits = grouped_holdout_splits(
        y, groups, n_repeats=p.repeats, test_size=p.test_size, seed=p.seed
    )

    from mia_ray.pipelines.attack import crop_to_scored_span

    stats = not multimodal and bool(_baseline_attacks(cfg))
    if stats and "ref" in cfg.attacks and cfg.model.reference:
        # Both models score the same text: the span that fits either one's context.
        meta, n_cropped = crop_to_scored_span(meta, cfg.model, True)
        if n_cropped:
            log(f"[{name}] {n_cropped} of {len(meta)} samples cut to the text both models score")
    parts, t_extract, act_fp = _extract(cfg, meta, out, stats)
    probe_fp = fingerprint(
        [pd.read_parquet(f, columns=["snippet_id"]).shape[0] for f in parts],
        list(meta["snippet_id"]),
        meta["label"].tolist(),
        list(meta["doc_id"]),
        act_fp,  # new activations (another model, dtype, texts) retrain every probe
        # How the probes are scheduled does not change them: not part of the fingerprint.
        {k: v for k, v in vars(p).items() if k not in ("parallel", "cpus_per_task")},
    )
    results, t_probe = _train_probes(cfg, parts, meta, splits, out, probe_fp)
    rows = sorted(
        _layer_rows(results),
        key=lambda r: (r["part"] != "vision", r["part"], r["probe"], r["layer"]),
    )
    best, best_layers = _best(rows)
    log(
        f"[{name}] best layer: {best['part']} {best['layer']} ({best['probe']}) "
        f"AUC {best['auc_mean']:.3f} ± {best['auc_std']:.3f}"
    )

    t1 = time.time()
    notes = []
    baselines: dict[str, dict] = {}
    if multimodal:
        notes.append(
            "The classic attacks score text continuations; for a vision-language model they are "
            "not computed here, only the blind baseline."
        )
    else:
        if "ref" in cfg.attacks and not cfg.model.reference:
            notes.append("The reference attack was skipped: no model.reference was given.")
        baselines = _baselines(cfg, meta, splits, out, parts)
    blind = _blind(meta, splits, cfg.eval.seed) if cfg.eval.blind_baseline else None
    members = docs.filter(lambda r: r["label"] == 1)
    nonmembers = docs.filter(lambda r: r["label"] == 0)
    ngram = [ngram_overlap_ds(members, nonmembers, n, cfg.eval.ngram_p) for n in cfg.eval.ngram_n]
    t_base = time.time() - t1

    write_parquet(out / "layers.parquet", pd.DataFrame(rows))
    write_parquet(out / "probe_scores.parquet", _score_rows(results, meta))
    write_parquet(out / "samples.parquet", meta.drop(columns=["text"]))
    n_test_non = min(int((y[test] == 0).sum()) for _, test in splits)
    notes += _notes(cfg, meta, n_test_non, rows, best, baselines, blind)
    return {
        "target": name,
        "model": {
            "name_or_path": cfg.model.name_or_path,
            "reference": cfg.model.reference or None,
            "multimodal": multimodal,
        },
        "data": {
            "path": cfg.data.path,
            "labels": cfg.data.labels or None,
            "n_samples": len(meta),
            "n_members": n_mem,
            "n_nonmembers": len(meta) - n_mem,
            "n_documents": int(meta["doc_id"].nunique()),
            "sample": "one record (image + text)"
            if multimodal
            else f"{cfg.data.snippet_size} {cfg.data.snippet_unit}",
            "max_length": cfg.model.max_length,
        },
        "probe": {
            "kinds": list(p.kinds),
            "repeats": p.repeats,
            "test_size": p.test_size,
            "val_fraction": p.val_fraction,
            "mlp": {
                "hidden": p.hidden,
                "dropout": p.dropout,
                "lr": p.lr,
                "max_epochs": p.max_epochs,
                "patience": p.patience,
                "batch_size": p.batch_size,
                "optimizer": "Adam",
            },
            "seed": p.seed,
        },
        "layers": rows,
        "best_layer": best,
        "best_layers": best_layers,
        "baselines": baselines,
        "blind_baseline": blind,
        "comparison": _comparison(best, baselines, blind),
        "ngram_overlap": ngram,
        "notes": notes,
        "timings": {
            "extract_s": round(t_extract, 2),
            "probe_s": round(t_probe, 2),
            "baseline_s": round(t_base, 2),
            "samples_per_s": round(len(meta) / max(t_extract, 1e-9), 2),
        },
    }


def _notes(cfg, meta, n_test_non, rows, best, baselines, blind) -> list[str]:
    p = cfg.probe
    notes = [
        f"Each sample is cropped to {cfg.model.max_length} tokens (or the model's context); its "
        "activation at a layer is the block output averaged over its real tokens.",
        f"{p.repeats} seeded {1 - p.test_size:.0%}/{p.test_size:.0%} splits, stratified and grouped "
        "by document: no document has samples on both sides. Early stopping (MLP) and the choice "
        f"of C (logistic regression) use a {p.val_fraction:.0%} validation fold of the training "
        "part; the test part only scores the finished probe. AUC is the mean ± std over repeats.",
        "The attacks and the blind baseline are scored on the same test parts and averaged alike.",
    ]
    if n_test_non < 100:
        notes.append(
            f"A test part holds as few as {n_test_non} non-members: TPR at 1% FPR is then the TPR "
            "with no false positive at all."
        )
    top = max(rows, key=lambda r: r["auc_mean"])
    if top["auc_mean"] > best["auc_mean"]:
        notes.append(
            f"The best layer is chosen by validation AUC ({best['part']} layer {best['layer']}, "
            f"{best['probe']}: test AUC {best['auc_mean']:.3f}). The highest test AUC of any "
            f"layer, {top['auc_mean']:.3f} ({top['part']} layer {top['layer']}, {top['probe']}), "
            "is not reported as LUMIA's: picking it would select on the test part."
        )
    if blind and best["auc_mean"] <= blind["auc"] + blind["auc_std"]:
        notes.append(
            f"Caution: the best layer (AUC {best['auc_mean']:.3f}) does not clearly beat the blind "
            f"baseline (AUC {blind['auc']:.3f}); members and non-members may differ in distribution."
        )
    if baselines:
        top = max(baselines.items(), key=lambda kv: kv[1]["auc"])
        if top[1]["auc"] > best["auc_mean"]:
            notes.append(
                f"The {top[0]} attack (AUC {top[1]['auc']:.3f}) beats the best probe "
                f"(AUC {best['auc_mean']:.3f}) on this model and data."
            )
    return notes


@pipeline("lumia", LumiaJobConfig, help="LUMIA: membership signal per layer from linear probes")
def run(cfg: LumiaJobConfig, out: Path) -> dict:
    from mia_ray.reports.io import write_json
    from mia_ray.reports.lumia import render_lumia_report

    targets = list(cfg.targets) or [cfg.world.target]
    runs = []
    for t in targets:
        tcfg = copy.deepcopy(cfg)
        tcfg.world.target = t
        name = t or Path(cfg.model.name_or_path.rstrip("/")).name or "model"
        runs.append(_run_target(tcfg, name, out / name))
    report: dict[str, Any] = {
        "pipeline": "lumia",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "targets": [r["target"] for r in runs],
        **runs[0],
        "runs": runs,
        "runtime": describe(),
    }
    write_json(out / "report.json", report)
    render_lumia_report(report, out / "report.html")
    return report
