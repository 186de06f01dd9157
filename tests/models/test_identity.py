"""Cache keys name a model by what it is: weight bytes, revision, dtype, options."""

import os

from mia_ray.models.identity import file_sha256, model_identity, model_key, tree_sha256


def test_same_path_new_weights_new_key(tmp_path, monkeypatch):
    monkeypatch.setenv("MIA_RAY_HOME", str(tmp_path / "home"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"n_layer": 2}')
    (model / "model.safetensors").write_bytes(b"weights v1")
    first = model_key(str(model))
    assert model_key(str(model)) == first  # stable, and now answered from the hash memo
    assert len(list((tmp_path / "home" / "file-hashes").iterdir())) == 2
    # Retrained into the same folder: same size, new bytes, new mtime.
    (model / "model.safetensors").write_bytes(b"weights v2")
    assert model_key(str(model)) != first
    # A hidden cache folder inside the model does not change what the model is.
    (model / ".cache").mkdir()
    (model / ".cache" / "x").write_text("noise")
    assert model_key(str(model)) == model_key(str(model))
    # dtype, device, GGUF file and options are part of the key.
    keys = {
        model_key(str(model)),
        model_key(str(model), dtype="bfloat16"),
        model_key(str(model), device="cuda"),
        model_key(str(model), gguf_file="m.gguf"),
        model_key(str(model), gpus=1),
    }
    assert len(keys) == 5


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
    assert model_identity("org/model")["commit"] == ""
    refs = tmp_path / "hub" / "models--org--model" / "refs"
    refs.mkdir(parents=True)
    (refs / "main").write_text("a" * 40)
    ident = model_identity("org/model")
    assert ident["hub"] == "org/model" and ident["commit"] == "a" * 40
    before = model_key("org/model")
    (refs / "main").write_text("b" * 40)  # the hub moved main: another model
    assert model_key("org/model") != before
    assert model_key("org/model", revision="v1") != model_key("org/model")
