"""Leakage survey: how much personal information, copyrighted text and benchmark data sits
in a corpus sample (the leakage rate of Kaneko et al., §2).

reference texts → shingle stores (hashed ``span``-word windows, hashed by Ray Data workers,
merged on the driver) → every shard streamed through a pool of scanner actors (PII regexes
and names, store lookups) → one row per document and one per finding, written per shard (a
rerun skips finished shards) → rates per category, type and shard with Wilson intervals →
precision and recall against planted truth when there is one → report.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pandas as pd

from mia_ray.config import LeakageJobConfig, to_dict
from mia_ray.errors import MiaError
from mia_ray.pipelines.common import fingerprint, log
from mia_ray.registry import pipeline
from mia_ray.runtime import describe

CATEGORIES = ("pii", "copyright", "benchmark")


def _resolve(cfg: LeakageJobConfig) -> None:
    """``crawl.demo``: the demo world's crawl, its truth, books and benchmark."""
    if not cfg.crawl.demo:
        return
    from mia_ray.demo.world import ensure_world

    log(f"demo crawl in the world at {cfg.world.resolved_root()}")
    info = ensure_world(cfg.world, [], crawl=True)["crawl"]
    cfg.crawl.shards = cfg.crawl.shards or info["shards"]
    cfg.crawl.truth = cfg.crawl.truth or info["planted"]
    cfg.scan.copyright = cfg.scan.copyright or [info["books_dir"]]
    cfg.scan.benchmark = cfg.scan.benchmark or [info["benchmark"]]
    span = info["meta"]["settings"]
    cfg.scan.copyright_span = min(cfg.scan.copyright_span, span["span_words"])
    cfg.scan.benchmark_span = min(cfg.scan.benchmark_span, span["bench_span_words"])


def _check_paths(cfg: LeakageJobConfig) -> None:
    for what, paths in (
        ("crawl.shards", cfg.crawl.shards),
        ("scan.copyright", cfg.scan.copyright),
        ("scan.benchmark", cfg.scan.benchmark),
    ):
        for p in paths:
            if not Path(p).expanduser().exists():
                raise MiaError(f"{what}: {p} not found")
    if cfg.crawl.truth and not Path(cfg.crawl.truth).is_file():
        raise MiaError(f"crawl.truth: {cfg.crawl.truth} not found")
    names = [Path(p).name for p in cfg.crawl.shards]
    if len(set(names)) != len(names):
        raise MiaError(
            "crawl.shards: two shards have the same file name; findings name shards by it"
        )


# ------------------------------------------------------------------------ stores


def _hash_batch(batch: pd.DataFrame, span: int) -> pd.DataFrame:
    from mia_ray.features.shingles import window_hashes, words_with_offsets

    hashes = [window_hashes(words_with_offsets(t)[0], span) for t in batch["text"]]
    return pd.DataFrame({"ref_id": batch["doc_id"].to_numpy(), "hashes": hashes})


def _reference_texts(category: str, cfg: LeakageJobConfig):
    """One Ray dataset of (doc_id, text) for a store; benchmark items give one text per field."""
    from mia_ray.data.readers import read_documents

    parts = []
    if category == "copyright":
        parts = [read_documents(p) for p in cfg.scan.copyright]
    else:
        for p in cfg.scan.benchmark:
            for f in cfg.scan.benchmark_fields:
                ds = read_documents(p, format="jsonl", text_field=f)
                parts.append(
                    ds.map_batches(
                        lambda b, f=f: b.assign(doc_id=b["doc_id"] + "#" + f),
                        batch_format="pandas",
                    )
                )
    ds = parts[0]
    for other in parts[1:]:
        ds = ds.union(other)
    return ds.select_columns(["doc_id", "text"])


def _stores(cfg: LeakageJobConfig, out: Path) -> dict[str, str]:
    """``{category: store path}``, built once per (sources, span) and reused on a rerun."""
    from mia_ray.features.shingles import ShingleStore

    s = cfg.scan
    stores = {}
    for category, sources, span in (
        ("copyright", s.copyright, s.copyright_span),
        ("benchmark", s.benchmark, s.benchmark_span),
    ):
        if not sources:
            continue
        stamp = [(str(Path(p).resolve()), _tree_stamp(Path(p))) for p in sources]
        key = fingerprint(
            category, stamp, span, s.benchmark_fields if category == "benchmark" else []
        )
        path = out / "stores" / f"{category}-{key}.npz"
        if not path.is_file():
            t0 = time.monotonic()
            ds = _reference_texts(category, cfg).map_batches(
                _hash_batch, fn_kwargs={"span": span}, batch_format="pandas", batch_size=64
            )
            batches = ds.iter_batches(batch_format="pandas", batch_size=None)
            pairs = (p for b in batches for p in zip(b["ref_id"], b["hashes"], strict=True))
            try:
                store = ShingleStore.from_hashes(pairs, span)
            except MiaError as e:
                raise MiaError(f"scan.{category} (scan.{category}_span = {span}): {e}") from None
            store.save(path)
            log(
                f"{category} store: {len(store.ref_ids)} texts, {len(store)} windows of {span} words "
                f"({store.skipped} shorter texts left out) in {time.monotonic() - t0:.1f} s"
            )
        stores[category] = str(path)
    return stores


