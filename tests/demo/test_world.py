"""The demo world: layout, exact membership, planted signal recovered, none invented, resumable."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from mia_ray.config import WorldConfig
from mia_ray.demo.world import SCALES, ensure_world, fingerprint
from mia_ray.errors import MiaError


def doc_logprobs(model_dir: str, texts: list[str], max_windows: int = 8) -> np.ndarray:
    """Per document: mean over its context-window-sized token windows of the mean token log-prob.

    The LOSS attack at document level (higher = more likely member); shape ``(len(texts),)``.
    """
    import torch

    from mia_ray.models.hf import load_causal_lm

    model, tok, _ = load_causal_lm(model_dir, device="cpu", dtype="float32")
    width = getattr(model.config, "n_positions", None) or model.config.max_position_embeddings
    width = min(width, 512)
    out = []
    with torch.no_grad():
        for text in texts:
            ids = tok(text)["input_ids"]
            windows = [ids[i : i + width] for i in range(0, len(ids), width)][:max_windows]
            windows = [w for w in windows if len(w) > 1]
            means = []
            for w in windows:
                x = torch.tensor([w])
                logp = torch.log_softmax(model(input_ids=x).logits[0, :-1].float(), dim=-1)
                means.append(logp.gather(1, x[0, 1:, None]).mean().item())
            out.append(float(np.mean(means)))
    return np.asarray(out)


def loss_auc(world: dict, target: str) -> tuple[float, float, float]:
    """Document-level LOSS AUC of ``target`` on its manifest, with a 95 % bootstrap interval."""
    from sklearn.metrics import roc_auc_score

    manifest = json.loads(Path(world["targets"][target]["manifest"]).read_text())
    rows = [json.loads(line) for line in open(world["documents"], encoding="utf-8")]
    rows = [r for r in rows if r["id"] in manifest]
    y = np.array([manifest[r["id"]] for r in rows])
    s = doc_logprobs(world["targets"][target]["model"], [r["text"] for r in rows])
    auc = roc_auc_score(y, s)
    rng = np.random.default_rng(0)
    boot = []
    for _ in range(500):
        i = rng.integers(0, len(y), len(y))
        if 0 < y[i].sum() < len(i):
            boot.append(roc_auc_score(y[i], s[i]))
    lo, hi = np.quantile(boot, [0.025, 0.975])
    return float(auc), float(lo), float(hi)


# ------------------------------------------------------------------------- fast checks


def test_fingerprint_mismatch_is_a_clear_error(tmp_path):
    (tmp_path / "world.json").write_text(
        json.dumps({"fingerprint": "0" * 16, "scale": "test", "seed": 9})
    )
    with pytest.raises(MiaError, match="built with other settings"):
        ensure_world(WorldConfig(root=str(tmp_path), scale="test"), ["tiny"])
    assert fingerprint("test", 0) != fingerprint("test", 1) != fingerprint("demo", 1)


def test_foreign_folder_and_unknown_target_are_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(MiaError, match="not a demo world"):
        ensure_world(WorldConfig(root=str(tmp_path), scale="test"), ["tiny"])
    with pytest.raises(MiaError, match="unknown demo target 'tinny'"):
        ensure_world(WorldConfig(root=str(tmp_path / "w"), scale="test"), ["tinny"])


def test_demo_pipeline_is_registered():
    from mia_ray.registry import get

    p = get("pipeline", "demo")
    assert p.name == "demo" and p.config_cls.__name__ == "DemoWorldJobConfig"


# ------------------------------------------------------------------ the test world (slow)


@pytest.mark.slow
def test_layout_and_manifests(test_world):
    root = Path(test_world["root"])
    meta = json.loads((root / "world.json").read_text())
    assert meta["scale"] == "test" and meta["fingerprint"] == fingerprint("test", 0)
    assert {"corpora", "tiny", "tiny-ref", "tiny-random"} <= set(meta["steps"])
    assert "split_rule" in meta and meta["versions"]["torch"]
    rows = [json.loads(line) for line in open(test_world["documents"], encoding="utf-8")]
    ref_rows = [json.loads(line) for line in open(test_world["reference_pool"], encoding="utf-8")]
    assert all(set(r) == {"id", "text", "source"} for r in rows + ref_rows)
    manifest = json.loads(Path(test_world["manifest"]).read_text())
    assert set(manifest) == {r["id"] for r in rows}
    assert not set(manifest) & {r["id"] for r in ref_rows}
    assert set(manifest.values()) == {0, 1}
    # Every evaluated book is a real file whose text is the document's text.
    books = [r for r in rows if r["source"] == "books"]
    files = sorted(
        p.relative_to(root).as_posix() for p in Path(test_world["books_dir"]).rglob("*.txt")
    )
    assert files == sorted(r["id"] for r in books)
    assert all((root / r["id"]).read_text(encoding="utf-8") == r["text"] for r in books)
    s = SCALES["test"]
    assert len(books) + sum(r["source"] == "books" for r in ref_rows) == s.n_books
    assert not list(root.rglob(".tmp-*"))


@pytest.mark.slow
def test_models_load_offline_with_their_tokenizer(test_world):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for name in ("tiny", "tiny-ref", "tiny-random"):
        folder = Path(test_world["root"]) / "models" / name
        model = AutoModelForCausalLM.from_pretrained(folder)
        tok = AutoTokenizer.from_pretrained(folder)
        assert model.config.vocab_size == len(tok) == SCALES["test"].bpe_merges + 257
        assert tok.decode(tok("To be, or not to be")["input_ids"]) == "To be, or not to be"
    assert test_world["reference"].endswith("models/tiny-ref")


@pytest.mark.slow
def test_tiny_memorised_its_members(test_world):
    auc, lo, hi = loss_auc(test_world, "tiny")
    assert auc >= 0.9, (auc, lo, hi)


@pytest.mark.slow
def test_untrained_target_invents_no_signal(test_world):
    auc, lo, hi = loss_auc(test_world, "tiny-random")
    assert lo <= 0.5 <= hi and abs(auc - 0.5) < 0.2, (auc, lo, hi)


@pytest.mark.slow
def test_training_is_deterministic_from_the_seed(test_world, tmp_path):
    from mia_ray.demo.world import read_jsonl_texts, train_tiny

    meta = json.loads(Path(test_world["world_json"]).read_text())
    manifest = json.loads(Path(test_world["manifest"]).read_text())
    members = read_jsonl_texts(Path(test_world["documents"]), {d for d, y in manifest.items() if y})
    again = train_tiny(
        members,
        str(tmp_path / "tiny"),
        "test",
        seed=0,
        threads=meta["steps"]["tiny"]["threads"],
        train=True,
        name="again",
    )
    assert again["weights_sha256"] == meta["steps"]["tiny"]["weights_sha256"]
    # The seed draws the initial weights (compared untrained, for time): another seed, other
    # weights, and the hash sees them.
    start = {
        seed: train_tiny(members, str(tmp_path / f"init-{seed}"), "test", seed=seed,
                         threads=again["threads"], train=False, name=f"init-{seed}")
        for seed in (0, 5)
    }  # fmt: skip
    assert start[0]["weights_sha256"] != start[5]["weights_sha256"]
    assert start[0]["weights_sha256"] != again["weights_sha256"]


@pytest.mark.slow
def test_interrupted_build_resumes(test_world, tmp_path):
    root = tmp_path / "world"
    shutil.copytree(test_world["root"], root, ignore=shutil.ignore_patterns("smollm2"))
    meta = json.loads((root / "world.json").read_text())
    del meta["steps"]["tiny-random"]
    (root / "world.json").write_text(json.dumps(meta))
    (root / "models" / ".tmp-tiny-random-x").mkdir()  # a crash mid-step left this behind
    tiny_weights = root / "models" / "tiny" / "model.safetensors"
    before = tiny_weights.stat().st_mtime_ns
    world = ensure_world(
        WorldConfig(root=str(root), scale="test", target="tiny-random"), num_cpus=2
    )
    meta = json.loads((root / "world.json").read_text())
    assert "tiny-random" in meta["steps"] and meta["steps"]["tiny-random"]["steps"] == 0
    assert world["model"] == str(root / "models" / "tiny-random")
    assert tiny_weights.stat().st_mtime_ns == before
    assert not list(root.rglob(".tmp-*"))


@pytest.mark.slow
def test_changed_recipe_rebuilds_that_model_only(test_world, tmp_path, capsys):
    root = tmp_path / "world"
    shutil.copytree(test_world["root"], root, ignore=shutil.ignore_patterns("smollm2"))
    meta = json.loads((root / "world.json").read_text())
    meta["steps"]["tiny-random"]["spec"]["epochs"] = 99.0  # as if built with another recipe
    (root / "world.json").write_text(json.dumps(meta))
    tiny = root / "models" / "tiny" / "model.safetensors"
    random_weights = root / "models" / "tiny-random" / "model.safetensors"
    before_tiny, before_random = tiny.stat().st_mtime_ns, random_weights.stat().st_mtime_ns
    ensure_world(WorldConfig(root=str(root), scale="test", target="tiny-random"), num_cpus=2)
    assert "tiny-random: its training recipe changed since it was built; rebuilding it" in (
        capsys.readouterr().err
    )
    meta = json.loads((root / "world.json").read_text())
    assert meta["steps"]["tiny-random"]["spec"]["epochs"] == 30.0
    assert random_weights.stat().st_mtime_ns != before_random
    assert tiny.stat().st_mtime_ns == before_tiny
    assert (
        meta["fingerprint"]
        == json.loads((Path(test_world["root"]) / "world.json").read_text())["fingerprint"]
    )


@pytest.mark.ray
@pytest.mark.slow
def test_demo_verb_trains_in_ray_tasks(ray_local, tmp_path, capsys):
    from mia_ray.cli import main

    root, out = tmp_path / "world", tmp_path / "run"
    code = main(
        [
            "demo",
            "--set",
            "world.scale=test",
            "--set",
            f"world.root={root}",
            "--set",
            "targets=[tiny-random]",
            "--set",
            "resources.num_cpus=1",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    assert "building tiny-ref with 1 CPU(s) in a Ray task" in capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    assert set(report["models"]) == {"tiny-ref", "tiny-random"}
    assert (
        report["models"]["tiny-ref"]["threads"] == 1 and report["models"]["tiny-ref"]["steps"] > 0
    )
    assert report["world"]["manifest"] == str(root / "manifests" / "tiny-random.json")
    assert report["sizes"]["manifests"]["tiny-random"]["members"] > 0
    # A second run finds everything built and trains nothing.
    assert (
        main(
            [
                "demo",
                "--set",
                "world.scale=test",
                "--set",
                f"world.root={root}",
                "--set",
                "targets=[tiny-random]",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert "building" not in capsys.readouterr().err
