"""Attack scores: snippets through Scorer actor pools (target, reference) as parts stages, then every attack's score per snippet and per document."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd

from mia_ray.data.inputs import labelled_documents, snippets_of
from mia_ray.errors import MiaError
from mia_ray.log import log
from mia_ray.scoring.config import Scoring
from mia_ray.scoring.pools import score_pool


def crop_to_scored_span(
    snip_meta: pd.DataFrame, model_cfg, with_reference: bool
) -> tuple[pd.DataFrame, int]:
    """Each snippet's ``text`` cut to what the first ``model.max_length`` tokens of the target
    (and of the reference, when it scores too) cover, capped at each model's context: every
    model and zlib then score the same characters. Returns the new frame and how many
    snippets were cut."""
    from mia_ray.models.hf import load_tokenizer
    from mia_ray.models.spans import common_prefix, context_limit

    m = model_cfg
    specs = [(m.name_or_path, m.revision, m.gguf_file)]
    if with_reference:
        specs.append((m.reference, "", ""))
    toks = [
        (
            load_tokenizer(name, rev, m.trust_remote_code, gguf),
            context_limit(name, m.max_length, rev, m.trust_remote_code, gguf),
        )
        for name, rev, gguf in specs
    ]
    before = snip_meta["text"].astype(str).str.len()
    out = snip_meta.copy()
    out["text"] = common_prefix(out["text"].tolist(), toks)
    return out, int((out["text"].str.len() < before).sum())


def aggregate_scores(snip: pd.DataFrame, cols: list[str], how: str) -> pd.DataFrame:
    return snip.groupby("doc_id")[cols].agg(how).reset_index()


def score_attacks(
    cfg: Scoring,
    out: Path,
    docs=None,
    labels: dict[str, int] | None = None,
    snippets: pd.DataFrame | None = None,
    prefixes: dict[str, str] | None = None,
    reference_features: bool = False,
) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Snippet-level and document-level attack scores; also returns the labels and timings.

    ``docs`` (a Ray Dataset with doc_id, text) and ``labels`` (doc_id -> 0/1) are read from
    ``cfg.data`` unless given; ``snippets`` (snippet_id, doc_id, text), when given, are scored
    as they are instead of the snippets ``cfg.data`` cuts from ``docs``; ``prefixes``, when
    given, are ReCaLL's and Con-ReCall's (else made from ``cfg.attack.recall``).

    ``reference_features``: the reference model's own scores for the same attacks on the same
    snippets too (``ctx["reference_scores"]``: snippet_id and one column per score, under the
    target's names; :func:`reference_job` says which attacks), every pass of it a resumable
    stage under ``out/reference``; its plain pass gives the ``ref`` attack its losses.
    """
    from mia_ray.features.attacks import passes_of
    from mia_ray.scoring.passes import recall_prefixes, run_passes

    t0 = time.time()
    docs, labels, snip_meta = _snippets_of_job(cfg, docs, labels, snippets)
    t_data = time.time() - t0

    attacks = list(cfg.attack.attacks)
    need = passes_of(attacks)
    held: dict[str, list[str]] = {}
    if prefixes is None:
        prefixes, held = recall_prefixes(cfg, need, snip_meta, labels)
    gone = {d for ids in held.values() for d in ids}
    if gone:
        snip_meta = snip_meta[~snip_meta["doc_id"].isin(gone)].reset_index(drop=True)
        labels = {d: y for d, y in labels.items() if d not in gone}
        if docs is not None:
            docs = docs.filter(lambda r: r["doc_id"] not in gone)
    both = "ref" in attacks or reference_features
    snip_meta, n_cropped = crop_to_scored_span(snip_meta, cfg.model, both)
    if n_cropped:
        log(
            f"{n_cropped} of {len(snip_meta)} snippets cut to the text that fits "
            f"model.max_length tokens of {'both models' if both else 'the model'}"
        )
    # (Scored rows are reused only for the very same cropped texts: the stages' keys.)
    scored = snip_meta[["snippet_id", "text"]]
    t1 = time.time()
    ref_scores, ref_loss, ref_seconds = None, None, {}
    if reference_features:
        ref_scores, ref_loss, ref_seconds = _reference_scores(cfg, snip_meta, out, prefixes, labels)
    merged, seconds = _forward_passes(cfg, snip_meta, out / "rows", ref_loss)
    seconds.update({k if k == "reference" else f"reference {k}": v for k, v in ref_seconds.items()})
    extra = run_passes(cfg, need, merged, out, prefixes, seconds)
    t_score = time.time() - t1
    snip_scores, doc_scores, score_cols = _score_frames(cfg, merged, extra, labels)
    timings = {
        "data_s": round(t_data, 2),
        "score_s": round(t_score, 2),
        "n_snippets": len(snip_meta),
        "n_cropped": n_cropped,
    }
    return (
        snip_scores,
        doc_scores,
        {
            "labels": labels,
            "timings": timings,
            "snippets": scored,
            # The target's rows (loss, token log-probs, vocabulary moments) by snippet, with
            # their text: a method run on the same snippets reuses them (audit.methods).
            "target_rows": merged.drop(columns=["ref_loss"], errors="ignore"),
            "docs": docs,
            "score_cols": score_cols,
            "passes": need,
            "pass_seconds": seconds,
            "held_out": held,
            "prefixes": prefixes,
            "reference_scores": ref_scores,
        },
    )


