"""The Python API: every pipeline as a function that runs it as ``mia-ray <pipeline>`` does and
returns a :class:`Result`. The CLI is a thin caller of :func:`run_job`, so a notebook and the
command line get the same numbers from the same code.

    import mia_ray
    r = mia_ray.audit(model="EleutherAI/pythia-160m", suspected="my_files/", unseen="later_files/")
    print(r.verdict, r.p_value)
    r.files  # per-file verdicts (a DataFrame)

Keyword arguments are the pipeline's own flags (``mia-ray audit --help``: ``model``,
``suspected``, ``unseen``, ``reference``, ``group_by``); ``config`` a YAML job file;
``settings`` a dict of the same dotted keys as ``--set`` (``{"audit.permutations": 199}``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from mia_ray.errors import MiaError

# Where a run's p-value sits in each report that has one (audit, verify, contamination).
_P_VALUE_AT = ("dataset_test", "combined_test", "test")


@dataclass
class Result:
    """One finished run: its report (the numbers of ``report.json``), its folder and its
    tables. ``files`` and ``snippets`` are read from the run folder when first used."""

    pipeline: str
    out: Path
    report: dict[str, Any]
    seconds: float
    mode: str  # the Ray it ran on: local, cluster, job or attached
    config: Any = field(repr=False, default=None)  # the job config as it ran

    @property
    def verdict(self) -> str | None:
        """The report's verdict in words (audit, verify, contamination), else None."""
        v = self.report.get("verdict")
        return v.get("text") if isinstance(v, dict) else v

    @property
    def p_value(self) -> float | None:
        """The dataset-level p-value (audit, verify, contamination), else None."""
        for key in _P_VALUE_AT:
            section = self.report.get(key)
            if isinstance(section, dict) and "p_value" in section:
                return section["p_value"]
        return None

    @property
    def html(self) -> Path | None:
        page = self.out / "report.html"
        return page if page.exists() else None

    @cached_property
    def tables(self) -> dict[str, Any]:
        """Every table at the top of the run folder, by name (``files``, ``snippet_scores``,
        ``document_scores``, ...), as pandas DataFrames."""
        import pandas as pd

        return {p.stem: pd.read_parquet(p) for p in sorted(self.out.glob("*.parquet"))}

    @property
    def files(self):
        """Per-file (or per-document) rows: the audit's verdicts, the attacks' document
        scores; else the report's ``files`` list as a DataFrame; None if the run has none."""
        import pandas as pd

        for name in ("files", "document_scores"):
            if name in self.tables:
                return self.tables[name]
        rows = self.report.get("files")
        return pd.DataFrame(rows) if isinstance(rows, list) else None

    @property
    def snippets(self):
        """Per-snippet scores (``snippet_scores.parquet``), or None."""
        return self.tables.get("snippet_scores")

    def _repr_html_(self) -> str:  # a notebook shows the verdict, not a dict dump
        from html import escape

        lines = [f"<b>mia-ray {escape(self.pipeline)}</b>: {self.seconds:.0f} s, {self.out}"]
        if self.verdict:
            lines.append(escape(self.verdict))
        return "<br>".join(lines)


def build_config(
    pipeline: str,
    config: str | os.PathLike | None = None,
    settings: dict[str, Any] | None = None,
    flags: dict[str, Any] | None = None,
) -> Any:
    """``pipeline``'s job config: its defaults, then the YAML ``config``, then ``settings``
    (dotted keys), then ``flags`` (the pipeline's own flags by name, ``group_by`` for
    ``--group-by``), validated. An unknown flag or key fails naming what is known."""
    from mia_ray import registry
    from mia_ray.config import load_config

    spec = registry.get("pipeline", pipeline)
    by_name = {flag.replace("-", "_"): key for flag, key, _ in spec.flags}
    overrides = [f"{k}={json.dumps(v)}" for k, v in (settings or {}).items()]
    for name, value in (flags or {}).items():
        name = name.rstrip("_")  # in_ for --in, a Python keyword
        if name not in by_name:
            known = ", ".join(sorted(by_name)) or "none; use settings"
            raise MiaError(f"{pipeline}: unknown argument {name!r} (its flags: {known})")
        if value is not None:
            # A path goes in as a string, whatever characters it holds.
            overrides.append(f"{by_name[name]}={json.dumps(str(value))}")
    return load_config(spec.config_cls, str(config) if config else None, overrides)


def run(
    pipeline: str,
    out: str | os.PathLike | None = None,
    config: str | os.PathLike | None = None,
    settings: dict[str, Any] | None = None,
    address: str | None = None,
    **flags: Any,
) -> Result:
    """Run ``pipeline`` (any ``mia-ray`` verb) into ``out`` (default: a new folder
    ``mia-ray-runs/<pipeline>-<time>`` here) and return its :class:`Result`. Ray starts
    locally unless ``address`` (or ``settings["resources.address"]``) names a cluster."""
    from mia_ray import redact
    from mia_ray.config import check_inputs_exist, dump_yaml

    cfg = build_config(pipeline, config, settings, flags)
    if address is not None and hasattr(cfg, "resources"):
        cfg.resources.address = address
    redact.remember([dump_yaml(cfg, pipeline)], env=False)
    check_inputs_exist(getattr(cfg, "input_paths", dict)())
    if out is None:
        out = Path("mia-ray-runs") / f"{pipeline}-{time.strftime('%Y%m%d-%H%M%S')}"
    return run_job(pipeline, cfg, out)


