"""Memory and time on the 3-D task (built-in prostate3d volumes, MONAI's SegResNet): Fed-LWR's CKA probe against the
feature size, with and without its voxel sampling; a site's local epoch and its sliding-window evaluation, per site;
and a real FedAvg run through NVFlare's simulator.

    python benchmarks/volumes.py                 # cka, sites, run into benchmarks/results/volumes/ (~20 min, 2 cores)
    python benchmarks/volumes.py --steps cka     # one step; finished entries are kept (resumable) unless --redo
    python benchmarks/volumes.py --steps gpu     # on a CUDA machine: the CKA probe's GPU memory (gpu_cka.json)
    python benchmarks/volumes.py --quick         # test-sized, into a temporary folder unless --out is given

Every measurement of the first two steps runs in a fresh Python process (this script with --child), one intra-op
thread, so that its peak resident memory is its own: the peak (VmHWM, reset through /proc/self/clear_refs right
before the measured work) less the resident memory just before it (imports, the models and the data already in
place), and its CPU seconds (time.process_time) beside its wall-clock seconds. Other work sharing the machine
stretches wall-clock seconds and, less, CPU seconds, so the load average is recorded at the start of every
measurement, and each CKA cell is measured in --repeats processes (default 3), the summary giving their median.

cka (cka_memory.json): `layerwise_cka` between two SegResNets (init_filters 8) on two batches of 8 patches of real
volumes (site-1's training volumes, cut as the CKA probe cuts them: half on the gland, no augmentation) at each patch
size, reading every voxel position of a 3-D layer output ("all") or at most N of them (N: 4096, the job's default
`cka_max_positions`, and 1024), beside the two forward passes alone ("forward", what any probe pays). The pair:
one start (seed 0) trained a few steps on site-1's patches (the local model) and on site-6's (the anchor), as Fed-LWR
compares a site's model with one built from the others; and, for the sampling error only, two random starts (seeds 0
and 1), whose CKA is far from 1. The sampling error is the difference from reading every position, per layer.

sites (sites.json): per site, a fresh SegResNet's local epoch (`train_local`, the job's defaults: Adam 1e-3, batch 8
volumes of 2 patches [64, 64, 32]) and the scoring of the site's whole test volumes (`evaluate_dice` with
`sliding_window`, overlap 0.25, Dice, HD95 and surface Dice), on the data a job uses (image size 64,
synthetic_size_scale 2): loading, training and evaluation CPU seconds and peak memory, and the volumes.

run (run.json): `fairfl run jobs/fedavg` on prostate3d with the same network (the command is recorded), each round's
seconds and its phases from results.json, the sites' training seconds, the final Dice, HD95 and surface Dice per site,
and the peak resident memory of every process of the run (sampled every 0.5 s).

gpu (gpu_cka.json): the CKA probe on CUDA at larger patches (up to 256^3), random inputs, in one process: the peak
CUDA's allocator held above what it held before each call, and the seconds.

SUMMARY.md holds the tables docs/benchmarks/volumes.md quotes; `--summary` rewrites it from the JSON files alone."""

from __future__ import annotations

import argparse
import copy
import datetime
import glob
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from volumes_summary import CKA_BATCH, MIB, NETWORK_ARGS, PAIR_STEPS, _numel, patch_shape, read_json, summary

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO, "benchmarks", "results", "volumes")
NETWORK = {"name": "SegResNet", "in_channels": 1, "num_classes": 2, "spatial_dims": 3, "args": NETWORK_ARGS}
JOB_PATCH = [64, 64, 32]  # the job's default patch_size
SIZE_SCALE = 2.0  # the segmentation jobs' default synthetic_size_scale
SITES = [f"site-{k}" for k in range(1, 7)]

FULL = {
    "sizes": ["16", "32", "48", "64x64x32", "64"],
    "positions": [4096, 1024],
    "cka_batches": 2,
    "repeats": 3,
    "gpu_sizes": ["64x64x32", "64", "96", "128", "192", "256"],
    "sites": SITES,
    "patch": JOB_PATCH,
    "size_scale": SIZE_SCALE,
    "run": {"n": 6, "t": 2, "num_rounds": 2, "eval_every": 1, "extra": {}},
}
QUICK = {
    "sizes": ["16", "32"],
    "positions": [1024],
    "cka_batches": 1,
    "repeats": 1,
    "gpu_sizes": ["32", "64"],
    "sites": ["site-6"],
    "patch": [32, 32, 16],
    "size_scale": 0.5,
    "run": {
        "n": 2,
        "t": 2,
        "num_rounds": 1,
        "eval_every": 1,
        "extra": {"patch_size": [32, 32, 16], "synthetic_size_scale": 0.5},
    },
}


