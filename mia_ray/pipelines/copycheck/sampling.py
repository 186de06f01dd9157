"""The samplers: each member's predictions p("1") per suspected snippet (Sampler actors over the members' adapters), or a black-box model's answers; each a parts stage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from mia_ray.config import to_dict
from mia_ray.data.snippets import text_key
from mia_ray.errors import MiaError
from mia_ray.pipelines.common import fingerprint, log
from mia_ray.pipelines.copycheck.config import CopyCheckJobConfig
from mia_ray.runtime import ray_options
from mia_ray.stages import parts_stage


def sample_experiment(
    cfg, e: dict, snippets: pd.DataFrame, jobs: list[dict], out: Path
) -> pd.DataFrame:
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

    threads = cfg.resources.sampler.threads()
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
            got = blackbox_rows(cfg, sus, out)
            result = result.merge(got, on="snippet_id", how="inner", validate="one_to_one")
            continue
        members = (
            [m for m in ex_jobs if m.startswith("ens-")] if sampler == "ensemble" else [sampler]
        )
        col = f"p_{sampler}"
        # The members' fingerprints carry the base model's content key and the recipe.
        own = {"mc_dropout": uc.mc_dropout} if sampler == "mcd" else {}
        inputs = {
            "members": [ex_jobs[m]["fingerprint"] for m in members],
            "sampler": common,
            "placement": uc.placement,
            "own": own,
            "gpu": cfg.resources.sampler.gpus > 0,
        }
        # The actors load the base where Ray places them (after the key: it is the same model).
        actor_kwargs = {**common, "base": storage.stage(cfg.model.name_or_path)}

        pg = None
        if sampler == "ensemble" and uc.placement == "members":
            mapper, pg = members_mapper(cfg, members, adapter, actor_kwargs, col)
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
                    compute=ray.data.ActorPoolStrategy(size=cfg.resources.sampler.actors),
                    **ray_options(
                        cfg.resources, cfg.resources.sampler.cpus, cfg.resources.sampler.gpus
                    ),
                ).select_columns(["snippet_id", col])

        log(f"{e['name']}: sampling {sampler} on {len(sus)} suspected snippets")
        try:
            got = parts_stage(
                out, f"samples/{e['name']}/{sampler}", rows, mapper, uc.batch_size,
                inputs=inputs, what=f"{e['name']}/{sampler}",
            )  # fmt: skip
        finally:
            if pg is not None:  # the reserved bundles go back to the cluster
                ray.util.remove_placement_group(pg)
        result = result.merge(got, on="snippet_id", how="inner", validate="one_to_one")
    if len(result) != len(sus):
        raise MiaError(f"{e['name']}: sampled {len(result)} of {len(sus)} snippets")
    return result.sort_values("snippet_id").reset_index(drop=True)


def blackbox_spec(cfg: CopyCheckJobConfig, out: Path) -> dict[str, Any]:
    from mia_ray.models.identity import model_key

    b = cfg.backend
    # A local or served model is ours to identify by content; a remote API's is not. `serve`
    # serves model.name_or_path under the API name backend.model; `local` loads backend.model.
    accel = cfg.resources.sampler.gpus > 0
    key = ""
    if b.serve:
        key = model_key(cfg.model, accel)
    elif b.loads_model:
        key = model_key(cfg.model, accel, b.model or None)
    return {
        **to_dict(b),
        "model": b.model or cfg.model.name_or_path,
        "model_key": key,
        "torch_threads": cfg.resources.sampler.threads(),
        "cache_dir": str(out / "backend-cache") if b.kind == "openai" else "",
        # A served model's port changes from run to run; its answers stay the model's, keyed
        # by its weights' content (new weights at the same path are asked afresh).
        "cache_scope": f"mia-ray-serve:{key}" if b.serve else "",
    }


def fit_prompts(texts: list[str], model: str) -> list[str]:
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


def blackbox_rows(cfg: CopyCheckJobConfig, sus: pd.DataFrame, out: Path) -> pd.DataFrame:
    """p("1") under each of the 10 prompts of §V-E for every snippet, through the backend in
    one actor; a stage per snippet set, so experiments sharing snippets ask once."""
    from mia_ray.models.prompt import BLACKBOX_PROMPTS
    from mia_ray.stages import frame_stage

    spec = blackbox_spec(cfg, out)
    if spec["kind"] == "local" or cfg.backend.serve:
        sus = sus.assign(text=fit_prompts(list(sus["text"]), cfg.model.name_or_path))
    same = {
        k: v
        for k, v in spec.items()
        if k not in ("cache_dir", "base_url" if cfg.backend.serve else "")
    }
    fp = fingerprint(text_key(sus), same, BLACKBOX_PROMPTS)
    # One stage per snippet set (its key in its name too), so experiments that share
    # snippets ask once and others keep theirs; the text as prompted (maybe cropped) is
    # kept beside its answers.
    got = frame_stage(out, f"samples/blackbox/{fp}", fp, lambda: _ask_blackbox(cfg, spec, sus))
    return got.drop(columns="text")


def _ask_blackbox(cfg: CopyCheckJobConfig, spec: dict, sus: pd.DataFrame) -> pd.DataFrame:
    """Every snippet of ``sus`` under the 10 prompts through one backend actor: snippet_id,
    text (as prompted) and p_blackbox (a list of 10)."""
    import ray

    from mia_ray import storage
    from mia_ray.actors.backend import BackendActor
    from mia_ray.models.prompt import BLACKBOX_PROMPTS, blackbox_p1

    where = spec["base_url"] or "a local model"
    log(
        f"blackbox: {len(sus)} snippets x {len(BLACKBOX_PROMPTS)} prompts via {spec['kind']} ({where})"
    )
    if spec["kind"] == "openai":
        # An API client that keeps its cache in --out, and may ask a server on the driver's
        # loopback (backend.serve): it runs on the driver's node.
        opts = {"num_cpus": cfg.resources.sampler.cpus, "num_gpus": 0, **storage.node_affinity()}
    else:  # a local model, loaded where Ray places the actor
        opts = ray_options(cfg.resources, cfg.resources.sampler.cpus, cfg.resources.sampler.gpus)
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
    if spec["kind"] == "openai":
        log(f"blackbox: {sent['requests_sent']} HTTP requests, {sent['cache_hits']} from the cache")
    return sus[["snippet_id", "text"]].assign(p_blackbox=p).reset_index(drop=True)


def serve_backend(cfg: CopyCheckJobConfig):
    """``backend.serve``: the target behind `mia-ray serve` on loopback; returns its stop."""
    from mia_ray.serve import serve_in_thread

    name = cfg.backend.model or cfg.model.name_or_path
    url, stop = serve_in_thread(
        cfg.model.name_or_path, name, device=cfg.model.device, dtype=cfg.model.dtype
    )
    cfg.backend.kind, cfg.backend.base_url = "openai", url
    log(f"blackbox: serving {name} at {url} (OpenAI-compatible, loopback)")
    return stop


def members_mapper(cfg, members: list[str], adapter, common: dict, col: str):
    """Placement "members": one actor per ensemble member, each pinned to its own bundle of a
    placement group (spread over GPUs and nodes); snippets stream through the 10 stages.
    Returns the mapper and the group, which the caller removes when the sampling is done.

    The group reserves members x resources.sampler.cpus CPUs for the whole sampling; Ray Data's own
    tasks need what is left, so leave at least one CPU outside it."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from mia_ray.actors import BATCH
    from mia_ray.actors.sampler import Sampler

    uc = cfg.uncertainty
    opts = ray_options(cfg.resources, cfg.resources.sampler.cpus, cfg.resources.sampler.gpus)
    # An actor placed in a bundle asks only for what the bundle holds: custom resources too.
    bundle = (
        {"CPU": cfg.resources.sampler.cpus}
        | ({"GPU": cfg.resources.sampler.gpus} if cfg.resources.sampler.gpus else {})
        | opts.get("resources", {})
    )
    total = ray.cluster_resources().get("CPU", 0)
    if total - len(members) * cfg.resources.sampler.cpus < 1:
        raise MiaError(
            f"placement=members would reserve {len(members)} x {cfg.resources.sampler.cpus:g} of the "
            f"cluster's {total:g} CPUs, leaving less than one for Ray Data's own tasks; lower "
            "resources.sampler.cpus or use uncertainty.placement=adapters"
        )
    pg = placement_group([bundle] * len(members), strategy=uc.placement_strategy)
    ready, _ = ray.wait([pg.ready()], timeout=120)
    if not ready:
        ray.util.remove_placement_group(pg)
        raise MiaError(
            f"cannot place {len(members)} ensemble actors of {bundle} ({uc.placement_strategy}) "
            "on this cluster; lower resources.sampler.cpus / gpus or use "
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
