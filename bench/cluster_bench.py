"""Multi-node: the 12 CopyCheck fine-tunes, and a scoring pass, on two worker nodes vs one.

Runs on the local 3-node cluster of the test suite (tests/cluster/conftest.py: a head and two
workers started with `ray start`, each worker in its own mount namespace whose disks hide
the driver's run, home and data folders; storage is a folder every node sees). Each pair is
measured side by side in one run, on the same cluster, through the CLI a user runs:

  one node:  every model actor / trial asks for the custom resource `worker_0` (on worker 0 only)
  two nodes: every model actor / trial asks for `mia_worker` (on both workers)

Fine-tuning: `mia-ray copycheck` with the 12 members of one experiment (MC dropout, BLoB and a
10-member ensemble) as Ray Tune trials; the time is that of the fine-tuning stage (from the
run's log). Scoring: `mia-ray attack` with 2 Scorer actors; the time is that of the scoring
pass (the log's final row count line). Both runs of a pair give the same report numbers
(checked here). On one machine the nodes share its cores: see the section's note.

    python bench/cluster_bench.py --out BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import shutil
import sys
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _markdown import update_section  # noqa: E402

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

PLACEMENTS = {
    "one node": "{worker_0: 1}",
    "two nodes": "{mia_worker: 1}",
}
COPYCHECK = [
    "experiment.n_suspected=10",
    "experiment.n_unseen=8",
    "experiment.n_unseen_in_suspected=[4]",
    "uncertainty.samplers=[mcd,blob,ensemble]",
    "uncertainty.ensemble_size=10",
    "uncertainty.n_samples=4",
    "resources.trainer.cpus=1",
    "detect.baselines=[]",
    "data.snippet_size=48",
    "data.max_snippets_per_doc=2",
    "finetune.max_length=128",
]
ATTACK = ["resources.scorer.actors=2", "resources.scorer.cpus=1", "model.batch_size=2"]


def _load_cluster_module():
    spec = importlib.util.spec_from_file_location(
        "mia_cluster", REPO / "tests" / "cluster" / "conftest.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _stamp(line: str) -> float:
    h, m, s = (int(x) for x in re.search(r"\[mia-ray (\d\d):(\d\d):(\d\d)\]", line).groups())
    return h * 3600 + m * 60 + s


def _finetune_seconds(log: str) -> float:
    lines = log.splitlines()
    start = next(i for i, ln in enumerate(lines) if "as Ray Tune trials" in ln)
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("[mia-ray "))
    return _stamp(lines[end]) - _stamp(lines[start])


def _scoring_seconds(log: str) -> tuple[float, int]:
    m = re.findall(r"(\d+)/(\d+) rows in (\d+) s", log)
    rows, _, took = m[-1]
    return float(took), int(rows)


def _run(cluster, args: list[str], timeout: float) -> tuple[str, dict, float]:
    t0 = time.time()
    r = cluster.run_driver(args, timeout=timeout)
    wall = time.time() - t0
    if r.returncode != 0:
        raise SystemExit(f"run failed ({r.returncode}):\n{r.stderr[-3000:]}")
    out = Path(args[args.index("--out") + 1])
    return r.stderr, json.loads((out / "report.json").read_text()), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", default="test", choices=["test", "demo"])
    ap.add_argument("--out", default="", help="a BENCHMARKS.md to update with this section")
    args = ap.parse_args()

    mod = _load_cluster_module()
    if not mod.can_unshare():
        raise SystemExit("needs root and unshare -m (private mount namespaces)")
    from mia_ray.config import WorldConfig
    from mia_ray.demo.world import ensure_world

    cluster = mod.start_cluster()
    try:
        world = cluster.data / "world"
        t0 = time.time()
        ensure_world(
            WorldConfig(root=str(world), scale=args.scale, seed=0, target="tiny"), ["tiny"]
        )
        print(f"world built in {time.time() - t0:.0f} s", file=sys.stderr)
        rows = []
        for name, custom in PLACEMENTS.items():
            tag = name.replace(" ", "-")
            common = ["--set", f"world.root={world}", "--set", f"world.scale={args.scale}"]
            common += ["--set", f"resources.custom_resources={custom}"]
            cc = ["copycheck", "--config", "jobs/copycheck_demo.yaml", *common]
            for s in COPYCHECK:
                cc += ["--set", s]
            cc += ["--set", f"resources.storage={cluster.shared / ('cc-' + tag)}"]
            cc += ["--out", str(cluster.runs / f"cc-{tag}")]
            log, report, wall = _run(cluster, cc, timeout=3600)
            ft = _finetune_seconds(log)
            at = ["attack", "--config", "jobs/attack_demo.yaml", *common]
            for s in ATTACK:
                at += ["--set", s]
            at += ["--set", f"resources.storage={cluster.shared / ('at-' + tag)}"]
            at += ["--out", str(cluster.runs / f"at-{tag}")]
            alog, areport, awall = _run(cluster, at, timeout=3600)
            score_s, n_rows = _scoring_seconds(alog)
            rows.append(
                {
                    "placement": name,
                    "finetune_s": ft,
                    "copycheck_wall_s": wall,
                    "members": len(report["finetune"]["records"]),
                    "cc_results": report["results"],
                    "scoring_s": score_s,
                    "rows": n_rows,
                    "attack_wall_s": awall,
                    "attack_results": areport["metrics"],
                }
            )
            print(json.dumps({k: v for k, v in rows[-1].items() if "results" not in k}),
                  file=sys.stderr)  # fmt: skip
    finally:
        cluster.shutdown()
        shutil.rmtree(cluster.base, ignore_errors=True)

    one, two = rows
    same_cc = one["cc_results"] == two["cc_results"]
    same_attack = one["attack_results"] == two["attack_results"]
    import torch

    lines = [
        f"Command: `python bench/cluster_bench.py --scale {args.scale} --out BENCHMARKS.md`",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{datetime.now():%Y-%m-%d}; the suite's local cluster: a head and two worker nodes "
        "(`ray start`, 2 logical CPUs each), each worker in its own mount namespace that hides "
        "the driver's disks, storage a folder every node sees; demo world `tiny` at scale "
        f"`{args.scale}`. *One node*: every trial and actor asks for `worker_0`; *two nodes*: "
        "for `mia_worker`, which both workers have.",
        "",
        "| | one node | two nodes | one / two |",
        "|---|---|---|---|",
        f"| CopyCheck: fine-tuning {one['members']} members as Tune trials (s) | "
        f"{one['finetune_s']:.0f} | {two['finetune_s']:.0f} | "
        f"**{one['finetune_s'] / max(two['finetune_s'], 1):.2f}×** |",
        f"| CopyCheck: whole run (s) | {one['copycheck_wall_s']:.0f} | "
        f"{two['copycheck_wall_s']:.0f} | {one['copycheck_wall_s'] / two['copycheck_wall_s']:.2f}× |",
        f"| attack: scoring {one['rows']} snippets with 2 Scorer actors (s) | "
        f"{one['scoring_s']:.0f} | {two['scoring_s']:.0f} | "
        f"**{one['scoring_s'] / max(two['scoring_s'], 1):.2f}×** |",
        f"| attack: whole run (s) | {one['attack_wall_s']:.0f} | {two['attack_wall_s']:.0f} | "
        f"{one['attack_wall_s'] / two['attack_wall_s']:.2f}× |",
        "",
        f"Same report numbers on one node and on two: CopyCheck {'yes' if same_cc else 'NO'}, "
        f"attack {'yes' if same_attack else 'NO'}.",
        "",
        f"All three nodes share this machine's {os.cpu_count()} cores, so two worker nodes "
        "bring no compute that one does not have: the ratios measure what spreading costs "
        "(staging the model once to storage, a second node's model loads, scheduling across "
        "raylets), not the speed-up of a real cluster. On GPU nodes each added node brings its "
        "own GPUs: the 12 fine-tunes are independent trials and the scoring actors share "
        "nothing but their input blocks, so both scale with the GPU count until the trials "
        "run out (12 per experiment) or the driver's reading and the object store become the "
        "limit; the fixed costs above (one staging upload per model, one model load per "
        "actor) are paid once per node and shrink as the work per node grows.",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        heading = "## Multi-node: CopyCheck fine-tunes and scoring on two worker nodes vs one"
        update_section(Path(args.out), heading + "\n\n" + text)


if __name__ == "__main__":
    main()
