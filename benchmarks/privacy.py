"""What differential privacy costs fairness (docs/benchmarks/privacy.md).

Each privacy level is one `fairfl benchmark` of the same methods and seeds through NVFlare's simulator, the level's
`--set dp_epsilon=...` its only difference; the levels run seed by seed (every level of seed 0, then of seed 1, ...),
so an interrupted benchmark has paired seeds to show and resumes where it stopped (finished runs are kept).

    python benchmarks/privacy.py run [--task prostate] [--methods fedavg ditto fedfloor] [--seeds 0 1 2]
        [--levels none 8 1] [--rounds 20] [--set KEY=VALUE ...] [--out benchmarks/results/privacy/prostate]
    python benchmarks/privacy.py summary [--out ...]

`summary` reads each level's <out>/<level>/dice/results.csv (the headline metric of the task) and writes
<out>/SUMMARY.md and <out>/summary.json: per method and level the mean over sites, the spread (population std), the
worst site and the smallest site's score (the site with the fewest training items: the largest DP sampling rate),
mean ± sd over seeds, each with its paired per-seed difference from the same method without privacy (95% t
interval); the sites' epsilon spent and noise multipliers; and the median round time per level."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import fedfloor_goal  # benchmarks/: the reader of a benchmark's results.csv

from fairfl.methods import display_name
from fairfl.paired import paired_interval
from fairfl.report.statistics import mean_sd

OUT = Path(__file__).resolve().parent / "results" / "privacy" / "prostate"
NONE = "none"
STATISTICS = ("mean", "std", "worst", "smallest")  # the smallest site's score: DP's first casualty
NAMES = {"mean": "Avg.", "std": "Std.", "worst": "worst site", "smallest": "smallest site"}


def level_name(level: str) -> str:
    return level if level == NONE else f"eps{level}"


def private_settings(level: str, clip: float) -> list[str]:
    """The job arguments a privacy level adds: none for no privacy, else the budget and the clip norm."""
    return [] if level == NONE else [f"dp_epsilon={float(level)}", f"dp_clip={clip}"]


def item_gradient_norms(task: str, size_scale: float) -> dict:
    """{site: {"items": its training items, "median_norm": median L2 norm of one training item's gradient}} of the
    default network at its seeded initial weights,
    on a batch of each site's training images (the fairfl.privacy per-item gradients): what `--clip` is chosen
    against (Abadi et al.: clip about the median norm, so that clipping rarely changes a gradient's direction while
    the noise, proportional to the clip, stays as small as it can)."""
    import torch

    from fairfl.data.builtin import builtin_dataset, ensure_builtin
    from fairfl.data.datalist import load_datalist
    from fairfl.data.loaders import make_loader
    from fairfl.models import DEFAULT_UNET, build_model
    from fairfl.privacy.dp_sgd import per_item_gradients
    from fairfl.training import segmentation_loss

    data = builtin_dataset(task)
    root = ensure_builtin(task, size_scale=size_scale)
    torch.manual_seed(0)
    model = build_model(DEFAULT_UNET)
    found = {}
    for k in range(1, data.min_sites + 1):
        site = f"site-{k}"
        training = load_datalist(root, site)["training"]
        loader = make_loader(training, 64, 2, 8, True, 0, site=site)
        batch = next(iter(loader))
        images, labels = (batch[key].as_subclass(torch.Tensor).unsqueeze(1) for key in ("image", "label"))
        grads, _ = per_item_gradients(model, images, labels, segmentation_loss())
        norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(dim=1) for g in grads.values()))
        found[site] = {"items": len(training), "median_norm": round(float(norms.median()), 3)}
    return found


def run(args) -> None:
    for seed in args.seeds:
        for level in args.levels:
            extra = ["--set", *args.set, *private_settings(level, args.clip)]
            command = [
                sys.executable, "-m", "fairfl.cli", "benchmark", args.task, "--methods", *args.methods,
                "--seeds", str(seed), "--rounds", str(args.rounds), "--eval-every", str(args.eval_every),
                "--out", str(args.out / level_name(level)), *extra,
            ]  # fmt: skip
            print(f"[privacy] seed {seed}, level {level}: {' '.join(command[2:])}", flush=True)
            subprocess.run(command, check=True)
    for level in args.levels:  # every seed's runs are kept: this only writes the level's summary of them all
        extra = ["--set", *args.set, *private_settings(level, args.clip)]
        command = [
            sys.executable, "-m", "fairfl.cli", "benchmark", args.task, "--methods", *args.methods,
            "--seeds", *map(str, args.seeds), "--rounds", str(args.rounds), "--eval-every", str(args.eval_every),
            "--out", str(args.out / level_name(level)), *extra,
        ]  # fmt: skip
        subprocess.run(command, check=True)


def per_seed(folder: Path) -> tuple[dict, dict, str]:
    """({method: {seed: {site or "mean"/"std"/"worst": percent}}}, {(method, seed): results.json path}, metric) of one
    level's output: its headline metric's results.csv, as fedfloor_goal reads a benchmark's."""
    metric = json.loads((folder / "summary.json").read_text())["metrics"][0]
    return (*fedfloor_goal.per_seed(str(folder), metric), metric)


def smallest_site(files: dict) -> str | None:
    """The site with the fewest training items, read from a run's aggregation weights (by sample count)."""
    for path in files.values():
        if os.path.exists(path):
            weights = json.loads(Path(path).read_text())["rounds"][0].get("weights")
            if weights:
                return min(weights, key=weights.get)
    return None


def statistics_of(values: dict, smallest: str | None) -> dict:
    """A run's mean, std and worst across its sites, as its results.csv has them, and the `smallest` site's score."""
    found = {name: values[name] for name in ("mean", "std", "worst")}
    if smallest in values:
        found["smallest"] = values[smallest]
    return found


def train_seconds(files: dict) -> dict:
    """{method: median over sites, rounds and seeds of a site's local training seconds} from the runs' results files
    ({} without them: they are not committed)."""
    found = {}
    for (method, _), path in files.items():
        if os.path.exists(path):
            for record in json.loads(Path(path).read_text())["rounds"]:
                found.setdefault(method, []).extend(
                    site["train_seconds"] for site in record.get("train", {}).values() if "train_seconds" in site
                )
    return {m: round(statistics.median(v), 3) for m, v in found.items() if v}


def filter_milliseconds(repeats: int = 5) -> dict:
    """{privacy_filter: median ms} of NVFlare's filter applied as a site applies it (fairfl.flare.update_filters) to
    an update the size of the default prostate U-Net's, on this machine."""
    import numpy as np
    from nvflare.apis.dxo import DXO, DataKind
    from nvflare.apis.fl_context import FLContext

    from fairfl.flare.update_filters import make_filter
    from fairfl.models import DEFAULT_UNET, build_model

    shapes = {k: tuple(v.shape) for k, v in build_model(DEFAULT_UNET).state_dict().items() if v.is_floating_point()}
    rng = np.random.default_rng(0)
    found = {}
    for setting in ("percentile", "svt", {"name": "exclude_vars", "exclude_vars": "^model\\.0\\."}):
        name = setting if isinstance(setting, str) else setting["name"]
        times = []
        for _ in range(repeats):
            update = {k: rng.normal(0, 1e-3, shape).astype(np.float32) for k, shape in shapes.items()}
            shareable = DXO(data_kind=DataKind.WEIGHT_DIFF, data=update).to_shareable()
            started = time.perf_counter()
            make_filter(setting).process(shareable, FLContext())
            times.append(1000 * (time.perf_counter() - started))
        found[name] = round(statistics.median(times), 1)
    return found


def privacy_spent(files: dict) -> dict:
    """{method: {"epsilon": [min, max] over sites and seeds at the last round, "noise": [min, max]}} from the runs'
    results files (not committed: {} without them)."""
    found = {}
    for (method, _), path in files.items():
        if not os.path.exists(path):
            continue
        last = json.loads(Path(path).read_text())["rounds"][-1].get("train", {})
        for site in last.values():
            if "dp_epsilon" in site:
                entry = found.setdefault(method, {"epsilon": [], "noise": []})
                entry["epsilon"].append(site["dp_epsilon"])
                entry["noise"].append(site["dp_noise_multiplier"])
    return {m: {k: [round(min(v), 3), round(max(v), 3)] for k, v in e.items()} for m, e in found.items()}


def noise_to_signal(noise_multipliers: list[float]) -> list[float]:
    """[min, max] over `noise_multipliers` of the norm of one DP-SGD step's noise over the largest norm its signal
    can have: sigma * clip * sqrt(d) / B against clip (every drawn item's clipped gradient aligned), d the default
    U-Net's trainable parameters and B the expected batch, the task's batch size (every run here uses it). Above 1 the
    noise outweighs even a perfectly aligned batch."""
    from fairfl.models import DEFAULT_UNET, build_model
    from fairfl.presets import TASK_DEFAULTS

    weights = sum(p.numel() for p in build_model(DEFAULT_UNET).parameters() if p.requires_grad)
    batch = TASK_DEFAULTS["segmentation"]["batch_size"]
    return [round(sigma * weights**0.5 / batch, 1) for sigma in (min(noise_multipliers), max(noise_multipliers))]


def summarize(out: Path) -> dict:
    levels = sorted((p.name for p in out.iterdir() if (p / "summary.json").exists()), key=_level_order)
    data = {level: per_seed(out / level) for level in levels}
    smallest = next((s for v in data.values() if (s := smallest_site(v[1]))), None)
    if smallest is None and (out / "summary.json").exists():  # the runs are not committed: the summary's
        smallest = json.loads((out / "summary.json").read_text()).get("smallest_site")
    result = {"levels": levels, "smallest_site": smallest, "methods": {}}
    for level in levels:
        values, files, metric = data[level]
        result["metric"] = metric
        seconds = json.loads((out / level / "summary.json").read_text())["round_seconds"]
        spent, training = privacy_spent(files), train_seconds(files)
        for method, seeds in values.items():
            stats = {s: statistics_of(sites, smallest) for s, sites in seeds.items()}
            entry = {
                "seeds": sorted(seeds),
                "round_seconds": seconds.get(method),
                **({"train_seconds": training[method]} if method in training else {}),
                **({"privacy_spent": spent[method]} if method in spent else {}),
            }
            for name in STATISTICS:
                per = {s: v[name] for s, v in stats.items() if name in v}
                if not per:
                    continue
                entry[name] = [round(x, 2) if x is not None else None for x in mean_sd(per.values())]
                base = data.get(NONE, ({}, {}, ""))[0].get(method)
                if level != NONE and base:
                    found = paired_interval(per, {s: statistics_of(v, smallest)[name] for s, v in base.items()})
                    entry[f"{name}_vs_none"] = [round(found.mean, 2), round(found.low, 2), round(found.high, 2)]
            result["methods"].setdefault(method, {})[level] = entry
    return result


def _level_order(name: str) -> float:
    """No privacy first, then ever less epsilon (ever more privacy)."""
    return -float("inf") if name == NONE else -float(name.removeprefix("eps"))


def _signed(value: float) -> str:
    return f"{value:+.2f}".replace("-", "\u2212")


def _cell(entry: dict, name: str) -> str:
    if name not in entry:
        return "–"
    mean, sd = entry[name]
    text = f"{mean:.2f}" + (f" ± {sd:.2f}" if sd is not None else "")
    paired = entry.get(f"{name}_vs_none")
    if paired:
        low, high = paired[1], paired[2]
        interval = f" [{_signed(low)}, {_signed(high)}]" if low == low and abs(low) != float("inf") else ", 1 seed"
        text += f" ({_signed(paired[0])}{interval})"
    return text


def table(result: dict, command: str) -> str:
    metric = result.get("metric", "dice")
    lines = [
        "# What differential privacy costs fairness",
        "",
        f"`{command}`: each level is one `fairfl benchmark` (its folder here: none, eps100, eps8, ...), the same "
        f"methods, seeds, rounds and data, `--set dp_epsilon=... dp_clip={result.get('clip')}` its only difference. "
        f"Final {metric} in %, mean ± sd "
        "over seeds; in brackets the paired per-seed difference from the same method without privacy and its 95% t "
        f"interval. Avg.: mean over sites; Std.: population std across sites; smallest site: "
        f"{result.get('smallest_site')}, the one with the fewest training items (the largest sampling rate, so the "
        "most noise for the same epsilon).",
        "",
        "| method | privacy | seeds | " + " | ".join(NAMES[n] for n in STATISTICS) + " | epsilon spent (sites) | "
        "noise multiplier | site training s | round s |",
        "|---|---|---:|" + "---:|" * len(STATISTICS) + "---:|---:|---:|---:|",
    ]
    for method, levels in result["methods"].items():
        for level in result["levels"]:
            entry = levels.get(level)
            if entry is None:
                continue
            spent = entry.get("privacy_spent", {})
            eps = "–" if not spent else "{:.2f}–{:.2f}".format(*spent["epsilon"])
            noise = "–" if not spent else "{:.2f}–{:.2f}".format(*spent["noise"])
            if spent:
                noise += " ({:g}–{:g}x)".format(*noise_to_signal(spent["noise"]))
            privacy = "none" if level == NONE else f"epsilon {level.removeprefix('eps')}"
            seconds, training = entry.get("round_seconds"), entry.get("train_seconds")
            lines.append(
                f"| {display_name(method)} | {privacy} | {len(entry['seeds'])} | "
                + " | ".join(_cell(entry, n) for n in STATISTICS)
                + f" | {eps} | {noise} | {'–' if training is None else f'{training:.2f}'}"
                + f" | {'–' if seconds is None else f'{seconds:.2f}'} |"
            )
    lines += [
        "",
        "Noise multiplier: the sites' sigma (range over sites and seeds); in brackets the norm of one step's noise "
        "over the largest its signal can have (sigma x sqrt(trainable weights) / batch: above 1 the noise outweighs "
        "even a batch whose clipped gradients all point the same way).",
        "",
        "Site training s: the median of a site's local training per round (results.json `train_seconds`); round s: "
        "the benchmark's median round. Both were measured while other work shared the machine's 2 cores, and the "
        "levels' runs were not interleaved: read them as rough ratios, not as a cost table.",
    ]
    if result.get("filter_ms"):
        lines += [
            "",
            "NVFlare's filters on an update of the default prostate U-Net (as a site applies them, median of 5, ms): "
            + ", ".join(f"{name} {ms:.1f}" for name, ms in result["filter_ms"].items())
            + ".",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("run", "summary", "norms"))
    parser.add_argument("--task", default="prostate")
    parser.add_argument("--methods", nargs="+", default=["fedavg", "ditto", "fedfloor"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--levels", nargs="+", default=[NONE, "8", "100"])
    parser.add_argument("--clip", type=float, default=0.25, help="dp_clip of the private levels")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="job arguments of every run")
    args = parser.parse_args()
    for level in args.levels:
        if level != NONE and not 0 < float(level) <= 1000:
            parser.error(f"level {level!r}: 'none' or an epsilon in (0, 1000]")
    size_scale = float(dict(item.split("=", 1) for item in args.set).get("synthetic_size_scale", 2.0))
    if args.action == "norms":
        print(json.dumps(item_gradient_norms(args.task, size_scale), indent=2))
        return
    if args.action == "run":
        run(args)
    result = summarize(args.out)
    previous = json.loads((args.out / "summary.json").read_text()) if (args.out / "summary.json").exists() else {}
    for method, levels in result["methods"].items():  # without the runs (not committed) keep what they gave
        for level, entry in levels.items():
            before = previous.get("methods", {}).get(method, {}).get(level, {})
            entry.update({k: before[k] for k in ("privacy_spent", "train_seconds") if k in before and k not in entry})
    kept = previous if args.action == "summary" else {}  # measured once, with the runs
    result["filter_ms"] = kept.get("filter_ms") or filter_milliseconds()
    result["item_gradient_norms"] = kept.get("item_gradient_norms") or item_gradient_norms(args.task, size_scale)
    result["clip"] = args.clip
    command = f"python benchmarks/privacy.py run --task {args.task} --methods {' '.join(args.methods)} --seeds " + (
        " ".join(map(str, args.seeds))
        + f" --levels {' '.join(args.levels)} --rounds {args.rounds}"
        + (f" --set {' '.join(args.set)}" if args.set else "")
    )
    (args.out / "summary.json").write_text(json.dumps({"command": command, **result}, indent=2) + "\n")
    (args.out / "SUMMARY.md").write_text(table(result, command))
    print(table(result, command))


if __name__ == "__main__":
    main()
