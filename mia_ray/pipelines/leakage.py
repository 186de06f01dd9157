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
from mia_ray.features.leaks import CATEGORIES
from mia_ray.models.identity import tree_sha256
from mia_ray.pipelines.common import fingerprint, log
from mia_ray.registry import pipeline
from mia_ray.runtime import describe

# Bumped when a scanned shard's rows change shape or meaning (2: the ``words`` column), so a
# rerun rescans rather than read rows of another format.
SCAN_FORMAT = 2


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


def _check_pool_fits(cfg: LeakageJobConfig) -> None:
    """Refuse a scanner pool that holds every CPU: Ray Data's read tasks would then wait for
    a CPU forever (until its no-progress timeout) while the actors wait for their input."""
    from mia_ray.runtime import cluster_cpus

    s, total = cfg.scan, cluster_cpus()
    if total - s.workers * s.cpus_per_worker < 1:
        raise MiaError(
            f"scan.workers x scan.cpus_per_worker = {s.workers} x {s.cpus_per_worker:g} CPUs of "
            f"the cluster's {total:g} leaves less than one CPU for Ray Data to read the shards "
            "with, so the scan would never start; lower scan.cpus_per_worker (e.g. 0.5) or "
            "scan.workers"
        )


# ------------------------------------------------------------------------ stores


def _hash_batch(batch: pd.DataFrame, span: int) -> pd.DataFrame:
    from mia_ray.features.shingles import vocabulary, window_hashes, words_with_offsets

    words = [words_with_offsets(t)[0] for t in batch["text"]]
    return pd.DataFrame(
        {
            "ref_id": batch["doc_id"].to_numpy(),
            "hashes": [window_hashes(w, span) for w in words],
            "vocab": [vocabulary(w) for w in words],
        }
    )


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
    from mia_ray.stages import folder_stage

    s = cfg.scan
    stores = {}
    for category, sources, span in (
        ("copyright", s.copyright, s.copyright_span),
        ("benchmark", s.benchmark, s.benchmark_span),
    ):
        if not sources:
            continue
        # By content: a reference text edited in place (same name, same size) rebuilds it.
        stamp = [(Path(p).name, tree_sha256(p)) for p in sources]
        key = fingerprint(
            category, stamp, span, s.benchmark_fields if category == "benchmark" else []
        )

        def build(folder: Path, category=category, span=span) -> dict:
            t0 = time.monotonic()
            ds = _reference_texts(category, cfg).map_batches(
                _hash_batch, fn_kwargs={"span": span}, batch_format="pandas", batch_size=64
            )
            batches = ds.iter_batches(batch_format="pandas", batch_size=None)
            items = (
                p for b in batches for p in zip(b["ref_id"], b["hashes"], b["vocab"], strict=True)
            )
            try:
                store = ShingleStore.from_hashes(items, span)
            except MiaError as e:
                raise MiaError(f"scan.{category} (scan.{category}_span = {span}): {e}") from None
            store.save(folder / "store.npz")
            log(
                f"{category} store: {len(store.ref_ids)} texts, {len(store)} windows of {span} words "
                f"({store.skipped} shorter texts left out) in {time.monotonic() - t0:.1f} s"
            )
            return None

        folder, _ = folder_stage(out, f"stores/{category}", key, build)
        stores[category] = str(folder / "store.npz")
    return stores


def _store_urls(stores: dict[str, str]) -> dict[str, str]:
    """Where the scanner actors read the stores: storage every node reaches (pushed there
    first); outside a run, or on one node with storage = ``--out``, the paths themselves."""
    from mia_ray import storage

    ws = storage.current()
    if ws is None:
        return stores
    for path in stores.values():
        ws.push(path)
    return {c: ws.url(path) for c, path in stores.items()}


# ------------------------------------------------------------------------ scanning


