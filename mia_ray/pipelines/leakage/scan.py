"""The scan: shingle stores of the copyright and benchmark texts (folder stages), the shards through a pool of LeakScanner actors, one frame stage per shard."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd

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


def scan_dataset(cfg: LeakageJobConfig, stores: dict[str, str], todo):
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
        .map_batches(with_shard, fn_kwargs={"name": name}, batch_format="pyarrow")
        for name, shard in todo
    ]
    ds = (labelled[0].union(*labelled[1:]) if len(labelled) > 1 else labelled[0]).materialize()
    return ds.map_batches(
        LeakScanner,
        fn_constructor_kwargs={
            "stores": store_urls(stores),
            "pii_types": s.pii_types,
            "names": s.names,
            "instance_words": s.instance_words,
        },
        compute=ray.data.ActorPoolStrategy(size=s.workers),
        **ray_options(cfg.resources, s.cpus_per_worker),
        batch_size=s.batch_size,
        batch_format="pyarrow",
    )


def with_shard(batch, name: str):
    import pyarrow as pa

    return batch.append_column("shard", pa.array([name] * batch.num_rows, pa.large_string()))


def scan_pass(
    cfg: LeakageJobConfig, stores: dict[str, str], todo, out: Path, keys
) -> dict[str, pd.DataFrame]:
    """One Ray Data pass over the shards in ``todo`` through one scanner pool (the actors
    load the stores once per pass); each shard's rows are its stage ``scan/<shard>``,
    written when the pass ends."""
    from mia_ray.stages import save_frame

    t0 = time.monotonic()
    res = scan_dataset(cfg, stores, todo)
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


def scan_shards(
    cfg: LeakageJobConfig, stores: dict[str, str], out: Path, shards: list
) -> pd.DataFrame:
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
    for name, shard in shards:
        keys[name] = fingerprint(key, shard.identity())
        reused = f"shard {name}: reusing the earlier scan"
        frames[name] = reuse_frame(out, f"scan/{name}", keys[name], reused)
        if frames[name] is None:
            todo.append((name, shard))
    step = max(1, s.shards_per_pass)
    for first in range(0, len(todo), step):
        frames.update(scan_pass(cfg, stores, todo[first : first + step], out, keys))
    return pd.concat([frames[name] for name, _ in shards], ignore_index=True)
