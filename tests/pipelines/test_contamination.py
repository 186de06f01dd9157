"""The order test (Oren et al. 2023) on the test world: a small GPT trained on a benchmark in
its published order prefers that order to shuffles; one trained on the same examples in
another order does not."""

import json
import random
from pathlib import Path

import pytest

from mia_ray.cli import main
from mia_ray.pipelines.contamination.pipeline import orderings, read_in_order, shards_of

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.extra]


def _train(text, tokenizer_dir, out):
    from transformers import AutoTokenizer

    from mia_ray.train.lm import TinyLMSpec, train_causal_lm

    spec = TinyLMSpec(n_layer=2, n_embd=64, n_head=2, n_positions=128, epochs=150.0,
                      batch_size=8, lr=3e-3)  # fmt: skip
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    train_causal_lm([text], tok, out, spec, seed=0, threads=2, name=Path(out).name)
    return out


@pytest.fixture(scope="module")
def benchmark(tmp_path_factory, ray_local, test_world):
    """48 items (a web lead's first sentence each) in a published order, and two models:
    one trained on them in that order, one on the same items shuffled."""
    root = Path(test_world["root"])
    docs = [json.loads(x) for x in (root / "corpus" / "documents.jsonl").read_text().splitlines()]
    items = [d["text"].split(". ")[0].strip() + "." for d in docs if d["id"].startswith("web/")]
    items = sorted(set(i for i in items if 30 < len(i) < 200))[:48]
    random.Random(0).shuffle(items)  # the published order: random, so the premise holds
    d = tmp_path_factory.mktemp("bench")
    path = d / "bench.jsonl"
    path.write_text("".join(json.dumps({"question": q}) + "\n" for q in items))
    other = list(items)
    random.Random(1).shuffle(other)
    tok = root / "models" / "tiny-ref"
    return {
        "path": path,
        "items": items,
        "trained": _train("\n\n".join(items), tok, d / "in-order"),
        "shuffled": _train("\n\n".join(other), tok, d / "other-order"),
    }


def _test(model, path, out, *extra):
    args = ["contamination", "--benchmark", str(path), "--model", str(model), *extra,
            "--set", "contamination.fields=[question]", "--set", "contamination.shard_size=4",
            "--set", "contamination.permutations=19", "--set", "model.max_length=128",
            "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    return json.loads((out / "report.json").read_text())


def test_a_model_trained_on_the_benchmark_in_order_is_caught(benchmark, tmp_path):
    r = _test(benchmark["trained"], benchmark["path"], tmp_path / "in-order")
    t = r["test"]
    assert t["shards"] == 12 and t["reject"] and t["p_value"] < 1e-3
    assert t["published_preferred"] >= 10
    assert (
        r["verdict"]["text"].startswith("Evidence")
        and "Exact if the published order" in (r["verdict"]["text"])
    )
    html = (tmp_path / "in-order" / "report.html").read_text()
    assert "<h2>Premise</h2>" in html and html.count("<img") == 1


def test_the_same_examples_learnt_in_another_order_are_not_contamination(benchmark, tmp_path):
    r = _test(benchmark["shuffled"], benchmark["path"], tmp_path / "other-order")
    assert not r["test"]["reject"] and r["verdict"]["text"].startswith("No evidence")


def test_a_reference_model_checks_the_premise(benchmark, tmp_path):
    # A reference that prefers the published order (here: it trained on it) means the order
    # is predictable without contamination: no verdict, whatever the target says.
    bad = _test(benchmark["shuffled"], benchmark["path"], tmp_path / "bad",
                "--reference", str(benchmark["trained"]))  # fmt: skip
    assert bad["premise"]["holds"] is False and bad["premise"]["reference_p_value"] < 1e-3
    assert bad["verdict"]["contaminated"] is None and not bad["test"]["reject"]
    assert (
        bad["verdict"]["text"].startswith("No verdict on ")
        and "premise fails" in (bad["verdict"]["text"])
    )
    # A reference that does not prefer it: the premise is checked and the verdict stands.
    good = _test(benchmark["trained"], benchmark["path"], tmp_path / "good",
                 "--reference", str(benchmark["shuffled"]))  # fmt: skip
    assert good["premise"]["holds"] is True and good["premise"]["reference_p_value"] > 0.05
    assert good["verdict"]["contaminated"] is True
    assert "Premise checked: the reference model" in good["verdict"]["text"]
    html = (tmp_path / "good" / "report.html").read_text()
    assert "checked by" in html and "reference_p_value" in html


def test_examples_are_read_in_file_order_and_sharded(tmp_path):

    p = tmp_path / "b.jsonl"
    p.write_text('{"q": "b?", "a": "1"}\n\n{"q": "a?", "a": "2"}\n{"q": "c?", "a": "3"}\n')
    assert read_in_order(str(p), ["q", "a"]) == ["b?\n1", "a?\n2", "c?\n3"]
    t = tmp_path / "b.txt"
    t.write_text("z\n\ny\nx\n")
    assert read_in_order(str(t), ["text"]) == ["z", "y", "x"]
    # Fixed size: the last shard of one example has no order and is dropped.
    assert shards_of(["a"] * 7, 3, None, 0, "\n") == [[0, 1, 2], [3, 4, 5]]
    first, *shuffles = orderings([[0, 1, 2, 3]], 5, seed=0)[0]
    assert first == [0, 1, 2, 3] and len(shuffles) == 5
    assert all(sorted(s) == first for s in shuffles)
    assert orderings([[0, 1, 2, 3]], 5, seed=0) == orderings([[0, 1, 2, 3]], 5, seed=0)


def test_shards_fill_the_window_in_tokens(test_world):
    from mia_ray.models.hf import load_tokenizer

    tok = load_tokenizer(str(Path(test_world["root"]) / "models" / "tiny-ref"))
    examples = ["one two three four five six seven eight nine ten"] * 10
    n = len(tok(examples[0] + "\n\n", add_special_tokens=False)["input_ids"])
    shards = shards_of(examples, 0, tok, 3 * n, "\n\n")
    assert [len(s) for s in shards] == [3, 3, 3]  # the tenth alone is dropped
