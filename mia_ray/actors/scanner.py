"""The leakage survey's scanner: a Ray Data actor that finds personal data and copied spans
(shingle stores loaded once per actor) in batches of documents."""

from __future__ import annotations

import functools
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


FINDING_COLUMNS = ("category", "type", "start", "end", "value", "ref", "instance_start", "instance")


def _finding_json(f: tuple) -> str:
    c, t, start, end, value, ref, a, instance = f
    row = (
        f'{{"category": {_js(c)}, "type": {_js(t)}, "start": {start}, "end": {end}, '
        f'"value": {_js(value)}, "ref": {_js(ref)}'
    )
    if a is not None:
        row += f', "instance_start": {a}, "instance": {_js(instance)}'
    return row + "}"


class LeakScanner:
    """One scanner actor: loads the stores once (``stores``: category -> a path or a storage
    URL of its file), then scans batches of documents (``doc_id``, ``text``, ``shard``; a
    pandas DataFrame or a pyarrow Table).

    Without ``write_to``, a batch comes back as one row per document (``doc_id``, ``shard``,
    ``chars``, ``bytes``, ``words``, ``findings``: a JSON list), as a table of the batch's
    kind. With ``write_to`` (a storage URL: the run's ``scan`` folder), the actor writes each
    shard's findings and per-document rows of the batch as Parquet under
    ``<write_to>/<shard>/findings/`` and ``documents/`` (a part named by its documents' ids,
    so a retried batch overwrites its own part) and returns one row per shard: ``shard``,
    ``counts`` (JSON of :func:`~mia_ray.features.leaks.tally` with ``spans``), ``node``.
    A batch row with an ``_error`` (a bad record) raises it."""

    def __init__(
        self,
        stores: dict[str, str],
        pii_types: list[str],
        names: bool,
        instance_words: int = 64,
        spans: dict[str, int] | None = None,
        write_to: str = "",
    ):
        self.stores = {c: load_store(p) for c, p in stores.items()}
        self.pii_types = pii_types or None
        self.names = names
        self.instance_words = instance_words
        self.spans = spans or {}
        self.write_to = write_to

    def findings(self, texts: list[str], sizes: bool = False):
        """Per text, its findings as tuples of :data:`FINDING_COLUMNS`; and the texts' word
        counts as the stores count them (a text shorter than a span never matches); with
        ``sizes``, also the texts' characters and UTF-8 bytes (int64 arrays)."""
        import numpy as np

        from mia_ray.features.leaks import sentence_bounds_batch
        from mia_ray.features.pii import PERSON_NAME, scan_pii_many
        from mia_ray.features.textbatch import TextBatch

        # One layout of the whole batch serves the PII prefilter, the stores' vocabulary
        # prefilter, the word counts, the PII values' sentences and the copied spans' instances.
        laid = TextBatch(texts)
        pii = scan_pii_many(texts, self.pii_types, names=self.names, batch=laid)
        spans = [
            (category, store.ref_ids, store.match_many(laid))
            for category, store in self.stores.items()
        ]
        # The instance the output and detection rates probe: a PII value's sentence
        # (instance_span's), all of the batch's at once.
        probed = [
            (i, m.start, m.end) for i, ms in enumerate(pii) for m in ms if m.type != PERSON_NAME
        ]
        if probed:
            d, a, b = np.array(probed, dtype=np.int64).T
            a, b = sentence_bounds_batch(laid, d, a, b)
            sentences = iter(zip(a.tolist(), b.tolist(), strict=True))
        found = []
        words = self.instance_words
        _, word_ends, first = laid.words
        offsets = laid.offsets.tolist()
        for i, text in enumerate(texts):
            rows = []
            for m in pii[i]:
                a = instance = None
                if m.type != PERSON_NAME:
                    a, b = next(sentences)
                    instance = text[a:b]
                rows.append(("pii", m.type, m.start, m.end, m.value, "", a, instance))
            for category, ref_ids, per_text in spans:
                if not per_text[i]:
                    continue
                at, w0 = offsets[i], int(first[i])
                for m in per_text[i]:
                    # instance_span's first ``words`` words of the span, from the text's words
                    # (a span starts and ends at a word's edges, so its words are the text's).
                    n = m.word_end - m.word_start
                    k = min(n, words) - 1
                    b = int(word_ends[w0 + m.word_start + (k if k >= 0 else k + n)]) - at
                    a = m.char_start
                    rows.append((
                        category, category, a, m.char_end,
                        text[a : m.char_end], ref_ids[m.ref], a, text[a:b],
                    ))  # fmt: skip
            found.append(rows)
        if sizes:
            return found, laid.word_counts(), laid.sizes(), laid.utf8_sizes()
        return found, laid.word_counts()

    def __call__(self, batch):
        import pyarrow as pa

        arrow = isinstance(batch, pa.Table)
        if self.write_to:
            return self.write(batch if arrow else pa.Table.from_pandas(batch, preserve_index=False))
        texts = batch.column("text").to_pylist() if arrow else batch["text"].tolist()
        found, words, chars, sizes = self.findings(texts, sizes=True)
        cols = {
            "chars": chars,
            "bytes": sizes,
            "words": words,
            "findings": [f"[{', '.join(map(_finding_json, f))}]" if f else "[]" for f in found],
        }
        if arrow:
            return pa.table(
                {
                    # The types Ray Data gave the DataFrame's columns, so the rows are the same.
                    "doc_id": batch.column("doc_id").cast(pa.large_string()),
                    "shard": batch.column("shard").cast(pa.large_string()),
                    "chars": pa.array(cols["chars"], pa.int64()),
                    "bytes": pa.array(cols["bytes"], pa.int64()),
                    "words": pa.array(cols["words"], pa.int64()),
                    "findings": pa.array(cols["findings"], pa.large_string()),
                }
            )
        # The columns as a DataFrame makes them from Python strings (pandas 3: its str dtype),
        # without a round trip through Python objects where they already are.
        text_dtype = _text_dtype()
        if isinstance(text_dtype, pd.StringDtype):
            cols["findings"] = pd.array(cols["findings"], dtype=text_dtype)
        ids = {
            c: batch[c].array if batch[c].dtype == text_dtype else batch[c].to_numpy()
            for c in ("doc_id", "shard")
        }
        return pd.DataFrame({**ids, **cols}, index=pd.RangeIndex(len(texts)), copy=False)

    def write(self, batch):
        """Scan ``batch``, write its parts, return its counts per shard (see the class)."""
        import hashlib

        import pyarrow as pa
        import pyarrow.compute as pc
        import ray

        from mia_ray.errors import MiaError
        from mia_ray.features.leaks import tally

        if "_error" in batch.column_names:
            errors = pc.drop_null(batch.column("_error"))
            if len(errors) > 1:
                raise MiaError(f"{errors[0].as_py()} (and {len(errors) - 1} more in this batch)")
            if len(errors):  # a record, or a whole file that does not read: as it says
                raise MiaError(errors[0].as_py())
        node = ray.get_runtime_context().get_node_id()
        types = _finding_types()
        shards, counts = [], []
        for shard in pc.unique(batch.column("shard")).to_pylist():
            part = batch.filter(pc.equal(batch.column("shard"), shard))
            ids = part.column("doc_id").to_pylist()
            texts = part.column("text").to_pylist()
            found, words, chars, sizes = self.findings(texts, sizes=True)
            name = hashlib.blake2b("\x1f".join(ids).encode(), digest_size=10).hexdigest()
            rows = [(d, *f) for d, fs in zip(ids, found, strict=True) for f in fs]
            columns = list(zip(*rows, strict=True)) if rows else [()] * 9
            findings = pa.table(
                {
                    "shard": pa.array([shard] * len(rows), pa.string()),
                    "doc_id": pa.array(columns[0], pa.string()),
                    **{
                        c: pa.array(v, types[c])
                        for c, v in zip(FINDING_COLUMNS, columns[1:], strict=True)
                    },
                }
            )
            documents = pa.table(
                {
                    "shard": pa.array([shard] * len(ids), pa.string()),
                    "doc_id": pa.array(ids, pa.string()),
                    "chars": pa.array(chars, pa.int64()),
                    "bytes": pa.array(sizes, pa.int64()),
                    "words": pa.array(words, pa.int64()),
                    "findings": pa.array([len(f) for f in found], pa.int64()),
                }
            )
            if len(findings):
                _write_parquet(self.write_to, f"{shard}/findings/part-{name}.parquet", findings)
            _write_parquet(self.write_to, f"{shard}/documents/part-{name}.parquet", documents)
            kinds = [[(f[0], f[1]) for f in fs] for fs in found]
            shards.append(shard)
            counts.append(json.dumps(tally(words, sizes, kinds, self.spans), sort_keys=True))
        return pa.table(
            {
                "shard": pa.array(shards, pa.string()),
                "counts": pa.array(counts, pa.string()),
                "node": pa.array([node] * len(shards), pa.string()),
            }
        )


@functools.cache
def _text_dtype():
    """The dtype pandas gives a column made from Python strings."""
    return pd.Series(["x"]).dtype


def _size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode())


def _finding_types():
    import pyarrow as pa

    s, i = pa.string(), pa.int64()
    return dict(zip(FINDING_COLUMNS, (s, s, i, i, s, s, i, s), strict=True))


def _write_parquet(url: str, rel: str, table) -> None:
    """One Parquet file at ``rel`` of the storage at ``url``, written whole."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mia_ray.storage import open_storage

    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    open_storage(url).write_bytes(rel, sink.getvalue().to_pybytes())
