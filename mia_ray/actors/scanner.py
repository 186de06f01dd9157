"""The leakage survey's scanner: a Ray Data actor that finds personal data and copied spans
(shingle stores loaded once per actor) in batches of documents."""

from __future__ import annotations

import json

import pandas as pd

_js = json.encoder.encode_basestring


def load_store(where: str):
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


class LeakScanner:
    """One scanner actor: loads the stores once (``stores``: category -> a path or a storage
    URL of its file), then per batch of documents returns one row per document (``doc_id``,
    ``shard``, ``chars``, ``bytes``, ``words``, ``findings``: a JSON list). A batch is a
    pandas DataFrame (rows come back as one) or a pyarrow Table (as one: what the pipeline
    passes: Ray Data's pandas conversions of a batch add about a third to its scan)."""

    def __init__(
        self, stores: dict[str, str], pii_types: list[str], names: bool, instance_words: int = 64
    ):
        self.stores = {c: load_store(p) for c, p in stores.items()}
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
