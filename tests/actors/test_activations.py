"""ActivationReader: LUMIA eq. 1 (the mean of each block's output over the real tokens)."""

import numpy as np
import pandas as pd
import pytest

from mia_ray.actors.activations import ActivationReader, block_lists, column, parse_column
from mia_ray.errors import MiaError

pytestmark = pytest.mark.slow

TEXTS = [
    "Friends, Romans, countrymen, lend me your ears.",
    "The quality of mercy is not strained; it droppeth as the gentle rain from heaven upon the place beneath.",
    "To be",
]


@pytest.fixture(scope="module")
def reader(test_world):
    return ActivationReader(test_world["targets"]["tiny"]["model"], max_length=128, torch_threads=1)


def _batch(texts):
    return pd.DataFrame({"snippet_id": [f"s{i}" for i in range(len(texts))], "text": texts})


def test_columns_name_part_and_one_based_layer():
    assert column("vision", 3) == "vision.3"
    assert parse_column("language.12") == ("language", 12)
    assert parse_column("snippet_id") is None and parse_column("n_tokens") is None


def test_mean_over_real_tokens_matches_the_hidden_states(reader):
    """Blocks 1..L-1 of GPT-2 are HF's hidden_states[1..L-1] (the last one has ln_f applied)."""
    import torch

    out = reader(_batch(TEXTS))
    assert reader.layers == {"text": 2}
    for i, text in enumerate(TEXTS):
        enc = reader.tok(text, return_tensors="pt")
        with torch.inference_mode():
            hs = reader.model(**enc, output_hidden_states=True).hidden_states
        want = hs[1][0].mean(0).numpy()
        np.testing.assert_allclose(out.iloc[i]["text.1"], want, rtol=1e-4, atol=1e-5)
        assert out.iloc[i]["n_tokens"] == enc["input_ids"].shape[1]
    assert out["text.2"].iloc[0].dtype == np.float32 and out["text.2"].iloc[0].shape == (64,)


def test_padding_in_a_batch_changes_nothing(reader):
    together = reader(_batch(TEXTS))
    for i, text in enumerate(TEXTS):
        alone = reader(_batch([text]))
        for col in ("text.1", "text.2"):
            np.testing.assert_allclose(together.iloc[i][col], alone.iloc[0][col], atol=1e-5)


def test_token_stats_from_the_same_pass_are_the_scorers_and_leave_the_layers_alone(
    reader, test_world
):
    """LUMIA's one pass: the classic attacks' statistics from the activation pass's logits are
    the Scorer's to the bit, and reading them changes no activation."""
    from mia_ray.actors.scorer import Scorer

    model = test_world["targets"]["tiny"]["model"]
    both = ActivationReader(model, max_length=128, torch_threads=1, token_stats=True)
    got = both(_batch(TEXTS))
    want = Scorer(model, max_length=128, torch_threads=1, lowercase=False)(_batch(TEXTS))
    for col in ("n_tokens", "loss", "token_logprobs", "mu", "sigma"):
        for a, b in zip(got[col], want[col], strict=True):
            np.testing.assert_array_equal(a, b, err_msg=col)
    plain = reader(_batch(TEXTS))
    assert "loss" not in plain
    for col in ("text.1", "text.2"):
        np.testing.assert_array_equal(np.stack(got[col]), np.stack(plain[col]))


def test_long_samples_are_cropped_to_the_context(test_world):
    short = ActivationReader(test_world["targets"]["tiny"]["model"], max_length=16)
    out = short(_batch([" ".join(["word"] * 200), "a b c"]))
    assert out["n_tokens"].tolist()[0] == 16 and out["n_tokens"].tolist()[1] < 16


def test_a_model_without_blocks_is_a_clear_error():
    import torch

    class NoBlocks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = type("C", (), {"num_hidden_layers": 4})()
            self.proj = torch.nn.ModuleList([torch.nn.Linear(2, 2)] * 2)

    with pytest.raises(
        MiaError, match=r"cannot find the transformer blocks \(text\) of a NoBlocks"
    ):
        block_lists(NoBlocks())


def test_an_image_given_as_bytes_reads_as_from_its_file(tmp_path, test_world):
    """On a cluster the readers get each image's bytes (read on the driver's node), not its
    path: the same activations, exactly."""
    import json
    from pathlib import Path

    from mia_ray.demo.llava import build_tiny_llava, make_image_text_samples

    model = build_tiny_llava(tmp_path / "llava", test_world["targets"]["tiny"]["model"])
    data = make_image_text_samples(tmp_path / "data", ["a red field", "two blue squares"], [1, 0])
    rows = [json.loads(x) for x in Path(data).read_text().splitlines()]
    paths = [str(Path(data).parent / r["image"]) for r in rows]
    reader = ActivationReader(str(model), max_length=64, torch_threads=1)
    batch = _batch([r["text"] for r in rows])
    from_files = reader(batch.assign(image=paths))
    from_bytes = reader(batch.assign(image=[Path(p).read_bytes() for p in paths]))
    pd.testing.assert_frame_equal(from_bytes, from_files, check_exact=True)
    assert {"vision.1", "language.2"} <= set(from_bytes.columns)
    with pytest.raises(MiaError, match="image of 3 bytes does not load"):
        reader(batch.head(1).assign(image=[b"png"]))
