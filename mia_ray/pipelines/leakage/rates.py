"""The leakage rate (Table 2) from the scan's findings, and its scoring against a planted truth."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from mia_ray.features.leaks import CATEGORIES


def findings_of(docs: pd.DataFrame) -> pd.DataFrame:
    rows = [
        {"shard": d.shard, "doc_id": d.doc_id, **f}
        for d in docs.itertuples(index=False)
        for f in json.loads(d.findings)
    ]
    cols = ["shard", "doc_id", "category", "type", "start", "end", "value", "ref",
            "instance_start", "instance"]  # fmt: skip
    return pd.DataFrame(rows, columns=cols)


def rate_of(k: int, n: int, ci: float) -> dict[str, Any]:
    from mia_ray.stats.metrics import wilson_interval

    return {"rate": k / n if n else 0.0, "ci": list(wilson_interval(k, n, ci)), "documents": k}


def leak_rates(
    docs: pd.DataFrame, found: pd.DataFrame, ci: float, spans: dict[str, int] | None = None
) -> dict[str, Any]:
    """:func:`rates_of_counts` of per-document rows (``shard``, ``doc_id``, ``words``,
    ``bytes``) and their findings, counted by the scanners' own :func:`tally`."""
    from mia_ray.features.leaks import tally

    by_doc: dict[tuple, list] = {}
    for key, c, t in zip(zip(found["shard"], found["doc_id"], strict=True),
                         found["category"], found["type"], strict=True):  # fmt: skip
        by_doc.setdefault(key, []).append((c, t))
    counts = {
        shard: tally(
            list(d["words"]),
            list(d["bytes"]),
            [by_doc.get((shard, i), []) for i in d["doc_id"]],
            spans or {},
        )  # fmt: skip
        for shard, d in docs.groupby("shard", sort=True)
    }
    return rates_of_counts(counts, ci, spans)


def rates_of_counts(
    counts: dict[str, dict], ci: float, spans: dict[str, int] | None = None
) -> dict[str, Any]:
    """Share of documents with at least one finding, per category, PII type and shard, from
    each shard's :func:`~mia_ray.features.leaks.tally`.

    A category's denominator is the documents it could match in (``eligible``: a text of
    fewer words than the category's span in ``spans`` holds no window; the paper leaves
    texts under 300 words out). ``raw_rate`` divides by every document, as before; for PII
    the two agree.
    """
    from mia_ray.features.leaks import add_counts
    from mia_ray.stats.metrics import wilson_interval

    spans = spans or {}

    def category_rate(c: str, t: dict) -> dict[str, Any]:
        k, n, eligible = t["hits"][c], t["documents"], t["eligible"][c]
        return {
            **rate_of(k, eligible, ci),
            "eligible": eligible,
            "min_words": spans.get(c, 0),
            "raw_rate": k / n if n else 0.0,
            "raw_ci": list(wilson_interval(k, n, ci)),
        }

    total: dict = {}
    for t in counts.values():
        total = add_counts(total, t)
    if not total:
        from mia_ray.features.leaks import tally

        total = tally([], [], [], spans)
    n = total["documents"]
    out: dict[str, Any] = {"documents": n}
    for c in CATEGORIES:
        out[c] = category_rate(c, total)
    out["pii_types"] = {t: rate_of(k, n, ci) for t, k in sorted(total["pii_types"].items())}
    out["pii_without_names"] = rate_of(total["pii_without_names"], n, ci)
    out["shards"] = {
        shard: {
            "documents": t["documents"],
            "bytes": t["bytes"],
            **{c: category_rate(c, t) for c in CATEGORIES},
        }
        for shard, t in sorted(counts.items())
    }
    return out


def same_leak(category: str, planted: dict, match: dict) -> bool:
    """Does ``match`` overlap ``planted`` and find the same thing (PII type, or reference
    text: a benchmark match names ``<item>#<field>``, its planted item the item)?"""
    if not (match["start"] < planted["end"] and planted["start"] < match["end"]):
        return False
    if category == "pii" or category == "person_name":
        return match["type"] == planted["type"]
    return match["ref"].split("#")[0] == planted["ref"]


def hits_of(rows: pd.DataFrame, others: pd.DataFrame, category: str) -> tuple[int, list[dict]]:
    """How many of ``rows`` some row of ``others`` in the same document is the same as; and
    the rows none is."""
    by_doc = {k: g.to_dict("records") for k, g in others.groupby(["shard", "doc_id"])}
    hit, miss = 0, []
    for r in rows.to_dict("records"):
        if any(
            same_leak(category, r, o) or same_leak(category, o, r)
            for o in by_doc.get((r["shard"], r["doc_id"]), [])
        ):
            hit += 1
        else:
            miss.append(r)
    return hit, miss


def score_against_truth(
    found: pd.DataFrame, truth_path: str, scanned: set[tuple[str, str]] | None = None
) -> dict[str, Any]:
    """Precision and recall against planted truth, per category.

    A planted span or record is found when a match in its document overlaps it and finds the
    same thing (the PII type; the reference text for copyright and benchmark); a match is
    right when it overlaps a planted one that way. Names are scored apart (recall only): the
    background pages are real text, full of real names nobody planted. ``scanned``: the
    ``(shard, doc_id)`` of the documents a sample scanned; planted records elsewhere are left
    out.
    """
    truth = pd.read_json(truth_path, lines=True, dtype={"doc_id": str, "shard": str, "ref": str})
    truth["ref"] = truth["ref"].fillna("")
    if scanned is not None:  # a sample: what was planted in documents never scanned is not missed
        keep = [k in scanned for k in zip(truth["shard"], truth["doc_id"], strict=True)]
        truth = truth[keep]
    out: dict[str, Any] = {}
    for category in (*CATEGORIES, "person_name"):
        if category == "person_name":
            t, f = truth[truth["type"] == category], found[found["type"] == category]
        else:
            t = truth[(truth["category"] == category) & (truth["type"] != "person_name")]
            f = found[(found["category"] == category) & (found["type"] != "person_name")]
        recalled, missed = hits_of(t, f, category)
        right, wrong = hits_of(f, t, category)
        out[category] = {
            "planted": len(t),
            "found": recalled,
            "recall": recalled / len(t) if len(t) else None,
            "matches": len(f),
            "precision": right / len(f) if len(f) else None,
            "missed": [{k: r[k] for k in ("shard", "doc_id", "type", "value")} for r in missed],
            "unplanted_matches": wrong[:50],
        }
        if category == "pii":
            out[category]["types"] = {
                typ: {
                    "planted": int((t["type"] == typ).sum()),
                    "found": hits_of(t[t["type"] == typ], f, category)[0],
                    "matches": int((f["type"] == typ).sum()),
                }
                for typ in sorted(set(t["type"]) | set(f["type"]))
            }
    # Precision means nothing for names here: the pages are full of real ones.
    out["person_name"]["precision"] = None
    out["person_name"].pop("unplanted_matches")
    return out
