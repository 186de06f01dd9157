"""The scan: shingle stores of the copyright and benchmark texts (folder stages), then the shards streamed through a pool of LeakScanner actors that write their findings; one folder stage per shard."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd

from mia_ray import storage
from mia_ray.actors.scanner import LeakScanner
from mia_ray.errors import MiaError
from mia_ray.models.identity import tree_sha256
from mia_ray.pipelines.common import fingerprint, log
from mia_ray.pipelines.leakage.config import LeakageJobConfig
from mia_ray.pipelines.leakage.inputs import SCAN_FORMAT


def hash_batch(batch: pd.DataFrame, span: int) -> pd.DataFrame:
    from mia_ray.features.shingles import vocabulary, window_hashes, words_with_offsets

    words = [words_with_offsets(t)[0] for t in batch["text"]]
    return pd.DataFrame(
        {
            "ref_id": batch["doc_id"].to_numpy(),
            "hashes": [window_hashes(w, span) for w in words],
            "vocab": [vocabulary(w) for w in words],
        }
    )


def reference_texts(category: str, cfg: LeakageJobConfig):
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


def build_stores(cfg: LeakageJobConfig, out: Path) -> dict[str, str]:
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
            ds = reference_texts(category, cfg).map_batches(
                hash_batch, fn_kwargs={"span": span}, batch_format="pandas", batch_size=64
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


def store_urls(stores: dict[str, str]) -> dict[str, str]:
    """Where the scanner actors read the stores: storage every node reaches (pushed there
    first); outside a run, or on one node with storage = ``--out``, the paths themselves."""
    from mia_ray import storage

    ws = storage.current()
    if ws is None:
        return stores
    for path in stores.values():
        ws.push(path)
    return {c: ws.url(path) for c, path in stores.items()}


def scan_dataset(
    cfg: LeakageJobConfig, stores: dict[str, str], todo, write_to: str, fraction: float = 1.0
):
    """The Ray dataset of one pass (lazy: nothing is read or scanned until it is consumed):
    the shards in ``todo`` (``(name, source)``) read by one read operator
    (:func:`~mia_ray.data.readers.read_shards`) and streamed through one pool of
    ``scan.workers`` scanner actors, which write their findings under ``write_to`` (a storage
    URL) and return counts (:meth:`LeakScanner.write`); ``fraction`` < 1: only the documents
    whose :func:`~mia_ray.data.readers.sample_point` is below it."""
    import ray

    from mia_ray.data.readers import read_shards
    from mia_ray.runtime import ray_options

    s, c = cfg.scan, cfg.crawl
    sample = (fraction, str(c.seed)) if fraction < 1 else None
    ds = read_shards(todo, text_field=c.text_field, id_field=c.id_field, sample=sample)
    return ds.map_batches(
        LeakScanner,
        fn_constructor_kwargs={
            "stores": store_urls(stores),
            "pii_types": s.pii_types,
            "names": s.names,
            "instance_words": s.instance_words,
            "spans": spans_of(cfg),
            "write_to": write_to,
        },
        compute=ray.data.ActorPoolStrategy(size=s.workers),
        **ray_options(cfg.resources, s.cpus_per_worker),
        batch_size=s.batch_size,
        batch_format="pyarrow",
    )


def spans_of(cfg: LeakageJobConfig) -> dict[str, int]:
    """Words a text needs for each text category to match in it."""
    return {"copyright": cfg.scan.copyright_span, "benchmark": cfg.scan.benchmark_span}


def scan_pass(
    cfg: LeakageJobConfig, stores: dict[str, str], todo, out: Path, keys, fraction: float = 1.0
) -> dict:
    """One streaming Ray Data pass over the shards in ``todo`` through one scanner pool (the
    actors load the stores once per pass). The scanners write each shard's rows into the
    run's storage (``scan/<shard>/``); the driver only sums their counts, and writes each
    shard's marker (with its counts) when the pass has ended."""
    from mia_ray.features.leaks import add_counts, tally
    from mia_ray.stages import commit, recorded

    ws = storage.workspace_of(out)
    base = storage.inside(out / "scan", ws.local)
    counts = {name: tally([], [], [], spans_of(cfg)) for name, _ in todo}
    nodes: set[str] = set()
    t0 = last = time.monotonic()
    log(f"scanning {len(todo)} shard(s) with {cfg.scan.workers} scanner actor(s)")
    res = scan_dataset(cfg, stores, todo, ws.url(base), fraction)
    for batch in batches_of(res):
        for shard, got, node in zip(*(batch.column(k).to_pylist() for k in ("shard", "counts", "node")), strict=True):  # fmt: skip
            counts[shard] = add_counts(counts[shard], json.loads(got))
            nodes.add(node)
        if time.monotonic() - last > 10:
            last = time.monotonic()
            mb = sum(c["bytes"] for c in counts.values()) / 1e6
            log(f"scanned {mb:.1f} MB so far ({mb / (last - t0):.1f} MB/s)")
    dt = time.monotonic() - t0
    for name, _ in todo:
        # Last: a shard with a marker for its key holds every part of this pass.
        commit(ws.storage, f"{base}/{name}", keys[name], "folder", {"counts": counts[name]})
        recorded(out, f"scan/{name}", keys[name], "folder", reused=False)
        c = counts[name]
        log(f"shard {name}: {c['documents']} documents, {c['bytes'] / 1e6:.2f} MB")
    n, mb = sum(c["documents"] for c in counts.values()), sum(c["bytes"] for c in counts.values())
    log(
        f"scanned {n} documents, {mb / 1e6:.2f} MB in {dt:.1f} s ({mb / 1e6 / max(dt, 1e-9):.1f} "
        f"MB/s) on {len(nodes)} node(s)"
    )
    return counts


