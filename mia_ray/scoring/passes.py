"""The passes beyond the target's plain one (``features.attacks.PASSES``): one batched Scorer
pool per input kind, each a parts stage keyed by the texts it reads and the model (so a
rerun reuses it and an interrupted one resumes), and DC-PDD's token counts, a stage keyed
by the corpus and the tokenizer."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from mia_ray.errors import MiaError
from mia_ray.keys import fingerprint
from mia_ray.log import log

PREFIX_SEPARATOR = "\n\n"


def rank(seed: int, doc_id: str) -> bytes:
    """A document's place in a seeded order (the prefix shots are taken first to last)."""
    return hashlib.sha256(f"{seed}\x1f{doc_id}".encode()).digest()


def held_out(labels: dict[str, int], label: int, n: int, seed: int) -> list[str]:
    """``n`` documents of class ``label``, the smallest by SHA-256 of ``seed`` and their id
    (the same ones on every run); an error when the class has fewer than ``n`` + 2 (two stay
    to be evaluated)."""
    ids = sorted((d for d, y in labels.items() if y == label), key=lambda d: rank(seed, d))
    if len(ids) < n + 2:
        what = "non-members" if label == 0 else "members"
        raise MiaError(
            f"attack.recall: {len(ids)} {what} cannot give {n} prefix documents and still be "
            f"evaluated; lower attack.recall.shots or give the prefix files"
        )
    return sorted(ids[:n])


def prefix_of(snippets: pd.DataFrame, doc_ids: list[str]) -> str:
    """The prefix: the first snippet of each document, in ``doc_ids``' order, each followed
    by a blank line."""
    first = snippets.sort_values("snippet_id").groupby("doc_id", sort=False)["text"].first()
    return "".join(str(first[d]).strip() + PREFIX_SEPARATOR for d in doc_ids)


def prefix_from_path(path: str, cfg, n: int, seed: int) -> tuple[str, list[str]]:
    """A prefix of ``n`` documents of ``path`` (the first by :func:`held_out`'s order)."""
    from mia_ray.data.inputs import snippets_of
    from mia_ray.data.readers import read_documents

    docs = read_documents(path, format=cfg.data.format, text_field=cfg.data.text_field,
                          id_field=cfg.data.id_field)  # fmt: skip
    snips = snippets_of(docs, cfg.data, cfg.model.name_or_path).materialize()
    snips = snips.select_columns(["snippet_id", "doc_id", "text"]).to_pandas()
    ids = sorted(set(snips["doc_id"]), key=lambda d: rank(seed, d))[:n]
    if len(ids) < n:
        raise MiaError(f"attack.recall: {path} has {len(ids)} documents, not the {n} shots")
    return prefix_of(snips, sorted(ids)), sorted(ids)


def recall_prefixes(cfg, need, snippets: pd.DataFrame, labels: dict[str, int] | None):
    """ReCaLL's non-member and Con-ReCall's member prefix (``{"non": text, "member": text}``,
    those ``need`` asks for) and the documents held out of the evaluation to make them
    (``{"non": ids, "member": ids}``): a prefix path's documents, or else ``shots``
    documents of the data's class."""
    r, seed = cfg.attack.recall, cfg.attack.seed
    prefixes: dict[str, str] = {}
    held: dict[str, list[str]] = {}
    wanted = (("recall", "non", 0, r.prefix, "attack.recall.prefix"),
              ("recall_member", "member", 1, r.member_prefix, "attack.recall.member_prefix"))  # fmt: skip
    for name, side, label, path, key in wanted:
        if name not in need:
            continue
        if path:
            prefixes[side], _ = prefix_from_path(path, cfg, r.shots, seed)
            continue
        if labels is None:
            raise MiaError(f"{', '.join(need[name])} needs {key}: files to build the prefix from")
        present = set(snippets["doc_id"])
        ids = held_out({d: y for d, y in labels.items() if d in present}, label, r.shots, seed)
        held[side] = ids
        prefixes[side] = prefix_of(snippets, ids)
        what = "non-member" if label == 0 else "member"
        log(f"{name}: the {what} prefix is the first snippet of {len(ids)} {what} documents, "
            "held out of the evaluation")  # fmt: skip
    return prefixes, held


