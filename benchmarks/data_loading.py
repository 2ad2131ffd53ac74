"""How much of a site's train task waits for data: the site's own loader (make_loader, as the executor builds it) and
its own training loop (fairfl.training.train_local), the time spent getting the next batch from the loader (MONAI's
CacheDataset: the random augmentations and the collation, in the training process) against the rest (forward,
backward, optimiser step). Also the one-off CacheDataset fill (reading and resizing every image), which a site pays
in every process that builds its loader (with the simulator's -t below -n, every task).

    PYTHONPATH=custom OMP_NUM_THREADS=1 python benchmarks/data_loading.py --preset cpu
    PYTHONPATH=custom OMP_NUM_THREADS=1 python benchmarks/data_loading.py --preset paper --steps 8 --rounds 2
    PYTHONPATH=custom OMP_NUM_THREADS=1 python benchmarks/data_loading.py --preset paper --device cuda [--amp] --out F

On a GPU the compute shrinks and the loading (on one CPU thread, as in a site process) does not: the share to watch.

Writes benchmarks/results/data_loading_<preset>.json (--out to change) and prints it."""

import argparse
import json
import os
import platform
import time

import torch
from monai.data import set_track_meta

from fairfl.data.builtin import ensure_builtin
from fairfl.data.datalist import load_datalist
from fairfl.data.loaders import make_loader
from fairfl.models import DEFAULT_UNET, build_model
from fairfl.presets import PRESETS, TASK_DEFAULTS
from fairfl.training import TrainSettings, seed_everything, site_seed, train_local


class TimedLoader:
    """`loader` as train_local uses it (len, iteration), adding up the seconds spent waiting for each batch."""

    def __init__(self, loader):
        self.loader, self.waited, self.batches = loader, 0.0, 0

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        batches = iter(self.loader)
        while True:
            started = time.perf_counter()
            try:
                batch = next(batches)
            except StopIteration:
                return
            self.waited += time.perf_counter() - started
            self.batches += 1
            yield batch


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu", help="cpu: 64 px; paper: 384 px U-Net")
    parser.add_argument("--site", default="site-1")
    parser.add_argument("--rounds", type=int, default=3, help="train tasks timed (after one untimed warm-up)")
    parser.add_argument("--steps", type=int, default=0, help="optimiser steps per task (0: one epoch)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (the executor's device)")
    parser.add_argument("--amp", action="store_true", help="mixed precision, as the executor's amp")
    parser.add_argument("--workers", type=int, default=0, help="loader workers (executor loader_workers)")
    parser.add_argument("--out", help="default benchmarks/results/data_loading_<preset>.json")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as the executor's num_threads: 1
    device = torch.device(args.device)
    preset, defaults = PRESETS[args.preset], TASK_DEFAULTS["segmentation"]
    image_size = preset.get("image_size", 64)
    spec = {
        **DEFAULT_UNET,
        "channels": preset.get("model_channels", defaults["model_channels"]),
        "strides": preset.get("model_strides", DEFAULT_UNET["strides"]),
    }
    root = ensure_builtin("prostate", image_size=image_size, num_sites=6, size_scale=defaults["synthetic_size_scale"])
    entries = load_datalist(root, args.site, num_classes=2)["training"]
    started = time.perf_counter()
    loader = make_loader(
        entries, image_size, 2, defaults["batch_size"], train=True, seed=0, site=args.site,
        augmentation=defaults["augmentation"], num_workers=args.workers,
    )  # fmt: skip
    cache_fill = time.perf_counter() - started
    settings = TrainSettings(lr=defaults["lr"], weight_decay=defaults["weight_decay"], local_steps=args.steps)
    seed_everything(0)
    model = build_model(spec)
    rounds = []
    for round_num in range(args.rounds + 1):
        seed = site_seed(0, args.site) + round_num  # re-seeded per round, as the executor does
        loader.generator.manual_seed(seed)
        loader.dataset.transform.set_random_state(seed=seed)  # workers: seeded from the generator
        timed = TimedLoader(loader)
        started = time.perf_counter()
        stats = train_local(model, timed, settings, device, amp=args.amp)
        total = time.perf_counter() - started
        if round_num:  # round 0 warms up (allocator, first-call overheads)
            rounds.append({"seconds": total, "loading_seconds": timed.waited, "steps": stats["steps"]})
    # where the loading time goes: the random transforms per image, on MONAI MetaTensors as cached (today) and on
    # plain tensors (what caching plain tensors would give; the same values)
    augment_ms = {}
    for plain in (False, True):
        set_track_meta(not plain)
        started = time.perf_counter()
        for i in range(len(loader.dataset)):
            loader.dataset[i]
        augment_ms[plain] = 1000 * (time.perf_counter() - started) / len(loader.dataset)
    set_track_meta(True)
    total = sum(r["seconds"] for r in rounds)
    loading = sum(r["loading_seconds"] for r in rounds)
    steps = sum(r["steps"] for r in rounds)
    result = {
        "preset": args.preset,
        "image_size": image_size,
        "model_channels": spec["channels"],
        "batch_size": defaults["batch_size"],
        "site": args.site,
        "training_images": len(entries),
        "cache_fill_seconds": round(cache_fill, 3),
        "rounds": len(rounds),
        "steps_per_round": rounds[0]["steps"],
        "loading_share": round(loading / total, 4),
        "loading_ms_per_step": round(1000 * loading / steps, 2),
        "compute_ms_per_step": round(1000 * (total - loading) / steps, 2),
        "augmentation_ms_per_image": round(augment_ms[False], 3),
        "augmentation_ms_per_image_plain_tensors": round(augment_ms[True], 3),
        "cache_fill_share_of_one_task": round(cache_fill / (cache_fill + total / len(rounds)), 4),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "amp": args.amp,
        "loader_workers": args.workers,
        "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "per_round": rounds,
    }
    out = args.out or os.path.join(os.path.dirname(__file__), "results", f"data_loading_{args.preset}.json")
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
