"""The attack pipeline end to end on the test world: planted signal found, none invented."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mia_ray.cli import main

pytestmark = [pytest.mark.ray, pytest.mark.slow]
ONE_PASS = ["loss", "zlib", "min_k", "min_k_plus_plus", "lowercase", "ref"]
ZOO = ["recall", "con_recall", "dc_pdd", "pac", "samia", "neighbourhood", "grad_norm"]
ATTACKS = ONE_PASS + ZOO


def _args(test_world, target, out):
    return [
        "attack", "--config", "jobs/attack_demo.yaml",
        "--set", "world.scale=test", "--set", f"world.root={test_world['root']}",
        "--set", f"world.target={target}", "--set", "eval.bootstrap=500",
        # the test world's 40 + 40 documents: 4 prefix shots each, 5 neighbours and 3
        # samples per snippet
        "--set", "attack.recall.shots=4", "--set", "attack.neighbourhood.n=5",
        "--set", "attack.samia.samples=3",
        "--out", str(out),
    ]  # fmt: skip


def _attack(tmp_path, test_world, target, name):
    out = tmp_path / name
    assert main(_args(test_world, target, out)) == 0
    return out, json.loads((out / "report.json").read_text())


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, ray_local, test_world):
    import mia_ray.stages as stages

    saved, stages.PART_ROWS = stages.PART_ROWS, 40  # several part files, to test resuming
    try:
        return _attack(tmp_path_factory.mktemp("runs"), test_world, "tiny", "tiny")
    finally:
        stages.PART_ROWS = saved


def test_report_has_every_attack_with_ci_and_tpr(tiny_run):
    out, report = tiny_run
    for name in ATTACKS:
        m = report["metrics"][name]
        assert 0.0 <= m["auc"] <= 1.0
        lo, hi = m["auc_ci"]
        assert lo <= m["auc"] <= hi
        assert set(m["tpr_at_fpr"]) == {"0.001", "0.01", "0.05"}
    assert 0.0 <= report["blind_baseline"]["auc"] <= 1.0
    assert {o["n"] for o in report["ngram_overlap"]} == {7, 13}
    assert (out / "report.html").read_text().count("<img") >= 1
    assert (out / "config.yaml").exists()
    # Per-row results are what the numbers came from: recompute LOSS AUC from them.
    from sklearn.metrics import roc_auc_score

    docs = pd.read_parquet(out / "document_scores.parquet")
    assert roc_auc_score(docs["label"], docs["loss"]) == pytest.approx(
        report["metrics"]["loss"]["auc"]
    )


def test_loss_finds_members_of_a_memorising_target(tiny_run):
    _, report = tiny_run
    assert report["metrics"]["loss"]["auc"] >= 0.9


def test_interrupted_scoring_resumes_with_identical_numbers(tmp_path, test_world, tiny_run, capsys):
    out, report = tiny_run
    before = pd.read_parquet(out / "snippet_scores.parquet")
    parts = sorted((out / "rows" / "target").glob("part-*.parquet"))
    assert len(parts) >= 2
    last = pd.read_parquet(parts[-1])
    total = sum(len(pd.read_parquet(p)) for p in parts)
    # As if the run had stopped with its last part half written, cutting a model batch: the
    # resumed pass scores that batch again whole, so its rows keep their batch mates.
    kept = len(last) // 2 + 1
    last.iloc[:kept].to_parquet(parts[-1])
    code = main(_args(test_world, "tiny", out))
    assert code == 0
    assert f"target: reusing {total - len(last) + kept} of {total} rows" in capsys.readouterr().err
    again = json.loads((out / "report.json").read_text())
    assert again["metrics"] == report["metrics"]
    # The pass's seconds are both runs' (the first run's whole pass, the resume's batch).
    assert again["passes"]["target"]["seconds"] > report["passes"]["target"]["seconds"]
    # Every snippet's every score to the last bit.
    pd.testing.assert_frame_equal(
        pd.read_parquet(out / "snippet_scores.parquet"), before, check_exact=True
    )


def test_no_signal_invented_on_an_untrained_model(tmp_path, ray_local, test_world):
    # 13 attacks at once: each interval at 1 - 0.05 / 13 (Bonferroni), so that the family
    # fails by chance at most 5 % of the time, not 1 - 0.95^13 = 49 %.
    out = tmp_path / "random"
    cheaper = ["--set", "data.max_snippets_per_doc=1", "--set", "attack.neighbourhood.n=3",
               "--set", "attack.pac.copies=2", "--set", "attack.samia.samples=2"]  # fmt: skip
    assert main(_args(test_world, "tiny-random", out) + ["--set", "eval.ci=0.9962", *cheaper]) == 0
    report = json.loads((out / "report.json").read_text())
    for name in ATTACKS:
        lo, hi = report["metrics"][name]["auc_ci"]
        assert lo <= 0.5 <= hi, (name, report["metrics"][name]["auc"], lo, hi)


def _loss_only(test_world, out, *extra):
    args = _args(test_world, "tiny", out) + [
        "--set", "attack.attacks=[loss]", "--set", "eval.bootstrap=100",
        "--set", "eval.blind_baseline=false", *extra,
    ]  # fmt: skip
    return args


def test_new_weights_or_dtype_at_the_same_path_are_scored_afresh(
    tmp_path, ray_local, test_world, capsys
):
    """Scored rows are keyed on the model's content and dtype, not its folder name."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(test_world["model"], model)
    out = tmp_path / "run"
    args = _loss_only(test_world, out, "--set", f"model.name_or_path={model}")
    assert main(args) == 0
    trained = json.loads((out / "report.json").read_text())["metrics"]["loss"]["auc"]
    assert trained >= 0.9
    # Retrained in place: the untrained model's weights now sit at the same path.
    shutil.copy(test_world["targets"]["tiny-random"]["model"] + "/model.safetensors", model)
    capsys.readouterr()
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "target: inputs changed since the last run; computing afresh" in err
    assert "reusing" not in err
    fresh = json.loads((out / "report.json").read_text())["metrics"]["loss"]["auc"]
    assert fresh < 0.75
    # Spelled out, what `auto` resolves to on a CPU actor is the same model: rows reused.
    assert main(args + ["--set", "model.dtype=float32", "--set", "model.device=cpu"]) == 0
    err = capsys.readouterr().err
    assert "target: reusing" in err and "computing afresh" not in err
    assert main(args + ["--set", "model.dtype=bfloat16"]) == 0
    assert "target: inputs changed since the last run; computing afresh" in capsys.readouterr().err


