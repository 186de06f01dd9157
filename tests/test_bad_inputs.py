"""Bad input, one row per case: each row runs the real CLI and checks what the user sees.

A row stops with its exit code (2: bad input; 1: unexpected), one ``mia-ray: error:`` (or
``failed:``) line that holds the row's phrase, no traceback on stderr, and, where the failure
came through Ray, the traceback in ``<out>/error.log``. Rows that fail in config validation
(most of them) must not even create ``--out``: nothing starts before the config is whole.

To add a probe, append a ``Bad(...)`` to ``ROWS``. Placeholders in ``argv``: ``{out}`` (the
run folder), ``{tmp}`` (the row's temp folder), ``{docs}`` / ``{labels}`` (12 labelled text
documents and their manifest, 6 per class, built by ``_docs``; a ``setup`` may change them)
and ``{model}`` (the test world's tiny target). Rows with ``ray=True`` share the session's
local Ray and test world; ``setup(tmp, model)`` prepares files; ``check(out)`` asserts
more.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from mia_ray.cli import main


@dataclass(frozen=True)
class Bad:
    name: str
    argv: tuple[str, ...]
    message: str  # a phrase of the one error line (exact text where it matters)
    code: int = 2
    ray: bool = False  # needs the session's Ray and the test world
    error_log: bool = False  # <out>/error.log holds the traceback
    setup: Callable[[Path, Path], None] | None = None  # (row's temp folder, tiny model)
    check: Callable[[Path], None] | None = None
    env: tuple[tuple[str, str], ...] = ()
    # secrets that must appear in no output: stderr, stdout, any file the run left in --out
    hidden: tuple[str, ...] = ()


def _sets(*pairs: str) -> tuple[str, ...]:
    return tuple(a for p in pairs for a in ("--set", p))


# Each verb on the row's own documents and a model folder that does not exist: a check that
# validation misses then fails fast (and with another message), never starts real work.
_MINE = ("data.path={docs}", "data.labels={labels}", "model.name_or_path={tmp}/no-model")
ATTACK = ("attack", *_sets(*_MINE, "attack.attacks=loss"))
COPYCHECK = ("copycheck", *_sets(*_MINE))
LUMIA = ("lumia", *_sets(*_MINE))
MEMHUNTER = ("memhunter", *_sets(*_MINE, "hunter.model={tmp}/no-model"))
LEAKAGE = ("leakage", *_sets("crawl.shards=[{docs}]"))
# An attack on the row's own documents with the test world's tiny model: cheap to score.
OWN = (
    "attack",
    *_sets(
        "data.path={docs}",
        "data.labels={labels}",
        "model.name_or_path={model}",
        "attack.attacks=loss",
        "data.min_docs_per_class=3",
        "eval.bootstrap=100",
        "data.snippet_size=32",
        "model.max_length=64",
        "resources.scorer.cpus=0.5",
    ),
)


# ---------------------------------------------------------------- setups and checks


def _no_tokenizer(tmp: Path, model: Path) -> None:
    """A model folder with config and weights but no tokenizer files."""
    (tmp / "model").mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(model / name, tmp / "model" / name)


def _broken_weights(tmp: Path, model: Path) -> None:
    """Config and tokenizer load; the weights file is cut short (a copy that broke off)."""
    shutil.copytree(model, tmp / "model")
    weights = tmp / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])


def _tokenizer_past_embeddings(tmp: Path, model: Path) -> None:
    """A reference whose tokenizer gained tokens its embedding matrix has no rows for."""
    from transformers import AutoConfig, AutoTokenizer

    shutil.copytree(model, tmp / "ref")
    tok = AutoTokenizer.from_pretrained(tmp / "ref")
    rows = AutoConfig.from_pretrained(tmp / "ref").vocab_size
    tok.add_tokens([f"<extra-{i}>" for i in range(rows - len(tok) + 3)])
    tok.save_pretrained(tmp / "ref")


def _rewrite_labels(fn: Callable[[dict], dict]) -> Callable[[Path, Path], None]:
    def setup(tmp: Path, model: Path) -> None:
        path = tmp / "labels.json"
        path.write_text(json.dumps(fn(json.loads(path.read_text()))))

    return setup


def _jsonl_docs(tmp: Path, model: Path) -> None:
    records = [{"key": f"d{i}", "text": f"text {i} " * 30, "label": i % 2} for i in range(12)]
    (tmp / "docs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def _old_report_and_binary_doc(tmp: Path, model: Path) -> None:
    """A finished run of another config in --out, then a rerun whose data fails to read."""
    out = tmp / "out"
    out.mkdir()
    (out / "config.yaml").write_text("pipeline: attack\neval:\n  bootstrap: 1000\n")
    (out / "report.json").write_text('{"old": true}')
    (out / "report.html").write_text("<p>old</p>")
    (out / "error.log").write_text("a traceback of a run before that")
    (out / "snippet_scores.parquet").write_bytes(b"the old run's rows")
    (tmp / "docs" / "doc1.txt").write_bytes(b"\x00\x01PNG\x00" * 10)


def _old_report_set_aside(out: Path) -> None:
    assert (out / "config.yaml").exists()
    assert "docs" in (out / "config.yaml").read_text()  # the new run's config
    for name in ("report.json", "report.html", "error.log"):
        assert not (out / name).exists(), name
    assert json.loads((out / "previous" / "report.json").read_text()) == {"old": True}
    assert (out / "previous" / "report.html").read_text() == "<p>old</p>"
    assert "bootstrap: 1000" in (out / "previous" / "config.yaml").read_text()
    # The old run's outputs go with its report: the folder never mixes two runs.
    assert not (out / "snippet_scores.parquet").exists()
    assert (out / "previous" / "snippet_scores.parquet").read_bytes() == b"the old run's rows"


# Credentials a user may paste into a path or URL: none may reach any output.
KEY_ID, SECRET, API_KEY = "AKIDEXAMPLE77", "wJalrXUtnFEMIK7MDENG", "sk-test0123456789abcdefXYZ"
AUDIT = ("audit", "--model", "{model}", "--unseen", "{docs}",
         *_sets("data.snippet_size=32", "model.max_length=64", "audit.attacks=[loss]",
                "resources.scorer.cpus=0.5"))  # fmt: skip
_held: list = []  # a lock this test process holds for a row, released by its check


def _run_holding_the_folder(tmp: Path, model: Path) -> None:
    """Another run holds --out: its lock is taken on another open file, as a second process
    would, and says who holds it."""
    import fcntl

    (tmp / "out").mkdir()
    f = open(tmp / "out" / ".mia-ray.lock", "a+")  # noqa: SIM115 - held until the check
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    f.write("pid 4242, started 2026-12-06 17:00:00\n")
    f.flush()
    _held.append(f)


def _folder_untouched_then_released(out: Path) -> None:
    assert sorted(p.name for p in out.iterdir()) == [".mia-ray.lock"]  # no config.yaml
    _held.pop().close()


def _cut(
    name: str, compress: Callable[[bytes], bytes], n: int = 30
) -> Callable[[Path, Path], None]:
    """--suspected as one compressed .jsonl whose last bytes are missing (a copy that broke
    off): ``n`` records, the stream cut 20 bytes before its end. 30 records break off in the
    driver's look at the first record; 60,000 (20 MB) past it, in a read task."""

    def setup(tmp: Path, model: Path) -> None:
        recs = "".join(json.dumps({"id": f"s{i}", "text": f"suspected text {i} " * 16}) + "\n"
                       for i in range(n))  # fmt: skip
        (tmp / name).write_bytes(compress(recs.encode())[:-20])

    return setup