def _reference_scores(cfg: Scoring, snip_meta, out: Path, prefixes, labels):
    """The reference's scores of the snippets for :func:`reference_job`'s attacks (snippet_id
    and one column per score), its losses for the ``ref`` attack and each pass's seconds."""
    from mia_ray.features.attacks import passes_of
    from mia_ray.scoring.passes import run_passes

    rcfg = reference_job(cfg)
    log(f"the reference {cfg.model.reference} scores the same snippets with the same attacks")
    rmerged, seconds = _forward_passes(rcfg, snip_meta, out / "reference" / "rows",
                                       name="reference")  # fmt: skip
    rextra = run_passes(rcfg, passes_of(rcfg.attack.attacks), rmerged, out / "reference",
                        prefixes, seconds, label="reference ")  # fmt: skip
    rs, _, rcols = _score_frames(rcfg, rmerged, rextra, labels)
    ref_loss = rmerged[["snippet_id", "loss"]].rename(columns={"loss": "ref_loss"})
    return rs[["snippet_id", *rcols]], ref_loss, seconds


def reference_job(cfg: Scoring) -> Scoring:
    """``cfg`` with the reference as its model and the attacks the reference can score as a
    target would: all but ``ref`` (itself) and SaMIA (its samples may come from an API or a
    server of the target)."""
    import copy

    rcfg = copy.deepcopy(cfg)
    m = rcfg.model
    m.name_or_path, m.revision, m.gguf_file, m.reference = m.reference, "", "", ""
    rcfg.attack.attacks = [a for a in cfg.attack.attacks if a not in ("ref", "samia")]
    return rcfg


def _snippets_of_job(cfg: Scoring, docs, labels, snippets):
    """The documents, labels and (snippet_id, doc_id, text) the job scores."""
    if docs is None and snippets is None:
        docs, labels = labelled_documents(cfg.data)
        n_mem = sum(labels.values())
        log(f"{len(labels)} documents: {n_mem} members, {len(labels) - n_mem} non-members")
    if snippets is None:
        cut = snippets_of(docs, cfg.data, cfg.model.name_or_path).materialize()
        snip_meta = cut.select_columns(["snippet_id", "doc_id", "text"]).to_pandas()
    else:
        snip_meta = snippets[["snippet_id", "doc_id", "text"]].reset_index(drop=True)
    if snip_meta["snippet_id"].duplicated().any():
        raise MiaError("snippet ids are not unique: are doc ids unique?")
    log(f"{len(snip_meta)} snippets ({cfg.data.snippet_size} {cfg.data.snippet_unit} max)")
    return docs, labels, snip_meta


