"""The CLI: verbs, failures that come through Ray, run folders and progress lines.

The bad-input probes (config errors, bad documents, models that do not load) are the table
in tests/test_bad_inputs.py.
"""

import json

import pytest

from mia_ray.cli import main
from mia_ray.errors import MiaError, describe_failure, find_mia_error


def test_help_lists_every_verb(capsys):
    # A "%" in a pipeline's help once crashed `mia-ray --help` inside argparse.
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for verb in (
        "attack",
        "audit",
        "contamination",
        "copycheck",
        "demo",
        "leakage",
        "lumia",
        "mark",
        "memhunter",
        "serve",
        "verify",
    ):
        assert verb in out
    assert "Min-K%, Min-K%++" in out


@pytest.mark.ray
def test_errors_from_ray_tasks_and_actors_name_their_cause(ray_local):
    ray = ray_local

    @ray.remote
    def fails(exc):
        raise exc

    @ray.remote
    class DiesAtBirth:
        def __init__(self, exc):
            raise exc

        def ping(self):
            return 1

    def caught(fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - the test looks at what Ray raised
            return e
        raise AssertionError("no error")

    task = caught(lambda: ray.get(fails.remote(RuntimeError("disk on fire\nsecond line"))))
    assert find_mia_error(task) is None
    assert (
        describe_failure(task) == "RuntimeError: disk on fire (raised inside a Ray task or actor)"
    )
    task = caught(lambda: ray.get(fails.remote(MiaError("bad input, said once"))))
    assert str(find_mia_error(task)) == "bad input, said once"
    # An actor that dies in __init__ keeps only the text of its traceback.
    actor = caught(lambda: ray.get(DiesAtBirth.remote(MiaError("no such model")).ping.remote()))
    assert type(actor).__name__ == "ActorDiedError"
    assert str(find_mia_error(actor)) == "no such model"
    actor = caught(lambda: ray.get(DiesAtBirth.remote(KeyError("float8")).ping.remote()))
    assert find_mia_error(actor) is None
    assert describe_failure(actor) == "KeyError: 'float8' (raised inside a Ray task or actor)"

    def explode(batch):
        raise ZeroDivisionError("in a map")

    data = caught(lambda: ray.data.range(4).map_batches(explode).materialize())
    assert describe_failure(data) == (
        "ZeroDivisionError: in a map (raised inside a Ray task or actor)"
    )
    assert describe_failure(ValueError("plain\nmore")) == "ValueError: plain"


@pytest.mark.ray
def test_a_failure_inside_ray_is_one_line_and_error_log(ray_local, tmp_path, capsys):
    """Through the CLI: exit 1 (unexpected) or 2 (a MiaError), one line, the traceback in
    error.log. A throwaway verb registered for the test runs the Ray work."""
    from dataclasses import dataclass

    from mia_ray import registry

    @dataclass
    class Cfg:
        what: str = "crash"

    def run(cfg, out):
        ray = ray_local

        def step(batch):
            if cfg.what == "crash":
                raise ZeroDivisionError("a bug in a map")
            raise MiaError("bad input found by a worker")

        ray.data.range(4).map_batches(step).materialize()
        return {}

    registry.pipeline("ray-failure-probe", Cfg, help="test only")(run)
    try:
        for what, code, line in [
            ("crash", 1, "mia-ray: failed: ZeroDivisionError: a bug in a map (raised inside"),
            ("bad", 2, "mia-ray: error: bad input found by a worker (traceback in"),
        ]:
            out = tmp_path / what
            assert main(["ray-failure-probe", "--set", f"what={what}", "--out", str(out)]) == code
            err = capsys.readouterr().err
            lines = [x for x in err.splitlines() if x.startswith("mia-ray: ")]
            assert len(lines) == 1 and lines[0].startswith(line), err
            assert "Traceback" not in err, err
            assert "Traceback" in (out / "error.log").read_text()
    finally:
        registry._REGISTRY["pipeline"].pop("ray-failure-probe")


@pytest.mark.ray
def test_rerun_sets_the_last_report_aside_and_progress_ends_at_the_total(
    ray_local, test_world, tmp_path, capsys
):
    d = tmp_path / "docs"
    d.mkdir()
    for i in range(12):
        (d / f"doc{i}.txt").write_text(f"document number {i} says " + "words and more words " * 20)
    (tmp_path / "labels.json").write_text(
        json.dumps({f"doc{i}.txt": int(i < 6) for i in range(12)})
    )
    out = tmp_path / "run"
    args = [
        "attack", "--set", f"data.path={d}", "--set", f"data.labels={tmp_path / 'labels.json'}",
        "--set", f"model.name_or_path={test_world['model']}", "--set", "attack.attacks=loss",
        "--set", "data.min_docs_per_class=3", "--set", "eval.bootstrap=100",
        "--set", "data.snippet_size=32", "--set", "model.max_length=64",
        "--set", "resources.scorer.cpus=0.5", "--out", str(out),
    ]  # fmt: skip
    assert main(args) == 0
    err = capsys.readouterr().err
    progress = [x for x in err.splitlines() if "target: " in x and " rows" in x]
    assert progress and "target: 24/24 rows in" in progress[-1], err
    first = json.loads((out / "report.json").read_text())
    # A rerun with another config that fails once the work has started (a binary document)
    # leaves no report beside its config.yaml; the finished run's report is kept aside.
    (d / "doc3.txt").write_bytes(b"\x00\x01" * 40)
    assert main([*args[:-2], "--set", "eval.bootstrap=200", "--out", str(out)]) == 2
    assert "document doc3.txt looks binary" in capsys.readouterr().err
    assert "bootstrap: 200" in (out / "config.yaml").read_text()
    assert not (out / "report.json").exists() and not (out / "report.html").exists()
    assert json.loads((out / "previous" / "report.json").read_text()) == first
    assert (out / "previous" / "report.html").exists()
    assert "bootstrap: 100" in (out / "previous" / "config.yaml").read_text()
    # No output of the finished run stays beside the failed run's config: the folder holds
    # one run (its stage folders are keyed caches, reused by key).
    top = {p.name for p in out.iterdir() if p.is_file()}
    assert top <= {"config.yaml", "manifest.json", "error.log", ".mia-ray.lock"}, top
    moved = {p.name for p in (out / "previous").iterdir()}
    assert {"snippet_scores.parquet", "document_scores.parquet", "manifest.json"} <= moved