def token_counts(cfg, out: Path) -> pd.DataFrame:
    """DC-PDD's reference: how often each token id occurs in ``attack.dc_pdd.corpus``, the
    first ``max_tokens`` tokens of each document, counted by Ray Data tasks over the corpus
    (``token_id``, ``count``; ids never seen left out). A stage keyed by the corpus's
    contents and the tokenizer's files."""
    from mia_ray.data.sources import resolve_source
    from mia_ray.models.identity import weights_identity
    from mia_ray.stages import frame_stage

    d, m = cfg.attack.dc_pdd, cfg.model
    source = resolve_source(d.corpus)
    key = fingerprint("token-counts", source.identity(), d.max_tokens, cfg.data.text_field,
                      weights_identity(m.name_or_path, m.revision, m.gguf_file))  # fmt: skip

    def count() -> pd.DataFrame:
        from mia_ray import storage
        from mia_ray.data.readers import read_documents

        docs = read_documents(source, text_field=cfg.data.text_field, id_field=cfg.data.id_field)
        ds = docs.map_batches(
            count_tokens,
            fn_kwargs={"tokenizer": storage.stage(m.name_or_path), "revision": m.revision,
                       "gguf_file": m.gguf_file, "max_tokens": d.max_tokens},
            batch_format="pandas",
        )  # fmt: skip
        total: dict[int, int] = {}
        for batch in ds.iter_batches(batch_format="pandas", batch_size=None):
            for i, c in zip(batch["token_id"], batch["count"], strict=True):
                total[int(i)] = total.get(int(i), 0) + int(c)
        log(f"dc_pdd: {sum(total.values())} tokens counted in {d.corpus}")
        return pd.DataFrame({"token_id": list(total), "count": list(total.values())})

    return frame_stage(out, "token-counts", key, count, reused="dc_pdd: reusing the token counts")


def count_tokens(batch: pd.DataFrame, tokenizer: str, revision: str, gguf_file: str,
                 max_tokens: int) -> pd.DataFrame:  # fmt: skip
    """One batch of documents' token counts (``token_id``, ``count``)."""
    from mia_ray.models.hf import load_tokenizer

    tok = load_tokenizer(tokenizer, revision, False, gguf_file)
    ids = tok([str(t) for t in batch["text"]], add_special_tokens=False, truncation=True,
              max_length=max_tokens)["input_ids"]  # fmt: skip
    flat = np.concatenate([np.asarray(x, dtype=np.int64) for x in ids]) if ids else np.zeros(0)
    uniq, counts = np.unique(flat.astype(np.int64), return_counts=True)
    return pd.DataFrame({"token_id": uniq, "count": counts})


def smoothed_frequencies(counts: pd.DataFrame, vocab: int) -> np.ndarray:
    """Laplace-smoothed frequency of every token id below ``vocab``: (count + 1) / (total +
    vocab)."""
    c = np.zeros(vocab, dtype=np.float64)
    ids = counts["token_id"].to_numpy()
    if len(ids) and ids.max() >= vocab:
        raise MiaError(f"token counts hold id {ids.max()}, outside the vocabulary of {vocab}")
    c[ids] = counts["count"].to_numpy(dtype=np.float64)
    return (c + 1) / (c.sum() + vocab)


def variant_rows(snippets: pd.DataFrame, tag: str, make) -> pd.DataFrame:
    """One row per variant text of each snippet: ``make(snippet_id, text) -> [texts]``;
    their ids are ``<snippet_id>#<tag><j>``."""
    rows = [
        (f"{sid}#{tag}{j}", t)
        for sid, text in zip(snippets["snippet_id"], snippets["text"], strict=True)
        for j, t in enumerate(make(sid, text))
    ]
    return pd.DataFrame(rows, columns=["snippet_id", "text"])