# --- measuring in this process ----------------------------------------------------------------------------------
def status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


class Measured:
    """CPU and wall-clock seconds and the peak resident memory of a block, less the resident memory before it.

    Resetting the peak also resets what getrusage's ru_maxrss reports, so the process's own peak is kept here
    (`process_peak_mib`): the largest VmHWM seen before each reset and after each block."""

    process_peak_kib = 0

    def __enter__(self):
        Measured.process_peak_kib = max(Measured.process_peak_kib, status_kib("VmHWM"))
        with open("/proc/self/clear_refs", "w") as f:  # the peak (VmHWM) back to the resident size now
            f.write("5")
        self.before_kib = status_kib("VmRSS")
        self.cpu, self.wall = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.cpu, self.wall = time.process_time() - self.cpu, time.perf_counter() - self.wall
        self.peak_kib = status_kib("VmHWM")
        Measured.process_peak_kib = max(Measured.process_peak_kib, self.peak_kib)

    def record(self) -> dict:
        return {
            "cpu_seconds": round(self.cpu, 3),
            "wall_seconds": round(self.wall, 3),
            "resident_before_mib": round(self.before_kib / 1024, 1),
            "peak_mib": round(self.peak_kib / 1024, 1),
            "peak_increase_mib": round((self.peak_kib - self.before_kib) / 1024, 1),
        }


def process_peak_mib() -> int:
    """The peak resident memory of this process so far (MiB), Measured's resets included."""
    return round(max(Measured.process_peak_kib, status_kib("VmHWM")) / 1024)


def machine() -> dict:
    import monai
    import torch

    return {
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "monai": monai.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "gpu": "none used (CPU only)",
    }


def load_average() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


# --- the children ---------------------------------------------------------------------------------------------
def child_cka(spec: dict) -> dict:
    import torch

    from fairfl.methods.fedlwr.cka import layerwise_cka
    from fairfl.models import build_model

    torch.set_num_threads(1)
    prep = torch.load(spec["prep"], weights_only=True)
    models = {}
    for name, state in prep["models"].items():
        models[name] = build_model(NETWORK)
        models[name].load_state_dict(state)
        models[name].eval()
    batches, setting = prep["batches"], spec["setting"]
    positions = None if setting in ("all", "forward") else int(setting)
    record = {"loadavg": load_average()}
    with Measured() as measured:
        if setting == "forward":  # the two forward passes a probe needs, nothing else
            with torch.no_grad():
                for x in batches:
                    models["local"](x)
                    models["anchor"](x)
        else:
            cka = layerwise_cka(models["local"], models["anchor"], batches, max_volume_positions=positions)
    record.update(measured.record(), process_peak_mib=process_peak_mib())
    if setting != "forward" and spec["values"]:  # not measured: the values, and those of the pair of random starts
        record["cka"] = cka
        record["cka_random_starts"] = layerwise_cka(
            models["seed0"], models["seed1"], batches, max_volume_positions=positions
        )
    return record


