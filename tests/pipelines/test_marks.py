"""`mia-ray mark` and `mia-ray verify` end to end on the test world's scenes: a model trained on
the marked copies is caught mark by mark, one trained on the same files unmarked is not, a
file that lost its mark gets no verdict, a key of another run is refused, and every input
format carries the marks through."""

import json
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mia_ray.cli import main
from mia_ray.data import marks
from mia_ray.data.marks import count_in, published, read_key

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.extra]
N_FILES, K = 12, 20


class _SeededSecrets:
    """The key's randomness seeded, so that the test's world is one fixed draw (mark itself
    uses the operating system's)."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def token_hex(self, n):
        return self.rng.bytes(n).hex()

    def randbelow(self, k):
        return int(self.rng.integers(k))


def _mark(monkeypatch, src, key, out, seed=0, *extra):
    monkeypatch.setattr(marks, "secrets", _SeededSecrets(seed))
    args = ["mark", "--in", str(src), "--key", str(key), "--set", f"mark.candidates={K}",
            "--set", "mark.copies=2", *extra, "--out", str(out)]  # fmt: skip
    return main(args)


def _train(texts, tokenizer_dir, out):
    from transformers import AutoTokenizer

    from mia_ray.train.lm import TinyLMSpec, train_causal_lm

    spec = TinyLMSpec(n_layer=2, n_embd=64, n_head=2, n_positions=128, epochs=12.0,
                      batch_size=8, lr=3e-3)  # fmt: skip
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    train_causal_lm(texts, tok, out, spec, seed=0, threads=2, name=Path(out).name)
    return out


def _verify(model, key, out, *extra):
    code = main(["verify", "--model", str(model), "--key", str(key), *extra, "--out", str(out)])
    return code, (json.loads((out / "report.json").read_text()) if code == 0 else None)


@pytest.fixture(scope="module")
def marked(tmp_path_factory, ray_local, test_world):
    """12 scenes (jsonl) marked, and two small GPTs: one trained on the marked copies, one on
    the same scenes unmarked."""
    root = Path(test_world["root"])
    docs = [json.loads(x) for x in (root / "corpus" / "documents.jsonl").read_text().splitlines()]
    docs = sorted((d for d in docs if d["id"].startswith("books/")), key=lambda d: d["id"])
    docs = random.Random(0).sample(docs, N_FILES)
    d = tmp_path_factory.mktemp("marks")
    src = d / "scenes.jsonl"
    src.write_text("".join(json.dumps({"id": x["id"], "text": x["text"]}) + "\n" for x in docs))
    mp = pytest.MonkeyPatch()
    try:
        assert _mark(mp, src, d / "key.json", d / "run") == 0
    finally:
        mp.undo()
    copy = pd.read_json(d / "run" / "marked" / "marked.jsonl", lines=True)
    tok = root / "models" / "tiny-ref"
    return {
        "dir": d,
        "src": src,
        "docs": docs,
        "key": d / "key.json",
        "copy": copy,
        "trained": _train(list(copy["text"]), tok, d / "trained-on-marked"),
        "unmarked": _train([x["text"] for x in docs], tok, d / "trained-on-unmarked"),
    }


def test_mark_writes_marked_copies_and_a_key_that_never_holds_their_text(marked, capsys):
    key = read_key(marked["key"])
    copy, pub = marked["copy"], published(key)
    assert sorted(copy["id"]) == sorted(x["id"] for x in marked["docs"])
    assert len(key["marks"]) == N_FILES and {m["files"][0] for m in key["marks"]} == set(copy["id"])
    text = dict(zip(copy["id"], copy["text"], strict=True))
    assert all(count_in(text[m["files"][0]], pub[m["mark_id"]]) == 2 for m in key["marks"])
    raw = marked["key"].read_text()
    assert all(x["text"][:40] not in raw for x in marked["docs"])
    report = json.loads((marked["dir"] / "run" / "report.json").read_text())
    assert report["n_marks"] == N_FILES and key["secret"] not in json.dumps(report)
    # A second mark onto the same key path is refused: the key is what proves the marks.
    capsys.readouterr()
    code = main(["mark", "--in", str(marked["src"]), "--key", str(marked["key"]),
                 "--out", str(marked["dir"] / "again")])  # fmt: skip
    assert code == 2 and "key file exists" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["text", "parquet"])
def test_every_input_format_carries_the_marks_through(marked, tmp_path, monkeypatch, fmt):
    docs = marked["docs"][:4]
    if fmt == "text":
        src = tmp_path / "in"
        for x in docs:
            (src / x["id"]).parent.mkdir(parents=True, exist_ok=True)
            (src / x["id"]).write_text(x["text"])
    else:
        src = tmp_path / "in.parquet"
        pd.DataFrame({"id": [x["id"] for x in docs], "text": [x["text"] for x in docs]}).to_parquet(
            src
        )
    assert _mark(monkeypatch, src, tmp_path / "key.json", tmp_path / "run", 1) == 0
    from mia_ray.data.readers import read_documents

    where = tmp_path / "run" / "marked"
    back = read_documents(str(where if fmt == "text" else where / "marked.parquet")).to_pandas()
    key = read_key(tmp_path / "key.json")
    text = dict(zip(back["doc_id"], back["text"], strict=True))
    for m in key["marks"]:
        assert count_in(text[m["files"][0]], published(key)[m["mark_id"]]) == 2


def test_a_model_trained_on_the_marked_copies_is_caught_mark_by_mark(marked, tmp_path):
    """Each published candidate outranks its 19 alternatives under the trained model; one
    scene's copy lost its mark, and that mark gets no verdict (not "not trained")."""
    copy = marked["copy"].copy()
    key = read_key(marked["key"])
    lost = key["marks"][0]
    i = copy.index[copy["id"] == lost["files"][0]][0]
    copy.loc[i, "text"] = copy.loc[i, "text"].replace(published(key)[lost["mark_id"]], "")
    files = tmp_path / "published.jsonl"
    copy.to_json(files, orient="records", lines=True)
    code, r = _verify(marked["trained"], marked["key"], tmp_path / "v", "--files", str(files))
    assert code == 0
    c = r["combined_test"]
    assert c["reject"] and c["p_value"] == 1 / 10_000 and c["n_marks"] == N_FILES - 1
    rows = {m["mark_id"]: m for m in r["marks"]}
    assert rows[lost["mark_id"]]["verdict"] == "mark not found in the published copy: no verdict"
    found = [m for m in r["marks"] if m["mark_id"] != lost["mark_id"]]
    assert sum(m["flagged"] for m in found) >= 0.8 * len(found)
    assert all(m["p_value"] == m["rank"] / K for m in r["marks"])
    assert r["premise"]["kind"] == "randomized" and r["verdict"]["text"].startswith("Evidence")
    html = (tmp_path / "v" / "report.html").read_text()
    assert "<h2>Premise</h2>" in html and html.count("<img") == 1


def test_a_model_trained_on_the_same_files_unmarked_is_not_accused(marked, tmp_path):
    code, r = _verify(marked["unmarked"], marked["key"], tmp_path / "v")
    assert code == 0
    assert not r["combined_test"]["reject"] and r["per_mark"]["n_flagged"] == 0
    assert (
        r["verdict"]["text"].startswith("No evidence")
        and "not proof of no training" in (r["verdict"]["text"])
    )


def test_a_key_of_another_run_is_refused_before_any_scoring(marked, tmp_path, monkeypatch, capsys):
    assert _mark(monkeypatch, marked["src"], tmp_path / "other.json", tmp_path / "run", 9) == 0
    capsys.readouterr()
    files = marked["dir"] / "run" / "marked" / "marked.jsonl"
    code, _ = _verify(
        marked["trained"], tmp_path / "other.json", tmp_path / "v", "--files", str(files)
    )
    err = capsys.readouterr().err
    assert code == 2 and f"none of the key's {N_FILES} marks is in" in err
    assert "the key is of another run" in err and "Traceback" not in err