def per_snippet(ids, scored: pd.DataFrame, tag: str, n: int, column: str) -> list:
    """``column`` of each snippet's ``n`` variants, in order."""
    by_id = scored.set_index("snippet_id")[column]
    return [[by_id[f"{sid}#{tag}{j}"] for j in range(n)] for sid in ids]


def run_passes(cfg, need: dict[str, list[str]], merged: pd.DataFrame, out: Path,
               prefixes: dict[str, str], seconds: dict[str, float],
               label: str = "") -> dict[str, list]:  # fmt: skip
    """The columns of every pass in ``need`` beyond the target and reference, for the
    snippets of ``merged`` (its rows' order), by ``SnippetStats`` field name; each pass's
    wall seconds over every run that computed it go to ``seconds``; ``label``
    prefixes the passes' names in the progress log (the reference's passes)."""
    from mia_ray.scoring.pools import score_pool
    from mia_ray.stages import stage_seconds

    a, rows_dir = cfg.attack, out / "rows"
    scored = merged[["snippet_id", "text"]]
    ids = merged["snippet_id"].tolist()
    extra: dict[str, list] = {}
    clock = [time.monotonic()]

    def took(name: str, stage: Path | None = None) -> None:
        """The pass's seconds: its stage's, summed over the runs that computed its rows (a
        resumed run reports the whole pass), else this run's wall time."""
        now = time.monotonic()
        got = stage_seconds(stage) if stage is not None else None
        seconds[name] = got if got is not None else round(now - clock[0], 2)
        clock[0] = now

    def pool(rows, name: str, **kw) -> pd.DataFrame:
        log(f"pass {label}{name}: {len(rows)} rows through {cfg.model.name_or_path}")
        return score_pool(rows, cfg.model, cfg.resources, cfg.model.name_or_path, "", False,
                          kw.pop("full", False), rows_dir / name, f"{label}{name}", **kw)  # fmt: skip

    for name, column, field in (("recall", "non", "recall_loss"),
                                ("recall_member", "member", "member_loss")):  # fmt: skip
        if name in need:
            text = prefixes[column]
            got = pool(scored, name, context=text)
            extra[field] = got.set_index("snippet_id").loc[ids, "loss"].tolist()
            short = int((got["context_tokens"] == 0).sum())
            if short:
                log(f"pass {name}: {short} snippet(s) fill the window; no prefix fits before them")
            took(name, rows_dir / name)
    if "token_counts" in need:
        from mia_ray.models.hf import load_tokenizer

        tok = load_tokenizer(cfg.model.name_or_path, cfg.model.revision, cfg.model.trust_remote_code,
                             cfg.model.gguf_file)  # fmt: skip
        ids_col = [np.asarray(t, dtype=np.int64) for t in merged["token_ids"]]
        vocab = max([len(tok)] + [int(t.max()) + 1 for t in ids_col if t.size])
        freq = smoothed_frequencies(token_counts(cfg, out), vocab)
        extra["token_ids"] = ids_col
        extra["token_freq"] = [freq[t] for t in ids_col]
        took("token_counts")
    if "neighbours" in need:
        from mia_ray.features.neighbors import Lexicon, make_neighbours

        nc, lex = a.neighbourhood, Lexicon.from_minilm()
        rows = variant_rows(scored, "nb", lambda sid, t: make_neighbours(
            t, nc.n, lex, seed=f"{a.seed}:{sid}", rate=nc.rate))  # fmt: skip
        got = pool(rows, "neighbours")
        took("neighbours", rows_dir / "neighbours")
        extra["neighbour_losses"] = [
            np.asarray(v) for v in per_snippet(ids, got, "nb", nc.n, "loss")
        ]
    if "augment" in need:
        from mia_ray.features.augment import random_swaps

        pc = a.pac
        rows = variant_rows(scored, "aug", lambda sid, t: random_swaps(
            t, pc.copies, pc.swap_share, seed=f"{a.seed}:{sid}"))  # fmt: skip
        # PAC reads the copies' token log-probs only: no vocabulary moments.
        got = pool(rows, "augment", full=True, moments=False)
        lps = per_snippet(ids, got, "aug", pc.copies, "token_logprobs")
        extra["augment_logprobs"] = [tuple(np.asarray(x) for x in v) for v in lps]
        took("augment", rows_dir / "augment")
    if "samples" in need:
        got = sampled(cfg, scored, out).set_index("snippet_id")
        extra["samples"] = [tuple(json.loads(v)) for v in got.loc[ids, "samples"]]
        took("samples", rows_dir / "samples")
    if "gradient" in need:
        got = pool(scored, "gradient", grad_norm=True)
        extra["grad_norm"] = got.set_index("snippet_id").loc[ids, "grad_norm"].tolist()
        took("gradient", rows_dir / "gradient")
    return extra