def _word_level_model(tmp_path, test_world, n_positions: int):
    """A random GPT-2 with a whitespace word-level vocabulary: another tokenizer than tiny's."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    words = {"[UNK]": 0, "[EOS]": 1}
    for line in open(test_world["documents"], encoding="utf-8"):
        for w in json.loads(line)["text"].split():
            words.setdefault(w, len(words))
    tok = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", eos_token="[EOS]", pad_token="[EOS]"
    )
    path = tmp_path / "word-ref"
    fast.save_pretrained(path)
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=len(words), n_positions=n_positions, n_embd=16, n_layer=1, n_head=2)
    GPT2LMHeadModel(cfg).save_pretrained(path)
    return path, fast


def test_a_reference_with_another_tokenizer_scores_the_same_text(tmp_path, ray_local, test_world):
    import zlib

    from transformers import AutoTokenizer

    from mia_ray.config import DataConfig
    from mia_ray.data.inputs import labelled_documents, snippets_of

    ref_path, ref_tok = _word_level_model(tmp_path, test_world, n_positions=32)
    out = tmp_path / "run"
    args = _args(test_world, "tiny", out) + [
        "--set", f"model.reference={ref_path}", "--set", "model.max_length=48",
        "--set", "attack.attacks=[loss,zlib,ref]", "--set", "eval.bootstrap=100",
        "--set", "eval.blind_baseline=false", "--set", "data.max_snippets_per_doc=2",
    ]  # fmt: skip
    assert main(args) == 0
    report = json.loads((out / "report.json").read_text())
    snip = pd.read_parquet(out / "snippet_scores.parquet").set_index("snippet_id")
    ref_rows = pd.read_parquet(list((out / "rows" / "reference").glob("part-*.parquet")))
    ref_rows = ref_rows.set_index("snippet_id")
    # The snippets as the pipeline cut them from the documents, before the crop.
    data = DataConfig(
        path=test_world["documents"], labels=test_world["manifest"], unlabelled="skip",
        snippet_size=128, max_snippets_per_doc=2,
    )  # fmt: skip
    docs, _ = labelled_documents(data)
    texts = snippets_of(docs, data, "").to_pandas().set_index("snippet_id")["text"]
    tgt_tok = AutoTokenizer.from_pretrained(test_world["model"])
    n_ref_bound = 0
    for sid, row in snip.iterrows():
        scored = texts[sid][: row["n_chars"]]
        n_tgt = len(tgt_tok(scored)["input_ids"])
        n_ref = len(ref_tok(scored)["input_ids"])
        assert n_tgt <= 48 and n_ref <= 32
        assert row["n_tokens"] == n_tgt
        assert ref_rows.loc[sid, "ref_n_tokens"] == n_ref  # the reference scored that very text
        n_ref_bound += n_ref >= 31
        # zlib compresses exactly the scored text: zlib = loss / len(compress(scored)).
        assert row["zlib"] == pytest.approx(row["loss"] / len(zlib.compress(scored.encode())))
    assert n_ref_bound > 0  # the reference was the tighter one there, not the target
    assert report["data"]["n_cropped"] == len(snip)
    assert any(
        f"{len(snip)} of {len(snip)} snippets were longer than what the first 48 tokens of "
        "the target and the reference cover" in n
        for n in report["notes"]
    )


def test_report_numbers_match_the_snapshot(tiny_run, report_snapshot):
    report_snapshot(tiny_run[1], "attack-tiny")


# ---------------------------------------------------------------- the attack zoo, by parity
# Each new attack's per-snippet score recomputed here from its paper's definition with plain
# transformers and numpy (not the project's Scorer or attack code), on the tiny target.


class _Plain:
    """The tiny target in this process: token log-probs, mean NLLs and gradients."""

    def __init__(self, path: str, max_length: int = 256):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.window = self.model.config.n_positions
        self.max_length = min(max_length, self.window)

    def ids(self, text: str) -> list[int]:
        return self.tok(text)["input_ids"][: self.max_length]

    def logprobs(self, ids: list[int], scored: int):
        """log p of the last ``scored`` tokens of ``ids``, each given all before it."""
        torch = self.torch
        with torch.no_grad():
            logits = self.model(torch.tensor([ids])).logits[0].double()
        lp = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
        return lp[len(ids) - 1 - scored :].numpy()

    def nll(self, text: str) -> float:
        ids = self.ids(text)
        return -float(self.logprobs(ids, len(ids) - 1).mean())

    def nll_after(self, prefix: str, text: str) -> float:
        own = self.ids(text)
        context = self.tok(prefix, add_special_tokens=False)["input_ids"]
        room = self.window - len(own)
        ids = context[max(0, len(context) - room) :] + own if room > 0 else own
        return -float(self.logprobs(ids, len(own) - 1).mean())

    def grad_inf_norm(self, text: str) -> float:
        torch = self.torch
        ids = torch.tensor([self.ids(text)])
        self.model.zero_grad()
        logits = self.model(ids).logits[0]
        loss = torch.nn.functional.cross_entropy(logits[:-1], ids[0, 1:])
        loss.backward()
        norms = [p.grad.abs().max().item() for p in self.model.parameters() if p.grad is not None]
        return float(np.mean(norms))


@pytest.fixture(scope="module")
def zoo(tiny_run, test_world):
    out, report = tiny_run
    snip = pd.read_parquet(out / "snippet_scores.parquet").set_index("snippet_id")
    return out, report, snip, _Plain(test_world["model"])


def test_recall_and_con_recall_match_their_definitions(zoo):
    out, report, snip, plain = zoo
    prefixes = json.loads((out / "recall_prefixes.json").read_text())
    docs = {json.loads(x)["id"]: json.loads(x)["text"] for x in open(report["data"]["path"])}
    for side in ("non", "member"):  # each shot starts as a held-out document does
        assert len(report["held_out"][side]) == 4
        for doc_id in report["held_out"][side]:
            assert " ".join(docs[doc_id].split()[:6]) in " ".join(prefixes[side].split())
    held = set(report["held_out"]["non"]) | set(report["held_out"]["member"])
    assert not held & set(snip["doc_id"])  # held out of every attack's evaluation
    for sid, row in snip.head(12).iterrows():
        own = plain.nll(row["text"])
        non = plain.nll_after(prefixes["non"], row["text"])
        mem = plain.nll_after(prefixes["member"], row["text"])
        assert row["recall"] == pytest.approx(non / own, abs=1e-4), sid
        assert row["con_recall"] == pytest.approx((non - 0.5 * mem) / own, abs=1e-4), sid


def test_dc_pdd_matches_its_definition(zoo, test_world):
    from collections import Counter

    out, report, snip, plain = zoo
    counts: Counter = Counter()
    for line in open(Path(test_world["root"]) / "corpus" / "reference_pool.jsonl"):
        text = json.loads(line)["text"]
        counts.update(plain.tok(text, add_special_tokens=False)["input_ids"][:1024])
    vocab, total = len(plain.tok), sum(counts.values())
    for sid, row in snip.head(12).iterrows():
        ids = plain.ids(row["text"])
        p = np.exp(plain.logprobs(ids, len(ids) - 1))
        seen, alphas = set(), []
        for t, pt in zip(ids[1:], p, strict=True):
            if t not in seen:
                seen.add(t)
                alphas.append(min(pt * -np.log((counts[t] + 1) / (total + vocab)), 0.01))
        assert row["dc_pdd"] == pytest.approx(np.mean(alphas), abs=1e-4), sid


def test_pac_neighbourhood_and_gradient_norm_match_their_definitions(zoo):
    from mia_ray.features.augment import random_swaps
    from mia_ray.features.neighbors import Lexicon, make_neighbours

    out, report, snip, plain = zoo
    lex = Lexicon.from_minilm()

    def polarized(lp) -> float:
        lp = sorted(lp)
        low, high = max(1, int(0.3 * len(lp))), max(1, int(0.05 * len(lp)))
        return float(np.mean(lp[-high:]) - np.mean(lp[:low]))

    for sid, row in snip.head(8).iterrows():
        text = row["text"]
        ids = plain.ids(text)
        copies = random_swaps(text, copies=5, share=0.3, seed=f"0:{sid}")
        cal = np.mean(
            [polarized(plain.logprobs(plain.ids(c), len(plain.ids(c)) - 1)) for c in copies]
        )
        assert row["pac"] == pytest.approx(
            -(polarized(plain.logprobs(ids, len(ids) - 1)) - cal), abs=1e-4
        )
        neighbours = make_neighbours(text, 5, lex, seed=f"0:{sid}", rate=0.1)
        nb = np.mean([plain.nll(t) for t in neighbours])
        assert row["neighbourhood"] == pytest.approx(nb - plain.nll(text), abs=1e-4), sid
        assert row["grad_norm"] == pytest.approx(-plain.grad_inf_norm(text), abs=1e-4), sid


def test_the_report_lists_the_passes_each_attack_cost(zoo):
    _, report, _, _ = zoo
    passes = report["passes"]
    assert list(passes) == ["target", "lowercase", "reference", "recall", "recall_member",
                            "token_counts", "neighbours", "augment", "gradient", "samples"]  # fmt: skip
    assert passes["recall"]["attacks"] == ["recall", "con_recall"]
    assert passes["gradient"]["attacks"] == ["grad_norm"]
    assert passes["gradient"]["cost"] == "one forward and one backward pass"
    # The fixture's run made every pass; the lowercase one inside the target's pool.
    assert all(p["seconds"] > 0 for name, p in passes.items() if name != "lowercase")
    assert passes["lowercase"]["seconds"] is None
    assert sorted(passes["target"]["attacks"]) == sorted(ATTACKS)


def test_samia_matches_its_definition(zoo, sample_by_hand):
    import hashlib
    from collections import Counter

    out, report, snip, plain = zoo
    for sid, row in snip.head(6).iterrows():
        words = row["text"].split()
        half = len(words) // 2
        # The prompt: the text up to the end of its first half of words, spacing kept.
        end, at = 0, 0
        for w in words[:half]:
            at = row["text"].index(w, end)
            end = at + len(w)
        prompt, rest = row["text"][:end], row["text"][end:]
        seed = int.from_bytes(hashlib.sha256(f"0:{sid}".encode()).digest()[:8], "little")
        n_rest = len(plain.tok(rest, add_special_tokens=False)["input_ids"])
        samples = sample_by_hand(plain.model, plain.tok, prompt, 3, n_rest, seed & (2**63 - 1), 50)
        ref = Counter(words[half:])
        recall = [sum(min(n, Counter(c.split())[w]) for w, n in ref.items()) / sum(ref.values())
                  for c in samples]  # fmt: skip
        assert row["samia"] == pytest.approx(np.mean(recall), abs=1e-4), sid


def test_samia_through_the_completions_api_scores_as_the_local_target(zoo, tmp_path, test_world):
    """SaMIA needs text only: the same attack through `mia-ray serve` over loopback HTTP."""
    out, _, snip, _ = zoo
    api = tmp_path / "api"
    # 12 documents of each class (a seeded sample): each snippet's samples are drawn from its
    # own seed, whatever else is in the run, so they must equal the full run's.
    args = _args(test_world, "tiny", api) + ["--set", "attack.attacks=[loss,samia]",
                                  "--set", "attack.samia.backend.serve=true",
                                  "--set", "data.max_docs_per_class=12"]  # fmt: skip
    assert main(args) == 0
    over_http = pd.read_parquet(api / "snippet_scores.parquet").set_index("snippet_id")
    both = over_http.index.intersection(snip.index)
    assert len(both) >= 20 and len(over_http) <= 40
    np.testing.assert_allclose(over_http.loc[both, "samia"], snip.loc[both, "samia"], atol=1e-12)
    assert (api / "backend-cache").exists() is False  # a served target is never cached


def test_a_benchmark_by_its_hub_name_runs_through_the_attack(tmp_path, ray_local, test_world):
    """data.path=hf://datasets/... with the split and fields WikiMIA's card gives: the test
    world's labelled documents in WikiMIA's layout, read by `datasets`, attacked by tiny."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    manifest = json.loads(Path(test_world["manifest"]).read_text())
    docs = [json.loads(x) for x in Path(test_world["documents"]).read_text().splitlines()]
    docs = [d for d in docs if d["id"] in manifest]
    root = tmp_path / "WikiMIA"
    (root / "data").mkdir(parents=True)
    (root / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: WikiMIA_length32\n"
        "    path: data/WikiMIA_length32-*\n---\n"
    )
    table = pa.table(
        {"input": [d["text"] for d in docs], "label": [manifest[d["id"]] for d in docs]}
    )
    pq.write_table(table, root / "data" / "WikiMIA_length32-00000-of-00001.parquet")
    out = tmp_path / "hub"
    args = [
        "attack", "--config", "jobs/attack_demo.yaml", "--set", "world.target=",
        "--set", f"data.path=hf://datasets/{root}", "--set", "data.split=WikiMIA_length32",
        "--set", "data.text_field=input", "--set", f"model.name_or_path={test_world['model']}",
        "--set", "attack.attacks=[loss,zlib]", "--set", "eval.bootstrap=100",
        "--set", "data.max_snippets_per_doc=1", "--out", str(out),
    ]  # fmt: skip
    assert main(args) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["data"]["n_documents"] == len(docs) and report["data"]["path"].startswith("hf://")
    assert report["metrics"]["loss"]["auc"] >= 0.9
