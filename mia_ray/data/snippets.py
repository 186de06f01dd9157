"""Cut documents into snippets, the unit a model scores (CopyCheck §III-B: 512-word snippets).

Words: the text is split on any run of whitespace and each window of ``size`` words is
joined with single spaces, so line breaks and indentation do not survive in snippets (a
snippet is a stream of words; the model sees the same words whatever the layout).
Tokens: a Hugging Face tokenizer splits the text (no special tokens), and each window of
``size`` token ids is decoded back to text. With byte-level BPE a window may start or end
inside a multi-byte character, which decodes to U+FFFD; re-tokenizing a decoded snippet
can give a slightly different number of tokens than ``size``.

A trailing piece shorter than ``min_size`` is dropped unless it is the document's only
piece; ``min_size`` above ``size`` keeps full-size pieces only (a document shorter than one
then has none). Snippet ids are ``f"{doc_id}#{index}"``: stable across runs and independent of the
order in which Ray processes rows.
"""

from __future__ import annotations

import functools

from mia_ray.errors import MiaError

UNITS = ("words", "tokens")


def _windows(n: int, size: int, min_size: int) -> list[tuple[int, int]]:
    spans = [(start, min(start + size, n)) for start in range(0, n, size)]
    # min_size > size: full windows only, even for a document's only piece (the audit's
    # files must contribute snippets of one size).
    short = spans and spans[-1][1] - spans[-1][0] < min(min_size, size)
    if short and (len(spans) > 1 or min_size > size):
        spans.pop()
    return spans


def split_words(text: str, size: int, min_size: int = 0) -> list[str]:
    """Cut ``text`` into pieces of ``size`` whitespace-separated words, joined by single spaces."""
    words = text.split()
    return [" ".join(words[a:b]) for a, b in _windows(len(words), size, min_size)]


def split_tokens(text: str, tokenizer, size: int, min_size: int = 0) -> list[str]:
    """Cut ``text`` into pieces of ``size`` tokens of ``tokenizer``, each decoded back to text."""
    ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    return [
        tokenizer.decode(ids[a:b], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        for a, b in _windows(len(ids), size, min_size)
    ]


@functools.lru_cache(maxsize=2)
def _tokenizer(path: str):
    # One load per worker process: Ray reuses worker processes across tasks.
    from mia_ray.models.hf import load_tokenizer

    return load_tokenizer(path)


def _batch_snippets(
    table, unit: str, size: int, min_size: int, max_per_doc: int, tokenizer_path: str | None
):
    """Arrow batch of documents -> Arrow batch of their snippets (other columns repeated)."""
    import pyarrow as pa

    tok = _tokenizer(tokenizer_path) if unit == "tokens" else None
    rows, snippet_ids, indices, texts = [], [], [], []
    doc_ids = table.column("doc_id").to_pylist()
    for row, (doc_id, text) in enumerate(
        zip(doc_ids, table.column("text").to_pylist(), strict=True)
    ):
        if unit == "words":
            pieces = split_words(text or "", size, min_size)
        else:
            pieces = split_tokens(text or "", tok, size, min_size)
        if max_per_doc > 0:
            pieces = pieces[:max_per_doc]
        for i, piece in enumerate(pieces):
            rows.append(row)
            snippet_ids.append(f"{doc_id}#{i}")
            indices.append(i)
            texts.append(piece)
    # take() repeats each document's other columns with their Arrow types kept, so a block
    # whose dates are all null still has a string ``date`` column.
    carried = table.drop_columns(["text"]).take(pa.array(rows, pa.int64()))
    out = pa.table(
        {
            "doc_id": carried.column("doc_id"),
            "snippet_id": pa.array(snippet_ids, pa.string()),
            "snippet_index": pa.array(indices, pa.int64()),
            "text": pa.array(texts, pa.string()),
        }
    )
    for name in carried.column_names:
        if name != "doc_id":
            out = out.append_column(name, carried.column(name))
    return out


def make_snippets(
    ds,
    unit: str = "words",
    size: int = 512,
    min_size: int = 32,
    max_per_doc: int = 0,
    tokenizer_path: str | None = None,
):
    """Dataset of documents -> dataset of snippets (lazy).

    One document row becomes its snippet rows; this is a ``flat_map`` written as an Arrow
    ``map_batches`` so that carried columns keep their types (``flat_map`` re-infers types from
    Python values per block, and a block whose dates are all None gets a ``null`` column).

    Output columns: ``doc_id``, ``snippet_id`` (``"{doc_id}#{i}"``), ``snippet_index`` (int),
    ``text``, and every other input column (``label``, ``date``, ...) carried over.
    ``max_per_doc`` > 0 keeps each document's first N snippets. ``unit="tokens"`` needs
    ``tokenizer_path`` (a local folder or hub name); the tokenizer is loaded once on the
    driver to fail early with a clear message, then once per worker process.
    """
    if unit not in UNITS:
        raise MiaError(f"snippet unit must be words or tokens, not {unit!r}")
    if size < 1:
        raise MiaError(f"snippet size must be at least 1, not {size}")
    if min_size < 0:
        raise MiaError(f"minimum snippet size must be 0 or more, not {min_size}")
    min_size = min(min_size, size + 1)
    if max_per_doc < 0:
        raise MiaError(f"max snippets per document must be 0 (all) or more, not {max_per_doc}")
    if unit == "tokens":
        if not tokenizer_path:
            raise MiaError("snippet unit 'tokens' needs a tokenizer (a model name or folder)")
        _tokenizer(str(tokenizer_path))
    return ds.map_batches(
        _batch_snippets,
        batch_format="pyarrow",
        fn_kwargs={
            "unit": unit,
            "size": int(size),
            "min_size": int(min_size),
            "max_per_doc": int(max_per_doc),
            "tokenizer_path": str(tokenizer_path) if tokenizer_path else None,
        },
    )


def take_per_file(snippets, k: int, seed: int):
    """``k`` snippets of each document of a pandas frame of snippets (doc_id, snippet_id, ...),
    drawn without replacement by a seeded generator of each doc_id (the same draw whatever the
    other documents or the row order); documents with fewer than ``k`` are left out."""
    import hashlib

    import numpy as np

    df = snippets.sort_values(["doc_id", "snippet_id"])
    keep = []
    for doc_id, pos in df.groupby("doc_id", sort=True).indices.items():
        if len(pos) < k:
            continue
        key = hashlib.sha256(f"{seed}/{doc_id}".encode()).digest()[:8]
        pick = np.random.default_rng(int.from_bytes(key, "little")).choice(len(pos), k, False)
        keep.extend(pos[np.sort(pick)])
    return df.iloc[np.sort(np.asarray(keep, dtype=np.int64))]


def text_key(df) -> str:
    """A key of rows' ``snippet_id`` and ``text``, whatever their order."""
    import pandas as pd

    return str(pd.util.hash_pandas_object(df[["snippet_id", "text"]], index=False).sum())