def child_site(spec: dict) -> dict:
    import torch

    from fairfl.data.builtin import ensure_builtin
    from fairfl.data.datalist import load_datalist, load_dataset_info
    from fairfl.data.loaders import make_loader
    from fairfl.data.volumes import VolumeSettings
    from fairfl.models import build_model
    from fairfl.training import TrainSettings, evaluate_dice, seed_everything, site_seed, sliding_window, train_local

    torch.set_num_threads(1)
    site, patch = spec["site"], tuple(spec["patch"])
    root = ensure_builtin("prostate3d", image_size=64, seed=0, num_sites=6, size_scale=spec["size_scale"])
    info = load_dataset_info(root, site, 2, task="segmentation", in_channels=1, spatial_dims=3)
    datalist = load_datalist(root, site, num_classes=2, spatial_dims=3)
    settings = VolumeSettings(patch_size=patch, spacing=tuple(info["declared"]["spacing"]))
    seed = site_seed(0, site)
    seed_everything(seed)
    model = build_model(NETWORK)
    train = TrainSettings()  # the segmentation jobs' defaults: Adam, lr 1e-3, weight decay 1e-4, batch 8, one epoch
    record = {"loadavg": load_average(), "patch": list(patch), "spacing_mm": list(settings.spacing)}
    with Measured() as loading:  # decoding, orientation, resampling, normalisation: cached once per volume
        loaders = {
            "train": make_loader(datalist["training"], 64, 2, train.batch_size, train=True, seed=seed, volume=settings),
            "test": make_loader(datalist["testing"], 64, 2, 1, train=False, seed=seed, volume=settings, whole=True),
        }
    predict = sliding_window(patch, 0.25)
    # the scoring's own memory, measured before training: the allocator keeps what training freed, so a scoring after
    # it would reuse that memory and show no increase (the same work: whole volumes, the same windows)
    with Measured() as evaluation:
        evaluate_dice(model, loaders["test"], 2, "cpu", predict=predict)
    with Measured() as training:
        steps = train_local(model, loaders["train"], train, "cpu")
    with Measured() as scoring:  # the trained network's scores, and the scoring's time after training
        scores = evaluate_dice(model, loaders["test"], 2, "cpu", predict=predict)
    shapes = [list(item["image"].shape[1:]) for item in loaders["test"].dataset]
    record.update(
        training_volumes=len(datalist["training"]),
        patches_per_epoch=len(datalist["training"]) * settings.patches_per_volume,
        steps=steps["steps"],
        test_volumes=len(datalist["testing"]),
        test_volume_shapes=shapes,
        loading=loading.record(),
        training=training.record(),
        evaluation=evaluation.record(),
        scoring=scoring.record(),
        process_peak_mib=process_peak_mib(),
        scores={k: round(v, 4) for k, v in scores.items()},
    )
    return record


def child_gpu(spec: dict) -> dict:
    """The CKA probe's GPU memory (CUDA's allocator: the peak allocated above what was allocated before) and time,
    all sizes and settings in this one process, on random inputs (memory and time do not depend on the values)."""
    import torch

    from fairfl.methods.fedlwr.cka import layerwise_cka, parameter_layers
    from fairfl.models import build_model

    device = torch.device("cuda")
    models = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        models.append(build_model(NETWORK).to(device).eval())
    layers = list(parameter_layers(models[0]))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # warm-up: CUDA and cuDNN set up once, outside every measurement
        models[0](torch.randn(2, 1, 32, 32, 32, device=device))
    runs, sizes = {}, {}
    for size in spec["sizes"]:
        shape = patch_shape(size)
        batches = [torch.randn(CKA_BATCH, 1, *shape, generator=generator).to(device) for _ in range(spec["batches"])]
        shapes = layer_shapes(models[0], layers, batches[0][:1])
        largest = max(shapes, key=lambda n: _numel(shapes[n]))
        sizes[size] = {
            "largest_layer": {"name": largest, "shape": shapes[largest], "features": _numel(shapes[largest])}
        }
        for setting in spec["settings"]:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            before, started = torch.cuda.memory_allocated(), time.perf_counter()
            try:
                if setting == "forward":
                    with torch.no_grad():
                        for x in batches:
                            models[0](x)
                            models[1](x)
                else:
                    positions = None if setting == "all" else int(setting)
                    layerwise_cka(*models, batches, device=device, max_volume_positions=positions)
                torch.cuda.synchronize()
                runs[f"{size}/{setting}"] = {
                    "peak_increase_mib": round((torch.cuda.max_memory_allocated() - before) / MIB, 1),
                    "seconds": round(time.perf_counter() - started, 3),
                }
            except torch.OutOfMemoryError:
                runs[f"{size}/{setting}"] = {"out_of_memory": True}
        del batches
    return {
        "gpu": torch.cuda.get_device_name(0),
        "gpu_memory_mib": round(torch.cuda.get_device_properties(0).total_memory / MIB),
        "torch": torch.__version__,
        "sizes": sizes,
        "runs": runs,
    }


