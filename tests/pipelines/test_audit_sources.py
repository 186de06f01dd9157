"""The audit's sources: a given group field and near-duplicates join files; a suspected file
that shares long spans with an unseen file is left out with its reason."""

import random

import pandas as pd

from mia_ray.pipelines.audit import assign_sources


def _text(seed: int, n: int = 300) -> str:
    rng = random.Random(seed)
    return " ".join(f"w{rng.randrange(5000)}" for _ in range(n))


def _edited(text: str, seed: int) -> str:
    words = text.split()
    for i in random.Random(seed).sample(range(len(words)), len(words) // 20):
        words[i] = "zzz"
    return " ".join(words)


def _files(rows):
    return pd.DataFrame(
        [
            {"doc_id": f"{side}/{fid}", "file_id": fid, "side": int(side == "suspected"),
             "group": group, "text": text}
            for side, fid, group, text in rows
        ]
    )  # fmt: skip


def test_groups_and_near_duplicates_join_and_cross_side_copies_are_left_out():
    a, b, u = _text(1), _text(2), _text(3)
    files = _files(
        [
            ("suspected", "a", "a", a),
            ("suspected", "a-copy", "a-copy", _edited(a, 0)),  # near-duplicate of a
            ("suspected", "u-copy", "u-copy", _edited(u, 1)),  # near-duplicate of unseen u
            ("suspected", "u-copy2", "u-copy2", _edited(u, 2)),  # and of u-copy, left out too
            ("suspected", "ch1", "book", _text(4)),
            ("suspected", "ch2", "book", _text(5)),
            ("unseen", "u", "u", u),
            ("unseen", "b", "b", b),
            ("unseen", "book-ch", "book", _text(6)),  # same group name, other side: apart
        ]
    )
    kept, summary = assign_sources(files, near_duplicates=True)
    src = dict(zip(kept["file_id"], kept["source"], strict=True))
    assert set(src) == {"a", "a-copy", "ch1", "ch2", "u", "b", "book-ch"}
    assert src["a"] == src["a-copy"] == "suspected/a"
    assert src["ch1"] == src["ch2"] == "suspected/ch1"
    assert len({src["u"], src["b"], src["book-ch"], src["a"], src["ch1"]}) == 5
    left = {f["file_id"]: f["reason"] for f in summary["left_out"]}
    assert set(left) == {"u-copy", "u-copy2"}
    assert left["u-copy"].startswith("shares ") and left["u-copy"].endswith(
        "of its 8-word spans with unseen file 'u': it cannot be both suspected and surely unseen"
    )
    assert summary["n_near_duplicate_pairs"] == 4  # a/a-copy, u/u-copy, u/u-copy2, the copies
    kept, summary = assign_sources(files, near_duplicates=False)
    assert len(kept) == len(files) and summary["n_near_duplicate_pairs"] == 0
    assert kept.groupby("side")["source"].nunique().to_dict() == {0: 3, 1: 5}
