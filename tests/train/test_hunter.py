"""MemHunter training: beam search (Algorithm 3), the prompt pool with rejection sampling, and
Algorithm 1's checkpointed iterations, on a hunter and a target whose scores are known."""

import numpy as np
import pandas as pd
import pytest

from mia_ray.errors import MiaError
from mia_ray.train.config import HunterConfig
from mia_ray.train.hunter import beam_search, train_hunter, update_pool

SECRET = [3, 1, 4, 1, 5]


class CountingHunter:
    """Proposes, after a prompt ending in t, the tokens t+1, t+2, ... (mod 10)."""

    allowed = np.arange(10)

    def __init__(self):
        self.adapters = []

    def topk(self, xs, prompts, k):
        return np.array([[(p[-1] + 1 + j) % 10 for j in range(k)] for p in prompts])

    def decode(self, ids):
        return " ".join(str(t) for t in ids)

    def load_adapter(self, path):
        self.adapters.append(path)


def secret_score(prompts, x_ids, y_ids):
    """mu: share of SECRET's positions the prompt matches; loss: 1 - that share + 0.01/token."""
    mu, loss = [], []
    for p in prompts:
        toks = [int(t) for t in p.split()] if p else []
        hits = sum(a == b for a, b in zip(toks, SECRET, strict=False))
        mu.append(hits / len(SECRET))
        loss.append(1 - hits / len(SECRET) + 0.01 * len(toks))
    return np.array(mu), np.array(loss)


def _pairs(n=3):
    return pd.DataFrame(
        {
            "pair_id": [f"d{i}#0" for i in range(n)],
            "x": [f"prefix {i}" for i in range(n)],
            "x_ids": [[1, 2]] * n,
            "y_ids": [[7, 8]] * n,
        }
    )


def test_beam_search_keeps_the_best_candidate_it_scored():
    # With all 10 next tokens proposed, a greedy choice of mu finds SECRET itself.
    spec = HunterConfig(prompt_tokens=5, top_k=10, beams=10, temperature=1e-4, loss_weight=0.0)
    found = beam_search(CountingHunter(), secret_score, _pairs(2), spec)
    assert list(found["pair_id"]) == ["d0#0", "d1#0"]
    for _, r in found.iterrows():
        # Every beam starts from a uniformly drawn token; the best one began with 3.
        assert r["mu"] == pytest.approx(1.0) and r["prompt_ids"] == SECRET
        assert r["prompt"] == "3 1 4 1 5"
        # 4 growth steps x at most 10 beams x 10 next tokens, duplicates scored once.
        assert 0 < r["candidates"] <= 4 * 100


def test_beam_search_is_seeded_per_pair_and_iteration():
    spec = HunterConfig(prompt_tokens=3, top_k=2, beams=2, temperature=1.0)
    a = beam_search(CountingHunter(), secret_score, _pairs(3), spec, iteration=0)
    b = beam_search(CountingHunter(), secret_score, _pairs(3).iloc[::-1], spec, iteration=0)
    b = b.set_index("pair_id").loc[a["pair_id"]].reset_index()
    pd.testing.assert_frame_equal(a, b)
    c = beam_search(CountingHunter(), secret_score, _pairs(3), spec, iteration=1)
    assert list(a["prompt"]) != list(c["prompt"])


def test_beam_search_refuses_a_one_token_prompt():
    with pytest.raises(MiaError, match="prompt_tokens must be at least 2"):
        beam_search(CountingHunter(), secret_score, _pairs(1), HunterConfig(prompt_tokens=1))


def _found(rows):
    return pd.DataFrame(
        [
            {"pair_id": p, "prompt_ids": [1], "prompt": t, "mu": m, "loss": lo, "candidates": 1}
            for p, t, m, lo in rows
        ]
    )


def test_pool_accepts_only_prompts_that_beat_the_prefix_alone():
    baseline = pd.DataFrame({"pair_id": ["a", "b", "c"], "mu": [0.5, 0.5, 0.5], "loss": [2.0] * 3})
    found = _found(
        [
            ("a", "better mu", 0.75, 3.0),  # higher mu: accepted whatever its loss
            ("b", "same mu, lower loss", 0.5, 1.5),  # accepted
            ("c", "same mu, higher loss", 0.5, 2.5),  # rejected
        ]
    )
    pool = update_pool(pd.DataFrame(), found, baseline, capacity=256)
    assert list(pool["prompt"]) == ["better mu", "same mu, lower loss"]
    everything = update_pool(pd.DataFrame(), found, baseline, capacity=256, rejection=False)
    assert len(everything) == 3