CHILDREN = {"cka": child_cka, "site": child_site, "gpu": child_gpu}


def in_child(kind: str, spec: dict) -> dict:
    """Run one measurement in a fresh interpreter (this script with --child) and return its JSON record."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", kind, json.dumps(spec)],
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        raise RuntimeError(f"child {kind} {spec} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- the steps ------------------------------------------------------------------------------------------------
def prepare_cka(sizes: list[str], batches: int, folder: str) -> dict:
    """Per patch size, a file with the models and the batches every child of that size reads, and the layers'
    output sizes (one sample)."""
    import torch

    from fairfl.data.builtin import ensure_builtin
    from fairfl.data.datalist import load_datalist, load_dataset_info
    from fairfl.data.loaders import make_loader
    from fairfl.data.volumes import VolumeSettings
    from fairfl.methods.fedlwr.cka import parameter_layers
    from fairfl.models import build_model
    from fairfl.training import TrainSettings, train_local

    torch.set_num_threads(1)
    root = ensure_builtin("prostate3d", image_size=64, seed=0, num_sites=6, size_scale=SIZE_SCALE)
    spacing = tuple(load_dataset_info(root, "site-1", 2, spatial_dims=3)["declared"]["spacing"])
    entries = {s: load_datalist(root, s, num_classes=2, spatial_dims=3)["training"] for s in ("site-1", "site-6")}
    models = {}
    for seed in (0, 1):
        torch.manual_seed(seed)
        models[f"seed{seed}"] = build_model(NETWORK)
    small = VolumeSettings(patch_size=(32, 32, 32), spacing=spacing)
    for name, site in (("local", "site-1"), ("anchor", "site-6")):  # one start, a few steps on two sites' patches
        models[name] = copy.deepcopy(models["seed0"])
        loader = make_loader(entries[site], 64, 2, CKA_BATCH // 2, train=True, seed=0, volume=small)
        train_local(models[name], loader, TrainSettings(batch_size=CKA_BATCH // 2, local_steps=PAIR_STEPS), "cpu")
    states = {name: model.state_dict() for name, model in models.items()}
    layers = list(parameter_layers(models["local"]))
    described = {}
    for size in sizes:
        settings = VolumeSettings(patch_size=tuple(patch_shape(size)), spacing=spacing)
        # CKA_BATCH // 2 volumes of 2 patches each: batches of CKA_BATCH patches, as the probe cuts them
        loader = make_loader(entries["site-1"], 64, 2, CKA_BATCH // 2, train=False, seed=0, volume=settings)
        chosen = [batch["image"].as_subclass(torch.Tensor).contiguous() for batch in loader][:batches]
        path = os.path.join(folder, f"cka_{size}.pt")
        torch.save({"models": states, "batches": chosen}, path)
        shapes = layer_shapes(models["local"], layers, chosen[0][:1])
        largest = max(shapes, key=lambda n: _numel(shapes[n]))
        described[size] = {
            "path": path,
            "batches": [list(b.shape) for b in chosen],
            "layers": len(layers),
            "largest_layer": {"name": largest, "shape": shapes[largest], "features": _numel(shapes[largest])},
            "layer_features": {n: _numel(s) for n, s in shapes.items()},
            "layer_voxels": {n: _numel(s[1:]) for n, s in shapes.items()},
            "layer_channels": {n: s[0] for n, s in shapes.items()},
        }
    return described


def layer_shapes(model, layers: list[str], x) -> dict[str, list[int]]:
    """{layer: its output's shape without the batch dimension} for input x."""
    import torch

    shapes: dict[str, list[int]] = {}

    def keep(name):
        def hook(module, inputs, output):  # returns None: the output stays as it is
            shapes.setdefault(name, list(output.shape[1:]))

        return hook

    hooks = [module.register_forward_hook(keep(n)) for n, module in model.named_modules() if n in layers]
    with torch.no_grad():
        model.eval()(x)
    for hook in hooks:
        hook.remove()
    return shapes


def gram_buffer_mib(described: dict, positions: int | None) -> float:
    """The float64 copy of the largest layer's features the Gram matrix is computed from: (B-1) x C x positions."""
    read = max(described["layer_channels"][n] * min(v, positions or v) for n, v in described["layer_voxels"].items())
    return round((CKA_BATCH - 1) * read * 8 / MIB, 2)


def step_cka(config: dict, out: Path, redo: bool, command: str) -> None:
    """Each (patch size, setting) `config["repeats"]` times, each in a fresh process, the repeats interleaved (every
    setting once, then again) so that a change in the machine's state reaches every setting alike. The CKA values
    (the sampling error) come from the first repeat, which computes them after its measurement."""
    path = out / "cka_memory.json"
    saved = read_json(path)
    if saved is None or redo:
        saved = {"runs": {}, "sizes": {}}
    settings = ["forward", "all", *map(str, config["positions"])]
    todo = [
        (r, size, setting)
        for r in range(config["repeats"])
        for size in config["sizes"]
        for setting in settings
        if len(saved["runs"].get(f"{size}/{setting}", {}).get("repeats", [])) <= r
    ]
    if not todo:
        return
    with tempfile.TemporaryDirectory() as tmp:
        print(f"cka: preparing the models and {config['cka_batches']} batches per patch size ...", flush=True)
        described = prepare_cka(sorted({size for _, size, _ in todo}), config["cka_batches"], tmp)
        for r, size, setting in todo:
            record = in_child("cka", {"prep": described[size]["path"], "setting": setting, "values": r == 0})
            entry = saved["runs"].setdefault(f"{size}/{setting}", {"repeats": []})
            for key in ("cka", "cka_random_starts"):
                if key in record:
                    entry[key] = record.pop(key)
            entry["repeats"].append(record)
            saved["sizes"][size] = {k: v for k, v in described[size].items() if k != "path"}
            saved["sizes"][size]["gram_buffer_mib"] = {
                s: gram_buffer_mib(described[size], None if s == "all" else int(s)) for s in settings[1:]
            }
            saved.update(header(command), batch_size=CKA_BATCH, network=NETWORK, pair_steps=PAIR_STEPS)
            write_json(path, saved)
            print(
                f"cka {size} {setting} (repeat {r + 1}): +{record['peak_increase_mib']} MiB, "
                f"{record['cpu_seconds']} s CPU ({record['wall_seconds']} s wall)",
                flush=True,
            )


def step_sites(config: dict, out: Path, redo: bool, command: str) -> None:
    path = out / "sites.json"
    saved = read_json(path) or {"sites": {}}
    for site in config["sites"]:
        if site in saved["sites"] and not redo:
            continue
        spec = {"site": site, "patch": config["patch"], "size_scale": config["size_scale"]}
        record = in_child("site", spec)
        saved["sites"][site] = record
        saved.update(header(command), network=NETWORK, size_scale=config["size_scale"])
        write_json(path, saved)
        print(
            f"{site}: {record['training_volumes']} training volumes, train {record['training']['cpu_seconds']} s CPU, "
            f"evaluate {record['test_volumes']} volumes {record['evaluation']['cpu_seconds']} s CPU, "
            f"peak {record['process_peak_mib']} MiB",
            flush=True,
        )


def step_gpu(config: dict, out: Path, redo: bool, command: str) -> None:
    path = out / "gpu_cka.json"
    if path.exists() and not redo:
        return
    settings = ["forward", "all", *map(str, config["positions"])]
    record = in_child("gpu", {"sizes": config["gpu_sizes"], "settings": settings, "batches": config["cka_batches"]})
    head = header(command)
    head["machine"]["gpu"] = f"{record['gpu']} ({record['gpu_memory_mib']} MiB), torch {record['torch']}"
    write_json(
        path, {**head, "batch_size": CKA_BATCH, "batches": config["cka_batches"], "settings": settings, **record}
    )
    print(f"gpu: {record['gpu']}: " + json.dumps(record["runs"]), flush=True)


def run_command(config: dict, workspace: str) -> list[str]:
    run = config["run"]
    sets = {
        "dataset": "prostate3d",
        "model": "SegResNet",
        "model_args": NETWORK_ARGS,
        "num_rounds": run["num_rounds"],
        "eval_every": run["eval_every"],
        **run["extra"],
    }
    arguments = [
        a for key, value in sets.items() for a in ("--set", f"{key}={json.dumps(value, separators=(',', ':'))}")
    ]
    return [
        "fairfl",
        "run",
        "jobs/fedavg",
        "-w",
        workspace,
        "--force",
        "-q",
        "-n",
        str(run["n"]),
        "-t",
        str(run["t"]),
    ] + arguments


def step_run(config: dict, out: Path, redo: bool, command: str) -> None:
    from scale import MemoryWatch  # benchmarks/scale.py: the peak RSS of every process of a simulator run

    path = out / "run.json"
    if path.exists() and not redo:
        return
    with tempfile.TemporaryDirectory() as tmp:
        workspace = os.path.join(tmp, "ws")
        argv = run_command(config, workspace)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
        print("run: " + shlex.join(argv), flush=True)
        before, started, loadavg = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter(), load_average()
        with MemoryWatch(workspace) as memory:
            proc = subprocess.run(
                [sys.executable, "-m", "fairfl.cli", *argv[1:]], cwd=REPO, env=env, capture_output=True, text=True
            )
        wall, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode:
            raise RuntimeError(f"fairfl run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        results = json.loads(
            Path(glob.glob(os.path.join(workspace, "**", "results.json"), recursive=True)[0]).read_text()
        )
    rounds = []
    for r in results["rounds"]:
        train = r.get("train", {})
        rounds.append(
            {
                "round": r["round"],
                "seconds": r["seconds"],
                "phases": r.get("phases"),
                "train_seconds": {s: round(m.get("train_seconds", 0.0), 3) for s, m in sorted(train.items())},
                "mean_dice": r.get("mean"),
            }
        )
    final = results["final"]
    metrics = ("dice", "hd95", "surface_dice")
    record = {
        **header(command),
        "fairfl_run": shlex.join(argv).replace(workspace, "WS"),
        "network": NETWORK,
        "loadavg": loadavg,
        "wall_seconds": round(wall, 1),
        "cpu_seconds_all_processes": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 1),
        "process_peak_mib": {k: round(v / MIB) for k, v in sorted(memory.peaks.items())},
        "all_processes_peak_mib": round(memory.total_peak / MIB),
        "rounds": rounds,
        "final": {
            "per_site": {
                s: {k: round(m[k], 4) for k in metrics if k in m} for s, m in sorted(final["per_site"].items())
            },
            "mean": {k: round(final[k], 4) for k in ("mean", "std", "worst") if k in final},
            "worst_site": final.get("worst_site"),
        },
        "config": {k: results["config"].get(k) for k in ("patch_size", "batch_size", "synthetic_size_scale", "lr")},
    }
    write_json(path, record)
    print(f"run: {wall:.0f} s wall, rounds " + ", ".join(f"{r['seconds']:.1f} s" for r in rounds), flush=True)