def run_job(pipeline: str, cfg: Any, out: str | os.PathLike) -> Result:
    """Run a built job config into ``out``, holding the folder while it runs (the CLI's path
    and :func:`run`'s): the last run's outputs go to ``out/previous``, Ray starts or attaches,
    the run's storage opens, the pipeline resolves and runs, the report is written."""
    from mia_ray import registry

    out = Path(out).expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise MiaError(f"--out {out} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    spec = registry.get("pipeline", pipeline)
    with _run_folder_lock(out):
        return _run_locked(spec, cfg, out)


def _run_locked(spec, cfg, out: Path) -> Result:
    from mia_ray import storage
    from mia_ray.config import check_inputs_exist, dump_yaml
    from mia_ray.reports.io import write_json, write_text
    from mia_ray.runtime import configure_data_context, connect

    _set_aside_last_report(out)
    write_text(out / "config.yaml", dump_yaml(cfg, spec.name))
    res = getattr(cfg, "resources", None)
    mode = connect(res.address if res else "", res.num_cpus if res else 0, hide_known_noise=True)
    configure_data_context(res.no_progress_timeout_s if res else 0.0, progress=sys.stderr.isatty())
    t0 = time.time()
    ws = storage.open_workspace(out, res.storage if res else "", mode)
    storage.set_current(ws)
    try:
        # Resolved once, here: the demo world fills in its paths; then the job's checks run
        # on the config as it will run, and the pipeline never resolves again.
        if spec.resolve is not None:
            cfg = spec.resolve(cfg)
            write_text(out / "config.yaml", dump_yaml(cfg, spec.name))
        if hasattr(cfg, "check_complete"):
            cfg.check_complete()
            check_inputs_exist(cfg.input_paths())
        report = spec.run(cfg, out)
    finally:
        # Whatever finished (or failed half-way) is kept where a new driver finds it.
        ws.push()
        storage.set_current(None)
    if not (out / "report.json").exists():
        write_json(out / "report.json", report)
    return Result(spec.name, out, report, time.time() - t0, mode, cfg)


@contextlib.contextmanager
def _run_folder_lock(out: Path):
    """Hold ``out/.mia-ray.lock`` while the run lasts, or refuse: two runs in one folder
    would mix their config, reports and manifest. An exclusive ``flock`` dies with its
    process, so a killed run never leaves a stale lock behind."""
    import fcntl

    from mia_ray.storage import RUN_LOCK

    with open(out / RUN_LOCK, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise MiaError(
                f"--out {out} is in use by another mia-ray run ({holder}); wait for it to end "
                "or give another --out"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        f.flush()
        yield  # the lock goes with the file's close


def _set_aside_last_report(out: Path) -> None:
    """Move the last run's outputs to ``out/previous/``: its report, its config, its manifest
    and every other file at the top of ``out`` (score tables and the like), so that a run
    folder never mixes two runs. Stage folders stay: the stage layer reuses them by key."""
    (out / "error.log").unlink(missing_ok=True)  # it told of a run that is over
    old = sorted(p for p in out.iterdir() if p.is_file() and not p.name.startswith("."))
    if not old:
        return
    prev = out / "previous"
    if prev.exists():
        shutil.rmtree(prev)
    prev.mkdir()
    for path in old:
        os.replace(path, prev / path.name)
    print(f"mia-ray: the last run's report is now in {prev}", file=sys.stderr)


def audit(
    model: str | None = None,
    suspected: str | os.PathLike | None = None,
    unseen: str | os.PathLike | None = None,
    reference: str | None = None,
    out: str | os.PathLike | None = None,
    config: str | os.PathLike | None = None,
    settings: dict[str, Any] | None = None,
    address: str | None = None,
    group_by: str | None = None,
) -> Result:
    """Did ``model`` train on the ``suspected`` files? A dataset-level p-value against the
    ``unseen`` files (ones it surely never saw) and per-file verdicts under false-discovery
    control; ``reference`` (a model that never saw either) checks the premise. ``config``,
    ``settings``, ``out`` and ``address`` as in :func:`run`."""
    return run("audit", out, config, settings, address, model=model, suspected=suspected,
               unseen=unseen, reference=reference, group_by=group_by)  # fmt: skip


def _verb(name: str):
    def call(out=None, config=None, settings=None, address=None, **flags) -> Result:
        return run(name, out, config, settings, address, **flags)

    call.__name__ = call.__qualname__ = name.replace("-", "_")
    call.__doc__ = (
        f"``mia-ray {name}`` as a function: keyword arguments are its flags; ``out``, "
        "``config``, ``settings`` and ``address`` as in :func:`mia_ray.api.run`."
    )
    return call


attack = _verb("attack")
copycheck = _verb("copycheck")
lumia = _verb("lumia")
memhunter = _verb("memhunter")
leakage = _verb("leakage")
mark = _verb("mark")
verify = _verb("verify")
contamination = _verb("contamination")
demo = _verb("demo")
