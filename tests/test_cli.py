"""Bad input stops early with one clear line, exit code 2 and no traceback."""

import json

import pytest

from mia_ray.cli import main


def _run(capsys, *args):
    code = main(list(args))
    err = capsys.readouterr().err
    return code, err


def _docs(tmp_path, n_members=6, n_non=6):
    d = tmp_path / "docs"
    d.mkdir()
    labels = {}
    for i in range(n_members + n_non):
        (d / f"doc{i}.txt").write_text(f"document number {i} says " + "words and more words " * 20)
        labels[f"doc{i}.txt"] = int(i < n_members)
    man = tmp_path / "labels.json"
    man.write_text(json.dumps(labels))
    return d, man


def _assert_one_line(err, code, needle):
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("mia-ray: error:")]
    assert lines and needle in lines[0], err
    assert "Traceback" not in err


def test_config_typo(capsys, tmp_path):
    code, err = _run(
        capsys,
        "attack",
        "--config",
        "jobs/attack_demo.yaml",
        "--set",
        "data.snipet_size=3",
        "--out",
        str(tmp_path / "o"),
    )
    _assert_one_line(
        err, code, "unknown config key 'data.snipet_size'; did you mean 'snippet_size'?"
    )


def test_missing_config_file(capsys, tmp_path):
    code, err = _run(capsys, "attack", "--config", "jobs/nope.yaml", "--out", str(tmp_path / "o"))
    _assert_one_line(err, code, "config file not found: jobs/nope.yaml")


@pytest.mark.ray
class TestBadData:
    @pytest.fixture(autouse=True)
    def _ray(self, ray_local, test_world):
        self.model = str(test_world["model"])

    def run(self, capsys, tmp_path, data, labels="", model=None, *extra):
        args = [
            "attack",
            "--set",
            f"data.path={data}",
            "--set",
            f"model.name_or_path={model or self.model}",
            "--set",
            "attack.attacks=loss",
            "--set",
            "data.min_docs_per_class=3",
            "--out",
            str(tmp_path / "o"),
        ]
        if labels:
            args += ["--set", f"data.labels={labels}"]
        return _run(capsys, *args, *extra)

    def test_missing_path(self, capsys, tmp_path):
        code, err = self.run(capsys, tmp_path, tmp_path / "absent")
        _assert_one_line(err, code, f"data path not found: {tmp_path / 'absent'}")

    def test_empty_file(self, capsys, tmp_path):
        d, man = _docs(tmp_path)
        (d / "doc0.txt").write_text("")
        code, err = self.run(capsys, tmp_path, d, man)
        _assert_one_line(err, code, "document doc0.txt is empty")

    def test_binary_file(self, capsys, tmp_path):
        d, man = _docs(tmp_path)
        (d / "doc1.txt").write_bytes(b"\x00\x01\x02PNG\x00" * 10)
        code, err = self.run(capsys, tmp_path, d, man)
        _assert_one_line(err, code, "document doc1.txt looks binary")

    def test_undecodable_file(self, capsys, tmp_path):
        d, man = _docs(tmp_path)
        (d / "doc2.txt").write_bytes(b"caf\xe9 au lait " * 5)
        code, err = self.run(capsys, tmp_path, d, man)
        _assert_one_line(err, code, "document doc2.txt is not valid UTF-8")

    def test_single_class(self, capsys, tmp_path):
        d, man = _docs(tmp_path, n_members=8, n_non=0)
        code, err = self.run(capsys, tmp_path, d, man)
        _assert_one_line(err, code, "only one class")

    def test_too_few_documents(self, capsys, tmp_path):
        d, man = _docs(tmp_path, n_members=2, n_non=2)
        code, err = self.run(capsys, tmp_path, d, man)
        _assert_one_line(err, code, "too few documents")

    def test_no_labels(self, capsys, tmp_path):
        d, _ = _docs(tmp_path)
        code, err = self.run(capsys, tmp_path, d)
        _assert_one_line(err, code, "no membership labels")

    def test_model_does_not_load(self, capsys, tmp_path):
        d, man = _docs(tmp_path)
        code, err = self.run(capsys, tmp_path, d, man, str(tmp_path / "no-such-model"))
        _assert_one_line(err, code, "does not load")


def test_help_lists_every_verb(capsys):
    # A "%" in a pipeline's help once crashed `mia-ray --help` inside argparse.
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for verb in ("attack", "copycheck", "demo", "leakage", "lumia", "memhunter", "serve"):
        assert verb in out
    assert "Min-K%, Min-K%++" in out