def _gzip(data: bytes) -> bytes:
    import gzip

    return gzip.compress(data)


def _zstd(data: bytes) -> bytes:
    import pyarrow as pa

    return pa.Codec("zstd").compress(data, asbytes=True)


def _no_secret_left(out: Path) -> None:
    """Every file of the run folder (config.yaml above all) is free of the credentials."""
    for path in out.rglob("*") if out.exists() else ():
        if path.is_file():
            text = path.read_bytes().decode("utf-8", "replace")
            for secret in (KEY_ID, SECRET, API_KEY):
                assert secret not in text, (path, secret)


# A leakage scan with one scanner actor of half a CPU: the session's 2-CPU Ray then keeps a
# CPU for Ray Data's reads (the default pool holds both; see its row).
SCAN = ("leakage", *_sets("scan.workers=1", "scan.cpus_per_worker=0.5"))


def _wet_pages(path: Path) -> None:
    from mia_ray.demo.crawl import write_wet

    write_wet([{"id": f"w{i}", "text": f"Page {i} says hello. " * 20} for i in range(8)], path)


def _wet_cut(tmp: Path, model: Path) -> None:
    """A WET shard whose last gzip member breaks off (a download cut short)."""
    _wet_pages(tmp / "CC-0.warc.wet.gz")
    data = (tmp / "CC-0.warc.wet.gz").read_bytes()
    (tmp / "CC-0.warc.wet.gz").write_bytes(data[:-20])


