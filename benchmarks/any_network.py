"""Each seed method and the baselines the papers compare against, through NVFlare's real simulator, on networks none of
them was written for: MONAI's SegResNet on the built-in 3-D prostate volumes, MONAI's AttentionUnet on the 2-D prostate
slices and MONAI's DenseNet121 on the 2-D skin images (the classification methods' data).

    python benchmarks/any_network.py --out benchmarks/results/any_network

Every run is `fairfl run JOB -n 3 -t 3 --set ...` with tiny settings (two rounds, small data): it shows that each
method trains and scores every site on that network and data, not how well (twenty rounds on the default data are the
other benchmarks'). A method that cannot run on a task refuses at the start with its reason, recorded as such (FedNPR
needs classes: it refuses a segmentation task). Resumable: a finished run's results.json is kept and not rerun.
Writes `<out>/<task>/<job>.results.json`, `.report.md` and `.log` (the command and its output), the workspaces under
`<out>/runs/` (not committed), and `<out>/SUMMARY.json` (per run: the final mean and worst site of the task's metric,
HD95 and surface Dice per site on volumes, seconds, or the refusal)."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from fairfl.benchmark.runner import versions

SEGRESNET = {"init_filters": 8, "norm": ["group", {"num_groups": 4}], "blocks_down": [1, 2, 2], "blocks_up": [1, 1]}
TASKS = {
    "volumes_segresnet": {
        "jobs": ["fedavg", "fedlwr", "fedce", "fedism_plus", "ditto", "fedfloor", "fednpr", "fednpr_per"],
        "set": {
            "dataset": "prostate3d",
            "model": "SegResNet",
            "model_args": SEGRESNET,
            "image_size": 32,
            "patch_size": [32, 32, 16],
            "batch_size": 2,
            "synthetic_size_scale": 0.5,
        },
    },
    "slices_attentionunet": {
        "jobs": ["fedavg", "fedlwr", "fedce", "ditto", "fedfloor"],
        "set": {
            "dataset": "prostate",
            "model": "AttentionUnet",
            "model_args": {"channels": [8, 16, 32], "strides": [2, 2]},
            "image_size": 32,
            "synthetic_size_scale": 0.5,
        },
    },
    "images_densenet": {
        "jobs": ["fedism_plus", "fednpr", "fednpr_per", "fedavg"],
        "set": {
            "dataset": "skin_imbalanced",
            "model": "DenseNet121",
            "model_args": {"init_features": 16, "growth_rate": 8, "block_config": [2, 2, 2]},
            "image_size": 32,
            "synthetic_size_scale": 0.5,
        },
    },
}
COMMON = {"num_rounds": 2, "eval_every": 1}


def run_one(task: str, job: str, out: Path) -> dict:
    """One `fairfl run` (kept when its results exist); its outcome for the summary."""
    workspace = out / "runs" / task / job  # the simulator's workspace (not committed: models, logs)
    results = workspace / "server" / "simulate_job" / "results.json"
    log = out / task / f"{job}.log"
    if not results.exists() and not log.exists():
        settings = {**COMMON, **TASKS[task]["set"]}
        if job == "fedlwr":
            settings["cka_max_samples"] = 16
        command = [sys.executable, "-m", "fairfl.cli", "run", f"jobs/{job}", "-w", str(workspace), "-n", "3", "-t", "3"]
        command += ["--force", "--quiet"]
        for key, value in settings.items():
            command += ["--set", f"{key}={json.dumps(value)}"]
        log.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        log.write_text(
            f"$ {' '.join(command)}\nexit {done.returncode} after {time.perf_counter() - started:.0f} s\n"
            + done.stdout
            + done.stderr
        )
    if not results.exists():
        lines = log.read_text().splitlines()
        # the server's own reason (a ValueError of the controller's constructor), else the first line naming an error
        reason = next((line for line in lines if line.startswith("ValueError: ")), None) or next(
            (line for line in lines if "error" in line.lower()), lines[-1]
        )
        return {"task": task, "job": job, "refused": reason.strip()[:400]}
    for name, source in (("results.json", results), ("report.md", workspace / "report" / "report.md")):
        if source.exists():  # what is committed of the run
            shutil.copyfile(source, out / task / f"{job}.{name}")
    data = json.loads(results.read_text())
    final = data.get("final") or {}
    per_site = final.get("per_site") or {}
    surface = {site: {k: round(v[k], 3) for k in ("hd95", "surface_dice") if k in v} for site, v in per_site.items()}
    return {
        "task": task,
        "job": job,
        "method": data["method"],
        "metric": data["metric"],
        "mean": final.get("mean"),
        "worst": final.get("worst"),
        "worst_site": final.get("worst_site"),
        "seconds": round(sum(r.get("seconds", 0) for r in data["rounds"]), 1),
        **({"surface": surface} if any(surface.values()) else {}),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/any_network")
    parser.add_argument("--tasks", nargs="*", choices=sorted(TASKS), default=sorted(TASKS))
    args = parser.parse_args(argv)
    out = Path(args.out)
    rows = [run_one(task, job, out) for task in args.tasks for job in TASKS[task]["jobs"]]
    summary = {
        "command": " ".join(["python", "benchmarks/any_network.py", *sys.argv[1:]]),
        "versions": versions(),
        "runs": rows,
    }
    (out / "SUMMARY.json").write_text(json.dumps(summary, indent=1) + "\n")
    for row in rows:
        outcome = row.get("refused") or f"{row['metric']} mean {row['mean']:.3f}, worst {row['worst_site']}"
        print(f"{row['task']:22s} {row['job']:12s} {outcome}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