def _tree_stamp(p: Path) -> list[tuple[str, int, int]]:
    """Names, sizes and mtimes under ``p``: a changed source rebuilds its store or rescans."""
    files = sorted(x for x in p.rglob("*") if x.is_file()) if p.is_dir() else [p]
    return [(str(f.relative_to(p) if p.is_dir() else f.name), f.stat().st_size,
             f.stat().st_mtime_ns) for f in files]  # fmt: skip


# ------------------------------------------------------------------------ scanning


class LeakScanner:
    """One scanner actor: loads the stores once, then per batch of documents returns one row
    per document (``doc_id``, ``shard``, ``chars``, ``findings``: a JSON list)."""

    def __init__(self, stores: dict[str, str], pii_types: list[str], names: bool):
        from mia_ray.features.shingles import ShingleStore

        self.stores = {c: ShingleStore.load(p) for c, p in stores.items()}
        self.pii_types = pii_types or None
        self.names = names

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        from mia_ray.features.pii import scan_pii

        found = []
        for text in batch["text"]:
            rows = [
                {"category": "pii", "type": m.type, "start": m.start, "end": m.end,
                 "value": m.value, "ref": ""}
                for m in scan_pii(text, self.pii_types, names=self.names)
            ]  # fmt: skip
            for category, store in self.stores.items():
                for m in store.match(text):
                    rows.append(
                        {"category": category, "type": category, "start": m.char_start,
                         "end": m.char_end, "value": text[m.char_start : m.char_end],
                         "ref": store.ref_ids[m.ref]}
                    )  # fmt: skip
            found.append(json.dumps(rows, ensure_ascii=False))
        return pd.DataFrame(
            {
                "doc_id": batch["doc_id"].to_numpy(),
                "shard": batch["shard"].to_numpy(),
                "chars": [len(t) for t in batch["text"]],
                "bytes": [len(t.encode()) for t in batch["text"]],
                "findings": found,
            }
        )


def _scan(cfg: LeakageJobConfig, stores: dict[str, str], out: Path) -> pd.DataFrame:
    """Every shard through the scanner pool; one parquet file per shard, skipped on a rerun."""
    import ray

    from mia_ray.data.readers import read_documents

    s = cfg.scan
    key = fingerprint(stores, sorted(s.pii_types), s.names)
    parts = []
    for i, shard in enumerate(cfg.crawl.shards):
        name = Path(shard).name
        part = out / "scan" / f"{name}-{fingerprint(key, _tree_stamp(Path(shard)))}.parquet"
        if not part.is_file():
            t0 = time.monotonic()
            ds = read_documents(
                shard, text_field=cfg.crawl.text_field, id_field=cfg.crawl.id_field
            ).select_columns(["doc_id", "text"])
            ds = ds.map_batches(lambda b, n=name: b.assign(shard=n), batch_format="pandas")
            res = ds.map_batches(
                LeakScanner,
                fn_constructor_kwargs={
                    "stores": stores,
                    "pii_types": s.pii_types,
                    "names": s.names,
                },
                compute=ray.data.ActorPoolStrategy(size=s.workers),
                num_cpus=s.cpus_per_worker,
                batch_size=s.batch_size,
                batch_format="pandas",
            )
            df = res.to_pandas().sort_values("doc_id").reset_index(drop=True)
            part.parent.mkdir(parents=True, exist_ok=True)
            tmp = part.with_name(part.name + ".tmp")
            df.to_parquet(tmp, index=False)
            tmp.replace(part)
            log(
                f"shard {i + 1}/{len(cfg.crawl.shards)} {name}: {len(df)} documents, "
                f"{df['bytes'].sum() / 1e6:.2f} MB in {time.monotonic() - t0:.1f} s"
            )
        else:
            log(f"shard {i + 1}/{len(cfg.crawl.shards)} {name}: reusing the earlier scan")
        parts.append(pd.read_parquet(part))
    return pd.concat(parts, ignore_index=True)


def _findings(docs: pd.DataFrame) -> pd.DataFrame:
    rows = [
        {"shard": d.shard, "doc_id": d.doc_id, **f}
        for d in docs.itertuples(index=False)
        for f in json.loads(d.findings)
    ]
    cols = ["shard", "doc_id", "category", "type", "start", "end", "value", "ref"]
    return pd.DataFrame(rows, columns=cols)


# ------------------------------------------------------------------------ rates


