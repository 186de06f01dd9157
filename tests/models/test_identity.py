"""Cache keys name a model by what it is: weight bytes, revision, dtype and device as they
resolve where the model runs, options."""

import os

from mia_ray.config import ModelConfig
from mia_ray.models.identity import (
    file_sha256,
    model_key,
    resolved_precision,
    tree_sha256,
    weights_identity,
)


def _cfg(path, **kw):
    return ModelConfig(name_or_path=str(path), **kw)


def test_same_path_new_weights_new_key(tmp_path, monkeypatch):
    monkeypatch.setenv("MIA_RAY_HOME", str(tmp_path / "home"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"n_layer": 2}')
    (model / "model.safetensors").write_bytes(b"weights v1")
    first = model_key(_cfg(model), False)
    assert model_key(_cfg(model), False) == first  # stable, and now answered from the hash memo
    assert len(list((tmp_path / "home" / "file-hashes").iterdir())) == 2
    # Retrained into the same folder: same size, new bytes, new mtime.
    (model / "model.safetensors").write_bytes(b"weights v2")
    assert model_key(_cfg(model), False) != first
    # A hidden cache folder inside the model does not change what the model is.
    (model / ".cache").mkdir()
    (model / ".cache" / "x").write_text("noise")
    assert model_key(_cfg(model), False) == model_key(_cfg(model), False)
    # The resolved dtype and device, the GGUF file and options are part of the key.
    keys = {
        model_key(_cfg(model), False),
        model_key(_cfg(model, dtype="bfloat16"), False),
        model_key(_cfg(model, device="cuda"), False),
        model_key(_cfg(model, gguf_file="m.gguf"), False),
        model_key(_cfg(model), False, scoring="v2"),
    }
    assert len(keys) == 5


def test_dtype_auto_keys_what_it_resolves_to_where_the_model_runs(tmp_path, monkeypatch):
    """``dtype: auto`` is float32 on a CPU and half precision on a GPU: a run that moves from
    CPU actors to GPU actors gets a new key (its numbers differ), while spelling out what
    auto resolves to keeps the key (its numbers do not)."""
    monkeypatch.setenv("MIA_RAY_HOME", str(tmp_path / "home"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"w")
    cpu, gpu = model_key(_cfg(model), False), model_key(_cfg(model), True)
    assert cpu != gpu
    assert model_key(_cfg(model, dtype="float32", device="cpu"), False) == cpu
    assert model_key(_cfg(model, device="cuda"), False) == gpu  # cuda named: a GPU either way
    assert resolved_precision("auto", "auto", False) == {"device": "cpu", "dtype": "float32"}
    assert resolved_precision("auto", "auto", True) == {"device": "cuda", "dtype": "half"}
    assert resolved_precision("bfloat16", "cpu", True) == {"device": "cpu", "dtype": "bfloat16"}
    # Another model of the section (a reference) shares dtype and device, not the revision.
    ref = tmp_path / "ref"
    ref.mkdir()
    (ref / "model.safetensors").write_bytes(b"r")
    with_rev = _cfg(model, revision="v1")
    assert model_key(with_rev, False, str(ref)) == model_key(_cfg(model), False, str(ref))
    assert model_key(with_rev, False, str(ref)) != model_key(_cfg(ref), True)


def test_file_hash_is_the_sha256_of_the_bytes(tmp_path, monkeypatch):
    import hashlib

    monkeypatch.setenv("MIA_RAY_HOME", str(tmp_path / "home"))
    f = tmp_path / "w.bin"
    f.write_bytes(b"abc" * 1000)
    assert file_sha256(f) == hashlib.sha256(b"abc" * 1000).hexdigest()
    # A changed file is rehashed even with its mtime restored: its size differs.
    st = f.stat()
    f.write_bytes(b"abd" * 1001)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert file_sha256(f) == hashlib.sha256(b"abd" * 1001).hexdigest()
    assert tree_sha256(f) == file_sha256(f)


def test_hub_names_keyed_by_revision_and_cached_commit(tmp_path, monkeypatch):
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert weights_identity("org/model")["commit"] == ""
    refs = tmp_path / "hub" / "models--org--model" / "refs"
    refs.mkdir(parents=True)
    (refs / "main").write_text("a" * 40)
    ident = weights_identity("org/model")
    assert ident["hub"] == "org/model" and ident["commit"] == "a" * 40
    before = model_key(_cfg("org/model"), False)
    (refs / "main").write_text("b" * 40)  # the hub moved main: another model
    assert model_key(_cfg("org/model"), False) != before
    assert model_key(_cfg("org/model", revision="v1"), False) != model_key(_cfg("org/model"), False)
