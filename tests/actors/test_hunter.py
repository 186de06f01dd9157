"""Hunter: MemHunter's prompt writer on a real small LM (the test world's tiny-ref)."""

import numpy as np
import pandas as pd
import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hunter_path(test_world):
    return test_world["targets"]["tiny"]["reference"]


@pytest.fixture(scope="module")
def hunter(hunter_path):
    from mia_ray.actors.hunter import Hunter

    return Hunter(hunter_path, torch_threads=1)


XS = ["The king and the queen", "Once upon a time there was", "In 1905 the city of"]


def test_topk_is_the_models_own_ranking_without_special_tokens(hunter):
    import torch

    top = hunter.topk(XS, [[], [262], [262, 318]], 12)
    assert top.shape == (3, 12)
    eos = hunter.tok.eos_token_id
    for x, p, row in zip(XS, [[], [262], [262, 318]], top, strict=True):
        ids = torch.tensor([hunter.context(x) + p])
        with torch.inference_mode():
            logits = hunter.model(ids).logits[0, -1]
        logits = logits.masked_fill(torch.arange(logits.numel()) == eos, float("-inf"))
        assert row.tolist() == torch.topk(logits, 12).indices.tolist()
        assert eos not in row


def test_sampled_prompts_depend_on_the_seed_not_on_the_batch(hunter):
    together = hunter.sample(XS, 5, 8, 1.0, [7, 8, 9])
    alone = [hunter.sample([x], 5, 8, 1.0, [s])[0] for x, s in zip(XS, [7, 8, 9], strict=True)]
    assert together == alone and all(len(p) == 5 for p in together)
    assert hunter.sample(XS, 5, 8, 1.0, [1, 2, 3]) != together


def test_finetuned_adapter_makes_the_pool_prompts_likely(hunter, hunter_path, tmp_path):
    import torch

    from mia_ray.train.config import HunterConfig
    from mia_ray.train.hunter import finetune_hunter

    prompts = [[464, 3290, 318, 257], [40, 716, 407, 534], [1212, 318, 262, 995]]
    pool = pd.DataFrame({"pair_id": ["a", "b", "c"], "prompt_ids": prompts})
    spec = HunterConfig(epochs=30, lr=5e-3, batch_size=3)
    xs = dict(zip(["a", "b", "c"], XS, strict=True))

    def logprob():
        total = 0.0
        for x, p in zip(XS, prompts, strict=True):
            ctx = hunter.context(x)
            ids = torch.tensor([ctx + p])
            with torch.inference_mode():
                lp = torch.log_softmax(hunter.model(ids).logits[0, :-1], -1)
            total += lp[len(ctx) - 1 :].gather(-1, ids[0, len(ctx) :, None]).sum().item()
        return total

    before = logprob()
    rec = finetune_hunter(hunter_path, "", pool, str(tmp_path / "ad"), spec, 0, xs, threads=1)
    assert rec["final_loss"] < rec["first_loss"]
    hunter.load_adapter(str(tmp_path / "ad"))
    after = logprob()
    hunter.load_adapter("")
    assert logprob() == pytest.approx(before, rel=1e-5)  # the base model is intact
    assert after > before + 5.0
    # The top proposal after each pool context now begins the pool prompt.
    hunter.load_adapter(str(tmp_path / "ad"))
    first = hunter.topk(XS, [[], [], []], 1)[:, 0]
    hunter.load_adapter("")
    assert np.mean(first == np.array([p[0] for p in prompts])) >= 2 / 3


def test_the_hunter_reads_x_after_the_bos_its_tokenizer_adds(hunter_path, tmp_path):
    import shutil

    from transformers import AutoTokenizer

    from mia_ray.actors.hunter import Hunter, hunter_context

    shutil.copytree(hunter_path, tmp_path / "h")
    AutoTokenizer.from_pretrained(tmp_path / "h", add_bos_token=True).save_pretrained(
        tmp_path / "h"
    )
    h = Hunter(str(tmp_path / "h"), torch_threads=1, max_x_tokens=4)
    bos = h.tok.bos_token_id
    x_ids = h.tok(XS[1], add_special_tokens=False)["input_ids"]
    # BOS, then x's last 4 tokens, then the separator: in sampling and in fine-tuning alike.
    assert h.context(XS[1]) == [bos, *x_ids[-4:], *h.sep]
    assert hunter_context(h.tok, XS[1], h.sep, 4) == h.context(XS[1])


def test_an_adapter_in_storage_serves_as_its_local_folder(
    hunter, hunter_path, tmp_path, monkeypatch
):
    """An adapter put into storage (pyarrow's mock://, as an object store) by another node's
    fine-tune: the hunter samples with it, and a fine-tune continues it, exactly as from the
    folder itself (each node copies it once into its node cache)."""
    import uuid

    from mia_ray.storage import open_storage
    from mia_ray.train.config import HunterConfig
    from mia_ray.train.hunter import finetune_hunter

    monkeypatch.setenv("MIA_RAY_HOME", str(tmp_path / "home"))
    pool = pd.DataFrame({"pair_id": ["a", "b"], "prompt_ids": [[464, 3290], [40, 716]]})
    xs = dict(zip(["a", "b"], XS[:2], strict=True))
    spec = HunterConfig(epochs=3, lr=5e-3, batch_size=2)
    finetune_hunter(hunter_path, "", pool, str(tmp_path / "ad"), spec, 0, xs, threads=1)
    store = open_storage(f"mock:///bucket-{uuid.uuid4().hex[:8]}/run")
    store.put_dir(tmp_path / "ad", "iter-00/adapter")
    url = store.url("iter-00/adapter")
    base = hunter.sample(XS, 4, 8, 1.0, [1, 2, 3])
    hunter.load_adapter(str(tmp_path / "ad"))
    local = hunter.sample(XS, 4, 8, 1.0, [1, 2, 3])
    hunter.load_adapter(url)
    remote = hunter.sample(XS, 4, 8, 1.0, [1, 2, 3])
    hunter.load_adapter("")
    assert remote == local != base
    # The next iteration's fine-tune continues the adapter from storage as from the folder.
    for name, adapter_in in (("from-folder", str(tmp_path / "ad")), ("from-storage", url)):
        finetune_hunter(hunter_path, adapter_in, pool, str(tmp_path / name), spec, 1, xs, threads=1)
    a = (tmp_path / "from-folder" / "adapter_model.safetensors").read_bytes()
    b = (tmp_path / "from-storage" / "adapter_model.safetensors").read_bytes()
    assert a == b