def test_pool_keeps_the_best_distinct_entries_up_to_its_capacity():
    baseline = pd.DataFrame({"pair_id": ["a", "b"], "mu": [0.0, 0.0], "loss": [9.0, 9.0]})
    first = update_pool(
        pd.DataFrame(), _found([("a", "p1", 0.5, 1.0), ("b", "p2", 0.25, 1.0)]), baseline, 2
    )
    second = update_pool(
        first,
        _found([("a", "p1", 0.5, 1.0), ("b", "p3", 0.75, 2.0)]),
        baseline,
        2,
        iteration=1,
    )
    assert list(second["prompt"]) == ["p3", "p1"]
    assert list(second["iteration"]) == [1, 0]  # the repeated (a, p1) kept its first entry


def _fake_finetune(log):
    def finetune(adapter_in, rows, out_dir, seed):
        log.append((adapter_in, sorted(rows["prompt"]), seed))
        return {"steps": len(rows)}

    return finetune


def test_interrupted_training_resumes_to_the_same_pool(tmp_path):
    spec = HunterConfig(prompt_tokens=3, top_k=3, beams=2, iterations=3, temperature=0.5)
    log_full, log_resumed = [], []
    full = train_hunter(
        CountingHunter(), secret_score, _fake_finetune(log_full), _pairs(), tmp_path / "a", spec
    )
    part = train_hunter(
        CountingHunter(),
        secret_score,
        _fake_finetune(log_resumed),
        _pairs(),
        tmp_path / "b",
        spec,
        stop_after=0,
    )
    assert not part["finished"] and len(part["iterations"]) == 1
    rest = train_hunter(
        CountingHunter(), secret_score, _fake_finetune(log_resumed), _pairs(), tmp_path / "b", spec
    )
    assert full["finished"] and rest["finished"]
    for i in range(3):
        a = pd.read_parquet(tmp_path / "a" / f"iter-{i:02d}" / "pool.parquet")
        b = pd.read_parquet(tmp_path / "b" / f"iter-{i:02d}" / "pool.parquet")
        pd.testing.assert_frame_equal(a, b)
    # The resumed run fine-tuned from the adapter of the iteration it resumed after.
    assert [(a.replace("/b/", "/a/"), *r) for a, *r in log_resumed] == log_full
    assert log_full[0][0] == "" and log_full[1][0] == str(tmp_path / "a" / "iter-00" / "adapter")
    # Nothing is searched again on a rerun of a finished training.
    again = train_hunter(CountingHunter(), None, _fake_finetune([]), _pairs(), tmp_path / "a", spec)
    assert again["iterations"] == full["iterations"]


def test_each_checkpoint_reaches_storage_and_another_driver_resumes_from_it(tmp_path):
    """Within a run whose storage is elsewhere (an object store: pyarrow's mock://), every
    stage (baseline, search, iteration) goes to storage as it finishes, its marker with it; a
    new driver whose --out is empty pulls storage and resumes after the last finished
    iteration."""
    import uuid

    from mia_ray import storage

    spec = HunterConfig(prompt_tokens=3, top_k=3, beams=2, iterations=2, temperature=0.5)
    uri = f"mock:///bucket-{uuid.uuid4().hex[:8]}/run"
    first = storage.Workspace(tmp_path / "out", uri, distributed=True)
    pushed = []
    push = first.push
    first.push = lambda rel="": pushed.append(str(rel)) or push(rel)
    storage.set_current(first)
    try:
        out = tmp_path / "out" / "hunter"
        train_hunter(CountingHunter(), secret_score, _fake_finetune([]), _pairs(), out, spec,
                     stop_after=0)  # fmt: skip
    finally:
        storage.set_current(None)
    names = set(first.storage.files())
    assert {"hunter/baseline/frame.parquet", "hunter/search-00/frame.parquet",
            "hunter/iter-00/pool.parquet", "hunter/iter-00/.complete.json"} <= names  # fmt: skip
    assert not any(n.startswith(("hunter/iter-01", "hunter/search-01")) for n in names)
    # The iteration's folder goes last, after its search: its marker with it.
    assert pushed[-1] == "hunter/iter-00"
    assert pushed.index("hunter/search-00") < len(pushed) - 1
    # Another driver, its --out empty, the same storage: it resumes after iteration 0.
    second = storage.Workspace(tmp_path / "elsewhere", uri, distributed=True)
    assert second.pull() == len(names)
    log = []
    rest = train_hunter(CountingHunter(), secret_score, _fake_finetune(log), _pairs(),
                        tmp_path / "elsewhere" / "hunter", spec)  # fmt: skip
    assert rest["finished"] and [r["iteration"] for r in rest["iterations"]] == [0, 1]
    assert len(log) == 1  # iteration 1's fine-tune only
    # Outside a run nothing is pushed anywhere.
    train_hunter(CountingHunter(), secret_score, _fake_finetune([]), _pairs(), tmp_path / "x", spec)
    assert set(first.storage.files()) == names


