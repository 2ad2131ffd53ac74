"""The summary of `bash benchmarks/gpu_round.sh`: per run, each round against its slowest site's training and the GPU's
utilisation while it ran.

    python benchmarks/gpu_round.py benchmarks/results/gpu_round     # writes SUMMARY.md and summary.json there

Per run (NAME_results.json): the rounds it finished; medians over the rounds that neither start the sites (round 0)
nor evaluate, of the round's seconds, its phases (the train task; the server's step, which holds Fed-LWR's CKA task)
and the slowest site's `train_seconds` (its local training alone); the round over that training (the issue's target:
at most 1.5). The GPU: nvidia-smi's utilisation (the share of each 200 ms sample in which a kernel ran) and memory,
over the samples between the run's start and end marks (marks.txt), start-up included."""

from __future__ import annotations

import json
import statistics
import sys
from datetime import datetime
from pathlib import Path

TARGET = 1.5  # a round at most 1.5x its slowest site's training (issue 33)
TIME_FORMAT = "%Y/%m/%d %H:%M:%S.%f"


def median(values) -> float | None:
    values = [v for v in values if isinstance(v, (int, float))]
    return round(statistics.median(values), 3) if values else None


def round_figures(results: dict) -> dict:
    """Medians over the rounds after the first that did not evaluate: round, train task, server step, slowest site's
    training, and the round over that training."""
    rounds = [r for r in results.get("rounds", [])[1:] if not r.get("per_site") and not r.get("stopped")]
    slowest = [max((m.get("train_seconds", 0.0) for m in r.get("train", {}).values()), default=None) for r in rounds]
    figures = {
        "rounds_finished": len(results.get("rounds", [])),
        "rounds_counted": len(rounds),
        "round": median(r.get("seconds") for r in rounds),
        "train_task": median(r.get("phases", {}).get("train_task") for r in rounds),
        "server_step": median(r.get("phases", {}).get("server_step") for r in rounds),
        "slowest_site_training": median(slowest),
    }
    ratios = [r["seconds"] / s for r, s in zip(rounds, slowest, strict=True) if s]
    figures["round_over_training"] = median(ratios)
    return figures


def read_marks(path: Path) -> dict:
    """{run: (start, end)} from marks.txt lines "DATE TIME start|end NAME"."""
    spans: dict = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        parts = line.split()
        if len(parts) != 4 or parts[2] not in ("start", "end"):
            continue
        moment = datetime.strptime(f"{parts[0]} {parts[1]}", TIME_FORMAT)
        spans.setdefault(parts[3], {})[parts[2]] = moment
    return {name: (s["start"], s["end"]) for name, s in spans.items() if "start" in s and "end" in s}


def read_utilisation(path: Path) -> list[tuple[datetime, float, float]]:
    """[(time, utilisation %, memory MiB)] of nvidia-smi's samples; lines it could not read are skipped."""
    samples = []
    for line in path.read_text().splitlines() if path.exists() else []:
        parts = [p.strip() for p in line.split(",")]
        try:
            samples.append((datetime.strptime(parts[0], TIME_FORMAT), float(parts[1]), float(parts[2])))
        except (ValueError, IndexError):
            continue
    return samples


def gpu_figures(samples, span) -> dict:
    inside = [(u, m) for t, u, m in samples if span and span[0] <= t <= span[1]]
    if not inside:
        return {"samples": 0}
    return {
        "samples": len(inside),
        "utilisation_mean": round(statistics.fmean(u for u, _ in inside), 1),
        "utilisation_median": median(u for u, _ in inside),
        "busy_share": round(sum(1 for u, _ in inside if u > 0) / len(inside), 3),
        "memory_peak_mib": max(m for _, m in inside),
    }


def summarize(folder: Path) -> tuple[dict, str]:
    marks, samples = read_marks(folder / "marks.txt"), read_utilisation(folder / "utilization.csv")
    runs = {}
    for path in sorted(folder.glob("*_results.json")):
        name = path.name[: -len("_results.json")]
        runs[name] = {**round_figures(json.loads(path.read_text())), "gpu": gpu_figures(samples, marks.get(name))}
    device = (folder / "gpu.txt").read_text().strip().splitlines()[-1] if (folder / "gpu.txt").exists() else "no GPU"
    lines = [
        "# Rounds on GPU sites",
        "",
        f"`bash benchmarks/gpu_round.sh`, then `python benchmarks/gpu_round.py {folder}`. Device: {device}.",
        "",
        "## Each run",
        "",
        "Seconds, medians over the rounds after the first that did not evaluate; round / training: the median of each "
        f"round over its slowest site's local training (target at most {TARGET}). GPU: nvidia-smi's utilisation "
        "(share of each 200 ms sample with a kernel running), over the whole run, start-up included.",
        "",
        "| run | rounds (counted) | round | train task | server step | slowest site's training | round / training "
        "| GPU utilisation mean (median) | samples with the GPU busy | GPU memory peak (MiB) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def cell(value, digits=2):
        return "–" if value is None else f"{value:.{digits}f}"

    for name, row in runs.items():
        gpu = row["gpu"]
        utilisation = (
            f"{gpu['utilisation_mean']:.1f}% ({gpu['utilisation_median']:.0f}%)" if gpu.get("samples") else "–"
        )
        busy = f"{gpu['busy_share']:.0%}" if gpu.get("samples") else "–"
        memory = f"{gpu['memory_peak_mib']:.0f}" if gpu.get("samples") else "–"
        lines.append(
            f"| {name} | {row['rounds_finished']} ({row['rounds_counted']}) | {cell(row['round'])} | "
            f"{cell(row['train_task'])} | {cell(row['server_step'])} | {cell(row['slowest_site_training'])} | "
            f"{cell(row['round_over_training'])} | {utilisation} | {busy} | {memory} |"
        )
    return {"device": device, "target": TARGET, "runs": runs}, "\n".join(lines) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print(__doc__, file=sys.stderr)
        return 2
    folder = Path(argv[0])
    summary, text = summarize(folder)
    (folder / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (folder / "SUMMARY.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
