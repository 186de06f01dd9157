"""Power of the owner's marks: which marks a model of the demo world's `tiny` recipe remembers,
by the mark's kind and length, its copies per file, and the epochs trained.

    python bench/marks_power.py --epochs 20 1 --out VALIDITY.md

One run: the demo world's corpora (built here, pure), its member and non-member books
marked per file by one key per cell (cells take the books in a seeded round robin), the
`tiny` recipe trained on the members (marked books + web leads) for each number of epochs,
then every candidate of every mark scored by the Scorer (the pass `mia-ray verify` runs).
Members' marks were trained on (power); non-members' never were (their rejections measure
the level, which the owner's randomization makes exact). A cell's dataset p combines its
member marks by Fisher (as `verify` does). Keys are seeded (``entropy``): a simulation.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _markdown import publish  # noqa: E402

from mia_ray.actors import BATCH  # noqa: E402
from mia_ray.data.marks import candidates_of, insert_mark, new_key, published  # noqa: E402

# (kind, length, copies per file)
CELLS = [("words", 4, 1), ("words", 8, 1), ("words", 16, 1), ("words", 4, 4),
         ("words", 8, 4), ("words", 16, 4), ("hex", 32, 4), ("sentences", 1, 4),
         ("sentences", 2, 1)]  # fmt: skip
# dataset marks (mark.per: dataset): one 8-word mark, one copy in each of n files, KEYS_PER_N
# keys per n; files drawn afresh for each key, so a book may carry several of them
SHARED_FILES, KEYS_PER_N = (2, 4, 8, 16), 3


def score(model: str, texts: list[str], threads: int, tokens: bool = False):
    """Loss of each text under ``model`` (``tokens``: and the tokens it scored): the
    Scorer's plain pass, in this process."""
    from mia_ray.actors.scorer import Scorer

    s = Scorer(model, torch_threads=threads, lowercase=False, token_stats=False, moments=False)
    df = pd.DataFrame({"snippet_id": [str(i) for i in range(len(texts))], "text": texts,
                       BATCH: np.arange(len(texts)) // 256})  # fmt: skip
    out = s(df)
    return (
        (out["loss"].to_numpy(), out["n_tokens"].to_numpy()) if tokens else out["loss"].to_numpy()
    )


def marked_world(k_member: int, k_other: int, seed: int):
    """The demo corpora with per-cell keys: (member texts to train on, keys with their side)."""
    from mia_ray.demo.world import build_corpora

    c = build_corpora("demo", seed)
    books = {d.id: d.text for d in c.evaluated if d.source == "books"}
    web_members = [d.text for d in c.evaluated if d.source == "web" and c.split[d.id] == "member"]
    keys = []
    for side, k in (("member", k_member), ("nonmember", k_other)):
        ids = sorted(b for b in books if c.split[b] == side)
        random.Random(f"cells-{side}-{seed}").shuffle(ids)
        for i, (kind, length, copies) in enumerate(CELLS):
            files = ids[i :: len(CELLS)]
            key = new_key(
                files, kind, length, k, copies, "file", entropy=[seed, i, side == "member"]
            )
            pub = published(key)
            for mk in key["marks"]:
                f = mk["files"][0]
                books[f] = insert_mark(books[f], pub[mk["mark_id"]], copies, key, f)
            keys.append((side, (kind, length, copies, 1), key))
        draw = random.Random(f"shared-{side}-{seed}")
        for n in SHARED_FILES:
            for j in range(KEYS_PER_N):
                files = sorted(draw.sample(ids, n))
                key = new_key(files, "words", 8, k, 1, "dataset",
                              entropy=[seed, 100 + n, j, side == "member"])  # fmt: skip
                (mk,) = key["marks"]
                for f in mk["files"]:
                    books[f] = insert_mark(books[f], published(key)[mk["mark_id"]], 1, key, f)
                keys.append((side, ("words", 8, 1, n), key))
    members = [books[b] for b in sorted(books) if c.split[b] == "member"] + web_members
    return members, keys


def ranks(keys, losses: dict[str, np.ndarray]) -> pd.DataFrame:
    rows = []
    for side, cell, key in keys:
        for mk in key["marks"]:
            s = -losses[mk["mark_id"] + key["run_id"]]
            mine = s[mk["chosen"]]
            p = (1 + np.count_nonzero(np.delete(s, mk["chosen"]) >= mine)) / s.size
            rows.append({"side": side, "cell": cell, "p": p, "K": s.size})
    return pd.DataFrame(rows)


def main() -> None:
    from mia_ray.demo.world import SCALES, gpt2_bpe_tokenizer
    from mia_ray.stats.ranks import combined_pvalue
    from mia_ray.train.lm import train_causal_lm

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=float, nargs="+", default=[20.0, 1.0])
    ap.add_argument("--candidates", type=int, default=1000, help="K of the members' marks")
    ap.add_argument("--control-candidates", type=int, default=200, help="K of non-members'")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="", help="a markdown file whose section this replaces")
    args = ap.parse_args()
    members, keys = marked_world(args.candidates, args.control_candidates, args.seed)
    texts, ids = [], []
    for _, _, key in keys:
        for mk in key["marks"]:
            cands = candidates_of(key, mk["mark_id"])
            texts += cands
            ids += [mk["mark_id"] + key["run_id"]] * len(cands)
    tok = gpt2_bpe_tokenizer(SCALES["demo"].bpe_merges)
    results, seconds = [], {}
    for epochs in args.epochs:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.time()
            spec = dataclasses.replace(SCALES["demo"].tiny, epochs=epochs)
            train_causal_lm(members, tok, tmp, spec, seed=args.seed, threads=args.threads,
                            name=f"tiny-{epochs:g}ep")  # fmt: skip
            t1 = time.time()
            loss = score(tmp, texts, args.threads)
            seconds[epochs] = (round(t1 - t0), round(time.time() - t1))
        by = pd.Series(loss).groupby(np.array(ids)).apply(np.asarray).to_dict()
        df = ranks(keys, by)
        df["epochs"] = epochs
        results.append(df)
        print(f"{epochs:g} epochs: trained {seconds[epochs][0]} s, scored {len(texts)} "
              f"candidates in {seconds[epochs][1]} s", file=sys.stderr)  # fmt: skip
    df = pd.concat(results)
    lines = [
        "## Marks: power on the demo world's `tiny` recipe",
        "",
        f"`python bench/marks_power.py --epochs {' '.join(f'{e:g}' for e in args.epochs)}`, "
        f"{time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}. "
        f"The demo world's 50 member and 110 non-member books, each marked once per file "
        f"(one key per cell, cells in a seeded round robin); then {KEYS_PER_N} dataset keys "
        f"(`mark.per: dataset`) per row with n > 1 files: one 8-word mark, one copy in each of "
        f"n books drawn afresh per key (a book may carry several marks). `tiny`'s recipe (4 layers, 192 "
        f"wide, 4,000-merge BPE) trained on the members (books + 150 web leads). Members' "
        f"marks have K = {args.candidates} candidates (smallest p {1 / args.candidates:g}), "
        f"non-members' K = {args.control_candidates}. Power: the share of member marks at "
        f"p <= 0.05 and at the smallest p; dataset p: Fisher over the cell's member marks "
        f"(9,999 draws). Level: the share of non-member marks (never trained on) at p <= 0.05.",
        "",
        "| epochs | kind | length | copies/file | files/mark | member marks | p <= 0.05 | "
        "p = 1/K | median p | dataset p | non-member p <= 0.05 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (epochs, cell), g in df.groupby(["epochs", "cell"], sort=False):
        m, o = g[g.side == "member"], g[g.side == "nonmember"]
        _, p_all = combined_pvalue(m["p"].to_numpy(), args.candidates, 9999, 0)
        lines.append(
            f"| {epochs:g} | {cell[0]} | {cell[1]} | {cell[2]} | {cell[3]} | {len(m)} | "
            f"{(m.p <= 0.05).mean():.0%} | {(m.p <= 1 / args.candidates).mean():.0%} | "
            f"{m.p.median():.3g} | {p_all:.2g} | {(o.p <= 0.05).sum()}/{len(o)} |"
        )
    lines += ["", "Seconds (train, score) per epochs setting: "
              + ", ".join(f"{e:g}: {a}, {b}" for e, (a, b) in seconds.items()) + "."]  # fmt: skip
    text = "\n".join(lines) + "\n"
    publish(text, args.out)


if __name__ == "__main__":
    main()