def sampled(cfg, scored: pd.DataFrame, out: Path) -> pd.DataFrame:
    """SaMIA's samples (``snippet_id``, ``samples``) from a pool of Continuations actors over
    the target (loaded in each actor), an API, or the target behind ``mia-ray serve``; a
    parts stage keyed by the texts, the model (or the API's URL and model name) and every
    sampling setting."""
    import ray

    from mia_ray import storage
    from mia_ray.actors.backend import Continuations
    from mia_ray.config import to_dict
    from mia_ray.runtime import ray_options
    from mia_ray.scoring.pools import scorer_key
    from mia_ray.stages import parts_stage

    sc, res, b = cfg.attack.samia, cfg.resources, cfg.attack.samia.backend
    local = b.loads_model or b.serve
    ident = scorer_key(cfg.model, res) if local else f"{b.base_url}|{b.model}"
    spec = {**to_dict(b), "model": b.model or cfg.model.name_or_path,
            "torch_threads": res.scorer.torch_threads, "seed": cfg.attack.seed,
            "cache_dir": str(out / "backend-cache") if not local else ""}  # fmt: skip
    stop = None
    if b.serve:
        from mia_ray.serve import serve_in_thread

        spec["base_url"], stop = serve_in_thread(
            cfg.model.name_or_path, device=b.device, dtype=b.dtype
        )
        spec["kind"], spec["cache_dir"] = "openai", ""
        spec["model"] = cfg.model.name_or_path
    if spec["kind"] != "openai":
        spec["model"] = storage.stage(spec["model"])
        opts = ray_options(res, res.scorer.cpus, res.scorer.gpus)
    else:  # an API client: on the driver's node, where its cache and a served port are
        opts = {"num_cpus": res.scorer.cpus, "num_gpus": 0, **storage.node_affinity()}
    kwargs = {"spec": spec, "n": sc.samples, "ratio": sc.prefix_ratio, "temperature": sc.temperature,
              "top_k": sc.top_k, "max_tokens": sc.max_tokens, "seed": cfg.attack.seed,
              "tokenizer": cfg.model.name_or_path if b.serve else ""}  # fmt: skip

    def mapper(todo):
        return todo.map_batches(Continuations, fn_constructor_kwargs=kwargs, batch_size=None,
                                batch_format="pandas",
                                compute=ray.data.ActorPoolStrategy(size=res.scorer.actors), **opts)  # fmt: skip

    log(f"pass samples: {sc.samples} continuations of each of {len(scored)} snippets "
        f"through the {spec['kind']} backend")  # fmt: skip
    try:
        inputs = {"model": ident, "max_length": cfg.model.max_length, "samia": to_dict(sc),
                  "seed": cfg.attack.seed}  # fmt: skip
        # Samples cost a generation per row: one model batch per block keeps progress coming.
        return parts_stage(out, "rows/samples", scored, mapper, cfg.model.batch_size,
                           inputs=inputs, block_rows=cfg.model.batch_size)  # fmt: skip
    finally:
        if stop is not None:
            stop()
