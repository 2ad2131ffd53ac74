"""The tables of benchmarks/volumes.py's SUMMARY.md (docs/benchmarks/volumes.md quotes them), read from its JSON files
alone, and the few names both modules use. Run `python benchmarks/volumes.py --summary` to rewrite it."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

MIB = 2**20
NETWORK_ARGS = {"init_filters": 8}
CKA_BATCH, PAIR_STEPS = 8, 4


def patch_shape(size: str) -> list[int]:
    """ "48" -> [48, 48, 48]; "64x64x32" -> [64, 64, 32]."""
    parts = [int(p) for p in size.split("x")]
    return parts * 3 if len(parts) == 1 else parts


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def read_json(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def sampling_errors(full: dict, sampled: dict, sampled_layers: list[str]) -> dict:
    """The sampled CKA's difference from reading every position, over the layers it samples: the largest and mean
    absolute difference, and the largest relative difference of 1 - CKA (what Fed-LWR's weights are made of)."""
    diffs = [abs(sampled[n] - full[n]) for n in sampled_layers]
    relative = [abs(sampled[n] - full[n]) / max(1.0 - full[n], 1e-12) for n in sampled_layers]
    worst = sampled_layers[relative.index(max(relative))]
    return {
        "worst_layer": worst,
        "worst_one_minus": (1.0 - full[worst], 1.0 - sampled[worst]),
        "max_abs": max(diffs),
        "mean_abs": sum(diffs) / len(diffs),
        "max_rel_one_minus": max(relative),
        "median_rel_one_minus": statistics.median(relative),
        "median_one_minus_full": sorted(1.0 - full[n] for n in sampled_layers)[len(sampled_layers) // 2],
    }


def table(head: list[str], rows: list[list]) -> list[str]:
    return [
        "| " + " | ".join(head) + " |",
        "|---" * len(head) + "|",
        *("| " + " | ".join(map(str, r)) + " |" for r in rows),
    ]


def median(records: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in records)


def patch_name(size: str) -> str:
    return "x".join(map(str, patch_shape(size)))


def setting_order(setting: str):
    return (setting != "forward", setting != "all", -int(setting) if setting.isdigit() else 0)


def cka_sections(cka: dict) -> list[str]:
    settings = sorted({k.split("/")[1] for k in cka["runs"]}, key=setting_order)
    sampled = [s for s in settings if s.isdigit()]
    layers = next(iter(cka["sizes"].values()))["layers"]
    rows = []
    for size, info in cka["sizes"].items():
        largest = info["largest_layer"]
        cells = []
        for s in settings:
            runs = cka["runs"].get(f"{size}/{s}", {}).get("repeats")
            cells.append(f"{median(runs, 'peak_increase_mib'):.0f}, {median(runs, 'cpu_seconds'):.2f}" if runs else "–")
        buffers = ", ".join(str(info["gram_buffer_mib"][s]) for s in settings[1:])
        medians = {s: median(cka["runs"][f"{size}/{s}"]["repeats"], "peak_increase_mib") for s in ("forward", "all")}
        shape = f"{largest['shape'][0]} x {_numel(largest['shape'][1:])} = {largest['features']:,}"
        extra = f"{medians['all'] - medians['forward']:.0f}"
        rows.append(
            [patch_name(size), f"{len(info['batches'])} x {info['batches'][0][0]}", shape, *cells, buffers, extra]
        )
    head = ["patch", "batches", "largest layer (C x voxels)", *(f"{_setting_name(s)}: MiB, CPU s" for s in settings)]
    head.append("Gram buffer MiB: " + ", ".join(_setting_name(s) for s in settings[1:]))
    head.append("every position above the forward passes, MiB")
    repeats = [e["repeats"] for e in cka["runs"].values()]
    memory = max(max(r["peak_increase_mib"] for r in e) - min(r["peak_increase_mib"] for r in e) for e in repeats)
    cpu = max(max(r["cpu_seconds"] for r in e) / min(r["cpu_seconds"] for r in e) for e in repeats)
    counts = sorted({len(e) for e in repeats})
    count = counts[0] if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"
    parts = [
        "## CKA probe memory",
        "",
        f"`layerwise_cka` on batches of {CKA_BATCH} patches ({layers} layers of SegResNet init_filters "
        f"{NETWORK_ARGS['init_filters']}), each in a fresh process: the peak resident memory above the memory before "
        f"the call (MiB) and its CPU seconds, the median of {count} processes; 'forward passes': the two forward "
        "passes alone. Largest layer: its output per sample (channels x voxels). Gram buffer: the float64 copy of the "
        "largest layer's features read, (B-1) x C x positions.",
        "",
        *table(head, rows),
        "",
        f"Between the processes of one cell the peak moved by up to {memory:.0f} MiB and the CPU seconds by up to "
        f"a factor {cpu:.2f}.",
    ]
    rows = []
    for size, info in cka["sizes"].items():
        full = cka["runs"].get(f"{size}/all", {})
        for s in sampled:
            run = cka["runs"].get(f"{size}/{s}", {})
            if "cka" not in full or "cka" not in run:
                continue
            read = [n for n, v in info["layer_voxels"].items() if v > int(s)]
            count = f"{len(read)} of {info['layers']}"
            if not read:
                rows.append([patch_name(size), s, count, "–", "–", "–", "–", "–", "–"])
            for pair, key in (("trained", "cka"), ("random", "cka_random_starts")) if read else ():
                e = sampling_errors(full[key], run[key], read)
                rows.append(
                    [
                        patch_name(size),
                        s,
                        count,
                        pair,
                        f"{e['max_abs']:.2e}",
                        f"{e['mean_abs']:.2e}",
                        f"{e['median_rel_one_minus']:.3f}",
                        f"{e['max_rel_one_minus']:.3f} ({e['worst_one_minus'][0]:.1e}, {e['worst_one_minus'][1]:.1e})",
                        f"{e['median_one_minus_full']:.2e}",
                    ]
                )
    head = [
        "patch",
        "positions",
        "layers sampled",
        "pair",
        "max abs. difference",
        "mean abs. difference",
        "median rel. difference of 1 - CKA",
        "max rel. difference of 1 - CKA (that layer's 1 - CKA: all, sampled)",
        "median 1 - CKA (all positions)",
    ]
    return parts + [
        "",
        "## CKA sampling error",
        "",
        "The sampled CKA against reading every position, over the layers whose output has more voxel positions than "
        "sampled (the others are read whole): the largest and the mean absolute difference, the relative difference "
        "of 1 - CKA (Fed-LWR's weights are made of 1 - CKA), median and largest over those layers, and the median "
        "1 - CKA read whole. Pairs: "
        "'trained', one start trained a few steps on site-1's and on site-6's patches; 'random', two random starts.",
        "",
        *table(head, rows),
        "",
        f"Command: `{cka['command']}` ({cka['date']}; {_machine(cka['machine'])}).",
        "",
    ]


def sites_section(sites: dict) -> list[str]:
    rows = []
    for site, r in sites["sites"].items():
        t, e, c, s = r["training"], r["evaluation"], r["scoring"], r["scores"]
        rows.append(
            [
                site,
                f"{r['training_volumes']} ({r['patches_per_epoch']})",
                r["steps"],
                r["test_volumes"],
                f"{r['loading']['cpu_seconds']:.1f}",
                f"{t['cpu_seconds']:.1f} ({t['wall_seconds']:.1f})",
                f"{t['peak_mib']:.0f}, {t['peak_increase_mib']:.0f}",
                f"{c['cpu_seconds']:.1f} ({c['wall_seconds']:.1f})",
                f"{e['peak_mib']:.0f}, {e['peak_increase_mib']:.0f}",
                r["process_peak_mib"],
                f"{s['dice']:.3f}",
                f"{s.get('hd95', float('nan')):.1f}",
                f"{s.get('surface_dice', float('nan')):.3f}",
            ]
        )
    head = [
        "site",
        "training volumes (patches)",
        "steps",
        "test volumes",
        "loading CPU s",
        "training CPU s (wall)",
        "training peak, increase MiB",
        "evaluation CPU s (wall)",
        "evaluation peak, increase MiB",
        "process peak MiB",
        "Dice",
        "HD95 mm",
        "surface Dice",
    ]
    first = next(iter(sites["sites"].values()))
    return [
        "## Per-site cost",
        "",
        "One local epoch of a fresh SegResNet and the scoring of the site's whole test volumes, each site in a fresh "
        "process, one thread. Loading: reading and preparing the volumes (cached for the run). CPU seconds "
        "(wall-clock in brackets); peak: the process's peak resident memory in the phase (MiB); increase: above the "
        "memory before it. The evaluation's memory is that of a scoring before the training (after it, the memory "
        "training freed is reused and shows no increase), its time that of the scoring after it. The scores are "
        "those of a network trained one epoch from scratch: they show that the evaluation ran, not what the network "
        "learns.",
        "",
        *table(head, rows),
        "",
        f"Patch {'x'.join(map(str, first['patch']))}, spacing {first['spacing_mm']} mm, synthetic_size_scale "
        f"{sites['size_scale']}. Command: `{sites['command']}` ({sites['date']}; {_machine(sites['machine'])}).",
        "",
    ]


def run_section(run: dict) -> list[str]:
    rows = []
    for r in run["rounds"]:
        p, t = r["phases"] or {}, list(r["train_seconds"].values())
        rows.append(
            [
                r["round"],
                f"{r['seconds']:.1f}",
                f"{p.get('train_task', 0):.1f}",
                f"{p.get('server_step', 0):.2f}",
                f"{p.get('evaluation', 0):.1f}",
                f"{sum(t):.1f}, {max(t, default=0):.1f}",
                "–" if r["mean_dice"] is None else f"{r['mean_dice']:.3f}",
            ]
        )
    head = ["round", "round s", "train task s", "server step s", "evaluation s", "sites' training s (sum, max)"]
    parts = [
        "## Simulator run",
        "",
        f"`{run['fairfl_run']}` (WS: a temporary workspace): {run['wall_seconds']:.0f} s wall-clock, "
        f"{run['cpu_seconds_all_processes']:.0f} CPU seconds over all its processes; peak resident memory of all "
        f"processes together {run['all_processes_peak_mib']} MiB. Each round's seconds and its phases (results.json); "
        "the sites' training: the wall-clock seconds each site reports (sites sharing the cores wait in them).",
        "",
        *table([*head, "mean Dice"], rows),
        "",
    ]
    rows = [
        [
            s,
            f"{m['dice']:.3f}",
            f"{m.get('hd95', float('nan')):.1f}",
            f"{m.get('surface_dice', float('nan')):.3f}",
            run["process_peak_mib"].get(s, "–"),
        ]
        for s, m in run["final"]["per_site"].items()
    ]
    return parts + [
        *table(["site", "Dice", "HD95 mm", "surface Dice", "its processes' peak MiB"], rows),
        "",
        "Its other processes' peaks (MiB): "
        + ", ".join(f"{k} {v}" for k, v in run["process_peak_mib"].items() if k not in run["final"]["per_site"])
        + " (the process that names every site: the simulator's client launcher). Command: "
        f"`{run['command']}` ({run['date']}; {_machine(run['machine'])}).",
        "",
    ]


def gpu_cell(run: dict | None) -> str:
    if not run:
        return "–"
    return "out of memory" if run.get("out_of_memory") else f"{run['peak_increase_mib']:.0f}, {run['seconds']:.2f}"


def gpu_section(gpu: dict) -> list[str]:
    rows = []
    for size, info in gpu["sizes"].items():
        largest = info["largest_layer"]
        cells = [gpu_cell(gpu["runs"].get(f"{size}/{s}")) for s in gpu["settings"]]
        shape = f"{largest['shape'][0]} x {_numel(largest['shape'][1:])} = {largest['features']:,}"
        buffer = round((gpu["batch_size"] - 1) * largest["features"] * 8 / MIB, 1)
        runs = [gpu["runs"].get(f"{size}/{s}", {}) for s in ("forward", "all")]
        extra = (
            runs[1]["peak_increase_mib"] - runs[0]["peak_increase_mib"] if all("seconds" in r for r in runs) else "–"
        )
        rows.append([patch_name(size), shape, *cells, buffer, f"{extra:.0f}" if extra != "–" else extra])
    head = ["patch", "largest layer (C x voxels)", *(f"{_setting_name(s)}: MiB, s" for s in gpu["settings"])]
    head += ["Gram buffer MiB, every position", "every position above the forward passes, MiB"]
    return [
        "## CKA probe memory on the GPU",
        "",
        f"The same probe on {gpu['gpu']} (CUDA): the peak memory CUDA's allocator held above what it held before the "
        f"call (MiB) and the seconds, {gpu['batches']} batches of "
        f"{CKA_BATCH} random patches (memory and time do not depend on the values), two random starts, all in one "
        "process after a warm-up.",
        "",
        *table(head, rows),
        "",
        f"Command: `{gpu['command']}` ({gpu['date']}; {gpu['machine']['gpu']}).",
        "",
    ]


def summary(out: Path) -> str:
    parts = ["# 3-D volumes: memory and time", ""]
    sections = (
        ("cka_memory.json", cka_sections),
        ("gpu_cka.json", gpu_section),
        ("sites.json", sites_section),
        ("run.json", run_section),
    )
    for name, section in sections:
        data = read_json(out / name)
        if data:
            parts += section(data)
    text = "\n".join(parts)
    (out / "SUMMARY.md").write_text(text)
    return text


def _setting_name(setting: str) -> str:
    return {"forward": "forward passes", "all": "every position"}.get(setting, f"{setting} positions")


def _machine(m: dict) -> str:
    return f"{m['cpu_count']} CPU cores, torch {m['torch']}, monai {m['monai']}, {m['gpu']}"