def _wet_garbage_in_a_folder(tmp: Path, model: Path) -> None:
    """A crawl folder (one shard): a good WET file and one whose bytes are no gzip at all."""
    import random

    (tmp / "crawl").mkdir()
    _wet_pages(tmp / "crawl" / "CC-0.warc.wet.gz")
    junk = b"PK\x03\x04" + random.Random(0).randbytes(4000)
    (tmp / "crawl" / "CC-1.warc.wet.gz").write_bytes(junk)


ROWS = [
    # ---- config validation: fails before anything starts
    Bad("config typo", ("attack", "--config", "jobs/attack_demo.yaml", *_sets("data.snipet_size=3")),
        "unknown config key 'data.snipet_size'; did you mean 'snippet_size'?"),
    Bad("missing config file", ("attack", "--config", "jobs/nope.yaml"),
        "config file not found: jobs/nope.yaml"),
    Bad("negative bootstrap", (*ATTACK, *_sets("eval.bootstrap=-5")),
        "eval.bootstrap must be 0 (no intervals) or at least 100 resamples, not -5"),
    Bad("too few bootstrap resamples", (*ATTACK, *_sets("eval.bootstrap=10")),
        "eval.bootstrap must be 0 (no intervals) or at least 100 resamples, not 10"),
    Bad("ci outside (0, 1)", (*ATTACK, *_sets("eval.ci=95")),
        "eval.ci must lie in (0, 1), e.g. 0.95, not 95.0"),
    Bad("fpr outside (0, 1)", (*ATTACK, *_sets("eval.fprs=[0.01,5]")),
        "eval.fprs must list false-positive rates in (0, 1), e.g. [0.01, 0.05]; got 5.0"),
    Bad("one threshold fold", (*ATTACK, *_sets("eval.threshold_folds=1")),
        "eval.threshold_folds must be at least 2 (cross-validation), not 1"),
    Bad("unknown attack", (*ATTACK, *_sets("attack.attacks=[loss,lossy]")),
        "attack.attacks: unknown attack 'lossy'; did you mean 'loss'?"),
    Bad("one document per class", (*ATTACK, *_sets("data.min_docs_per_class=1")),
        "data.min_docs_per_class must be at least 2, not 1"),
    Bad("batch size 0", (*ATTACK, *_sets("model.batch_size=0")),
        "model.batch_size must be at least 1, not 0"),
    Bad("no scorer actors", (*ATTACK, *_sets("resources.scorer.actors=0")),
        "resources.scorer.actors must be at least 1, not 0"),
    Bad("actors with no CPU", (*ATTACK, *_sets("resources.scorer.cpus=0")),
        "resources.scorer.cpus must be more than 0, not 0.0"),
    Bad("max_length 0", (*ATTACK, *_sets("model.max_length=0")),
        "model.max_length must be at least 2 tokens, not 0"),
    Bad("unknown dtype", (*ATTACK, *_sets("model.dtype=float8")),
        "model.dtype must be one of auto, float32, bfloat16, float16, not 'float8'"),
    Bad("unknown device", (*ATTACK, *_sets("model.device=tpu")),
        "model.device must be one of auto, cpu, cuda, not 'tpu'"),
    Bad("copycheck sampler batch 0", (*COPYCHECK, *_sets("uncertainty.batch_size=0")),
        "uncertainty.batch_size must be at least 1, not 0"),
    Bad("copycheck no sampler actors", (*COPYCHECK, *_sets("resources.sampler.actors=0")),
        "resources.sampler.actors must be at least 1, not 0"),
    Bad("a key of an earlier version", (*COPYCHECK, *_sets("uncertainty.train_cpus=2")),
        "config key 'uncertainty.train_cpus' is now 'resources.trainer.cpus' (one resources "
        "section per role)"),
    Bad("trainer with no CPU", (*COPYCHECK, *_sets("resources.trainer.cpus=0")),
        "resources.trainer.cpus must be more than 0, not 0.0"),
    Bad("copycheck unknown clustering", (*COPYCHECK, *_sets("detect.methods=[gmm,kmean]")),
        "detect: unknown method 'kmean'; did you mean 'kmeans'?"),
    Bad("copycheck bootstrap", (*COPYCHECK, *_sets("eval.bootstrap=-5")),
        "eval.bootstrap must be 0 (no intervals) or at least 100 resamples, not -5"),
    Bad("lumia max_length 1", (*LUMIA, *_sets("model.max_length=1")),
        "model.max_length must be at least 2 tokens, not 1"),
    Bad("lumia probe CPUs 0", (*LUMIA, *_sets("probe.cpus_per_task=0")),
        "probe.cpus_per_task must be more than 0, not 0.0"),
    Bad("memhunter hunter batch 0", (*MEMHUNTER, *_sets("hunter.batch_size=0")),
        "hunter.batch_size must be at least 1, not 0"),
    Bad("memhunter dtype", (*MEMHUNTER, *_sets("model.dtype=float8")),
        "model.dtype must be one of auto, float32, bfloat16, float16, not 'float8'"),
    Bad("leakage scanner CPUs 0", (*LEAKAGE, *_sets("scan.cpus_per_worker=0")),
        "scan.cpus_per_worker must be more than 0, not 0.0"),
    # ---- inputs checked before the model work (Ray is up)
    # The default pool (2 actors x 1 CPU) on the session's 2-CPU Ray: Ray Data's reads
    # would wait for a CPU until its no-progress timeout (30 min), seen in a bench run.
    Bad("leakage scanner pool holds every CPU", LEAKAGE,
        "scan.workers x scan.cpus_per_worker = 2 x 1 CPUs of the cluster's 2 leaves less than "
        "one CPU for Ray Data to read the shards with", ray=True),
    Bad("missing data path", (*OWN, *_sets("data.path={tmp}/absent")),
        "data path not found: {tmp}/absent", ray=True),
    Bad("empty document", OWN, "document doc0.txt is empty", ray=True,
        setup=lambda t, m: (t / "docs" / "doc0.txt").write_text("")),
    Bad("binary document", OWN, "document doc1.txt looks binary", ray=True,
        setup=lambda t, m: (t / "docs" / "doc1.txt").write_bytes(b"\x00\x01\x02PNG\x00" * 10)),
    Bad("undecodable document", OWN, "document doc2.txt is not valid UTF-8", ray=True,
        setup=lambda t, m: (t / "docs" / "doc2.txt").write_bytes(b"caf\xe9 au lait " * 5)),
    Bad("single class", OWN, "only one class", ray=True,
        setup=_rewrite_labels(lambda m: dict.fromkeys(m, 1))),
    Bad("too few documents per class", (*OWN, *_sets("data.min_docs_per_class=7")),
        "too few documents: 6 members and 6 non-members, need at least 7 per class "
        "(data.min_docs_per_class)", ray=True),
    Bad("no labels", (*OWN, *_sets("data.labels=")), "no membership labels", ray=True),
    Bad("manifest lacks documents", OWN,
        "labels manifest lacks 2 of 12 documents: doc10.txt, doc11.txt (set "
        "data.unlabelled=skip to leave unlabelled documents out)", ray=True,
        setup=_rewrite_labels(lambda m: {k: v for k, v in m.items() if k not in
                                         ("doc10.txt", "doc11.txt")})),
    Bad("id field typo", (*OWN, *_sets("data.path={tmp}/docs.jsonl", "data.id_field=uuid")),
        "id field 'uuid' (data.id_field) is not in the first record of docs.jsonl", ray=True,
        setup=_jsonl_docs),
    Bad("model folder missing", (*OWN, *_sets("model.name_or_path={tmp}/no-such-model")),
        "model '{tmp}/no-such-model' does not load: no such local folder", ray=True),
    Bad("model folder without tokenizer", (*OWN, *_sets("model.name_or_path={tmp}/model")),
        "model.name_or_path: model '{tmp}/model' has no usable tokenizer", ray=True,
        setup=_no_tokenizer),
    Bad("offline hub name", (*OWN, *_sets("model.name_or_path=gpt2")),
        "model.name_or_path: model 'gpt2' is not a local folder and the Hugging Face hub "
        "cannot be reached (offline mode: HF_HUB_OFFLINE=1)", ray=True,
        env=(("HF_HUB_OFFLINE", "1"),)),
    Bad("weights cut short", (*OWN, *_sets("model.name_or_path={tmp}/model")),
        "model.name_or_path: weights file model.safetensors of '{tmp}/model' is cut short: "
        "1000 bytes", ray=True, setup=_broken_weights),
    Bad("reference tokenizer past its embeddings", (*OWN, *_sets("model.reference={tmp}/ref",
        "attack.attacks=[loss,ref]")),
        "model.reference: '{tmp}/ref' has a tokenizer of {ref_tokens} tokens but an embedding "
        "matrix of {ref_rows} rows", ray=True, setup=_tokenizer_past_embeddings),
    # ---- leakage shards that do not decompress
    Bad("leakage: truncated .warc.wet.gz shard", (*SCAN, *_sets("crawl.shards=[{tmp}/CC-0.warc.wet.gz]")),
        "file CC-0.warc.wet.gz cannot be read to its end (a truncated or corrupt gzip file?): "
        "Truncated compressed stream", ray=True, setup=_wet_cut),
    Bad("leakage: truncated .jsonl.zst shard", (*SCAN, *_sets("crawl.shards=[{tmp}/part-0.jsonl.zst]")),
        "file part-0.jsonl.zst cannot be read to its end (a truncated or corrupt zstd file?): "
        "Truncated compressed stream", ray=True, setup=_cut("part-0.jsonl.zst", _zstd)),
    Bad("leakage: garbage .warc.wet.gz in a shard folder", (*SCAN, *_sets("crawl.shards=[{tmp}/crawl]")),
        "file CC-1.warc.wet.gz of shard crawl cannot be read to its end (a truncated or corrupt "
        "gzip file?): zlib inflate failed: incorrect header check", ray=True,
        setup=_wet_garbage_in_a_folder),
    Bad("leakage: .wet shard that is not WARC", (*SCAN, *_sets("crawl.shards=[{tmp}/page.wet]")),
        "file page.wet cannot be read to its end (a truncated or corrupt file?): Invalid WARC "
        "header", ray=True,
        setup=lambda t, m: (t / "page.wet").write_text("<html><body>a saved page</body></html>\n" * 20)),
    # ---- a rerun that fails leaves no report of another config beside its config.yaml
    Bad("failed rerun over an old report", OWN, "document doc1.txt looks binary", ray=True,
        setup=_old_report_and_binary_doc, check=_old_report_set_aside),
    # ---- round 4: secrets, one run per folder, bad files named, tests that can reject
    Bad("credentials in an s3 path", (*AUDIT, "--suspected",
        f"s3://{KEY_ID}:{SECRET}@bucket/docs/?endpoint_override=127.0.0.1:9&bogus=1"),
        "--suspected (s3://***@bucket/docs/?endpoint_override=127.0.0.1:9&bogus=1): cannot "
        "read s3://***@bucket/docs/", ray=True, hidden=(KEY_ID, SECRET), check=_no_secret_left),
    Bad("credentials in an s3 query", (*AUDIT, "--suspected",
        f"s3://bucket/docs/?access_key={KEY_ID}&secret_key={SECRET}&bogus=1"),
        "cannot read s3://bucket/docs/?access_key=***&secret_key=***&bogus=1", ray=True,
        hidden=(KEY_ID, SECRET), check=_no_secret_left),
    Bad("an API key in base_url's user info", (*OWN, *_sets(
        "attack.attacks=[loss,samia]", "attack.samia.samples=2", "attack.samia.max_tokens=4",
        "attack.samia.backend.kind=openai", "attack.samia.backend.max_retries=1",
        f"attack.samia.backend.base_url=http://user:{API_KEY}@127.0.0.1:9/v1")),
        # parsed right: the host is 127.0.0.1 (refused), not a DNS name with the key in it
        "POST http://127.0.0.1:9/v1/completions failed after 1 attempts: could not reach the "
        "server", ray=True, error_log=True, hidden=(API_KEY,), check=_no_secret_left),
    Bad("a second run into a folder in use", LEAKAGE,
        "is in use by another mia-ray run (pid 4242, started 2026-12-06 17:00:00); wait for it "
        "to end or give another --out", setup=_run_holding_the_folder,
        check=_folder_untouched_then_released),
    Bad("permutations that can never reject", (*AUDIT, "--suspected", "{docs}",
        *_sets("audit.permutations=1")),
        "audit.permutations = 1 cannot reject at level 0.05: the smallest p-value it can give "
        "is 1/(1 + 1) = 0.5; give at least 19"),
    Bad("permutations at a stricter level", (*AUDIT, "--suspected", "{docs}",
        *_sets("audit.permutations=50", "audit.alpha=0.01")),
        "audit.permutations = 50 cannot reject at level 0.01: the smallest p-value it can give "
        "is 1/(50 + 1) = 0.0196; give at least 99"),
    Bad("ten million permutations", (*AUDIT, "--suspected", "{docs}",
        *_sets("audit.permutations=10000000")),
        "audit.permutations = 10000000 is more than 100000"),
    Bad("dc_pdd corpus missing", (*OWN, *_sets("attack.attacks=[loss,dc_pdd]",
        "attack.dc_pdd.corpus={tmp}/no-corpus.jsonl")),
        "data path not found: {tmp}/no-corpus.jsonl (attack.dc_pdd.corpus)"),
    Bad("leakage shard missing", ("leakage", *_sets("crawl.shards=[{docs},{tmp}/gone.jsonl]")),
        "data path not found: {tmp}/gone.jsonl (crawl.shards[1])"),
    Bad("audit input missing", (*AUDIT, "--suspected", "{tmp}/absent"),
        "data path not found: {tmp}/absent (audit.suspected)"),
    Bad("samia samples longer than the window", (*OWN, *_sets(
        "attack.attacks=[loss,samia]", "attack.samia.max_tokens=400", "model.max_length=512")),
        "attack.samia.max_tokens = 400 does not fit the target's window of 128 tokens", ray=True),
    Bad("truncated .jsonl.gz", (*AUDIT, "--suspected", "{tmp}/sus.jsonl.gz"),
        "file sus.jsonl.gz cannot be read to its end (a truncated or corrupt gzip file?)",
        ray=True, setup=_cut("sus.jsonl.gz", _gzip)),
    Bad("truncated .jsonl.zst", (*AUDIT, "--suspected", "{tmp}/sus.jsonl.zst"),
        "file sus.jsonl.zst cannot be read to its end (a truncated or corrupt zstd file?)",
        ray=True, setup=_cut("sus.jsonl.zst", _zstd)),
    Bad("a tab in a file name", OWN,
        "file name 'doc\\t12.txt' (in {docs}) holds a tab, which Ray Data's path handling drops, "
        "so the file could not be found: rename it", ray=True,
        setup=lambda t, m: (t / "docs" / "doc\t12.txt").write_text("a document " * 30)),
    Bad(".jsonl.gz truncated past its first 8 MB", (*AUDIT, "--suspected", "{tmp}/sus.jsonl.gz"),
        "file sus.jsonl.gz cannot be read to its end (a truncated or corrupt gzip file?)",
        ray=True, setup=_cut("sus.jsonl.gz", _gzip, 60_000)),
]  # fmt: skip


