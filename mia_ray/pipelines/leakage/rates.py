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
    """Share of documents with at least one finding, per category, PII type and shard.

    ``spans`` (category: words) makes a category's denominator the documents it could match
    in: a text of fewer words than the span holds no window (the paper leaves texts under
    300 words out). ``raw_rate`` divides by every document, as before; for PII the two agree.
    """
    from mia_ray.stats.metrics import wilson_interval

    spans = spans or {}
    n = len(docs)
    hit = {c: set(zip(*[found.loc[found["category"] == c, k] for k in ("shard", "doc_id")], strict=True)) for c in CATEGORIES}  # fmt: skip

    def category_rate(c: str, d: pd.DataFrame) -> dict[str, Any]:
        keys = set(zip(d["shard"], d["doc_id"], strict=True))
        k = len(hit[c] & keys)
        eligible = int((d["words"] >= spans[c]).sum()) if c in spans else len(d)
        return {
            **rate_of(k, eligible, ci),
            "eligible": eligible,
            "min_words": spans.get(c, 0),
            "raw_rate": k / len(d) if len(d) else 0.0,
            "raw_ci": list(wilson_interval(k, len(d), ci)),
        }

    out: dict[str, Any] = {"documents": n}
    for c in CATEGORIES:
        out[c] = category_rate(c, docs)
    pii = found[found["category"] == "pii"]
    out["pii_types"] = {
        t: rate_of(int(g[["shard", "doc_id"]].drop_duplicates().shape[0]), n, ci)
        for t, g in pii.groupby("type")
    }
    regex = pii[pii["type"] != "person_name"]
    out["pii_without_names"] = rate_of(
        int(regex[["shard", "doc_id"]].drop_duplicates().shape[0]), n, ci
    )
    per_shard = {}
    for shard, d in docs.groupby("shard"):
        per_shard[shard] = {
            "documents": len(d),
            "bytes": int(d["bytes"].sum()),
            **{c: category_rate(c, d) for c in CATEGORIES},
        }
    out["shards"] = per_shard
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


def score_against_truth(found: pd.DataFrame, truth_path: str) -> dict[str, Any]:
    """Precision and recall against planted truth, per category.

    A planted span or record is found when a match in its document overlaps it and finds the
    same thing (the PII type; the reference text for copyright and benchmark); a match is
    right when it overlaps a planted one that way. Names are scored apart (recall only): the
    background pages are real text, full of real names nobody planted.
    """
    truth = pd.read_json(truth_path, lines=True, dtype={"doc_id": str, "shard": str, "ref": str})
    truth["ref"] = truth["ref"].fillna("")
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
