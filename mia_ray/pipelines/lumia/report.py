"""What LUMIA's report says beside its numbers."""

from __future__ import annotations


def report_notes(cfg, meta, n_test_non, rows, best, baselines, blind) -> list[str]:
    p = cfg.probe
    notes = [
        f"Each sample is cropped to {cfg.model.max_length} tokens (or the model's context); its "
        "activation at a layer is the block output averaged over its real tokens.",
        f"{p.repeats} seeded {1 - p.test_size:.0%}/{p.test_size:.0%} splits, stratified and grouped "
        "by document: no document has samples on both sides. Early stopping (MLP) and the choice "
        f"of C (logistic regression) use a {p.val_fraction:.0%} validation fold of the training "
        "part; the test part only scores the finished probe. AUC is the mean ± std over repeats.",
        "The attacks and the blind baseline are scored on the same test parts and averaged alike.",
    ]
    if n_test_non < 100:
        notes.append(
            f"A test part holds as few as {n_test_non} non-members: TPR at 1% FPR is then the TPR "
            "with no false positive at all."
        )
    top = max(rows, key=lambda r: r["auc_mean"])
    if top["auc_mean"] > best["auc_mean"]:
        notes.append(
            f"The best layer is chosen by validation AUC ({best['part']} layer {best['layer']}, "
            f"{best['probe']}: test AUC {best['auc_mean']:.3f}). The highest test AUC of any "
            f"layer, {top['auc_mean']:.3f} ({top['part']} layer {top['layer']}, {top['probe']}), "
            "is not reported as LUMIA's: picking it would select on the test part."
        )
    if blind and best["auc_mean"] <= blind["auc"] + blind["auc_std"]:
        notes.append(
            f"Caution: the best layer (AUC {best['auc_mean']:.3f}) does not clearly beat the blind "
            f"baseline (AUC {blind['auc']:.3f}); members and non-members may differ in distribution."
        )
    if baselines:
        top = max(baselines.items(), key=lambda kv: kv[1]["auc"])
        if top[1]["auc"] > best["auc_mean"]:
            notes.append(
                f"The {top[0]} attack (AUC {top[1]['auc']:.3f}) beats the best probe "
                f"(AUC {best['auc_mean']:.3f}) on this model and data."
            )
    return notes
