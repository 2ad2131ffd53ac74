"""Cost of the averaging step with `robust_aggregation`: the server's `average_updates` on the default prostate job's
model (U-Net 16..128, as jobs/fedavg builds it) for 6 sites, weighted mean vs coordinate-wise median vs trimmed mean.

    PYTHONPATH=custom python benchmarks/robust_cost.py [--sites 6] [--repeats 20] [--threads 1]

Prints one JSON line per mode: the median and min seconds of one aggregation step over the repeats."""

import argparse
import json
import statistics
import time

import torch

from fairfl.flare.engine import SiteUpdate
from fairfl.methods.fedavg.controller import FedAvgController
from fairfl.models import initial_state, state_to_torch


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spec = FedAvgController().model_spec()
    state = state_to_torch(initial_state(spec, 0))
    updates = {
        f"site-{i + 1}": SiteUpdate(
            {k: v + 0.01 * torch.randn(v.shape) if v.is_floating_point() else v for k, v in state.items()},
            10 * (i + 1),
            {},
        )
        for i in range(args.sites)
    }
    weights = {s: 1.0 / args.sites for s in updates}
    parameters = sum(v.numel() for v in state.values() if v.is_floating_point())
    for mode in ("none", "median", "trimmed_mean"):
        controller = FedAvgController(robust_aggregation=mode)
        controller.average_updates(updates, weights)  # warm-up
        times = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            controller.average_updates(updates, weights)
            times.append(time.perf_counter() - started)
        print(
            json.dumps(
                {
                    "mode": mode,
                    "sites": args.sites,
                    "parameters": parameters,
                    "threads": args.threads,
                    "median_s": round(statistics.median(times), 5),
                    "min_s": round(min(times), 5),
                }
            )
        )


if __name__ == "__main__":
    main()