def test_other_settings_pairs_or_models_in_the_same_folder_train_afresh(tmp_path):
    """Each step is a stage keyed on the recipe, the pairs and the models' content keys
    (``identity``): the same training is reused whole (no search: its score is None), and
    other pairs, settings or weights at the same paths train again in the same folder."""
    spec = HunterConfig(prompt_tokens=2, top_k=2, beams=1, iterations=1)
    a = {"target": "aaaa", "hunter": "bbbb"}
    logs: list[list] = [[], [], [], [], []]
    first = train_hunter(CountingHunter(), secret_score, _fake_finetune(logs[0]), _pairs(),
                         tmp_path, spec, identity=a)  # fmt: skip
    again = train_hunter(CountingHunter(), None, _fake_finetune(logs[1]), _pairs(), tmp_path,
                         spec, identity=a)  # fmt: skip
    assert logs[0] and not logs[1] and again["iterations"] == first["iterations"]
    train_hunter(CountingHunter(), secret_score, _fake_finetune(logs[2]), _pairs(2), tmp_path,
                 spec, identity=a)  # fmt: skip
    other = {"target": "cccc", "hunter": "bbbb"}  # the target's weights changed in place
    train_hunter(CountingHunter(), secret_score, _fake_finetune(logs[3]), _pairs(), tmp_path,
                 spec, identity=other)  # fmt: skip
    wider = HunterConfig(prompt_tokens=2, top_k=3, beams=1, iterations=1)
    train_hunter(CountingHunter(), secret_score, _fake_finetune(logs[4]), _pairs(), tmp_path,
                 wider, identity=other)  # fmt: skip
    assert all(len(log) == 1 for log in (logs[2], logs[3], logs[4])), logs


@pytest.mark.slow
def test_real_models_resume_to_the_same_pool_and_adapter(tmp_path, test_world):
    """The test world's tiny as the target, its tiny-ref as the hunter: a training stopped
    after its first iteration and resumed ends with the pool and adapter of an unbroken one."""
    import json
    from pathlib import Path

    from mia_ray.actors.hunter import Hunter
    from mia_ray.actors.target import TargetLM
    from mia_ray.data.pairs import make_pairs
    from mia_ray.train.hunter import finetune_hunter

    paths = test_world["targets"]["tiny"]
    docs = [json.loads(x) for x in Path(test_world["documents"]).read_text().splitlines()][:6]
    target = TargetLM(paths["model"], torch_threads=1)
    pairs = make_pairs([(d["id"], d["text"]) for d in docs], target.tok, 16, 16)
    xs = dict(zip(pairs["pair_id"], pairs["x"], strict=True))
    spec = HunterConfig(prompt_tokens=3, top_k=4, beams=2, iterations=2, epochs=2, batch_size=4)

    def finetune(adapter_in, rows, out_dir, seed):
        return finetune_hunter(
            paths["reference"], adapter_in, rows, out_dir, spec, seed, xs, threads=1
        )

    def run(out, **kw):
        hunter = Hunter(paths["reference"], torch_threads=1)
        return train_hunter(hunter, target.score, finetune, pairs, out, spec, **kw)

    run(tmp_path / "a")
    run(tmp_path / "b", stop_after=0)
    run(tmp_path / "b")
    for i in range(2):
        a = pd.read_parquet(tmp_path / "a" / f"iter-{i:02d}" / "pool.parquet")
        b = pd.read_parquet(tmp_path / "b" / f"iter-{i:02d}" / "pool.parquet")
        pd.testing.assert_frame_equal(a, b)
    wa = (tmp_path / "a" / "iter-01" / "adapter" / "adapter_model.safetensors").read_bytes()
    wb = (tmp_path / "b" / "iter-01" / "adapter" / "adapter_model.safetensors").read_bytes()
    assert wa == wb
