"""The audit's inputs: the suspected and unseen files, their sources (a group field, near-duplicates), the same number of full-size snippets per file, and the counts a valid test needs."""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import pandas as pd

from mia_ray.errors import MiaError
from mia_ray.pipelines.audit.config import AuditJobConfig
from mia_ray.pipelines.common import log, resolved
from mia_ray.redact import redact

SIDES = ("suspected", "unseen")


NULL_CHECK_MIN_UNSEEN = 8  # two pseudo-sides of 4 groups: each still needs 2 per half


LENGTH_RATIO_WARNING = 2.0  # median words per file of one side over the other's
# audit.snippets_per_file 0 reads at most this many full snippets of a file when
# data.max_snippets_per_doc sets no cap (the cost grows with it; the gain in power flattens)
AUTO_MAX_SNIPPETS = 16


def resolve_world(cfg: AuditJobConfig) -> AuditJobConfig:
    """With ``world.target``: a copy of ``cfg`` on the demo world's books, split for the
    audit, and its models."""
    if not cfg.world.target:
        return cfg
    import copy

    from mia_ray.demo.world import ensure_audit_books, ensure_world

    if cfg.world.target not in ("tiny", "tiny-random"):
        raise MiaError(
            f"world.target {cfg.world.target!r}: the audit demo runs on tiny or tiny-random"
        )
    cfg = copy.deepcopy(cfg)
    log(f"demo world at {cfg.world.resolved_root()} (target {cfg.world.target})")
    info = ensure_world(cfg.world, [cfg.world.target])
    split = ensure_audit_books(info["root"], cfg.world.target)
    cfg.audit.suspected = cfg.audit.suspected or split["suspected"]
    cfg.audit.unseen = cfg.audit.unseen or split["unseen"]
    cfg.data.labels = cfg.data.labels or split["labels"]
    cfg.model.name_or_path = cfg.model.name_or_path or info["model"]
    cfg.model.reference = cfg.model.reference or info["reference"]
    # DC-PDD counts tokens in the reference model's documents, never audited.
    cfg.audit.dc_pdd.corpus = cfg.audit.dc_pdd.corpus or info["reference_pool"]
    return resolved(cfg)


def _read_side(cfg: AuditJobConfig, side: str) -> pd.DataFrame:
    from mia_ray.data.readers import read_documents

    path = getattr(cfg.audit, side)
    try:
        ds = read_documents(
            path,
            format=cfg.data.format,
            text_field=cfg.data.text_field,
            id_field=cfg.data.id_field,
            label_field=cfg.data.label_field,
            date_field=cfg.data.date_field,
            group_field=cfg.data.group_field,
            subset=cfg.data.subset,
            split=cfg.data.split,
        )
    except MiaError as e:
        raise MiaError(f"--{side} ({redact(path)}): {e}") from None
    cols = ["doc_id", "text", *(["group"] if cfg.data.group_field else [])]
    df = ds.select_columns(cols).to_pandas()
    if df.empty:
        raise MiaError(f"--{side} ({redact(path)}) holds no documents")
    df["file_id"] = df["doc_id"].astype(str)
    df["doc_id"] = f"{side}/" + df["file_id"]
    df["side"] = int(side == "suspected")
    if "group" not in df:
        df["group"] = df["file_id"]
    return df


def read_inputs(cfg: AuditJobConfig) -> pd.DataFrame:
    """Both sides as one frame: doc_id (``suspected/<id>``, ``unseen/<id>``), file_id, text,
    side (1 suspected, 0 unseen), group (``data.group_field``'s value, else the file id). A
    text on both sides, or a group on both sides, is an error."""
    sus, uns = (_read_side(cfg, side) for side in SIDES)
    digest = {
        side: df["text"].map(lambda t: hashlib.sha256(t.encode()).hexdigest())
        for side, df in (("suspected", sus), ("unseen", uns))
    }
    shared = sorted(set(digest["suspected"]) & set(digest["unseen"]))
    if shared:
        a = sus["file_id"][digest["suspected"] == shared[0]].iloc[0]
        b = uns["file_id"][digest["unseen"] == shared[0]].iloc[0]
        raise MiaError(
            f"--suspected and --unseen share {len(shared)} file(s) with the same text, e.g. "
            f"{a!r} and {b!r}: a file cannot be both suspected and surely unseen"
        )
    if cfg.data.group_field:
        both = sorted(set(sus["group"]) & set(uns["group"]))
        if both:
            raise MiaError(
                f"group {both[0]!r} (data.group_field {cfg.data.group_field!r}) has files in "
                f"both --suspected and --unseen ({len(both)} such group(s)): a source cannot be "
                "both suspected and surely unseen"
            )
    return pd.concat([sus, uns], ignore_index=True)


