"""MemHunter's target data: (x, y) pairs cut from documents, split into train / test / val.

x is a prefix of ``prefix_tokens`` tokens and y the next ``target_tokens`` tokens of the same
document, in the target model's tokenizer (MemHunter §3.2: the hunter writes a prompt p for
x so that the target continues with y). A document gives up to ``per_doc`` pairs from
consecutive, non-overlapping windows from its start; a document too short for one window
gives none. The token ids are the ground truth (LCSS on tokens); the texts are their decodings.
x_ids and y_ids carry no special tokens: a model's context starts with :func:`bos_prefix`.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

import pandas as pd

from mia_ray.errors import MiaError

SPLITS = ("train", "test", "val")


def bos_prefix(tokenizer) -> list[int]:
    """The ids a tokenizer puts before a text by default (``[bos]`` for Llama-family
    tokenizers, ``[]`` for GPT-2's): what the model saw at the start of every training
    sequence, so what every context built from token ids must start with."""
    full = list(tokenizer("a")["input_ids"])
    bare = list(tokenizer("a", add_special_tokens=False)["input_ids"])
    for i in range(len(full) - len(bare) + 1):
        if full[i : i + len(bare)] == bare:
            return full[:i]  # tokens added after the text (an EOS) are not a prefix
    bos = tokenizer.bos_token_id
    return [bos] if bos is not None and full[:1] == [bos] else []


def make_pairs(
    docs: Iterable[tuple[str, str]],
    tokenizer,
    prefix_tokens: int = 32,
    target_tokens: int = 32,
    per_doc: int = 1,
) -> pd.DataFrame:
    """Pairs from ``(doc_id, text)``: columns pair_id, doc_id, x, y, x_ids, y_ids."""
    if prefix_tokens < 1 or target_tokens < 1 or per_doc < 1:
        raise MiaError("pairs: prefix_tokens, target_tokens and per_doc must be at least 1")
    width = prefix_tokens + target_tokens
    rows = []
    for doc_id, text in docs:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        for k in range(min(per_doc, len(ids) // width)):
            window = ids[k * width : (k + 1) * width]
            x_ids, y_ids = window[:prefix_tokens], window[prefix_tokens:]
            rows.append(
                {
                    "pair_id": f"{doc_id}#{k}",
                    "doc_id": doc_id,
                    "x": tokenizer.decode(x_ids),
                    "y": tokenizer.decode(y_ids),
                    "x_ids": list(x_ids),
                    "y_ids": list(y_ids),
                }
            )
    if not rows:
        raise MiaError(
            f"pairs: no document has {width} tokens (prefix {prefix_tokens} + target "
            f"{target_tokens}); shorten them or give longer documents"
        )
    return pd.DataFrame(rows)


def split_pairs(
    pairs: pd.DataFrame, fractions: tuple[float, float, float] = (0.6, 0.2, 0.2), seed: int = 0
) -> pd.DataFrame:
    """Add a ``split`` column (train / test / val), by document: a document's pairs share a
    split. Documents are sorted, shuffled with ``random.Random(f"pairs-{seed}")``, and cut by
    ``fractions`` (rounded; every split gets at least one document)."""
    if len(fractions) != 3 or any(f <= 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-9:
        raise MiaError(
            f"pairs: split fractions must be three positive shares summing to 1, got {fractions}"
        )
    docs = sorted(pairs["doc_id"].unique())
    if len(docs) < 3:
        raise MiaError(f"pairs: {len(docs)} documents cannot fill train, test and val")
    random.Random(f"pairs-{seed}").shuffle(docs)
    n_train = max(1, round(fractions[0] * len(docs)))
    n_test = max(1, min(round(fractions[1] * len(docs)), len(docs) - n_train - 1))
    which = {}
    for i, d in enumerate(docs):
        which[d] = "train" if i < n_train else "test" if i < n_train + n_test else "val"
    out = pairs.copy()
    out["split"] = out["doc_id"].map(which)
    return out
