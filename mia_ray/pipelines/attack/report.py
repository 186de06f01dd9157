"""What the attack report says beside its numbers."""

from __future__ import annotations

from mia_ray.pipelines.attack.config import AttackJobConfig


def report_notes(cfg: AttackJobConfig, report: dict) -> list[str]:
    notes = [
        f"Scores are computed per snippet ({cfg.data.snippet_size} {cfg.data.snippet_unit}, cropped to "
        f"{cfg.model.max_length} tokens) and evaluated per {cfg.attack.level}"
        + (
            f" ({cfg.attack.aggregate} of its snippets)." if cfg.attack.level == "document" else "."
        ),
        "Balanced accuracy and accuracy use thresholds chosen by cross-fitting: each row is classified "
        "by a threshold chosen on the other folds, never with its own label.",
    ]
    d = report["data"]
    models = "the target and the reference" if "ref" in cfg.attack.attacks else "the target"
    notes.append(
        f"{d['n_cropped']} of {d['n_snippets']} snippets were longer than what the first "
        f"{cfg.model.max_length} tokens of {models} cover (capped at each model's context) and "
        "were cut to that text before scoring; every model and zlib score exactly the same "
        "characters (snippet_scores.parquet: n_chars)."
    )
    if cfg.attack.level == "snippet" and d["n_snippets"] > d["n_documents"]:
        notes.append(
            f"Confidence intervals: {cfg.eval.bootstrap} cluster-bootstrap resamples of documents "
            f"(a document's snippets are drawn together, members and non-members apart), "
            f"{cfg.eval.ci:.0%} percentile: snippets of one document are not independent."
        )
    else:
        notes.append(
            f"Confidence intervals: {cfg.eval.bootstrap} stratified bootstrap resamples, "
            f"{cfg.eval.ci:.0%} percentile."
        )
    n_non = report["data"]["n_nonmembers"] if cfg.attack.level == "document" else None
    if n_non:
        floor = 1 / n_non
        coarse = [f"{f:g}" for f in cfg.eval.fprs if f < floor]
        if coarse:
            notes.append(
                f"With {n_non} non-members the smallest non-zero FPR is 1/{n_non} = {floor:.2%}: "
                f"TPR at FPR {', '.join(coarse)} is the TPR with no false positive at all."
            )
    for side, ids in report.get("held_out", {}).items():
        what = "non-member" if side == "non" else "member"
        attacks = "ReCaLL's" if side == "non" else "Con-ReCall's"
        notes.append(
            f"{attacks} {what} prefix is the first snippet of {len(ids)} {what} documents of "
            f"the data, held out of every attack's evaluation ({', '.join(ids[:5])}"
            f"{', ...' if len(ids) > 5 else ''})."
        )
    blind = report.get("blind_baseline")
    if blind:
        best = max(report["metrics"].items(), key=lambda kv: kv[1]["auc"])
        lo = best[1]["auc_ci"][0] if best[1]["auc_ci"] else best[1]["auc"]
        if lo <= blind["auc"]:
            notes.append(
                f"Caution: the best attack ({best[0]}, AUC {best[1]['auc']:.3f}) does not clearly beat the "
                f"blind baseline (AUC {blind['auc']:.3f}); members and non-members may differ in distribution."
            )
    return notes
