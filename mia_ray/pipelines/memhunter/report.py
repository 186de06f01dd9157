"""What MemHunter's report says beside its numbers."""

from __future__ import annotations

from mia_ray.pipelines.memhunter.config import MemHunterJobConfig


def notes(cfg: MemHunterJobConfig, dtest: dict, bos: list[int]) -> list[str]:
    h, e, d = cfg.hunter, cfg.extraction, cfg.dataset_test
    power, weak = dtest["power_check"], []
    if power.get("p_value") is None or power["p_value"] >= d.alpha:
        p = power.get("p_value")
        weak.append(
            f"Power check failed: the proxy, which trained on the dataset, does not recover "
            f"more than the reference either (one-sided paired t-test p = "
            f"{'undefined' if p is None else f'{p:.3f}'}). On these samples LCSS cannot tell "
            "training from no training, so 'no evidence of memorization' is not evidence that "
            "a suspect did not train on the data; use more samples or longer continuations."
        )
    if dtest["splits"]["nonmember"] is None:
        weak.append(
            "The data holds fewer than 2 nonmember pairs: the verdict (the suspect's gain over "
            "the reference on members against the same gain on nonmembers) is undefined."
        )
    return [
        *weak,
        "mu = LCSS(output, y) / |y| on the target's tokens; Avg LCSS is the mean over pairs of "
        "the best mu among k prompts, Hit Rate the share of pairs with mu = 1.",
        "The target reads BOS + prompt + x "
        + (
            f"(its tokenizer puts token {bos} before every text, so the model expects it)."
            if bos
            else "with no BOS: its tokenizer adds none."
        ),
        f"Hunter training: {h.iterations} iterations, beam search with top-{h.top_k} and "
        f"{h.beams} beams over {h.prompt_tokens}-token prompts (paper: top-48, 4 beams, 10 "
        f"iterations), prompt pool {h.pool_size}, LoRA r {h.lora_r} / alpha {h.lora_alpha}, "
        f"{h.epochs} epochs, lr {h.lr:g}.",
        "Seconds are wall clock on this run's resources. At budget k, MemHunter samples k "
        "prompts per pair and the target continues them all in one batched pass (inference "
        "alone, in parallel, as the paper uses it); MiniPrompt (GCG from random tokens) gets, "
        "per budget, the seconds MemHunter took; Manual is one greedy continuation of the "
        "prefix alone.",
        f"Plug-in: GCG runs until mu = 1 or {e.plugin_max_s:g} s (censored there), from the "
        "hunter's best prompt (its pre-search time added) or from random tokens.",
        "Dataset test: every model reads the same hunter prompts on the same pairs, so the "
        "tests are paired (on per-pair differences). The paper's test (an unpaired Welch t, "
        "p > alpha read as memorized) is shown for comparison only: a large p-value is no "
        "evidence of sameness. The one-sided paired t-test says whether the suspect recovers "
        "more than a model that never saw the data; the paired TOST whether it recovers as "
        "much as the proxy. The verdict is the gap test: the suspect's per-pair gain over the "
        f"reference on the {d.split} pairs against the same gain on the nonmember pairs (one-"
        "sided Welch, the two are different pairs), so a model that merely follows the hunter's "
        "prompts better than the reference is not flagged.",
        "Caches (hunter iterations, extraction, baselines, the dataset test's fine-tunes and "
        "LCSS values, sweep cells) are keyed on the models' weights by content, dtype and "
        "device, the pairs' tokens and the options: other weights at the same path are "
        "scored afresh.",
    ]
