"""Model batches drawn on the driver: a snippet's numbers do not depend on Ray Data's blocks."""

import numpy as np
import pandas as pd
import pytest

from mia_ray.actors import BATCH, in_model_batches
from mia_ray.stages import BLOCK_ROWS, model_blocks

TEXTS = [f"Snippet {i}: " + "to be or not to be, " * (1 + (7 * i) % 11) for i in range(150)]


def _rows(order) -> pd.DataFrame:
    return pd.DataFrame(
        {"snippet_id": [f"d{i}#0" for i in order], "text": [TEXTS[i] for i in order]}
    )


@pytest.mark.ray
def test_batches_are_drawn_from_the_rows_alone_longest_first(ray_local):
    a = model_blocks(_rows(range(150)), 4)
    b = model_blocks(_rows(np.random.default_rng(0).permutation(150)), 4)
    blocks = [ref for ref in a.to_pandas_refs()]
    got_a, got_b = a.to_pandas(), b.to_pandas()
    # The same batches whatever order the rows came in.
    pd.testing.assert_frame_equal(got_a, got_b)
    lengths = got_a["text"].str.len().to_numpy()
    assert (np.diff(lengths) <= 0).all()  # longest first
    # Ties by snippet_id, batches of 4 in that order.
    assert got_a[BATCH].tolist() == [i // 4 for i in range(150)]
    tie = got_a[got_a["text"].str.len() == lengths[0]]["snippet_id"].tolist()
    assert tie == sorted(tie)
    # Every block holds whole batches: 64 rows (16 batches), the last 150 - 128 = 22.
    import ray

    sizes = [len(ray.get(ref)) for ref in blocks]
    assert sizes == [BLOCK_ROWS, BLOCK_ROWS, 22]
    assert all(
        ray.get(ref)[BATCH].value_counts().max() <= 4
        and not set(ray.get(ref)[BATCH]) & set(ray.get(other)[BATCH])
        for i, ref in enumerate(blocks)
        for other in blocks[i + 1 :]
    )


def test_each_model_batch_is_one_call_whatever_blocks_ray_merges():
    calls = []

    def fn(rows: pd.DataFrame) -> pd.DataFrame:
        calls.append(rows["snippet_id"].tolist())
        return pd.DataFrame({"snippet_id": rows["snippet_id"], "n": len(rows)})

    rows = _rows(range(10))
    rows[BATCH] = [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
    # Two blocks of whole batches, merged into one bundle by Ray Data: still four calls.
    out = in_model_batches(pd.concat([rows.iloc[6:], rows.iloc[:6]]), fn)
    assert calls == [
        ["d6#0", "d7#0", "d8#0"],
        ["d9#0"],
        ["d0#0", "d1#0", "d2#0"],
        ["d3#0", "d4#0", "d5#0"],
    ]
    assert out["n"].tolist() == [3, 3, 3, 1, 3, 3, 3, 3, 3, 3]
    assert out[BATCH].tolist() == [2, 2, 2, 3, 0, 0, 0, 1, 1, 1]  # passes through, for chains
    # Without the column the batch is one model batch.
    calls.clear()
    in_model_batches(rows.drop(columns=BATCH), fn)
    assert calls == [rows["snippet_id"].tolist()]


def test_a_scorers_numbers_are_the_same_bits_in_any_bundle_of_its_blocks(test_world):
    """Padding a snippet to another length moves its float32 sums (~1e-7): with the batches
    drawn on the driver a block scored alone or merged with another gives the same bits."""
    from mia_ray.actors.scorer import Scorer

    scorer = Scorer(str(test_world["model"]), device="cpu", dtype="float32", torch_threads=1)
    rows = _rows(range(12))
    rows[BATCH] = np.arange(12) // 4
    alone = pd.concat([scorer(rows.iloc[:4]), scorer(rows.iloc[4:])], ignore_index=True)
    merged = scorer(rows)
    pd.testing.assert_frame_equal(merged, alone, check_exact=True)
    # The same rows cut into other batches are padded otherwise: not the same bits (the
    # property above is not vacuous), the same numbers to float32 rounding.
    other = rows.assign(**{BATCH: np.arange(12) // 3})
    recut = scorer(other)
    assert not np.array_equal(
        np.concatenate(recut["token_logprobs"]), np.concatenate(merged["token_logprobs"])
    )
    np.testing.assert_allclose(recut["loss"], merged["loss"], rtol=1e-5)
