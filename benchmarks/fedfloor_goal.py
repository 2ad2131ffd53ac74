"""FedFloor's goal per seed, from a benchmark's CSV (docs/methods/fedfloor.md): its spread as a multiple of FedAvg's
and its worst site against FedAvg's, Solo's and Ditto's, seed by seed (the claim checker judges only differences).

    python benchmarks/fedfloor_goal.py benchmarks/results/fedfloor/prostate [more folders]

Writes <folder>/goal.json and prints it."""

import csv
import json
import os
import sys


def goal(folder: str) -> dict:
    metric_dir = next(d for d in sorted(os.listdir(folder)) if os.path.isfile(os.path.join(folder, d, "results.csv")))
    values = {}
    for row in csv.DictReader(open(os.path.join(folder, metric_dir, "results.csv"))):
        values.setdefault(row["method"], {}).setdefault(int(row["seed"]), {})[row["site"]] = float(row["percent"])
    floor = values["fedfloor"]
    seeds = sorted(set(floor) & set(values["fedavg"]))
    return {
        "metric": metric_dir,
        "seeds": seeds,
        "std_over_fedavg": [round(floor[s]["std"] / values["fedavg"][s]["std"], 3) for s in seeds],
        "worst": {
            method: [round(values[method][s]["worst"], 2) for s in seeds]
            for method in ("fedfloor", "fedavg", "solo", "ditto")
            if method in values
        },
    }


if __name__ == "__main__":
    for folder in sys.argv[1:]:
        result = goal(folder)
        with open(os.path.join(folder, "goal.json"), "w") as f:
            json.dump(result, f, indent=2)
        print(folder, json.dumps(result))