def scan_shards(cfg: LeakageJobConfig, stores: dict[str, str], out: Path, shards: list) -> dict:
    """Every shard not scanned before, ``scan.shards_per_pass`` at a time through one scanner
    pool each; returns each shard's counts (:func:`~mia_ray.features.leaks.tally`). A shard
    is a stage ``scan/<shard>`` in the run's storage, so a rerun (or a resumed run, on any
    driver) skips the finished ones."""
    s, c = cfg.scan, cfg.crawl
    from mia_ray.stages import done, recorded, stage_key

    # Everything a shard's rows depend on: the stores (by their stages' keys; not their
    # folder, so a new driver whose --out is elsewhere resumes), the scanner's settings and
    # row format, the fields read, the sample, the shard's bytes.
    names = {category: stage_key(Path(path).parent) for category, path in stores.items()}
    fraction = sample_fraction(cfg, out, shards)
    key = fingerprint(
        SCAN_FORMAT, names, sorted(s.pii_types), s.names, s.instance_words, spans_of(cfg),
        c.text_field, c.id_field, fraction, c.seed if fraction < 1 else 0,
    )  # fmt: skip
    ws = storage.workspace_of(out)
    base = storage.inside(out / "scan", ws.local)
    keys, counts, todo = {}, {}, []
    for name, shard in shards:
        keys[name] = fingerprint(key, shard.identity())
        got = done(ws.storage, f"{base}/{name}", keys[name])
        if got is not None:
            counts[name] = got["counts"]
            recorded(out, f"scan/{name}", keys[name], "folder", reused=True)
            log(f"shard {name}: reusing the earlier scan")
        else:
            ws.storage.delete(f"{base}/{name}")  # parts of an unfinished pass, or another key's
            todo.append((name, shard))
    step = max(1, s.shards_per_pass)
    for first in range(0, len(todo), step):
        counts.update(scan_pass(cfg, stores, todo[first : first + step], out, keys, fraction))
    return {name: counts[name] for name, _ in shards}


def batches_of(ds):
    """The Arrow batches of ``ds`` as they come; a ``MiaError`` raised in a task or actor
    (a bad record) comes out as itself, its first line."""
    from mia_ray.errors import find_mia_error

    try:
        yield from ds.iter_batches(batch_format="pyarrow", batch_size=None)
    except Exception as e:
        err = find_mia_error(e)
        if err is None:
            raise
        raise MiaError(str(err.args[0] if err.args else err).splitlines()[0]) from None