# --- outputs --------------------------------------------------------------------------------------------------
def header(command: str) -> dict:
    return {"command": command, "date": datetime.date.today().isoformat(), "machine": machine()}


def write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


STEPS = {"cka": step_cka, "sites": step_sites, "run": step_run, "gpu": step_gpu}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--steps", nargs="+", choices=list(STEPS), default=["cka", "sites", "run"], help="gpu: on a CUDA machine only"
    )
    parser.add_argument("--out", default=None, help=f"output folder (default {os.path.relpath(DEFAULT_OUT, REPO)})")
    parser.add_argument("--quick", action="store_true", help="test-sized: 2 patch sizes, 1 site, a 2-site 1-round run")
    parser.add_argument("--redo", action="store_true", help="measure again what the output already holds")
    parser.add_argument("--repeats", type=int, default=None, help="processes per CKA cell (default 3; --quick 1)")
    parser.add_argument("--summary", action="store_true", help="only rewrite SUMMARY.md from the JSON files")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "SPEC"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(CHILDREN[args.child[0]](json.loads(args.child[1]))), flush=True)
        return 0
    out = Path(args.out or (tempfile.mkdtemp(prefix="fairfl_volumes_") if args.quick else DEFAULT_OUT))
    command = shlex.join(["python", "benchmarks/volumes.py", *(sys.argv[1:] if argv is None else argv)])
    if not args.summary:
        config = dict(QUICK if args.quick else FULL)
        config["repeats"] = args.repeats or config["repeats"]
        for step in args.steps:
            STEPS[step](config, out, args.redo, command)
            summary(out)
    print(summary(out))
    print(f"outputs: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