def assign_sources(files: pd.DataFrame, near_duplicates: bool) -> tuple[pd.DataFrame, dict]:
    """Each file's ``source``: its group, joined with every file it shares long spans with
    (``data.neardup``, within a side). A suspected file that shares long spans with an unseen
    file is left out (it cannot be both). Returns the kept files with ``source`` and a summary
    (pairs found, files left out with the reason)."""
    from mia_ray.data.neardup import connected_groups, near_duplicate_pairs

    ids = files["doc_id"].tolist()
    side = dict(zip(ids, files["side"], strict=True))
    pairs = near_duplicate_pairs(ids, files["text"].tolist()) if near_duplicates else []
    cross = [(a, b, s) for a, b, s in pairs if side[a] != side[b]]
    left_out: dict[str, dict] = {}
    for a, b, share in cross:
        sus, uns = (a, b) if side[a] == 1 else (b, a)
        left_out.setdefault(
            sus,
            {
                "file_id": sus.split("/", 1)[1],
                "side": "suspected",
                "reason": f"shares {share:.0%} of its 8-word spans with unseen file "
                f"{uns.split('/', 1)[1]!r}: it cannot be both suspected and surely unseen",
            },
        )
    kept = files[~files["doc_id"].isin(left_out)].copy()
    links = [
        (a, b)
        for a, b, _ in pairs
        if side[a] == side[b] and a not in left_out and b not in left_out
    ]
    # The files of one given group, chained, join the same component.
    for _, members in kept.groupby(["side", "group"])["doc_id"]:
        m = sorted(members)
        links.extend(zip(m, m[1:], strict=False))
    comp = connected_groups(kept["doc_id"].tolist(), links)
    kept["source"] = kept["doc_id"].map(comp)
    summary = {
        "near_duplicates": bool(near_duplicates),
        "near_duplicate_pairs": [
            {"a": a, "b": b, "share": round(float(s), 4)} for a, b, s in pairs[:50]
        ],
        "n_near_duplicate_pairs": len(pairs),
        "left_out": list(left_out.values()),
    }
    return kept, summary


def snippets_per_file(counts, asked: int, cap: int, short_files: float) -> int:
    """How many full-size snippets every file is scored on: ``asked`` when given; else the
    most that all files but the shortest ``short_files`` share of them have (``counts``: full
    snippets per file, both sides pooled), at most ``cap`` (0: :data:`AUTO_MAX_SNIPPETS`)
    and at least 1. The rule reads the counts of every file and never their side, so it
    treats a relabelling of the sides alike and every test and p-value stays exact."""
    if asked:
        return int(asked)
    c = np.sort(np.asarray(counts, dtype=np.int64))
    if c.size == 0:
        return 1
    # The files below c[m] are among the m shortest: at most the share asked for.
    k = int(c[int(np.floor(short_files * c.size + 1e-9))])
    return max(1, min(k, cap or AUTO_MAX_SNIPPETS))