def _load_store(where: str):
    """A :class:`ShingleStore` from its file: a local path, or a storage URL (``s3://...``)."""
    import io

    from mia_ray.features.shingles import ShingleStore
    from mia_ray.storage import is_uri, open_storage

    if not is_uri(where):
        return ShingleStore.load(where)
    plain, _, query = where.partition("?")
    folder, _, name = plain.rpartition("/")
    data = open_storage(folder + (f"?{query}" if query else "")).read_bytes(name)
    return ShingleStore.load(io.BytesIO(data))


# A string as json.dumps(..., ensure_ascii=False) writes it: the findings column is that
# JSON, a list of objects, written here directly (a third of the time of dicts and dumps).
_js = json.encoder.encode_basestring


class LeakScanner:
    """One scanner actor: loads the stores once (``stores``: category -> a path or a storage
    URL of its file), then per batch of documents returns one row per document (``doc_id``,
    ``shard``, ``chars``, ``bytes``, ``words``, ``findings``: a JSON list). A batch is a
    pandas DataFrame (rows come back as one) or a pyarrow Table (as one: what the pipeline
    passes: Ray Data's pandas conversions of a batch add about a third to its scan)."""

    def __init__(
        self, stores: dict[str, str], pii_types: list[str], names: bool, instance_words: int = 64
    ):
        self.stores = {c: _load_store(p) for c, p in stores.items()}
        self.pii_types = pii_types or None
        self.names = names
        self.instance_words = instance_words

    def __call__(self, batch):
        import pyarrow as pa

        from mia_ray.features.leaks import instance_span
        from mia_ray.features.pii import scan_pii_many
        from mia_ray.features.textbatch import TextBatch

        arrow = isinstance(batch, pa.Table)
        texts = batch.column("text").to_pylist() if arrow else list(batch["text"])
        # One layout of the whole batch serves the PII prefilter, the stores' vocabulary
        # prefilter and the word counts.
        laid = TextBatch(texts)
        pii = scan_pii_many(texts, self.pii_types, names=self.names, batch=laid)
        spans = [
            (category, _js(category), store.ref_ids, store.match_many(laid))
            for category, store in self.stores.items()
        ]
        found = []
        words = self.instance_words
        for i, text in enumerate(texts):
            rows = []
            for m in pii[i]:
                row = (
                    f'{{"category": "pii", "type": {_js(m.type)}, "start": {m.start}, '
                    f'"end": {m.end}, "value": {_js(m.value)}, "ref": ""'
                )
                if m.type != "person_name":  # the instance the output and detection rates probe
                    a, b = instance_span(text, m.start, m.end, "pii", words)
                    row += f', "instance_start": {a}, "instance": {_js(text[a:b])}'
                rows.append(row + "}")
            for category, c, ref_ids, per_text in spans:
                for m in per_text[i]:
                    a, b = instance_span(text, m.char_start, m.char_end, category, words)
                    rows.append(
                        f'{{"category": {c}, "type": {c}, "start": {m.char_start}, '
                        f'"end": {m.char_end}, "value": {_js(text[m.char_start : m.char_end])}, '
                        f'"ref": {_js(ref_ids[m.ref])}, "instance_start": {a}, '
                        f'"instance": {_js(text[a:b])}}}'
                    )
            found.append(f"[{', '.join(rows)}]" if rows else "[]")
        chars = [len(t) for t in texts]
        size = [len(t) if t.isascii() else len(t.encode()) for t in texts]
        # Words as the stores count them: a text shorter than a span never matches.
        words = laid.word_counts()
        if arrow:
            return pa.table(
                {
                    # The types Ray Data gave the DataFrame's columns, so the rows are the same.
                    "doc_id": batch.column("doc_id").cast(pa.large_string()),
                    "shard": batch.column("shard").cast(pa.large_string()),
                    "chars": pa.array(chars, pa.int64()),
                    "bytes": pa.array(size, pa.int64()),
                    "words": pa.array(words, pa.int64()),
                    "findings": pa.array(found, pa.large_string()),
                }
            )
        return pd.DataFrame(
            {
                "doc_id": batch["doc_id"].to_numpy(),
                "shard": batch["shard"].to_numpy(),
                "chars": chars,
                "bytes": size,
                "words": words,
                "findings": found,
            }
        )