def _rate(k: int, n: int, ci: float) -> dict[str, Any]:
    from mia_ray.stats.metrics import wilson_interval

    return {"rate": k / n if n else 0.0, "ci": list(wilson_interval(k, n, ci)), "documents": k}


def _rates(docs: pd.DataFrame, found: pd.DataFrame, ci: float) -> dict[str, Any]:
    """Share of documents with at least one finding, per category, PII type and shard."""
    n = len(docs)
    hit = {c: set(zip(*[found.loc[found["category"] == c, k] for k in ("shard", "doc_id")], strict=True)) for c in CATEGORIES}  # fmt: skip
    out: dict[str, Any] = {"documents": n}
    for c in CATEGORIES:
        out[c] = _rate(len(hit[c]), n, ci)
    pii = found[found["category"] == "pii"]
    out["pii_types"] = {
        t: _rate(int(g[["shard", "doc_id"]].drop_duplicates().shape[0]), n, ci)
        for t, g in pii.groupby("type")
    }
    regex = pii[pii["type"] != "person_name"]
    out["pii_without_names"] = _rate(
        int(regex[["shard", "doc_id"]].drop_duplicates().shape[0]), n, ci
    )
    per_shard = {}
    for shard, d in docs.groupby("shard"):
        keys = set(zip(d["shard"], d["doc_id"], strict=True))
        per_shard[shard] = {
            "documents": len(d),
            "bytes": int(d["bytes"].sum()),
            **{c: _rate(len(hit[c] & keys), len(d), ci) for c in CATEGORIES},
        }
    out["shards"] = per_shard
    return out


def _same(category: str, planted: dict, match: dict) -> bool:
    """Does ``match`` overlap ``planted`` and find the same thing (PII type, or reference
    text: a benchmark match names ``<item>#<field>``, its planted item the item)?"""
    if not (match["start"] < planted["end"] and planted["start"] < match["end"]):
        return False
    if category == "pii" or category == "person_name":
        return match["type"] == planted["type"]
    return match["ref"].split("#")[0] == planted["ref"]


def _hits(rows: pd.DataFrame, others: pd.DataFrame, category: str) -> tuple[int, list[dict]]:
    """How many of ``rows`` some row of ``others`` in the same document is the same as; and
    the rows none is."""
    by_doc = {k: g.to_dict("records") for k, g in others.groupby(["shard", "doc_id"])}
    hit, miss = 0, []
    for r in rows.to_dict("records"):
        if any(
            _same(category, r, o) or _same(category, o, r)
            for o in by_doc.get((r["shard"], r["doc_id"]), [])
        ):
            hit += 1
        else:
            miss.append(r)
    return hit, miss


def _score(found: pd.DataFrame, truth_path: str) -> dict[str, Any]:
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
        recalled, missed = _hits(t, f, category)
        right, wrong = _hits(f, t, category)
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
                    "found": _hits(t[t["type"] == typ], f, category)[0],
                    "matches": int((f["type"] == typ).sum()),
                }
                for typ in sorted(set(t["type"]) | set(f["type"]))
            }
    # Precision means nothing for names here: the pages are full of real ones.
    out["person_name"]["precision"] = None
    out["person_name"].pop("unplanted_matches")
    return out


# ------------------------------------------------------------------------ pipeline


@pipeline(
    "leakage",
    LeakageJobConfig,
    help="leakage survey: personal data, copyrighted text and benchmark data in a corpus",
)
def run(cfg: LeakageJobConfig, out: Path) -> dict:
    from mia_ray.reports.leakage import write_report

    t0 = time.monotonic()
    _resolve(cfg)
    _check_paths(cfg)
    stores = _stores(cfg, out)
    docs = _scan(cfg, stores, out)
    found = _findings(docs)
    found.to_parquet(out / "matches.parquet", index=False)
    rates = _rates(docs, found, cfg.scan.ci)
    truth = _score(found, cfg.crawl.truth) if cfg.crawl.truth else None
    leakage_rate = {}
    for c in CATEGORIES:
        row = dict(rates[c])
        if truth:
            row.update({k: truth[c][k] for k in ("planted", "found", "precision", "recall")})
        leakage_rate[c] = row
    scanned_mb = float(docs["bytes"].sum()) / 1e6
    report = {
        "pipeline": "leakage",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "crawl": {"shards": cfg.crawl.shards, "documents": len(docs), "megabytes": scanned_mb},
        "leakage_rate": leakage_rate,
        "pii_types": rates["pii_types"],
        "pii_without_names": rates["pii_without_names"],
        "shards": rates["shards"],
        "truth": truth,
        "matches": found.head(cfg.scan.max_listed_matches).to_dict("records"),
        "matches_total": len(found),
        "config": to_dict(cfg),
        "runtime": {**describe(), "seconds": round(time.monotonic() - t0, 1)},
    }
    write_report(report, out)
    return report