def select_snippets(
    cfg: AuditJobConfig, files: pd.DataFrame
) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """The same number of full-size snippets for every file (:func:`snippets_per_file`):
    files with fewer are left out and listed. Returns (kept files, snippets (snippet_id,
    doc_id, text), length summary)."""
    import ray

    from mia_ray.data.inputs import snippets_of
    from mia_ray.data.snippets import take_per_file

    d = cfg.data
    full = dataclasses.replace(d, min_snippet_size=d.snippet_size + 1, max_snippets_per_doc=0)
    cut = snippets_of(ray.data.from_pandas(files[["doc_id", "text"]]), full, cfg.model.name_or_path)
    snip = cut.select_columns(["snippet_id", "doc_id", "text"]).to_pandas()
    if snip.empty:  # no block had a row: Ray gives no columns either
        snip = pd.DataFrame({"snippet_id": [], "doc_id": [], "text": []}, dtype=object)
    counts = snip.groupby("doc_id").size().reindex(files["doc_id"], fill_value=0)
    a = cfg.audit
    k = snippets_per_file(counts.to_numpy(), a.snippets_per_file, d.max_snippets_per_doc,
                          a.short_files)  # fmt: skip
    short = counts[counts < k]
    left_out = [
        {
            "file_id": doc.split("/", 1)[1],
            "side": doc.split("/", 1)[0],
            "reason": (
                f"shorter than one full snippet ({d.snippet_size} {d.snippet_unit})"
                if n == 0
                else f"{n} full snippet(s), fewer than the {k} every file is scored on "
                "(audit.snippets_per_file)"
            ),
        }
        for doc, n in short.items()
    ]
    kept = files[~files["doc_id"].isin(short.index)]
    chosen = take_per_file(snip[snip["doc_id"].isin(kept["doc_id"])], k, cfg.audit.seed)
    words = pd.Series([len(str(t).split()) for t in files["text"]], index=files["doc_id"])
    lengths = {
        "snippets_per_file": k,
        "rule": (
            "audit.snippets_per_file"
            if a.snippets_per_file
            else f"the most full snippets that all but the shortest {a.short_files:.0%} of the "
            f"files have (both sides pooled), at most "
            f"{d.max_snippets_per_doc or AUTO_MAX_SNIPPETS}"
        ),
    }
    for side, name in ((1, "suspected"), (0, "unseen")):
        ids = files["doc_id"][files["side"] == side]
        w, c = words[ids], counts[ids]
        lengths[name] = {
            "files": int(len(ids)),
            "words_median": float(w.median()),
            "words_min": int(w.min()),
            "words_max": int(w.max()),
            "full_snippets_median": float(c.median()),
            "full_snippets_min": int(c.min()),
            "full_snippets_max": int(c.max()),
        }
    ws, wu = lengths["suspected"]["words_median"], lengths["unseen"]["words_median"]
    ratio = max(ws, wu) / max(1.0, min(ws, wu))
    lengths["warning"] = (
        f"the sides' lengths differ: a suspected file has {ws:g} words at the median, an unseen "
        f"one {wu:g}. Every file is scored on {k} snippet(s) of the same size, so their scores "
        "are comparable, but files of very different lengths may differ in kind too (the "
        "blind check tests that)"
        if ratio >= LENGTH_RATIO_WARNING
        else None
    )
    return kept, chosen, {"lengths": lengths, "left_out": left_out}


