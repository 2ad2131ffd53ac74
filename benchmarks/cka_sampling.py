"""Fed-LWR's layer weights on the same trained local models, with the CKA sample drawn as before the fix (the
datalist's order, minibatches of 8, shuffled only above 64 images) and as now (a seeded random sample of at most 64
images, minibatches of 8, 32 or 64; five sample seeds each): what the sampling bug did to the small sites.

    fairfl run jobs/fedlwr -w WS -n 6 -t 6 --set num_rounds=10 --set eval_every=10
    PYTHONPATH=custom python benchmarks/cka_sampling.py WS > benchmarks/results/cka_sampling.txt

WS is the simulator workspace of a finished Fed-LWR run on the built-in prostate data (default sizes); the anchor
is the uniform mean of the sites' last local models, as the job builds it."""

import argparse
import json
import os
import statistics

import numpy as np
import torch

from fairfl.aggregation import weighted_average
from fairfl.data.builtin import ensure_builtin
from fairfl.data.datalist import load_datalist
from fairfl.data.loaders import make_loader, segmentation_transforms
from fairfl.methods.fedlwr.cka import layerwise_cka
from fairfl.methods.fedlwr.controller import FedLWRController
from fairfl.methods.fedlwr.weights import lwr_layer_weights
from fairfl.models import build_model
from fairfl.training import load_tensors, site_seed

IMAGE_SIZE, MAX_SAMPLES, REPEATS = 64, 64, 5


def datalist_order_batches(entries, batch_size):
    """The sample as drawn before the fix: datalist order unless the site has more than MAX_SAMPLES images."""
    if len(entries) > MAX_SAMPLES:
        entries = [entries[i] for i in np.random.default_rng(0).permutation(len(entries))[:MAX_SAMPLES]]
    transform = segmentation_transforms(IMAGE_SIZE, 2, train=False)
    images = [transform(e)["image"] for e in entries]
    return [torch.stack(images[i : i + batch_size]) for i in range(0, len(images), batch_size)]


def random_sample_batches(entries, batch_size, seed):
    """The sample as drawn now: the executor's CKA loader."""
    loader = make_loader(entries, IMAGE_SIZE, 2, batch_size, train=False, seed=seed, max_samples=MAX_SAMPLES)
    return [batch["image"] for batch in loader]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workspace", help="simulator workspace of a finished jobs/fedlwr run")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with open(os.path.join(args.workspace, "server", "simulate_job", "results.json")) as f:
        results = json.load(f)
    sites, config = results["sites"], results["config"]
    spec = FedLWRController(model_channels=config["model_channels"], model_strides=config["model_strides"]).model_spec()
    local = {}
    for site in sites:
        local[site] = build_model(spec)
        local[site].load_state_dict(
            load_tensors(os.path.join(args.workspace, site, "simulate_job", "fairfl_site", "local_model.pt"))
        )
        local[site].eval()
    anchor = build_model(spec)
    anchor.load_state_dict(weighted_average([local[s].state_dict() for s in sites], [1.0] * len(sites)))
    root = ensure_builtin(
        "prostate", image_size=IMAGE_SIZE, seed=config["data_seed"], num_sites=len(sites), size_scale=2.0
    )
    entries = {s: load_datalist(str(root), s, num_classes=2)["training"] for s in sites}

    def mean_layer_weights(batches_of):
        cka = {s: layerwise_cka(local[s], anchor, batches_of(s)) for s in sites}
        weights = lwr_layer_weights(cka)
        return {s: statistics.mean(weights[layer][s] for layer in weights) for s in sites}

    print("site            " + " ".join(f"{s:>7}" for s in sites))
    print("training images " + " ".join(f"{len(entries[s]):>7}" for s in sites))
    before = mean_layer_weights(lambda s: datalist_order_batches(entries[s], 8))
    print("datalist order, batch 8: mean layer weight " + " ".join(f"{before[s]:.3f}" for s in sites))
    for batch_size in (8, 32, 64):
        runs = [
            mean_layer_weights(
                lambda s, size=batch_size, r=r: random_sample_batches(entries[s], size, site_seed(0, s) + r)
            )
            for r in range(REPEATS)
        ]
        print(
            f"random sample, batch {batch_size}: mean layer weight over {REPEATS} samples "
            + " ".join(f"{statistics.mean(run[s] for run in runs):.3f}" for s in sites)
            + "; sd "
            + " ".join(f"{statistics.stdev(run[s] for run in runs):.3f}" for s in sites),
            flush=True,
        )


if __name__ == "__main__":
    main()