def _docs(tmp: Path) -> None:
    d = tmp / "docs"
    d.mkdir()
    labels = {}
    for i in range(12):
        (d / f"doc{i}.txt").write_text(f"document number {i} says " + "words and more words " * 20)
        labels[f"doc{i}.txt"] = int(i < 6)
    (tmp / "labels.json").write_text(json.dumps(labels))


@pytest.fixture
def model(request) -> Path | None:
    """The test world's tiny target for Ray rows (and the session's Ray); None for the rest,
    which must not need Ray."""
    if not request.node.callspec.params["row"].ray:
        return None
    request.getfixturevalue("ray_local")
    return Path(request.getfixturevalue("test_world")["model"])


@pytest.mark.parametrize(
    "row",
    [pytest.param(r, id=r.name, marks=[pytest.mark.ray] if r.ray else []) for r in ROWS],
)
def test_bad_input(row: Bad, model, tmp_path, capsys, monkeypatch):
    for key, value in row.env:
        monkeypatch.setenv(key, value)
    _docs(tmp_path)
    if row.setup:
        row.setup(tmp_path, model)
    out = tmp_path / "out"
    fill = {
        "out": str(out),
        "tmp": str(tmp_path),
        "docs": str(tmp_path / "docs"),
        "labels": str(tmp_path / "labels.json"),
        "model": str(model),
    }
    if (tmp_path / "ref").is_dir():
        from transformers import AutoConfig, AutoTokenizer

        fill["ref_tokens"] = str(len(AutoTokenizer.from_pretrained(tmp_path / "ref")))
        fill["ref_rows"] = str(AutoConfig.from_pretrained(tmp_path / "ref").vocab_size)
    argv = [a.format(**fill) for a in row.argv] + ["--out", str(out)]
    existed = out.exists()

    code = main(argv)

    captured = capsys.readouterr()
    err = captured.err
    assert code == row.code, err
    for secret in row.hidden:
        assert secret not in err + captured.out, secret
    head = "mia-ray: error: " if row.code == 2 else "mia-ray: failed: "
    lines = [
        line for line in err.splitlines() if line.startswith(("mia-ray: error", "mia-ray: failed"))
    ]
    assert len(lines) == 1 and lines[0].startswith(head), err
    assert row.message.format(**fill) in lines[0], err
    assert "Traceback" not in err, err
    if row.error_log:
        log = (out / "error.log").read_text()
        assert "Traceback" in log and f"traceback in {out / 'error.log'}" in lines[0]
    elif out.exists():
        assert not (out / "error.log").exists()
    if not row.ray and not existed:
        assert not out.exists(), "a config error must stop before --out is created"
    if row.check:
        row.check(out)
    if row.ray:
        _every_cpu_free_again()


def _every_cpu_free_again(wait_s: float = 30) -> None:
    """A failed run holds no CPU of the session's Ray (its actors are gone): the next run in
    this process (a test, a notebook cell) must not wait for them forever."""
    import time

    import ray

    total = ray.cluster_resources().get("CPU", 0)
    t0 = time.monotonic()
    while ray.available_resources().get("CPU", 0) < total and time.monotonic() - t0 < wait_s:
        time.sleep(0.5)
    assert ray.available_resources().get("CPU", 0) == total, ray.available_resources()