def check_counts(
    cfg: AuditJobConfig, n_suspected: int, n_unseen: int, unit: str = "file", held: int = 0
) -> dict:
    """Fail before any scoring when there are too few independent sources (``unit``: file or
    source) for the test, the null check or any per-file verdict at ``audit.fdr``; return
    what the calibration allows. ``held``: unseen ones that ReCaLL's prefix will take out of
    the audit, counted in the one minimum every message gives."""
    from mia_ray.detectors.dataset_inference import MIN_GROUPS_PER_SIDE
    from mia_ray.stats.audit import min_calibration_files

    a = cfg.audit
    need = min_calibration_files(a.fdr)
    floor = max(MIN_GROUPS_PER_SIDE, need, NULL_CHECK_MIN_UNSEEN if a.null_check else 0)
    least = floor + held
    also = f" ({held} of them for ReCaLL's prefix, held out of the audit)" if held else ""
    has = f"--unseen has {n_unseen} {unit}(s)" + (
        f", {held} of them held out for ReCaLL's prefix" if held else ""
    )
    n = n_unseen - held  # the unseen ones the audit tests and calibrates with
    if n_suspected < MIN_GROUPS_PER_SIDE or n < MIN_GROUPS_PER_SIDE:
        side, count = ("suspected", n_suspected) if n_suspected < MIN_GROUPS_PER_SIDE else (
            "unseen", n_unseen)  # fmt: skip
        raise MiaError(
            f"--{side} has {count} {unit}(s): the audit needs at least {MIN_GROUPS_PER_SIDE} "
            f"suspected and {least} unseen {unit}s{also} (2 of each in each cross-fitting half)"
        )
    # A suspected source is ranked against every unseen one the audit keeps.
    if n < need:
        raise MiaError(
            f"{has}: a suspected {unit} is ranked against {n} of them, so its p-value is at "
            f"least 1/{n + 1} = {1 / (n + 1):.3f} > audit.fdr = {a.fdr:g} and no file could "
            f"ever be flagged; give at least {least} unseen {unit}s{also} (or raise audit.fdr)"
        )
    if a.null_check and n < NULL_CHECK_MIN_UNSEEN:
        raise MiaError(
            f"{has}: the null check (unseen vs unseen) needs {NULL_CHECK_MIN_UNSEEN} of them; "
            f"give at least {least} unseen {unit}s{also}, or set audit.null_check=false"
        )
    min_p = 1 / (n + 1)
    return {
        "n_calibration": n,
        "min_p_value": min_p,
        # BH flags k of m sources only if the k-th smallest p-value is <= fdr * k / m.
        "min_flagged_together": int(np.ceil(n_suspected * min_p / a.fdr - 1e-12)),
    }


def check_sources(
    cfg: AuditJobConfig, files: pd.DataFrame, count_held: bool = True
) -> tuple[dict, pd.Series]:
    """:func:`check_counts` on the independent sources of each side (files when none is
    grouped), with ReCaLL's held-out sources counted while they are still among ``files``
    (``count_held``); returns its result and the sources per side (index 0 unseen, 1
    suspected)."""
    n_src = files.groupby("side")["source"].nunique().reindex([0, 1], fill_value=0)
    unit = "source" if n_src.sum() < len(files) else "file"
    held = recall_holds_out(cfg, files) if count_held else 0
    return check_counts(cfg, int(n_src[1]), int(n_src[0]), unit, held), n_src


def recall_holds_out(cfg: AuditJobConfig, files: pd.DataFrame) -> int:
    """How many unseen sources ReCaLL's prefix will hold out of the audit (0 when no attack
    reads it or ``audit.recall.prefix`` gives it); its shots when the side is too small."""
    from mia_ray.features.attacks import passes_of

    r = cfg.audit.recall
    if "recall" not in passes_of(cfg.audit.attacks) or r.prefix:
        return 0
    try:
        return len(held_out_sources(files, r.shots, cfg.audit.seed)[1])
    except MiaError:
        return r.shots


def truth_labels(cfg: AuditJobConfig, files: pd.DataFrame) -> dict[str, int]:
    """data.labels (file id -> 0/1 over the suspected files), for scoring the verdicts."""
    if not cfg.data.labels:
        return {}
    from mia_ray.data.readers import load_manifest

    known = load_manifest(cfg.data.labels)
    sus = files[files["side"] == 1]
    return {
        d: int(known[f]) for d, f in zip(sus["doc_id"], sus["file_id"], strict=True) if f in known
    }


