"""Cost of Fed-LWR's CKA probe on one site, measured side by side in one process.

- time: `layerwise_cka(local, anchor)` over a site's images versus the two plain forward passes it needs
  (local model and anchor over the same batches); runs alternate, the median of the paired ratios is quoted.
- memory: peak resident memory of the CKA probe in a fresh process at 1x, 4x and 16x the site's data.
- `--batch-sizes 8 32 64`: instead, per CKA minibatch size (Fed-LWR's `cka_batch_size`), the probe's time
  and peak resident memory, each in a fresh process, on a random sample of `--samples` images of site-1 of the
  built-in prostate data (`cka_batch_size_<image size>px.json`).

    python benchmarks/cka_cost.py [--image-size 64] [--samples 64] [--repeats 15] [--out benchmarks/results]
    python benchmarks/cka_cost.py --batch-sizes 8 32 64 [--image-size 64] [--samples 64] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from fairfl.data.builtin import ensure_builtin
from fairfl.data.datalist import load_datalist
from fairfl.data.loaders import make_loader
from fairfl.methods.fedlwr.cka import layerwise_cka
from fairfl.models import DEFAULT_UNET, build_model
from fairfl.training import configure_threads


def make_models(seed=0):
    torch.manual_seed(seed)
    anchor = build_model(DEFAULT_UNET).eval()
    local = build_model(DEFAULT_UNET).eval()
    local.load_state_dict(anchor.state_dict())
    with torch.no_grad():  # a local model is the anchor after some training: a small perturbation
        for p in local.parameters():
            p.add_(0.05 * (p.abs().mean() + 1e-3) * torch.randn_like(p))
    return local, anchor


def make_batches(samples, image_size, batch_size=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(min(batch_size, samples - i), 1, image_size, image_size, generator=g)
        for i in range(0, samples, batch_size)
    ]


@torch.no_grad()
def forward_only(local, anchor, batches):
    for x in batches:
        local(x)
        anchor(x)


def time_it(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure_time(image_size, samples, repeats):
    local, anchor = make_models()
    batches = make_batches(samples, image_size)
    forward_only(local, anchor, batches)  # warm-up
    layerwise_cka(local, anchor, batches)
    forward, cka = [], []
    for _ in range(repeats):
        forward.append(time_it(lambda: forward_only(local, anchor, batches)))
        cka.append(time_it(lambda: layerwise_cka(local, anchor, batches)))
    ratios = [c / f for c, f in zip(cka, forward, strict=True)]
    return {
        "forward_s_median": statistics.median(forward),
        "cka_s_median": statistics.median(cka),
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def peak_memory_child(image_size, samples) -> None:
    """Runs in a fresh process: peak RSS during one CKA probe over `samples` images fed one batch at a time.

    Linux: the peak (VmHWM) is reset to the current RSS just before the probe (clear_refs 5), so the number
    is the probe's own peak, not the peak of imports and model building."""
    local, anchor = make_models()
    g = torch.Generator().manual_seed(1)
    batches = (torch.randn(8, 1, image_size, image_size, generator=g) for _ in range(samples // 8))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status_kib("VmRSS")
    layerwise_cka(local, anchor, batches)
    peak = _status_kib("VmHWM")
    print(json.dumps({"samples": samples, "peak_rss_mib": peak / 1024, "before_probe_mib": before / 1024}))


def batch_size_child(image_size, samples, batch_size, repeats) -> None:
    """Runs in a fresh process: the probe's median time and peak RSS (as in peak_memory_child) with minibatches
    of `batch_size` over a random sample of `samples` images of the built-in prostate data's site-1, read
    before the probe so that only the probe is measured."""
    local, anchor = make_models()
    root = ensure_builtin("prostate", image_size=image_size, seed=0, num_sites=6, size_scale=2.0)
    entries = load_datalist(root, "site-1", num_classes=2)["training"]
    loader = make_loader(entries, image_size, 2, batch_size, train=False, seed=0, max_samples=samples)
    batches = [b["image"] for b in loader]
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status_kib("VmRSS")
    seconds = [time_it(lambda: layerwise_cka(local, anchor, batches)) for _ in range(repeats)]
    print(
        json.dumps(
            {
                "batch_size": batch_size,
                "samples": samples,
                "cka_s_median": statistics.median(seconds),
                "peak_rss_mib": _status_kib("VmHWM") / 1024,
                "before_probe_mib": before / 1024,
            }
        )
    )


def measure_batch_sizes(image_size, samples, batch_sizes, repeats):
    rows = []
    for b in batch_sizes:
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--batch-size-child",
                str(b),
                "--image-size",
                str(image_size),
                "--samples",
                str(samples),
                "--repeats",
                str(repeats),
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        print(
            f"batch {b}: CKA probe {rows[-1]['cka_s_median'] * 1e3:.0f} ms (median of {repeats}), peak RSS "
            f"{rows[-1]['peak_rss_mib']:.0f} MiB (before the probe {rows[-1]['before_probe_mib']:.0f} MiB)"
        )
    return rows


def measure_memory(image_size, samples):
    rows = []
    for n in (samples, 4 * samples, 16 * samples):
        out = subprocess.run(
            [sys.executable, __file__, "--memory-child", str(n), "--image-size", str(image_size)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--samples", type=int, default=64, help="the CPU default cka_max_samples")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a FLARE client uses 1)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    parser.add_argument("--batch-sizes", type=int, nargs="+", help="measure these CKA minibatch sizes instead")
    parser.add_argument("--memory-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--batch-size-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    configure_threads(args.threads)
    if args.memory_child:
        return peak_memory_child(args.image_size, args.memory_child)
    if args.batch_size_child:
        return batch_size_child(args.image_size, args.samples, args.batch_size_child, args.repeats)
    if args.batch_sizes:
        result = {
            "image_size": args.image_size,
            "samples": args.samples,
            "threads": args.threads,
            "model": DEFAULT_UNET,
            "torch": torch.__version__,
            "data": "built-in prostate, site-1",
            "batch_sizes": measure_batch_sizes(args.image_size, args.samples, args.batch_sizes, args.repeats),
        }
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"cka_batch_size_{args.image_size}px.json"), "w") as f:
            json.dump(result, f, indent=1)
        return None
    result = {
        "image_size": args.image_size,
        "samples": args.samples,
        "threads": args.threads,
        "model": DEFAULT_UNET,
        "torch": torch.__version__,
        "time": measure_time(args.image_size, args.samples, args.repeats),
        "memory": measure_memory(args.image_size, args.samples),
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cka_cost.json"), "w") as f:
        json.dump(result, f, indent=1)
    t, m = result["time"], result["memory"]
    print(
        f"CKA probe / its forward passes: median {t['ratio_median']:.2f} "
        f"(min {t['ratio_min']:.2f}, max {t['ratio_max']:.2f}; {t['cka_s_median'] * 1e3:.0f} ms vs "
        f"{t['forward_s_median'] * 1e3:.0f} ms, {args.samples} images {args.image_size}px, {args.repeats} pairs)"
    )
    for row in m:
        print(
            f"peak RSS with {row['samples']} images: {row['peak_rss_mib']:.0f} MiB "
            f"(before the probe {row['before_probe_mib']:.0f} MiB)"
        )


if __name__ == "__main__":
    main()
