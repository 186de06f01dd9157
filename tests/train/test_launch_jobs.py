"""What a fine-tuning trial is given on a run with storage: URLs and contents, no driver path."""

import json
import uuid

from mia_ray.storage import COMPLETE, Workspace, open_storage
from mia_ray.train.launch import finished, jobs_for_nodes


def test_trials_get_storage_urls_the_staged_base_and_the_deepspeed_config_itself(tmp_path):
    out, model = tmp_path / "out", tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights")
    ds = tmp_path / "zero2.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    train = out / "train" / "n4" / "snippets.parquet"
    train.parent.mkdir(parents=True)
    train.write_bytes(b"PAR1 snippets")
    uri = f"mock:///bucket-{uuid.uuid4().hex[:8]}/run"  # pyarrow's in-memory filesystem
    ws = Workspace(out, uri, distributed=True)
    jobs = [
        {
            "experiment": "n4",
            "member": m,
            "base": str(model),
            "train_file": str(train),
            "out_dir": str(out / "train" / "n4" / m),
            "spec": {"deepspeed": str(ds), "seed": 0},
            "fingerprint": f"fp-{m}",
        }
        for m in ("mcd", "ens-0")
    ]
    remote = jobs_for_nodes(ws, jobs)
    store = open_storage(uri)
    for job, r in zip(jobs, remote, strict=True):
        assert "train_file" not in r and "out_dir" not in r
        assert r["train_url"] == f"{uri}/train/n4/snippets.parquet"
        assert r["out_url"] == f"{uri}/train/n4/{job['member']}"
        assert r["base"].startswith(f"{uri}/inputs/")
        assert r["deepspeed_config"] == {"zero_optimization": {"stage": 2}}
        # The rest is the job as it was (the fingerprint, the recipe as the user wrote it).
        assert {k: r[k] for k in ("member", "fingerprint", "spec")} == {
            k: job[k] for k in ("member", "fingerprint", "spec")
        }
    # The snippets were pushed, the base staged once (by content) with its marker.
    assert store.read_bytes("train/n4/snippets.parquet") == b"PAR1 snippets"
    assert remote[0]["base"] == remote[1]["base"]
    leaf = remote[0]["base"].rsplit("/", 1)[1]
    assert store.files(f"inputs/{leaf}").keys() == {"config.json", "model.safetensors", COMPLETE}

    # finished() reads the done record through storage, and checks its fingerprint.
    assert not finished(remote[0])
    store.write_json("train/n4/mcd/.complete.json", {"key": "fp-mcd", "complete": True})
    store.write_json("train/n4/ens-0/.complete.json", {"key": "another recipe", "complete": True})
    assert finished(remote[0]) and not finished(remote[1])