def prepare_files(cfg: AuditJobConfig):
    """The audit's files with their sources, each file's snippets, the truth (labels, when
    given), the calibration counts, and what was left out and why (logged). Returns
    ``(files, snippets, truth, calib, inputs)``."""
    files, sources = assign_sources(read_inputs(cfg), cfg.audit.near_duplicates)
    check_sources(cfg, files)
    files, snippets, lengths = select_snippets(cfg, files)
    left_out = sources.pop("left_out") + lengths.pop("left_out")
    for f in left_out:
        log(f"left out: {f['side']} file {f['file_id']}: {f['reason']}")
    try:
        calib, n_src = check_sources(cfg, files)
    except MiaError as e:
        raise MiaError(
            f"{e}; that is after leaving out {len(left_out)} file(s) (the log lists them): "
            "shorter than audit.snippets_per_file full snippets, or near-duplicates of an "
            "unseen file. A smaller data.snippet_size or audit.snippets_per_file keeps more"
        ) from None
    files, snippets, prefixes, held = audit_prefixes(cfg, files, snippets)
    if held:
        calib, n_src = check_sources(cfg, files, count_held=False)
    truth = truth_labels(cfg, files)
    log(
        f"{int(files['side'].sum())} suspected and {int((files['side'] == 0).sum())} unseen "
        f"files ({int(n_src[1])} and {int(n_src[0])} independent sources), "
        f"{lengths['lengths']['snippets_per_file']} snippet(s) of each"
    )
    inputs = {**sources, **lengths, "left_out": left_out, "prefixes": prefixes, "held_out": held}
    return files, snippets, truth, calib, inputs


def held_out_sources(files: pd.DataFrame, shots: int, seed: int) -> tuple[list[str], list]:
    """ReCaLL's prefix files in the audit and the sources held out with them: unseen sources
    (``files``: doc_id, side, source) in the order of a hash of ``seed`` and their name,
    whole, until ``shots`` files are gathered; the prefix is the first ``shots`` of those
    files, each source's in the order of a hash of their ids."""
    from mia_ray.scoring.passes import rank

    unseen = files[files["side"] == 0]
    chosen, sources = [], []
    for src in sorted(set(unseen["source"]), key=lambda x: rank(seed, str(x))):
        sources.append(src)
        mine = unseen.loc[unseen["source"] == src, "doc_id"]
        chosen += sorted(mine, key=lambda d: rank(seed, d))
        if len(chosen) >= shots:
            break
    if len(chosen) < shots:
        raise MiaError(
            f"audit.recall: the unseen side has {len(chosen)} files, fewer than the {shots} "
            "shots of ReCaLL's prefix; give audit.recall.prefix or lower audit.recall.shots"
        )
    return chosen[:shots], sources


def audit_prefixes(cfg: AuditJobConfig, files: pd.DataFrame, snippets: pd.DataFrame):
    """ReCaLL's non-member prefix and Con-ReCall's member prefix, for the attacks that read
    them: from ``audit.recall.prefix`` / ``member_prefix``, or (ReCaLL) from unseen files
    held out of the audit. Held out are whole sources, in the order of a hash of the seed and
    their name, until ``shots`` files are gathered: none of their files is scored or
    calibrated on, so the prefix is a fixed part of the score function for every file that
    remains, and the remaining unseen files stay exchangeable with a suspected file the model
    never saw (the p-values' premise). Returns ``(files, snippets, prefixes, held)``, ``held``
    the prefix's files and every file left out with them."""
    from mia_ray.features.attacks import passes_of
    from mia_ray.scoring.passes import prefix_from_path, prefix_of

    a, r = cfg.audit, cfg.audit.recall
    need = passes_of(a.attacks)
    prefixes: dict[str, str] = {}
    held: dict = {}
    if "recall_member" in need:
        prefixes["member"], _ = prefix_from_path(r.member_prefix, cfg, r.shots, a.seed)
    if "recall" in need and r.prefix:
        prefixes["non"], _ = prefix_from_path(r.prefix, cfg, r.shots, a.seed)
    elif "recall" in need:
        ids, sources = held_out_sources(files, r.shots, a.seed)
        prefixes["non"] = prefix_of(snippets, ids)
        gone = set(files.loc[files["source"].isin(sources), "doc_id"])
        held = {"prefix_files": ids, "sources": [str(x) for x in sources],
                "files_left_out": sorted(gone)}  # fmt: skip
        files = files[~files["doc_id"].isin(gone)].reset_index(drop=True)
        snippets = snippets[~snippets["doc_id"].isin(gone)].reset_index(drop=True)
        log(f"recall: the prefix is the first snippet of {len(ids)} unseen files of "
            f"{len(sources)} source(s), whose {len(gone)} file(s) are held out of the audit")  # fmt: skip
    return files, snippets, prefixes, held
