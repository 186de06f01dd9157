"""The snippet size that fits a run's models (``data.snippet_size: 0``): tokens of the
target's tokenizer that every model reads whole, with room for ReCaLL's prefix."""

import pytest

from mia_ray.config import DataConfig
from mia_ray.errors import MiaError
from mia_ray.models.spans import window_snippet_tokens


def _model(tmp_path, name, positions, bos=False):
    """A model folder with a config of ``positions`` tokens of context and a word-level
    tokenizer that adds BOS when ``bos`` (no weights: only these two are read)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import GPT2Config, PreTrainedTokenizerFast

    out = tmp_path / name
    GPT2Config(n_positions=positions, n_layer=1, n_embd=8, n_head=1).save_pretrained(out)
    tok = Tokenizer(models.WordLevel({"<s>": 0, "<unk>": 1, "a": 2}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", 0)]
        )
    PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", unk_token="<unk>"
    ).save_pretrained(out)
    return (str(out), "", False, "")


def test_the_window_is_max_length_capped_at_every_models_context_less_its_specials(tmp_path):
    short = _model(tmp_path, "short", 256)
    long = _model(tmp_path, "long", 1024)
    bos = _model(tmp_path, "bos", 1024, bos=True)
    assert window_snippet_tokens([short], 512, prefix_room=False) == 256
    assert window_snippet_tokens([long], 512, prefix_room=False) == 512
    assert window_snippet_tokens([long], 100, prefix_room=False) == 100
    # A reference with a shorter context caps the target's snippets.
    assert window_snippet_tokens([long, short], 512, prefix_room=False) == 256
    # A tokenizer that adds BOS takes one token of the window.
    assert window_snippet_tokens([bos], 512, prefix_room=False) == 511
    assert window_snippet_tokens([long, bos], 512, prefix_room=False) == 511


def test_recall_keeps_half_of_each_context_for_its_prefix(tmp_path):
    short = _model(tmp_path, "short", 256)
    long = _model(tmp_path, "long", 4096)
    assert window_snippet_tokens([short], 512, prefix_room=True) == 128
    # A context far past max_length leaves the prefix room already.
    assert window_snippet_tokens([long], 512, prefix_room=True) == 512
    assert window_snippet_tokens([long, short], 512, prefix_room=True) == 128


def test_a_window_size_counts_tokens():
    DataConfig(snippet_unit="tokens", snippet_size=0).validate()
    with pytest.raises(MiaError, match=r"data.snippet_size 0 \(the model's window\) counts tokens"):
        DataConfig(snippet_unit="words", snippet_size=0).validate()
    with pytest.raises(
        MiaError, match=r"data.snippet_size must be 0 \(the model's window\) or more"
    ):
        DataConfig(snippet_size=-1).validate()