def _scan_dataset(cfg: LeakageJobConfig, stores: dict[str, str], todo):
    """The Ray dataset of one pass: the shards in ``todo`` (``(name, path)``; each read,
    labelled and materialized here) streamed through one pool of ``scan.workers`` scanner actors
    (lazy: nothing is scanned until it is consumed). Its rows are :class:`LeakScanner`'s."""
    import ray

    from mia_ray.data.readers import read_documents
    from mia_ray.runtime import ray_options

    s = cfg.scan
    # The scan streams from one materialized input of every shard's labelled blocks: a lazy
    # union of per-shard operators made the driver's executor loop (on the actors' cores) cost
    # the actor a quarter of its time on 32 shards (measured). The labelling runs for all the
    # shards in one parallel pass.
    labelled = [
        read_documents(shard, text_field=cfg.crawl.text_field, id_field=cfg.crawl.id_field)
        .select_columns(["doc_id", "text"])
        .map_batches(_with_shard, fn_kwargs={"name": name}, batch_format="pyarrow")
        for name, shard in todo
    ]
    ds = (labelled[0].union(*labelled[1:]) if len(labelled) > 1 else labelled[0]).materialize()
    return ds.map_batches(
        LeakScanner,
        fn_constructor_kwargs={
            "stores": _store_urls(stores),
            "pii_types": s.pii_types,
            "names": s.names,
            "instance_words": s.instance_words,
        },
        compute=ray.data.ActorPoolStrategy(size=s.workers),
        **ray_options(cfg.resources, s.cpus_per_worker),
        batch_size=s.batch_size,
        batch_format="pyarrow",
    )


def _with_shard(batch, name: str):
    import pyarrow as pa

    return batch.append_column("shard", pa.array([name] * batch.num_rows, pa.large_string()))


def _scan_pass(
    cfg: LeakageJobConfig, stores: dict[str, str], todo, out: Path, keys
) -> dict[str, pd.DataFrame]:
    """One Ray Data pass over the shards in ``todo`` through one scanner pool (the actors
    load the stores once per pass); each shard's rows are its stage ``scan/<shard>``,
    written when the pass ends."""
    from mia_ray.stages import save_frame

    t0 = time.monotonic()
    res = _scan_dataset(cfg, stores, todo)
    log(f"scanning {len(todo)} shard(s) with {cfg.scan.workers} scanner actor(s)")
    df = res.to_pandas()
    dt = time.monotonic() - t0
    got = {}
    for name, _ in todo:
        part = df[df["shard"] == name].sort_values("doc_id").reset_index(drop=True)
        got[name] = save_frame(out, f"scan/{name}", keys[name], part)  # a rerun skips it
        log(f"shard {name}: {len(part)} documents, {part['bytes'].sum() / 1e6:.2f} MB")
    log(
        f"scanned {len(df)} documents, {df['bytes'].sum() / 1e6:.2f} MB in {dt:.1f} s "
        f"({len(df) / max(dt, 1e-9):.0f} documents/s)"
    )
    return got


def _scan(cfg: LeakageJobConfig, stores: dict[str, str], out: Path) -> pd.DataFrame:
    """Every shard not scanned before, ``scan.shards_per_pass`` at a time through one scanner
    pool each; one parquet file per shard, so a rerun (or a resumed run) skips finished ones."""
    s, c = cfg.scan, cfg.crawl
    from mia_ray.stages import reuse_frame, stage_key

    # Everything a shard's rows depend on: the stores (by their stages' keys; not their
    # folder, so a new driver whose --out is elsewhere resumes), the scanner's settings and
    # row format, the fields read, the shard's bytes.
    names = {category: stage_key(Path(path).parent) for category, path in stores.items()}
    key = fingerprint(
        SCAN_FORMAT, names, sorted(s.pii_types), s.names, s.instance_words,
        c.text_field, c.id_field,
    )  # fmt: skip
    keys, frames, todo = {}, {}, []
    for shard in cfg.crawl.shards:
        name = Path(shard).name
        keys[name] = fingerprint(key, tree_sha256(shard))
        reused = f"shard {name}: reusing the earlier scan"
        frames[name] = reuse_frame(out, f"scan/{name}", keys[name], reused)
        if frames[name] is None:
            todo.append((name, shard))
    step = max(1, s.shards_per_pass)
    for first in range(0, len(todo), step):
        frames.update(_scan_pass(cfg, stores, todo[first : first + step], out, keys))
    return pd.concat([frames[Path(p).name] for p in cfg.crawl.shards], ignore_index=True)


