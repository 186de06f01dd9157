"""CopyCheck's report.json: results, summary, fine-tuning diagnostics and notes."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from mia_ray.pipelines.copycheck.config import CLUSTER_METHODS
from mia_ray.pipelines.copycheck.training import member_names
from mia_ray.runtime import describe


def build_report(cfg, docs, snippets, exps, jobs, records, base, meeus, got, timings) -> dict:
    """report.json's dict."""
    from mia_ray.reports.copycheck import FINETUNE_COLUMNS

    results = got["results"]
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
        "summary": summary_of(results),
        "files": got["files"],
        "blind_baseline": got["blind"],
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
        "timings": timings,
    }
    report["diagnostics"] = fit_diagnostic(records)
    report["notes"] = report_notes(cfg, report)
    return report


def fit_diagnostic(records: list[dict]) -> dict:
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


def summary_of(results: list[dict]) -> dict:
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


def report_notes(cfg, report: dict) -> list[str]:
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
    if member_names(cfg):
        notes.append(
            f"Each experiment fine-tunes {len(member_names(cfg))} models (LoRA r {ft.lora_r}, alpha "
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
