"""Scorer actor pools as the pipelines run them: a pool over model batches, written as a
resumable parts stage, and the key of a model's numbers."""

from __future__ import annotations

from pathlib import Path


def scorer_mapper(model_cfg, res_cfg, model: str, prefix: str, lowercase: bool, full: bool,
                  context: str = "", grad_norm: bool = False, moments: bool = True):  # fmt: skip
    """``mapper(ds) -> ds``: a pool of Scorer actors over ``model_blocks`` (whole blocks of
    whole model batches), as the pipelines run it (``context``, ``grad_norm``: the Scorer's
    other passes; ``moments``: see the Scorer)."""
    import ray

    from mia_ray import storage
    from mia_ray.actors import BATCH
    from mia_ray.actors.scorer import Scorer
    from mia_ray.runtime import ray_options

    role = res_cfg.scorer
    # A model folder of the driver reaches the actors through storage (a no-op on one node).
    # Lost actors (a node that dies) are restarted and their batches retried by Ray Data's
    # own defaults for actor pools (max_restarts=-1, max_task_retries=-1): nothing to set.
    model = storage.stage(model)

    def mapper(todo):
        return todo.select_columns(["snippet_id", "text", BATCH]).map_batches(
            Scorer,
            fn_constructor_kwargs={
                "model": model,
                "device": model_cfg.device,
                "dtype": model_cfg.dtype,
                "max_length": model_cfg.max_length,
                "revision": model_cfg.revision if prefix == "" else "",
                "gguf_file": model_cfg.gguf_file if prefix == "" else "",
                "trust_remote_code": model_cfg.trust_remote_code,
                "torch_threads": role.threads(),
                "lowercase": lowercase,
                "token_stats": full,
                "prefix": prefix,
                "context": context,
                "grad_norm": grad_norm,
                "moments": moments,
            },
            batch_size=None,
            batch_format="pandas",
            compute=ray.data.ActorPoolStrategy(size=role.actors),
            **ray_options(res_cfg, role.cpus, role.gpus),
        )

    return mapper


def score_pool(
    snippets,
    model_cfg,
    res_cfg,
    model: str,
    prefix: str,
    lowercase: bool,
    full: bool,
    out_dir: Path,
    what: str = "",
    **passes,
):
    """Stream snippets (pandas: snippet_id, text) through one Scorer pool into the ``parts``
    stage ``out_dir`` (``stages.parts_stage``: resumable); ``passes``: the Scorer's
    ``context``, ``grad_norm`` or ``moments``. The stage's key is derived here from all that
    decides the numbers: the snippets by content, the model by :func:`scorer_key`, its
    window and batch size, and every option the actors are given."""
    from mia_ray.stages import BLOCK_ROWS, parts_stage

    inputs = {
        "model": scorer_key(model_cfg, res_cfg, model),
        "max_length": model_cfg.max_length,
        "prefix": prefix,
        "lowercase": lowercase,
        "full": full,
        "passes": passes,
    }
    mapper = scorer_mapper(model_cfg, res_cfg, model, prefix, lowercase, full, **passes)
    # The gradient pass costs a backward per row: one model batch per block keeps it moving.
    block = model_cfg.batch_size if passes.get("grad_norm") else BLOCK_ROWS
    return parts_stage(out_dir.parent, out_dir.name, snippets, mapper, model_cfg.batch_size,
                       inputs=inputs, what=what, block_rows=block)  # fmt: skip


def scorer_key(model_cfg, res_cfg, name: str | None = None) -> str:
    """Cache key of one Scorer's numbers: the model by content, dtype, device and whether a
    GPU turns ``dtype: auto`` into bfloat16 (see ``models.identity``)."""
    from mia_ray.models.identity import model_key

    return model_key(model_cfg, res_cfg.scorer.gpus > 0, name)