def _findings(docs: pd.DataFrame) -> pd.DataFrame:
    rows = [
        {"shard": d.shard, "doc_id": d.doc_id, **f}
        for d in docs.itertuples(index=False)
        for f in json.loads(d.findings)
    ]
    cols = ["shard", "doc_id", "category", "type", "start", "end", "value", "ref",
            "instance_start", "instance"]  # fmt: skip
    return pd.DataFrame(rows, columns=cols)


# ------------------------------------------------------------------------ rates


def _rate(k: int, n: int, ci: float) -> dict[str, Any]:
    from mia_ray.stats.metrics import wilson_interval

    return {"rate": k / n if n else 0.0, "ci": list(wilson_interval(k, n, ci)), "documents": k}


def _rates(
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
            **_rate(k, eligible, ci),
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
        t: _rate(int(g[["shard", "doc_id"]].drop_duplicates().shape[0]), n, ci)
        for t, g in pii.groupby("type")
    }
    regex = pii[pii["type"] != "person_name"]
    out["pii_without_names"] = _rate(
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


def _model_keys(cfg: LeakageJobConfig, evaluation: dict | None) -> dict[str, Any]:
    """output_rate, detection_rate and few_shot_curve of the first target (every target's
    under ``eval.models``), with how instances, prompts and counterparts were made."""
    if not evaluation or not evaluation["models"]:
        return {}
    from mia_ray.features import leaks

    first = evaluation["models"][cfg.eval.targets[0]]
    return {
        "output_rate": first["output_rate"],
        "detection_rate": first["detection_rate"],
        "few_shot_curve": first["few_shot_curve"],
        "eval": {
            "target": cfg.eval.targets[0],
            "instances": evaluation["instances"],
            "models": evaluation["models"],
            "method": " ".join((leaks.__doc__ or "").split()),
            "refusals": list(leaks.REFUSALS),
        },
    }


@pipeline(
    "leakage",
    LeakageJobConfig,
    help="leakage survey: personal data, copyrighted text and benchmark data in a corpus, and how models emit and detect it",
)
def run(cfg: LeakageJobConfig, out: Path) -> dict:
    from mia_ray.reports.leakage import write_report

    t0 = time.monotonic()
    _resolve(cfg)
    _check_paths(cfg)
    _check_pool_fits(cfg)
    stores = _stores(cfg, out)
    docs = _scan(cfg, stores, out)
    found = _findings(docs)
    found.to_parquet(out / "matches.parquet", index=False)
    spans = {"copyright": cfg.scan.copyright_span, "benchmark": cfg.scan.benchmark_span}
    rates = _rates(docs, found, cfg.scan.ci, spans)
    truth = _score(found, cfg.crawl.truth) if cfg.crawl.truth else None
    leakage_rate = {}
    for c in CATEGORIES:
        row = dict(rates[c])
        if truth:
            row.update({k: truth[c][k] for k in ("planted", "found", "precision", "recall")})
        leakage_rate[c] = row
    evaluation = None
    if cfg.eval.targets:
        from mia_ray.pipelines.leak_eval import run_eval

        evaluation = run_eval(cfg, found, out)
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
        **_model_keys(cfg, evaluation),
        "matches": found.drop(columns=["instance_start", "instance"])
        .head(cfg.scan.max_listed_matches)
        .to_dict("records"),
        "matches_total": len(found),
        "config": to_dict(cfg),
        "runtime": {**describe(), "seconds": round(time.monotonic() - t0, 1)},
    }
    write_report(report, out)
    return report
