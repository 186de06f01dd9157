"""TargetLM: the target model role of MemHunter: greedy continuations and the loss of y.

Given a prompt p (text, from the hunter or a baseline) and a pair (x, y) in the target's
token ids, the context is ``bos + tokens(p) + x_ids``, where ``bos`` is what the target's
tokenizer puts before a text by default (a Llama-family model trained with a BOS token
expects it; GPT-2's tokenizer adds none). ``__call__`` returns, per row, the greedy
continuation of ``len(y_ids)`` tokens, its memorization value mu = LCSS / |y| on tokens
(MemHunter eq. 3) and the teacher-forced mean NLL of y after the context (the loss L(p, x, y)
that ranks candidate prompts, eq. 5).
"""

from __future__ import annotations

import inspect

import numpy as np
import pandas as pd

from mia_ray.data.pairs import bos_prefix
from mia_ray.features.lcss import memorization
from mia_ray.models.hf import left_pad
from mia_ray.runtime import ray_options
from mia_ray.storage import for_remote


class TargetLM:
    """``__call__(batch)``: rows with ``prompt`` (str), ``x_ids`` and ``y_ids`` (int lists)
    -> the same rows plus ``out_ids``, ``mu`` and ``loss``. Serves Ray Data or an ActorPool."""

    def __init__(
        self,
        model: str,
        device: str = "auto",
        dtype: str = "auto",
        revision: str = "",
        trust_remote_code: bool = False,
        torch_threads: int = 0,
    ):
        from mia_ray.models.hf import load_causal_lm, set_torch_threads

        set_torch_threads(torch_threads)
        self.model, self.tok, self.device = load_causal_lm(
            model, device, dtype, revision, trust_remote_code
        )
        self.pad = self.tok.pad_token_id
        self.bos = bos_prefix(self.tok)

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Prompt texts in the target's tokens, without special tokens (GCG's start)."""
        return [list(self.tok(t, add_special_tokens=False)["input_ids"]) for t in texts]

    def context(self, prompt_ids: list[int], x_ids: list[int]) -> list[int]:
        """What the target reads before y: its BOS (if its tokenizer adds one), p, x."""
        return [*self.bos, *map(int, prompt_ids), *map(int, x_ids)]

    def contexts(self, prompts: list[str], x_ids: list[list[int]]) -> list[list[int]]:
        return [self.context(p, x) for p, x in zip(self.encode(prompts), x_ids, strict=True)]

    def generate(self, contexts: list[list[int]], new_tokens: int) -> list[list[int]]:
        """Greedy continuations, ``new_tokens`` each (no early stop at EOS: |output| = |y|)."""
        import torch

        ids, mask, pos = left_pad(contexts, self.pad, self.device)
        out = []
        past = None
        # transformers 5 renamed the KV cache argument and output field to `cache`.
        key = (
            "cache"
            if "cache" in inspect.signature(self.model.forward).parameters
            else "past_key_values"
        )
        with torch.inference_mode():
            step_ids, step_pos = ids, pos
            for _ in range(new_tokens):
                res = self.model(
                    input_ids=step_ids,
                    attention_mask=mask,
                    position_ids=step_pos,
                    use_cache=True,
                    logits_to_keep=1,
                    **{key: past},
                )
                past = getattr(res, key)
                nxt = res.logits[:, -1].argmax(-1, keepdim=True)
                out.append(nxt)
                step_ids = nxt
                step_pos = step_pos[:, -1:] + 1
                mask = torch.cat([mask, torch.ones_like(nxt)], dim=1)
        return torch.cat(out, dim=1).cpu().tolist() if out else [[] for _ in contexts]

    def loss(self, contexts: list[list[int]], y_ids: list[list[int]]) -> list[float]:
        """Mean NLL of each y after its context (teacher forcing), one padded pass."""
        import torch

        seqs = [list(c) + list(y) for c, y in zip(contexts, y_ids, strict=True)]
        ids, mask, pos = left_pad(seqs, self.pad, self.device)
        # Left padding puts every y at the end: project only the positions that predict y.
        keep = max(len(y) for y in y_ids) + 1
        with torch.inference_mode():
            logits = self.model(
                input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=keep
            ).logits
        logp = torch.log_softmax(logits[:, -keep:-1].float(), dim=-1)
        tok_lp = logp.gather(-1, ids[:, -keep + 1 :, None]).squeeze(-1)
        out = []
        for i, y in enumerate(y_ids):
            n = len(y)
            out.append(float(-tok_lp[i, -n:].mean()))
        return out

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        x_ids = [list(map(int, x)) for x in batch["x_ids"]]
        y_ids = [list(map(int, y)) for y in batch["y_ids"]]
        if "prompt_ids" in batch:  # prompts already in the target's tokens (GCG)
            ctx = [self.context(p, x) for p, x in zip(batch["prompt_ids"], x_ids, strict=True)]
        else:
            ctx = self.contexts([str(p) for p in batch["prompt"]], x_ids)
        n = max(len(y) for y in y_ids)
        outs = [o[: len(y)] for o, y in zip(self.generate(ctx, n), y_ids, strict=True)]
        res = batch.copy()
        res["out_ids"] = outs
        res["mu"] = np.array([memorization(o, y) for o, y in zip(outs, y_ids, strict=True)])
        res["loss"] = self.loss(ctx, y_ids)
        return res

    def score(self, prompts: list[str], x_ids: list[list[int]], y_ids: list[list[int]]):
        """(mu, loss) arrays for text prompts: the ``score`` callable of hunter training."""
        res = self(pd.DataFrame({"prompt": prompts, "x_ids": x_ids, "y_ids": y_ids}))
        return res["mu"].to_numpy(dtype=float), res["loss"].to_numpy(dtype=float)

    def allowed_tokens(self) -> np.ndarray:
        """Token ids GCG may place in a prompt: every id but the special ones."""
        special = set(self.tok.all_special_ids)
        n = self.model.get_input_embeddings().weight.shape[0]
        return np.array([i for i in range(min(n, len(self.tok))) if i not in special])

    def gcg_step(
        self,
        prompt_ids: list[int],
        x_ids: list[int],
        y_ids: list[int],
        top_k: int,
        n_candidates: int,
        rng: np.random.Generator,
        allowed: np.ndarray,
    ) -> tuple[list[int], float]:
        """One step of Greedy Coordinate Gradient (Zou et al. 2023; MemHunter Algorithm 4).

        The gradient of the loss of y with respect to the one-hot prompt tokens gives, per
        position, the ``top_k`` most promising substitutes (among ``allowed``); each of
        ``n_candidates`` candidates swaps one uniformly drawn position for one of its
        substitutes; the candidate (or the current prompt) with the lowest loss is returned
        with that loss.
        """
        import torch

        emb = self.model.get_input_embeddings()
        W = emb.weight
        p = torch.tensor(prompt_ids, device=self.device)
        onehot = torch.zeros(len(prompt_ids), W.shape[0], device=self.device, dtype=W.dtype)
        onehot[torch.arange(len(prompt_ids)), p] = 1.0
        onehot.requires_grad_(True)
        rest = torch.tensor(list(x_ids) + list(y_ids), device=self.device)
        bos = torch.tensor(self.bos, dtype=torch.long, device=self.device)
        with torch.enable_grad():
            embeds = torch.cat([emb(bos).detach(), onehot @ W, emb(rest).detach()], dim=0)[None]
            logits = self.model(inputs_embeds=embeds).logits[0]
            n = len(y_ids)
            logp = torch.log_softmax(logits[-n - 1 : -1].float(), dim=-1)
            target = torch.tensor(list(y_ids), device=self.device)
            loss = -logp.gather(-1, target[:, None]).mean()
            (grad,) = torch.autograd.grad(loss, onehot)
        mask = torch.full((W.shape[0],), float("inf"), device=self.device)
        mask[torch.from_numpy(allowed).to(self.device)] = 0.0
        subs = torch.topk(-(grad.float() + mask), top_k, dim=-1).indices.cpu().numpy()
        cands = [list(prompt_ids)]
        for _ in range(n_candidates):
            c = list(prompt_ids)
            pos = int(rng.integers(len(c)))
            c[pos] = int(subs[pos, rng.integers(top_k)])
            cands.append(c)
        losses = self.loss([self.context(c, x_ids) for c in cands], [list(y_ids)] * len(cands))
        best = int(np.argmin(losses))
        return cands[best], float(losses[best])

    def gcg_run(
        self,
        prompt_ids: list[int],
        x_ids: list[int],
        y_ids: list[int],
        budgets_s: list[float],
        top_k: int,
        n_candidates: int,
        seed: int,
        stop_at_full: bool = False,
        check_every: int = 1,
    ) -> dict:
        """GCG on one pair for ``max(budgets_s)`` seconds of wall clock (MiniPrompt, and the
        plug-in from a hunter prompt). ``prompt_ids`` (target tokens) is the start; an empty
        one is not allowed. Returns, in the order of ``budgets_s`` (which need not be sorted),
        the prompt at each budget (``snapshots``) and the steps run by then
        (``snapshot_steps``); the steps run in all; and with ``stop_at_full`` the seconds until
        mu reached 1 (checked every ``check_every`` steps; the checks count towards the time),
        else None."""
        import time

        if not prompt_ids:
            raise ValueError("gcg_run needs a non-empty starting prompt")
        rng = np.random.default_rng(seed)
        allowed = self.allowed_tokens()
        order = sorted(range(len(budgets_s)), key=lambda i: float(budgets_s[i]))
        budgets = [float(budgets_s[i]) for i in order]
        prompt, snaps, steps, recovered = list(map(int, prompt_ids)), [], 0, None
        at: list[int] = []
        x, y = list(map(int, x_ids)), list(map(int, y_ids))
        t0 = time.perf_counter()
        while len(snaps) < len(budgets):
            elapsed = time.perf_counter() - t0
            while len(snaps) < len(budgets) and elapsed >= budgets[len(snaps)]:
                snaps.append(list(prompt))
                at.append(steps)
            if len(snaps) == len(budgets):
                break
            prompt, _ = self.gcg_step(prompt, x, y, top_k, n_candidates, rng, allowed)
            steps += 1
            if stop_at_full and steps % check_every == 0:
                out = self.generate([self.context(prompt, x)], len(y))[0]
                if memorization(out, y) >= 1.0:
                    recovered = time.perf_counter() - t0
                    at += [steps] * (len(budgets) - len(snaps))
                    snaps += [list(prompt)] * (len(budgets) - len(snaps))
        back = [0] * len(order)
        for pos, i in enumerate(order):
            back[i] = pos
        return {
            "snapshots": [snaps[back[i]] for i in range(len(order))],
            "snapshot_steps": [at[back[i]] for i in range(len(order))],
            "steps": steps,
            "recovered_s": recovered,
        }


class TargetPool:
    """A pool of TargetLM actors holding one model (``path``, loaded with the ``model_cfg``
    section's settings, on actors sized by the ``res_cfg`` section): batched scoring and GCG
    runs. Its launcher."""

    def __init__(self, path: str, model_cfg, res_cfg):
        import ray
        from ray.util import ActorPool

        res, m = res_cfg, model_cfg
        threads = res.scorer.threads()
        remote = ray.remote(TargetLM).options(
            **ray_options(res, res.scorer.cpus, res.scorer.gpus),
            # An actor whose node died starts again on another node (it loads the model from
            # storage there) and the call it was serving runs again: scoring and GCG read
            # nothing but their arguments, so a retried call gives the same rows.
            max_restarts=2,
            max_task_retries=2,
        )
        # The target's revision is the target's: other models (reference, proxy) load their
        # default one, as their cache keys (models.identity.model_key) say.
        rev = m.revision if path == m.name_or_path else ""
        name = for_remote(path)  # never a path of this node's disk on a cluster
        self.actors = [
            remote.remote(name, m.device, m.dtype, rev, m.trust_remote_code, threads)
            for _ in range(res.scorer.actors)
        ]
        self.pool = ActorPool(self.actors)
        self.batch = max(1, m.batch_size)

    def frame(self, rows: pd.DataFrame) -> pd.DataFrame:
        """Rows with prompt or prompt_ids, x_ids, y_ids -> plus out_ids, mu, loss (in order)."""
        # Batches of at most model.batch_size, and at least one per actor when rows are few.
        size = max(1, min(self.batch, -(-len(rows) // len(self.actors))))
        chunks = [rows.iloc[i : i + size] for i in range(0, len(rows), size)]
        out = list(self.pool.map(lambda a, c: a.__call__.remote(c), chunks))
        return pd.concat(out, ignore_index=True) if out else rows.iloc[:0]

    def score(self, prompts, x_ids, y_ids) -> tuple[np.ndarray, np.ndarray]:
        res = self.frame(pd.DataFrame({"prompt": prompts, "x_ids": x_ids, "y_ids": y_ids}))
        return res["mu"].to_numpy(dtype=float), res["loss"].to_numpy(dtype=float)

    def gcg(self, jobs: list[dict]) -> list[dict]:
        return list(self.pool.map(lambda a, j: a.gcg_run.remote(**j), jobs))

    def allowed(self) -> np.ndarray:
        import ray

        return ray.get(self.actors[0].allowed_tokens.remote())

    def encode(self, texts: list[str]) -> list[list[int]]:
        import ray

        return ray.get(self.actors[0].encode.remote(texts))

    def close(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a)
