"""CopyCheck (Li et al.): which suspected files has the model seen? No threshold, no labels.

files → snippets (pseudo-label 1 suspected / 0 surely unseen) → 12 fine-tunes per
experiment as Ray Tune trials (MC dropout, BLoB, 10 ensemble members) → Sampler actors give
10 predictions p("1") per suspected snippet and sampler → 13 uncertainty metrics each (39) →
standardize, PCA 10, max-pool per file → clustering (GMM default) oriented by rule → verdicts.
Baselines go through the same file pipeline: Min-K% at 10 ratios (Prob-Tool), neighbour
LOSS / PPL, and the supervised Meeus et al. meta-classifier; plus the blind baseline.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from mia_ray.config import CLUSTER_METHODS, CopyCheckJobConfig, to_dict
from mia_ray.errors import MiaError
from mia_ray.pipelines.common import (
    check_target_early,
    fingerprint,
    log,
    resolve_world,
    snippets_of,
)
from mia_ray.registry import pipeline
from mia_ray.runtime import describe, ray_options
from mia_ray.stages import parts_stage

# ---------------------------------------------------------------------------- experiments


def _read(path: str, data_cfg, prefix: str = "") -> pd.DataFrame:
    from mia_ray.data.readers import read_documents

    ds = read_documents(
        path,
        format=data_cfg.format,
        text_field=data_cfg.text_field,
        id_field=data_cfg.id_field,
        label_field=data_cfg.label_field,
        date_field=data_cfg.date_field,
    )
    df = ds.select_columns(["doc_id", "text"]).to_pandas()
    df["doc_id"] = prefix + df["doc_id"].astype(str)
    return df


def _experiments(cfg: CopyCheckJobConfig) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """Documents (doc_id, text) and the experiments: name, n_unseen, suspected, unseen,
    pseudo_label, truth (empty when unknown)."""
    from mia_ray.data.readers import load_manifest
    from mia_ray.data.splits import copycheck_experiment

    ex = cfg.experiment
    if ex.mode == "audit":
        sus = _read(ex.suspected, cfg.data, "suspected/")
        uns = _read(ex.unseen, cfg.data, "unseen/")
        truth: dict[str, int] = {}
        if cfg.data.labels:
            known = load_manifest(cfg.data.labels)
            truth = {
                d: int(known[d.split("/", 1)[1]])
                for d in sus["doc_id"]
                if d.split("/", 1)[1] in known
            }
            truth |= {d: 0 for d in uns["doc_id"]}
        pseudo = {d: 1 for d in sus["doc_id"]} | {d: 0 for d in uns["doc_id"]}
        n_true_unseen = (
            sum(1 for d in sus["doc_id"] if truth.get(d) == 0) if len(truth) > len(uns) else None
        )
        exps = [
            {
                "name": "audit",
                "n_unseen": n_true_unseen,
                "suspected": sorted(sus["doc_id"]),
                "unseen": sorted(uns["doc_id"]),
                "pseudo_label": pseudo,
                "truth": truth,
            }
        ]
        return pd.concat([sus, uns], ignore_index=True), exps
    if not cfg.data.labels and not cfg.world.target:
        raise MiaError("a sweep needs membership labels: set data.labels (doc_id -> 0/1 manifest)")
    docs = _read(cfg.data.path, cfg.data)
    labels = load_manifest(cfg.data.labels)
    if cfg.world.target:
        # The demo world's sweep runs on one source (the books, as in the paper).
        docs = docs[docs["doc_id"].str.startswith(ex.source + "/")]
    docs = docs[docs["doc_id"].isin(labels.keys())].reset_index(drop=True)
    seen = [d for d in docs["doc_id"] if labels[d] == 1]
    unseen = [d for d in docs["doc_id"] if labels[d] == 0]
    exps = []
    for n in ex.n_unseen_in_suspected:
        split = copycheck_experiment(seen, unseen, ex.n_suspected, n, ex.n_unseen, seed=ex.seed)
        exps.append(
            {
                "name": f"n{n}",
                "n_unseen": n,
                "suspected": split.suspected,
                "unseen": split.unseen,
                "pseudo_label": split.pseudo_label,
                "truth": split.truth,
            }
        )
    return docs, exps


def _snippets(cfg: CopyCheckJobConfig, docs: pd.DataFrame) -> pd.DataFrame:
    """Snippets (snippet_id, doc_id, text) of the documents, sorted by snippet id."""
    import ray

    snip = snippets_of(
        ray.data.from_pandas(docs[["doc_id", "text"]]), cfg.data, cfg.model.name_or_path
    )
    df = snip.select_columns(["snippet_id", "doc_id", "text"]).to_pandas()
    if df["snippet_id"].duplicated().any():
        raise MiaError("snippet ids are not unique: are document ids unique?")
    return df.sort_values("snippet_id").reset_index(drop=True)


def _text_fp(df: pd.DataFrame) -> str:
    return str(pd.util.hash_pandas_object(df[["snippet_id", "text"]], index=False).sum())


# ---------------------------------------------------------------------------- fine-tuning


def _members(cfg: CopyCheckJobConfig) -> list[str]:
    out = []
    if "mcd" in cfg.uncertainty.samplers:
        out.append("mcd")
    if "blob" in cfg.uncertainty.samplers:
        out.append("blob")
    if "ensemble" in cfg.uncertainty.samplers:
        out += [f"ens-{i}" for i in range(cfg.uncertainty.ensemble_size)]
    return out


def finetune_jobs(cfg: CopyCheckJobConfig, exps: list[dict], snippets: pd.DataFrame, out: Path):
    """Write each experiment's training snippets; return one job per (experiment, member).

    A job's fingerprint (its done.json's key) covers what decides the adapter: the training
    snippets and pseudo-labels, the member and its seed, the recipe, the base model by
    content with its dtype and device, and the data-parallel worker count (steps, BLoB's pi)."""
    from dataclasses import asdict

    from mia_ray.models.identity import model_key
    from mia_ray.reports.io import write_parquet
    from mia_ray.train.copycheck import member_seed

    uc = cfg.uncertainty
    base_key = model_key(cfg.model, uc.train_gpus > 0)
    jobs = []
    for e in exps:
        part = snippets[snippets["doc_id"].isin(e["pseudo_label"].keys())].copy()
        part["label"] = part["doc_id"].map(e["pseudo_label"]).astype(int)
        edir = out / "train" / e["name"]
        edir.mkdir(parents=True, exist_ok=True)
        train_file = edir / "snippets.parquet"
        write_parquet(train_file, part[["snippet_id", "doc_id", "text", "label"]])
        n1 = int(part["label"].sum())
        log(f"{e['name']}: fine-tuning set of {len(part)} snippets ({n1} labelled 1)")
        data_fp = fingerprint(_text_fp(part), part["label"].tolist())
        for member in _members(cfg):
            spec = asdict(cfg.finetune)
            jobs.append(
                {
                    "experiment": e["name"],
                    "member": member,
                    "base": cfg.model.name_or_path,
                    "train_file": str(train_file),
                    "out_dir": str(edir / member),
                    "spec": spec,
                    "device": cfg.model.device,
                    "dtype": cfg.model.dtype,
                    "fingerprint": fingerprint(
                        data_fp,
                        member,
                        member_seed(member, cfg.finetune.seed),
                        spec,
                        base_key,
                        max(1, uc.train_workers),
                        # A ZeRO config by content, not by its path (no part when unset, so
                        # other members keep their keys).
                        *([Path(spec["deepspeed"]).read_text()] if spec.get("deepspeed") else []),
                    ),
                }
            )
    return jobs


def _finetune(cfg: CopyCheckJobConfig, exps: list[dict], snippets: pd.DataFrame, out: Path):
    from mia_ray.train.launch import train_members

    jobs = finetune_jobs(cfg, exps, snippets, out)
    uc = cfg.uncertainty
    records = train_members(
        jobs,
        out / "tune",
        cpus=uc.train_cpus,
        gpus=uc.train_gpus,
        workers=uc.train_workers,
        max_concurrent=uc.max_concurrent_trials,
        log=log,
        res_cfg=cfg.resources,
    )
    return jobs, records


# ---------------------------------------------------------------------------- sampling


def _sample(cfg, e: dict, snippets: pd.DataFrame, jobs: list[dict], out: Path) -> pd.DataFrame:
    """p("1") lists per sampler for the suspected snippets of one experiment."""
    import ray

    from mia_ray import storage
    from mia_ray.actors.sampler import Sampler

    uc = cfg.uncertainty
    sus = snippets[snippets["doc_id"].isin(set(e["suspected"]))][["snippet_id", "text"]]
    rows = sus.reset_index(drop=True)
    ex_jobs = {j["member"]: j for j in jobs if j["experiment"] == e["name"]}
    ws = storage.current()

    def adapter(m: str) -> str:
        """Where a sampler on any node finds member ``m``'s adapter (it localizes a URL)."""
        path = Path(ex_jobs[m]["out_dir"]) / "adapter"
        return ws.url(path) if ws is not None else str(path)

    threads = max(1, int(np.ceil(uc.cpus_per_actor)))
    common = {
        "base": cfg.model.name_or_path,
        "n_samples": uc.n_samples,
        "seed": cfg.finetune.seed,
        "template": cfg.finetune.template,
        "max_length": cfg.finetune.max_length,
        "device": cfg.model.device,
        "dtype": cfg.model.dtype,
        "torch_threads": threads,
    }
    result = sus[["snippet_id"]].copy()
    for sampler in uc.samplers:
        if sampler == "blackbox":
            got = _blackbox(cfg, sus, out)
            result = result.merge(got, on="snippet_id", how="inner", validate="one_to_one")
            continue
        members = (
            [m for m in ex_jobs if m.startswith("ens-")] if sampler == "ensemble" else [sampler]
        )
        col = f"p_{sampler}"
        # The members' fingerprints carry the base model's content key and the recipe.
        own = {"mc_dropout": uc.mc_dropout} if sampler == "mcd" else {}
        fp = fingerprint(
            _text_fp(sus),
            [ex_jobs[m]["fingerprint"] for m in members],
            common,
            uc.placement,
            own,
            uc.gpus_per_actor > 0,
        )
        # The actors load the base where Ray places them (after the key: it is the same model).
        actor_kwargs = {**common, "base": storage.stage(cfg.model.name_or_path)}

        pg = None
        if sampler == "ensemble" and uc.placement == "members":
            mapper, pg = _members_mapper(cfg, members, adapter, actor_kwargs, col)
        else:

            def mapper(todo, sampler=sampler, members=members, col=col, own=own, kw=actor_kwargs):
                return todo.map_batches(
                    Sampler,
                    fn_constructor_kwargs={
                        **kw,
                        **own,
                        "kind": sampler,
                        "adapters": [adapter(m) for m in members],
                        "column": col,
                    },
                    batch_size=None,  # whole blocks of whole model batches (model_blocks)
                    batch_format="pandas",
                    compute=ray.data.ActorPoolStrategy(size=uc.sampler_actors),
                    **ray_options(cfg.resources, uc.cpus_per_actor, uc.gpus_per_actor),
                ).select_columns(["snippet_id", col])

        log(f"{e['name']}: sampling {sampler} on {len(sus)} suspected snippets")
        try:
            got = parts_stage(
                out, f"samples/{e['name']}/{sampler}", fp, rows, mapper, uc.batch_size,
                what=f"{e['name']}/{sampler}",
            )  # fmt: skip
        finally:
            if pg is not None:  # the reserved bundles go back to the cluster
                ray.util.remove_placement_group(pg)
        result = result.merge(got, on="snippet_id", how="inner", validate="one_to_one")
    if len(result) != len(sus):
        raise MiaError(f"{e['name']}: sampled {len(result)} of {len(sus)} snippets")
    return result.sort_values("snippet_id").reset_index(drop=True)


def _blackbox_spec(cfg: CopyCheckJobConfig, out: Path) -> dict[str, Any]:
    from mia_ray.models.identity import model_key

    b = cfg.backend
    # A local or served model is ours to identify by content; a remote API's is not. `serve`
    # serves model.name_or_path under the API name backend.model; `local` loads backend.model.
    accel = cfg.uncertainty.gpus_per_actor > 0
    key = ""
    if b.serve:
        key = model_key(cfg.model, accel)
    elif b.kind == "local":
        key = model_key(cfg.model, accel, b.model or None)
    return {
        **to_dict(b),
        "model": b.model or cfg.model.name_or_path,
        "model_key": key,
        "torch_threads": max(1, int(np.ceil(cfg.uncertainty.cpus_per_actor))),
        "cache_dir": str(out / "backend-cache") if b.kind == "openai" else "",
        # A served model's port changes from run to run; its answers stay the model's, keyed
        # by its weights' content (new weights at the same path are asked afresh).
        "cache_scope": f"mia-ray-serve:{key}" if b.serve else "",
    }


def _fit_prompts(texts: list[str], model: str) -> list[str]:
    """Snippets cropped (their tail dropped, as the white-box prompt does) so that every one
    of the 10 prompts around them, and the answer, fit the model's positions. A model whose
    files are here tells its limit; a remote API's prompts go as they are."""
    from transformers import AutoConfig

    from mia_ray.models.hf import load_tokenizer
    from mia_ray.models.prompt import BLACKBOX_PROMPTS

    conf = AutoConfig.from_pretrained(model).get_text_config()
    limit = getattr(conf, "max_position_embeddings", None) or getattr(conf, "n_positions", None)
    if not limit:
        return texts
    tok = load_tokenizer(model)
    n = lambda s: len(tok(s, add_special_tokens=False)["input_ids"])  # noqa: E731
    # One position for BOS, two for a token merged across the snippet's edges.
    room = limit - 1 - max(n(t.replace("{text}", "") + " 0") for t in BLACKBOX_PROMPTS) - 2
    out, cropped = [], 0
    for text in texts:
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        if len(enc["input_ids"]) > room:
            text = text[: enc["offset_mapping"][room - 1][1]]
            cropped += 1
        out.append(text)
    if cropped:
        log(f"blackbox: {cropped} of {len(texts)} snippets cropped to {room} tokens to fit {limit}")
    return out


def _blackbox(cfg: CopyCheckJobConfig, sus: pd.DataFrame, out: Path) -> pd.DataFrame:
    """p("1") under each of the 10 prompts of §V-E for every snippet, through the backend in
    one actor; cached per snippet set, so experiments sharing snippets ask once."""
    import ray

    from mia_ray import storage
    from mia_ray.actors.backend import BackendActor
    from mia_ray.models.prompt import BLACKBOX_PROMPTS, blackbox_p1
    from mia_ray.reports.io import write_parquet

    spec = _blackbox_spec(cfg, out)
    if spec["kind"] == "local" or cfg.backend.serve:
        sus = sus.assign(text=_fit_prompts(list(sus["text"]), cfg.model.name_or_path))
    same = {
        k: v
        for k, v in spec.items()
        if k not in ("cache_dir", "base_url" if cfg.backend.serve else "")
    }
    fp = fingerprint(_text_fp(sus), same, BLACKBOX_PROMPTS)
    f = out / "samples" / "blackbox" / f"{fp}.parquet"
    if f.is_file():
        return pd.read_parquet(f).drop(columns="text")
    where = spec["base_url"] or "a local model"
    log(
        f"blackbox: {len(sus)} snippets x {len(BLACKBOX_PROMPTS)} prompts via {spec['kind']} ({where})"
    )
    uc = cfg.uncertainty
    if spec["kind"] == "openai":
        # An API client that keeps its cache in --out, and may ask a server on the driver's
        # loopback (backend.serve): it runs on the driver's node.
        opts = {"num_cpus": uc.cpus_per_actor, "num_gpus": 0, **storage.node_affinity()}
    else:  # a local model, loaded where Ray places the actor
        opts = ray_options(cfg.resources, uc.cpus_per_actor, uc.gpus_per_actor)
        spec = {**spec, "model": storage.stage(spec["model"])}
    actor = ray.remote(BackendActor).options(**opts).remote(spec)
    try:
        pairs = [(t.format(text=x), o) for x in sus["text"] for t in BLACKBOX_PROMPTS
                 for o in (" 0", " 1")]  # fmt: skip
        lps = []
        step = 64 * 2 * len(BLACKBOX_PROMPTS)
        for i in range(0, len(pairs), step):
            lps += ray.get(actor.loglikelihood.remote(pairs[i : i + step]))
            log(
                f"blackbox: {min(i + step, len(pairs)) // (2 * len(BLACKBOX_PROMPTS))}/{len(sus)} snippets"
            )
        sent = ray.get(actor.stats.remote())
    finally:
        ray.kill(actor)
    tot = np.array([sum(lp) for lp in lps]).reshape(len(sus), len(BLACKBOX_PROMPTS), 2)
    p = [[blackbox_p1(a, b) for a, b in row] for row in tot]
    # The text as prompted (maybe cropped) is kept beside its answers.
    got = sus[["snippet_id", "text"]].assign(p_blackbox=p).reset_index(drop=True)
    write_parquet(f, got)
    got = got.drop(columns="text")
    if spec["kind"] == "openai":
        log(f"blackbox: {sent['requests_sent']} HTTP requests, {sent['cache_hits']} from the cache")
    return got


def _serve(cfg: CopyCheckJobConfig):
    """``backend.serve``: the target behind `mia-ray serve` on loopback; returns its stop."""
    from mia_ray.serve import serve_in_thread

    name = cfg.backend.model or cfg.model.name_or_path
    url, stop = serve_in_thread(
        cfg.model.name_or_path, name, device=cfg.model.device, dtype=cfg.model.dtype
    )
    cfg.backend.kind, cfg.backend.base_url = "openai", url
    log(f"blackbox: serving {name} at {url} (OpenAI-compatible, loopback)")
    return stop


def _members_mapper(cfg, members: list[str], adapter, common: dict, col: str):
    """Placement "members": one actor per ensemble member, each pinned to its own bundle of a
    placement group (spread over GPUs and nodes); snippets stream through the 10 stages.
    Returns the mapper and the group, which the caller removes when the sampling is done.

    The group reserves members x cpus_per_actor CPUs for the whole sampling; Ray Data's own
    tasks need what is left, so leave at least one CPU outside it."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from mia_ray.actors import BATCH
    from mia_ray.actors.sampler import Sampler

    uc = cfg.uncertainty
    opts = ray_options(cfg.resources, uc.cpus_per_actor, uc.gpus_per_actor)
    # An actor placed in a bundle asks only for what the bundle holds: custom resources too.
    bundle = (
        {"CPU": uc.cpus_per_actor}
        | ({"GPU": uc.gpus_per_actor} if uc.gpus_per_actor else {})
        | opts.get("resources", {})
    )
    total = ray.cluster_resources().get("CPU", 0)
    if total - len(members) * uc.cpus_per_actor < 1:
        raise MiaError(
            f"placement=members would reserve {len(members)} x {uc.cpus_per_actor:g} of the "
            f"cluster's {total:g} CPUs, leaving less than one for Ray Data's own tasks; lower "
            "uncertainty.cpus_per_actor or use uncertainty.placement=adapters"
        )
    pg = placement_group([bundle] * len(members), strategy=uc.placement_strategy)
    ready, _ = ray.wait([pg.ready()], timeout=120)
    if not ready:
        ray.util.remove_placement_group(pg)
        raise MiaError(
            f"cannot place {len(members)} ensemble actors of {bundle} ({uc.placement_strategy}) "
            "on this cluster; lower uncertainty.cpus_per_actor / gpus_per_actor or use "
            "uncertainty.placement=adapters"
        )
    cols = [f"{col}_{i}" for i in range(len(members))]

    def mapper(todo):
        ds = todo
        for i, m in enumerate(members):
            ds = ds.map_batches(
                Sampler,
                fn_constructor_kwargs={
                    **common,
                    "kind": "ensemble",
                    "adapters": [adapter(m)],
                    "column": cols[i],
                    "scalar": True,
                },
                batch_size=None,  # whole blocks of whole model batches (model_blocks)
                batch_format="pandas",
                compute=ray.data.ActorPoolStrategy(size=1),
                **opts,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    pg, placement_group_bundle_index=i
                ),
            )

        def gather(batch: pd.DataFrame) -> pd.DataFrame:
            out = batch[["snippet_id", BATCH]].copy()
            out[col] = list(batch[cols].to_numpy(dtype=np.float64))
            return out

        # A light task: the bundles above already hold most CPUs of a small machine.
        return ds.map_batches(gather, batch_format="pandas", num_cpus=0.05)

    return mapper, pg


# ---------------------------------------------------------------------------- features


def _uncertainty(cfg, preds: pd.DataFrame) -> tuple[np.ndarray, list[str], np.ndarray]:
    """39 (13 per sampler) features per suspected snippet, their names, and the orientation
    score: the snippet's aleatoric uncertainty averaged over the samplers."""
    from mia_ray.features.uncertainty import feature_names, uncertainty_features

    blocks, names, ale = [], [], []
    y = np.ones(len(preds), dtype=int)  # every suspected snippet carries pseudo-label 1
    for sampler in cfg.uncertainty.samplers:
        p = np.stack(preds[f"p_{sampler}"].to_numpy()).astype(np.float64)
        f = uncertainty_features(p, y, eps=cfg.uncertainty.eps)
        blocks.append(f)
        names += feature_names(sampler)
        ale.append(f[:, 0])
    return np.hstack(blocks), names, np.mean(ale, axis=0)


def _score_target(
    cfg, rows: pd.DataFrame, out_dir: Path, token_stats: bool, scored: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Scorer pass (target model) over rows (snippet_id, text): loss, token log-probs.

    ``scored``: rows the caller already scored with this very ``cfg.model`` (text plus the
    Scorer's columns, token statistics included); snippets with one of those texts are not
    scored again, so a pass over the same snippets is the only one."""
    from mia_ray.models.identity import model_key
    from mia_ray.pipelines.attack import score_pool

    rows = rows[["snippet_id", "text"]].reset_index(drop=True)
    known = pd.DataFrame()
    if scored is not None and len(scored):
        by_text = scored.drop(columns=["snippet_id", "doc_id", "lower_loss"], errors="ignore")
        by_text = by_text.drop_duplicates("text").set_index("text")
        hit = rows["text"].isin(by_text.index)
        known = rows[hit].join(by_text, on="text").drop(columns="text")
        rows = rows[~hit].reset_index(drop=True)
        if len(known):
            log(f"{len(known)} snippets' target scores reused from the caller's pass")
        if not len(rows):
            return known.reset_index(drop=True)
    # Keyed on the target by content (weights, tokenizer), dtype, device and the options.
    key = model_key(cfg.model, cfg.resources.gpus_per_actor > 0)
    fp = fingerprint(_text_fp(rows), key, cfg.model.max_length, token_stats)
    # (score_pool stages the target for Scorer actors on any node; the key is its content.)
    new = score_pool(
        rows, cfg.model, cfg.resources, cfg.model.name_or_path, "", False, token_stats, out_dir, fp
    )
    return pd.concat([known, new], ignore_index=True) if len(known) else new


def _baseline_features(
    cfg, snippets: pd.DataFrame, union_ids: set[str], out: Path, scored: pd.DataFrame | None
) -> dict:
    """Per-snippet baseline features for every suspected snippet of any experiment
    (``scored``: see :func:`_score_target`)."""
    from mia_ray.features.attacks import min_k, stats_from_columns

    dc = cfg.detect
    feats: dict[str, Any] = {}
    rows = snippets[snippets["doc_id"].isin(union_ids)].reset_index(drop=True)
    need_scores = {"prob_tool", "neighbor_loss", "neighbor_ppl"} & set(dc.baselines)
    if not need_scores:
        return feats
    log(f"baselines: scoring {len(rows)} suspected snippets with the target")
    tgt = _score_target(cfg, rows, out / "rows" / "target", True, scored)
    tgt = rows[["snippet_id", "doc_id", "text"]].merge(tgt, on="snippet_id", validate="one_to_one")
    if "prob_tool" in dc.baselines:
        stats = stats_from_columns(tgt["text"], tgt["token_logprobs"], tgt["mu"], tgt["sigma"])
        X = np.array([[min_k(s, r) for r in dc.min_k_ratios] for s in stats])
        # Min-K% scores are higher for members: the negated mean orients "unseen".
        feats["prob_tool"] = (tgt["snippet_id"].to_numpy(), X, -X.mean(axis=1))
    if {"neighbor_loss", "neighbor_ppl"} & set(dc.baselines):
        from mia_ray.features.neighbors import DESCRIPTION, Lexicon, make_neighbours

        lex = Lexicon.from_minilm()
        nb_rows = []
        for sid, text in zip(tgt["snippet_id"], tgt["text"], strict=True):
            nbs = make_neighbours(
                text, dc.n_neighbors, lex, seed=f"{dc.seed}:{sid}", rate=dc.neighbor_rate
            )
            nb_rows += [(f"{sid}#nb{j}", t) for j, t in enumerate(nbs)]
        nb = pd.DataFrame(nb_rows, columns=["snippet_id", "text"])
        log(f"baselines: scoring {len(nb)} neighbour texts ({dc.n_neighbors} per snippet)")
        nb_scores = _score_target(cfg, nb, out / "rows" / "neighbours", False)
        nb_loss = nb_scores.set_index("snippet_id")["loss"]
        own = tgt["loss"].to_numpy(dtype=np.float64)
        L = np.array(
            [[nb_loss[f"{sid}#nb{j}"] for j in range(dc.n_neighbors)] for sid in tgt["snippet_id"]]
        )
        d_loss = own[:, None] - L  # Mattern et al.: a member's loss sits below its neighbours'
        d_ppl = np.exp(own)[:, None] - np.exp(L)
        if "neighbor_loss" in dc.baselines:
            feats["neighbor_loss"] = (tgt["snippet_id"].to_numpy(), d_loss, d_loss.mean(axis=1))
        if "neighbor_ppl" in dc.baselines:
            feats["neighbor_ppl"] = (tgt["snippet_id"].to_numpy(), d_ppl, d_ppl.mean(axis=1))
        feats["_neighbours"] = DESCRIPTION
    feats["_target_rows"] = tgt
    return feats


def _meeus(cfg, suspected_rows: pd.DataFrame, out: Path) -> dict | None:
    """Train the Meeus et al. meta-classifier on labelled files disjoint from the audited ones;
    return its per-file seen-probabilities for the suspected files (or None, with why)."""

    from mia_ray.data.readers import load_manifest
    from mia_ray.data.splits import sample_per_class
    from mia_ray.detectors.meeus import MeeusClassifier, meeus_features

    dc = cfg.detect
    if dc.meeus_data:
        docs = _read(dc.meeus_data, cfg.data)
        labels = load_manifest(dc.meeus_labels) if dc.meeus_labels else None
        if labels is None:
            raise MiaError("detect.meeus_data needs detect.meeus_labels (doc_id -> 0/1)")
        where = dc.meeus_data
    elif cfg.world.target:
        docs = _read(cfg.data.path, cfg.data)
        labels = load_manifest(cfg.data.labels)
        docs = docs[docs["doc_id"].str.startswith(dc.meeus_source + "/")]
        where = f"demo world, source {dc.meeus_source!r}"
    else:
        return {"skipped": "no labelled training files (set detect.meeus_data and meeus_labels)"}
    docs = docs[docs["doc_id"].isin(labels.keys())]
    docs = docs[~docs["doc_id"].isin(set(suspected_rows["doc_id"]))]
    lab = sample_per_class(
        {d: labels[d] for d in docs["doc_id"]}, dc.meeus_max_docs_per_class, dc.seed
    )
    docs = docs[docs["doc_id"].isin(lab.keys())].reset_index(drop=True)
    train_rows = _snippets(cfg, docs)
    log(f"Meeus et al.: scoring {len(train_rows)} snippets of {len(docs)} labelled training files")
    scored = _score_target(cfg, train_rows, out / "rows" / "meeus_train", True)
    scored = train_rows.merge(scored, on="snippet_id", validate="one_to_one")
    ids, F = meeus_features(
        [np.asarray(v, dtype=np.float64) for v in scored["token_logprobs"]],
        scored["doc_id"].to_numpy(),
    )
    clf = MeeusClassifier(seed=dc.seed).fit(F, np.array([lab[d] for d in ids]))
    sids, SF = meeus_features(
        [np.asarray(v, dtype=np.float64) for v in suspected_rows["token_logprobs"]],
        suspected_rows["doc_id"].to_numpy(),
    )
    proba = clf.predict_proba(SF)[:, 1]
    n1 = sum(lab.values())
    return {
        "p_seen": dict(zip(sids, proba.tolist(), strict=True)),
        "train": {"where": where, "n_files": len(lab), "n_seen": n1, "n_unseen": len(lab) - n1},
    }


# ---------------------------------------------------------------------------- detection


def _row(method: str, e: dict, conf: dict, features: str) -> dict:
    return {
        "method": method,
        "n_unseen": e["n_unseen"],
        "experiment": e["name"],
        "features": features,
        **{k: conf[k] for k in ("acc", "bacc", "tp", "fp", "fn", "tn")},
    }


def _detect(cfg, e, X, snip_doc, unseen_score, method) -> dict:
    from mia_ray.detectors.filelevel import detect_files

    return detect_files(
        X,
        snip_doc,
        unseen_score,
        method=method,
        n_components=cfg.detect.pca_components,
        seed=cfg.detect.seed,
    )


@pipeline(
    "copycheck",
    CopyCheckJobConfig,
    help="CopyCheck: which suspected files the model has seen, from fine-tuning uncertainty",
)
def run(cfg: CopyCheckJobConfig, out: Path, scored: pd.DataFrame | None = None) -> dict:
    """``scored``: the target's rows of a pass the caller made over the same snippets with the
    same ``model`` config (the audit's), reused by the baselines instead of a second pass."""
    from mia_ray.detectors.blind import BlindBagOfWords
    from mia_ray.detectors.filelevel import confusion
    from mia_ray.reports.copycheck import FINETUNE_COLUMNS, render_copycheck_report
    from mia_ray.reports.io import write_json, write_parquet

    t0 = time.time()
    resolve_world(cfg)
    remote_only = cfg.uncertainty.samplers == ["blackbox"] and cfg.backend.kind == "openai"
    if not (remote_only and not cfg.backend.serve):  # an API-only model has no local files
        check_target_early(cfg.model)
    docs, exps = _experiments(cfg)
    used = sorted(set().union(*(e["pseudo_label"].keys() for e in exps)))
    docs = docs[docs["doc_id"].isin(used)].reset_index(drop=True)
    snippets = _snippets(cfg, docs)
    write_parquet(out / "snippets.parquet", snippets)
    n_per = snippets.groupby("doc_id").size()
    log(
        f"{len(exps)} experiment(s), {len(docs)} files, {len(snippets)} snippets "
        f"({n_per.mean():.1f} per file)"
    )
    t_data = time.time() - t0

    t1 = time.time()
    # The black-box sampler alone fine-tunes nothing.
    jobs, records = _finetune(cfg, exps, snippets, out) if _members(cfg) else ([], [])
    t_train = time.time() - t1
    server = _serve(cfg) if cfg.backend.serve and "blackbox" in cfg.uncertainty.samplers else None

    t2 = time.time()
    results, files, snip_tables = [], [], []
    union = sorted(set().union(*(e["suspected"] for e in exps)))
    base = _baseline_features(cfg, snippets, set(union), out, scored)
    meeus = None
    if "meeus" in cfg.detect.baselines:
        tgt = base.get("_target_rows")
        if tgt is None:
            rows = snippets[snippets["doc_id"].isin(set(union))]
            tgt = rows.merge(
                _score_target(cfg, rows, out / "rows" / "target", True, scored), on="snippet_id"
            )
        meeus = _meeus(cfg, tgt, out)
    blind = []
    try:
        for e in exps:
            preds = _sample(cfg, e, snippets, jobs, out)
            preds = preds.merge(
                snippets[["snippet_id", "doc_id"]], on="snippet_id", validate="one_to_one"
            )
            X, names, ale = _uncertainty(cfg, preds)
            snip_doc = preds["doc_id"].to_numpy()
            truth = e["truth"]
            known = bool(truth) and all(d in truth for d in e["suspected"])
            table = preds[["snippet_id", "doc_id"]].copy()
            table["experiment"], table["n_unseen"] = e["name"], e["n_unseen"]
            table["truth"] = table["doc_id"].map(truth) if known else np.nan
            for s in cfg.uncertainty.samplers:
                table[f"p_{s}"] = preds[f"p_{s}"]
            for j, n in enumerate(names):
                table[n] = X[:, j]
            snip_tables.append(table)
            for method in cfg.detect.methods:
                det = _detect(cfg, e, X, snip_doc, ale, method)
                if known:
                    results.append(
                        _row(
                            method,
                            e,
                            confusion(det["verdict"], [truth[f] for f in det["file_ids"]]),
                            "uncertainty",
                        )
                    )
                if method == cfg.detect.methods[0]:
                    for f, v, c in zip(
                        det["file_ids"], det["verdict"], det["confidence"], strict=True
                    ):
                        files.append(
                            {
                                "experiment": e["name"],
                                "n_unseen": e["n_unseen"],
                                "method": method,
                                "file_id": f,
                                "verdict": "seen" if v == 1 else "unseen",
                                "confidence": float(c),
                                "label": int(truth[f]) if f in truth else None,
                            }
                        )
            sus = set(e["suspected"])
            for name in ("prob_tool", "neighbor_loss", "neighbor_ppl"):
                if name not in base:
                    continue
                sids, F, score = base[name]
                docs_of = snippets.set_index("snippet_id").loc[sids, "doc_id"].to_numpy()
                keep = np.isin(docs_of, list(sus))
                det = _detect(
                    cfg, e, F[keep], docs_of[keep], score[keep], cfg.detect.baseline_method
                )
                if known:
                    results.append(
                        _row(
                            name,
                            e,
                            confusion(det["verdict"], [truth[f] for f in det["file_ids"]]),
                            name,
                        )
                    )
            if meeus and "p_seen" in meeus and known:
                fids = sorted(sus)
                verdict = [int(meeus["p_seen"][f] >= 0.5) for f in fids]
                results.append(
                    _row("meeus", e, confusion(verdict, [truth[f] for f in fids]), "meeus")
                )
            if cfg.eval.blind_baseline and known:
                texts = docs.set_index("doc_id").loc[sorted(sus), "text"].tolist()
                y = np.array([truth[f] for f in sorted(sus)])
                if min(y.sum(), len(y) - y.sum()) >= 2:
                    folds = int(min(cfg.eval.threshold_folds, y.sum(), len(y) - y.sum()))
                    s = BlindBagOfWords(folds=folds, seed=cfg.eval.seed).oof_scores(texts, y)
                    blind.append(
                        {"experiment": e["name"], "n_unseen": e["n_unseen"], **_blind_row(s, y)}
                    )
    finally:
        if server is not None:
            server()
    t_detect = time.time() - t2
    snip_all = pd.concat(snip_tables, ignore_index=True)
    write_parquet(out / "uncertainty.parquet", snip_all)
    write_parquet(out / "files.parquet", pd.DataFrame(files))

    summary = _summary(results)
    report: dict[str, Any] = {
        "pipeline": "copycheck",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": {"name_or_path": cfg.model.name_or_path},
        "data": {
            "mode": cfg.experiment.mode,
            "n_files": len(docs),
            "n_snippets": len(snippets),
            "snippet": f"{cfg.data.snippet_size} {cfg.data.snippet_unit}",
            "experiments": [
                {
                    "name": e["name"],
                    "n_unseen": e["n_unseen"],
                    "n_suspected": len(e["suspected"]),
                    "n_unseen_set": len(e["unseen"]),
                }
                for e in exps
            ],
        },
        "results": results,
        "summary": summary,
        "files": files,
        "blind_baseline": blind,
        "finetune": {
            "records": [
                {k: r.get(k) for k in FINETUNE_COLUMNS} | {"experiment": j["experiment"]}
                for j, r in zip(jobs, records, strict=True)
            ],
            "spec": records[0]["spec"] if records else None,
            "mc_dropout": cfg.uncertainty.mc_dropout,
            "blob_kl_pi": sorted({r["kl_pi"] for r in records if r.get("kl_pi") is not None}),
        },
        "baselines": {
            "neighbours": base.get("_neighbours"),
            "min_k_ratios": cfg.detect.min_k_ratios,
            "meeus": {k: v for k, v in (meeus or {}).items() if k != "p_seen"} or None,
            "method": cfg.detect.baseline_method,
        },
        "runtime": describe(),
        "timings": {
            "data_s": round(t_data, 2),
            "finetune_s": round(t_train, 2),
            "detect_s": round(t_detect, 2),
        },
    }
    report["diagnostics"] = _fit_diagnostic(records)
    report["notes"] = _notes(cfg, report)
    write_json(out / "report.json", report)
    render_copycheck_report(report, snip_all, out / "report.html")
    return report


def _blind_row(scores: np.ndarray, y: np.ndarray) -> dict:
    from mia_ray.detectors.filelevel import confusion
    from mia_ray.stats.metrics import roc_auc

    conf = confusion((scores >= 0.5).astype(int), y)
    return {"auc": roc_auc(scores, y), **{k: conf[k] for k in ("acc", "bacc")}}


def _fit_diagnostic(records: list[dict]) -> dict:
    """Did the fine-tunes learn more than the pseudo-labels' base rate? Label-free: compares
    their final training loss with the entropy of the base rate (the loss of a model that
    predicts the share of 1s for every snippet). Near 1, the uncertainty carries little signal."""
    rows = [r for r in records if r.get("final_loss") is not None and r.get("n_train")]
    if not rows:
        return {}
    share = np.mean([r["n_label1"] / r["n_train"] for r in rows])
    entropy = float(-(share * np.log(share) + (1 - share) * np.log(1 - share)))
    final = float(np.mean([r["final_loss"] for r in rows]))
    return {
        "base_rate_entropy": entropy,
        "mean_final_loss": final,
        "loss_over_entropy": final / entropy,
    }


def _summary(results: list[dict]) -> dict:
    """Mean accuracy and balanced accuracy per method over the experiments."""
    out: dict[str, dict] = {}
    for r in results:
        out.setdefault(r["method"], {"acc": [], "bacc": []})
        out[r["method"]]["acc"].append(r["acc"])
        out[r["method"]]["bacc"].append(r["bacc"])
    return {
        m: {
            "mean_acc": float(np.mean(v["acc"])),
            "mean_bacc": float(np.mean(v["bacc"])),
            "n": len(v["acc"]),
        }
        for m, v in out.items()
    }


def _notes(cfg, report: dict) -> list[str]:
    ft = cfg.finetune
    notes = []
    if "blackbox" in cfg.uncertainty.samplers:
        from mia_ray.models.prompt import BLACKBOX_PROMPTS

        b = cfg.backend
        notes.append(
            f"Black-box sampler (§V-E): no fine-tune; the target answers {len(BLACKBOX_PROMPTS)} "
            "differently worded 'seen this text? 0 or 1' prompts per snippet, through the "
            f"{b.kind} backend{' at ' + b.base_url if b.kind == 'openai' else ''}; each "
            "prediction is the softmax over the log-probs of the answers ' 0' and ' 1'."
        )
    if _members(cfg):
        notes.append(
            f"Each experiment fine-tunes {len(_members(cfg))} models (LoRA r {ft.lora_r}, alpha "
            f"{ft.lora_alpha}, lr {ft.lr:g}, {ft.epochs:g} epoch(s), batch {ft.batch_size}); MC dropout "
            f"and BLoB give {cfg.uncertainty.n_samples} predictions per snippet, the ensemble one per "
            "member. Each prediction is the softmax over the logits of the answer tokens 0 and 1 only. "
            f"The learning rate warms up linearly over the first {ft.warmup_ratio:.0%} of the steps "
            "(finetune.warmup_ratio; 6% in the authors' scripts), then decays linearly."
        )
    if "mcd" in cfg.uncertainty.samplers:
        notes.append(
            "MC dropout samples with every dropout of the model switched on (model.train(), as "
            "the CopyCheck and BLoB reference code do; uncertainty.mc_dropout=all)"
            if cfg.uncertainty.mc_dropout == "all"
            else "MC dropout samples with only the LoRA layers' dropout switched on, the rest of "
            "the model in eval mode (uncertainty.mc_dropout=lora; the reference code switches "
            "on every dropout)"
        )
        notes[-1] += (
            f"; each of a snippet's {cfg.uncertainty.n_samples} passes draws its own masks."
        )
    pis = report["finetune"].get("blob_kl_pi") or []
    if "blob" in cfg.uncertainty.samplers and pis:
        notes.append(
            "BLoB steps pi x KL with its own SGD (lr "
            f"{ft.blob_kl_lr:g}) after each optimizer step, pi = finetune.blob_kl_weight / "
            "optimizer steps per epoch (batch x grad_accum x Ray Train workers snippets a step), "
            f"so the KL adds up to the same pressure per epoch however batches are split: pi = "
            + ", ".join(f"{p:.4g}" for p in pis)
            + "."
        )
    notes += [
        "Features: the 13 uncertainty metrics of §IV-B per sampler, standardized, PCA to "
        f"{cfg.detect.pca_components}, max-pooled per file. The group of files with the higher mean "
        "aleatoric uncertainty is called unseen (a rule, never the cluster index); a method that "
        "finds a single group calls every file unseen.",
        "Hyperparameters were fixed before any label was looked at; labels only score the verdicts.",
        "Accuracy and balanced accuracy are computed from the confusion counts: balanced accuracy is "
        "(TPR + TNR) / 2 with seen files as positives.",
    ]
    diag = report.get("diagnostics") or {}
    if diag and diag["loss_over_entropy"] > 0.9:
        notes.append(
            f"Warning: the fine-tuned models ended at a mean training loss of "
            f"{diag['mean_final_loss']:.3f}, {diag['loss_over_entropy']:.0%} of the "
            f"{diag['base_rate_entropy']:.3f} a model reaches by predicting the share of 1s for "
            "every snippet: they learned little beyond the base rate, so their uncertainty carries "
            "little about the files. This is measured without any true label."
        )
    nb = report["baselines"]["neighbours"]
    if nb:
        notes.append(f"Neighbour baselines: {nb}.")
    me = report["baselines"]["meeus"]
    if me and "train" in me:
        t = me["train"]
        notes.append(
            f"Meeus et al.: a random forest on token-probability histograms, trained on {t['n_files']} "
            f"labelled files ({t['n_seen']} seen, {t['n_unseen']} unseen; {t['where']}) disjoint from "
            "the audited files; a file is called seen when its predicted probability is at least 0.5."
        )
    elif me and "skipped" in me:
        notes.append(f"Meeus et al. skipped: {me['skipped']}.")
    s = report["summary"]
    if "gmm" in s:
        best_base = max(
            ((m, v["mean_bacc"]) for m, v in s.items() if m not in CLUSTER_METHODS),
            key=lambda kv: kv[1],
            default=None,
        )
        line = f"CopyCheck (GMM) mean balanced accuracy over the experiments: {s['gmm']['mean_bacc']:.3f}"
        if best_base:
            line += f"; best baseline {best_base[0]}: {best_base[1]:.3f}"
        notes.append(line + ". The paper reports 0.901 (LLaMA 7B) and 0.916 (LLaMA2 7B).")
    return notes
