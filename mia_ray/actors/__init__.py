"""One class per model role, each served by ``Dataset.map_batches`` with an actor pool."""

from __future__ import annotations

BATCH = "_batch"  # the model batch a row belongs to, drawn on the driver (``model_blocks``)


def in_model_batches(batch, fn):
    """``fn(rows) -> rows`` over each model batch in ``batch`` (pandas).

    A row's numbers depend on the rows it is padded with (float32 sums taken in another order,
    ~1e-7), so which rows share a forward pass is decided with the data, on the driver (the
    ``_batch`` column), never by where Ray Data happens to cut or merge blocks on a cluster.
    Without that column ``batch`` is one model batch. The column passes through, so that
    chained actors keep the same batches. Before each batch the actor's torch threads are fitted
    to the machine (``models.hf.fit_threads``).
    """
    import pandas as pd

    from mia_ray.models.hf import fit_threads

    if BATCH not in batch:
        fit_threads()
        return fn(batch)
    parts = []
    for key, rows in batch.groupby(BATCH, sort=False):
        fit_threads()
        out = fn(rows.drop(columns=BATCH).reset_index(drop=True))
        out[BATCH] = key
        parts.append(out)
    return pd.concat(parts, ignore_index=True)
