"""Wiring shared by pipelines: demo-world resolution, documents → labelled snippets, progress."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mia_ray.errors import MiaError
from mia_ray.keys import fingerprint
from mia_ray.log import log, note

__all__ = ["fingerprint", "log", "note"]  # the pipelines' wiring imports them from here


def resolved(cfg):
    """``cfg`` (a copy, filled in from the world) marked resolved: ``world.target`` moves to
    ``world.resolved``, so that resolving it again changes nothing and no check or step
    after resolution sees a world to fill in."""
    cfg.world.resolved, cfg.world.target = cfg.world.target, ""
    return cfg


def resolve_world(cfg):
    """With ``world.target`` set, build the demo world if missing; return a copy of ``cfg``
    whose data and model point at it, marked :func:`resolved` (``cfg`` itself unchanged; a
    resolved config resolves to itself)."""
    if not cfg.world.target:
        return cfg
    import copy

    cfg = copy.deepcopy(cfg)
    fill_from_world(cfg, world_paths(cfg))
    return resolved(cfg)


def fill_from_world(cfg, paths: dict[str, Any]) -> None:
    """Point ``cfg``'s data and model at one world target's ``paths`` (documents, manifest,
    model, reference), keeping what the config sets itself."""
    cfg.data.path = cfg.data.path or str(paths["documents"])
    if not cfg.data.labels:
        # A target's manifest is its evaluated set: smollm2's is a sample of the corpus.
        cfg.data.labels = str(paths["manifest"])
        cfg.data.unlabelled = "skip"
    cfg.model.name_or_path = cfg.model.name_or_path or str(paths["model"])
    if paths.get("reference"):
        cfg.model.reference = cfg.model.reference or str(paths["reference"])


def world_paths(cfg) -> dict[str, Any] | None:
    """With ``world.target`` set, the demo world (built if missing) as ``ensure_world`` gives
    it: its model, reference, key and benchmarks; else None."""
    if not cfg.world.target:
        return None
    from mia_ray.demo.world import ensure_world

    log(f"demo world at {cfg.world.resolved_root()} (target {cfg.world.target})")
    return ensure_world(cfg.world, [cfg.world.target])


def world_copy(cfg, need: str, what: str):
    """With ``world.target`` set: (a copy of ``cfg`` to fill in, marked :func:`resolved`, the
    world's paths), refusing a world whose ``need`` is empty (``what`` it lacks); else
    (``cfg``, None)."""
    info = world_paths(cfg)
    if info is None:
        return cfg, None
    if not info[need]:
        raise MiaError(f"the {cfg.world.scale} demo world has no {what}: use world.scale demo")
    import copy

    return resolved(copy.deepcopy(cfg)), info


def fit_snippets_to_window(cfg, attacks=()):
    """With ``data.snippet_size`` 0 (a snippet as long as the model reads), a copy of ``cfg``
    whose snippet size is that many tokens: ``model.max_length`` capped at the target's and
    the reference's context, leaving room for a prefix when one of ``attacks`` reads a
    snippet after one (ReCaLL, Con-ReCall; :func:`mia_ray.models.spans.window_snippet_tokens`).
    Else ``cfg`` itself."""
    if cfg.data.snippet_size:
        return cfg
    import copy

    from mia_ray.features.attacks import passes_of
    from mia_ray.models.spans import window_snippet_tokens

    reads_prefix = bool({"recall", "recall_member"} & set(passes_of(list(attacks))))

    m = cfg.model
    models = [(m.name_or_path, m.revision, m.trust_remote_code, m.gguf_file)]
    if m.reference:
        models.append((m.reference, "", m.trust_remote_code, ""))
    cfg = copy.deepcopy(cfg)
    cfg.data.snippet_size = window_snippet_tokens(models, m.max_length, reads_prefix)
    log(
        f"snippets of {cfg.data.snippet_size} tokens: what "
        f"{'both models read' if m.reference else 'the model reads'} of model.max_length "
        f"{m.max_length}"
        + (", half of the context left to ReCaLL's prefix" if reads_prefix else "")
    )
    return cfg


def check_model_early(
    name: str, what: str, revision: str = "", trust_remote_code: bool = False, gguf_file: str = ""
) -> int:
    """Fail before any scoring if a model's config or tokenizer cannot load (cheap: no weights);
    return the model's window in tokens as its config states it (0: unknown)."""
    if not name:
        return 0
    from transformers import AutoConfig

    from mia_ray.models.hf import describe_load_failure, load_tokenizer

    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if revision:
        kwargs["revision"] = revision
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    try:
        config = AutoConfig.from_pretrained(name, **kwargs)
    except Exception as e:
        raise MiaError(f"{what}: " + describe_load_failure(name, e)) from None
    try:
        tok = load_tokenizer(name, revision, trust_remote_code, gguf_file)
    except MiaError as e:
        raise MiaError(f"{what}: {e}") from None
    rows = embedding_rows(config)
    if rows and len(tok) > rows:
        # Token ids past the embedding matrix fail deep inside the first forward pass
        # (IndexError: index out of range in self), after any work before it.
        raise MiaError(
            f"{what}: {name!r} has a tokenizer of {len(tok)} tokens but an embedding matrix "
            f"of {rows} rows, so token ids {rows}..{len(tok) - 1} cannot be scored; give the "
            "tokenizer the model was trained with, or resize the model's embeddings "
            "(model.resize_token_embeddings(len(tokenizer))) and save it"
        )
    folder = Path(name).expanduser()
    for path in sorted(folder.glob("*.safetensors")) if folder.is_dir() else []:
        problem = _safetensors_problem(path)
        if problem:
            raise MiaError(f"{what}: weights file {path.name} of {name!r} {problem}")
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(getattr(text, "max_position_embeddings", 0) or getattr(text, "n_positions", 0) or 0)


def embedding_rows(config) -> int:
    """The rows of a model's input embedding matrix as its config states them (0: unknown);
    for a vision-language model, its language model's."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(getattr(text, "vocab_size", 0) or 0)


def _safetensors_problem(path: Path) -> str:
    """Why a .safetensors file cannot load ("" if its header and size agree).

    Reads the header only (8 bytes of length, then JSON): a file cut short by a copy or a
    download fails here in a line, not in the ``__init__`` of every scoring actor.
    """
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if size < 8 + n:
                return f"is cut short: {size} bytes, its header alone needs {8 + n}"
            header = json.loads(f.read(n))
        end = max(
            (v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0
        )
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return "is not a readable safetensors file (its header does not parse)"
    if 8 + n + end > size:
        return f"is cut short: {size} bytes, its tensors need {8 + n + end}"
    return ""


def check_target_early(model_cfg, attack=None, section: str = "attack") -> None:
    """:func:`check_model_early` for the target model of a job's ``model`` section; with the
    job's ``attack`` config, also that SaMIA's samples fit the window the target reads."""
    window = check_model_early(
        model_cfg.name_or_path,
        "model.name_or_path",
        model_cfg.revision,
        model_cfg.trust_remote_code,
        model_cfg.gguf_file,
    )
    if attack is None or "samia" not in attack.attacks or not attack.samia.backend.loads_model:
        return
    # A local backend (HF or vLLM) keeps the prompt's last max_length - max_tokens tokens: a sample of
    # max_tokens or more leaves no prompt, and one past the positions cannot be generated.
    window = min(n for n in (window, model_cfg.max_length) if n) if window else model_cfg.max_length
    n = attack.samia.max_tokens
    if n >= window:
        raise MiaError(
            f"{section}.samia.max_tokens = {n} does not fit the target's window of {window} "
            f"tokens (model.max_length or the model's positions), which must hold the prompt "
            f"too: give at most {window - 1}, or 0 (as many tokens as each true continuation)"
        )