def _forward_passes(cfg: Scoring, snip_meta: pd.DataFrame, rows_dir: Path,
                    ref_loss: pd.DataFrame | None = None, name: str = "target"):  # fmt: skip
    """The model's pass (with the lowercase one when asked) and the reference's, merged
    with the snippets; also the seconds of each. ``ref_loss`` (snippet_id, ref_loss): the
    reference's losses from its own full pass, used instead of a pass of its own; ``name``:
    what the model is to the run (its stage's name)."""
    attacks = cfg.attack.attacks
    scored = snip_meta[["snippet_id", "text"]]
    t1 = time.time()
    log(f"scoring with {name} {cfg.model.name_or_path} on {cfg.resources.scorer.actors} actor(s)")
    tgt = score_pool(
        scored,
        cfg.model,
        cfg.resources,
        cfg.model.name_or_path,
        "",
        "lowercase" in attacks,
        True,
        rows_dir / name,
    )
    # The pass's seconds over every run that computed its rows (with the lowercase pass).
    seconds = {name: _seconds(rows_dir / name, time.time() - t1)}
    merged = snip_meta.merge(tgt, on="snippet_id", how="inner", validate="one_to_one")
    if "ref" in attacks and ref_loss is not None:
        merged = merged.merge(ref_loss, on="snippet_id", how="inner", validate="one_to_one")
    elif "ref" in attacks:
        log(f"scoring with reference {cfg.model.reference}")
        ref = score_pool(
            scored,
            cfg.model,
            cfg.resources,
            cfg.model.reference,
            "ref_",
            False,
            False,
            rows_dir / "reference",
        )
        merged = merged.merge(
            ref[["snippet_id", "ref_loss"]], on="snippet_id", how="inner", validate="one_to_one"
        )
        seconds["reference"] = _seconds(rows_dir / "reference", time.time() - t1 - seconds[name])
    if len(merged) != len(snip_meta):
        raise MiaError(f"scored {len(merged)} of {len(snip_meta)} snippets: results are missing")
    return merged, seconds


def _score_frames(cfg: Scoring, merged: pd.DataFrame, extra: dict, labels):
    """Every attack's snippet scores and their document aggregates, labelled."""
    from mia_ray.features.attacks import score_table, stats_from_columns

    stats = stats_from_columns(
        merged["text"],
        merged["token_logprobs"],
        merged["mu"],
        merged["sigma"],
        merged["lower_loss"] if "lower_loss" in merged else None,
        merged["ref_loss"] if "ref_loss" in merged else None,
        extra,
    )
    attack = cfg.attack
    table = score_table(stats, attack.attacks, attack.min_k_ratios, attack.min_k_ratio,
                        attack.params())  # fmt: skip
    snip_scores = merged[["snippet_id", "doc_id", "n_tokens"]].copy()
    for name, col in table.items():
        snip_scores[name] = col
    snip_scores["label"] = snip_scores["doc_id"].map(labels).astype(int)
    score_cols = list(table)
    doc_scores = aggregate_scores(snip_scores, score_cols, attack.aggregate)
    doc_scores["label"] = doc_scores["doc_id"].map(labels).astype(int)
    doc_scores["n_snippets"] = doc_scores["doc_id"].map(snip_scores.groupby("doc_id").size())
    snip_scores["n_chars"] = merged["text"].str.len().to_numpy()
    snip_scores["text"] = merged["text"].to_numpy()  # exactly what every model scored
    return snip_scores, doc_scores, score_cols


def _seconds(stage: Path, wall: float) -> float:
    """A parts stage's seconds over every run that added its rows, else ``wall``."""
    from mia_ray.stages import stage_seconds

    got = stage_seconds(stage)
    return got if got is not None else round(wall, 2)