def sample_fraction(cfg: LeakageJobConfig, out: Path, shards: list) -> float:
    """``crawl.sample`` as the share the read tasks keep. A number of documents N becomes
    the share just above the N-th smallest :func:`~mia_ray.data.readers.sample_point` of the
    crawl, found by one pass that reads every shard's ids (a Parquet file's text is not
    read; each batch sends the driver its N smallest points) and kept as a stage, so a rerun
    does not read twice."""
    import math

    c = cfg.crawl
    if c.sample <= 1:
        return float(c.sample)
    from mia_ray.stages import json_stage

    n = int(c.sample)
    key = fingerprint("sample", n, c.seed, c.text_field, c.id_field,
                      [(name, src.identity()) for name, src in shards])  # fmt: skip

    def count() -> float:
        import heapq

        from mia_ray.data.readers import read_shards

        t0 = time.monotonic()
        ds = read_shards(shards, text_field=c.text_field, id_field=c.id_field, ids_only=True)
        ds = ds.map_batches(lowest_points, fn_kwargs={"n": n, "seed": str(c.seed)},
                            batch_format="pyarrow")  # fmt: skip
        lowest: list[float] = []
        for batch in batches_of(ds):
            lowest = heapq.nsmallest(n, lowest + batch.column("point").to_pylist())
        total = "all" if len(lowest) < n else f"the {n} drawn"
        log(f"crawl.sample = {n} documents: {total} found in one read of the crawl "
            f"({time.monotonic() - t0:.1f} s)")  # fmt: skip
        return 1.0 if len(lowest) < n else math.nextafter(lowest[-1], 1.0)

    return json_stage(out, "crawl-sample", key, count, reused="crawl.sample: reusing the draw")


def lowest_points(batch, n: int, seed: str):
    """The ``n`` smallest sample points of a batch of documents (``doc_id``, ``shard``);
    a bad record raises its problem, as the scan would."""
    import heapq

    import pyarrow as pa
    import pyarrow.compute as pc

    from mia_ray.data.readers import sample_point

    errors = pc.drop_null(batch.column("_error"))
    if len(errors):
        raise MiaError(errors[0].as_py())
    ids, shards = batch.column("doc_id").to_pylist(), batch.column("shard").to_pylist()
    points = (sample_point(seed, s, d) for s, d in zip(shards, ids, strict=True))
    return pa.table({"point": pa.array(heapq.nsmallest(n, points), pa.float64())})


def read_findings(out: Path, shards: list[str], limit: int | None = None) -> pd.DataFrame:
    """The findings the scanners wrote for ``shards`` (from the run's storage), in one order
    whatever order the parts were written in: by shard as listed, then document id;
    ``limit``: at most that many rows, from the first parts, for a report's sample."""
    import pyarrow.parquet as pq

    from mia_ray.actors.scanner import FINDING_COLUMNS

    ws = storage.workspace_of(out)
    base = storage.inside(out / "scan", ws.local)
    frames, rows = [], 0
    for name in shards:
        rel = f"{base}/{name}/findings"
        for part in sorted(ws.storage.files(rel)):
            with ws.storage.fs.open_input_file(ws.storage.path(f"{rel}/{part}")) as f:
                frames.append(pq.read_table(f).to_pandas())
            rows += len(frames[-1])
            if limit is not None and rows >= limit:
                break
        if limit is not None and rows >= limit:
            break
    cols = ["shard", "doc_id", *FINDING_COLUMNS]
    if not frames:  # the columns' types as a part's, so string accessors work on none
        ints = {"start", "end", "instance_start"}
        return pd.DataFrame(
            {c: pd.Series([], dtype="int64" if c in ints else object) for c in cols}
        )
    found = pd.concat(frames, ignore_index=True)[cols]
    # A document's findings sit together in one part, in the scanner's order: a stable sort
    # by shard (as listed) and document keeps them so.
    rank = found["shard"].map({name: i for i, name in enumerate(shards)})
    order = pd.DataFrame({"rank": rank, "doc_id": found["doc_id"]}).sort_values(
        ["rank", "doc_id"], kind="stable"
    )
    found = found.loc[order.index]
    return found.reset_index(drop=True).head(limit)


def findings_at(out: Path) -> str:
    """Where the findings of a run's shards are (a path or a URL without credentials)."""
    ws = storage.workspace_of(out)
    return storage.redact(ws.url(storage.inside(out / "scan", ws.local))) + "/<shard>/findings/"


def scanned_documents(out: Path, shards: list[str]) -> set[tuple[str, str]]:
    """``(shard, doc_id)`` of every document the scanners wrote a row for."""
    import pyarrow.parquet as pq

    ws = storage.workspace_of(out)
    base = storage.inside(out / "scan", ws.local)
    got: set[tuple[str, str]] = set()
    for name in shards:
        rel = f"{base}/{name}/documents"
        for part in ws.storage.files(rel):
            with ws.storage.fs.open_input_file(ws.storage.path(f"{rel}/{part}")) as f:
                got.update(
                    (name, d) for d in pq.read_table(f, columns=["doc_id"])["doc_id"].to_pylist()
                )
    return got
