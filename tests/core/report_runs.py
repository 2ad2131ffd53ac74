"""Synthetic results files for the report's tests (test_report*.py), shaped as fairfl.results.ResultsLog writes
them: runs of Solo, FedAvg and Fed-LWR with known final Dice per site, FedAvg with aggregation weights, FedCE with a
free rider, a leave-one-out file and personalised runs; and a markdown table or a PNG file read back."""

import json

import numpy as np

SITES = ["site-1", "site-2", "site-3"]
LAYERS = [
    "model.0.conv.unit0.conv",
    "model.0.residual",
    "model.1.submodule.0.conv.unit0.conv",
    "model.1.submodule.1.submodule.0.conv.unit0.conv",
    "model.2.1.conv.unit0.conv",
]
FINAL = {  # (method, seed): final Dice per site
    ("solo", 0): [0.70, 0.80, 0.60],  # Avg. 70.00, Std. 8.16 (population; the sample sd would be 10.00)
    ("fedavg", 0): [0.80, 0.90, 0.70],  # Avg. 80.00, Std. 8.16
    ("fedlwr", 0): [0.85, 0.88, 0.82],  # Avg. 85.00, Std. sqrt(6) = 2.449
    ("fedlwr", 1): [0.87, 0.90, 0.86],  # Avg. 87.67, Std. 1.700
}


def per_site(values, regions=False):
    """{site: {"dice": v}}; with regions also fundus-like dice_disc = v + 0.05 and dice_cup = v - 0.05."""
    return {
        s: {"dice": v, **({"dice_disc": v + 0.05, "dice_cup": v - 0.05} if regions else {})}
        for s, v in zip(SITES, values, strict=True)
    }


def write_run(
    path,
    method,
    seed,
    final,
    schema=1,
    layer_weights=False,
    finished=True,
    config=None,
    regions=False,
    round_fields=None,
    final_fields=None,
):
    """A results.json like fairfl.results.ResultsLog writes: 4 rounds, evaluated at 0, 2 and 3, then `final`.
    round_fields(r) -> extra fields of round r; final_fields: extra fields of `final`."""
    rounds = []
    for r in range(4):
        record = {"round": r, "seconds": 10.0, "train": {s: {"train_loss": 0.5 - 0.1 * r} for s in SITES}}
        if r != 1:
            record["per_site"] = per_site([v - 0.05 * (3 - r) for v in final], regions)
        if layer_weights:
            w = [1 / 3 + 0.02 * r, 1 / 3, 1 / 3 - 0.02 * r]
            record["layer_weights"] = {
                layer: dict(zip(SITES, np.roll(w, i).tolist(), strict=True)) for i, layer in enumerate(LAYERS)
            }
        if r == 2:
            record["rejected"] = {"site-3": "NaN in model.0.conv.weight"}
        record.update(round_fields(r) if round_fields else {})
        rounds.append(record)
    data = {
        "schema": schema,
        "method": method,
        "task": "segmentation",
        "metric": "dice",
        "seed": seed,
        "sites": SITES,
        "config": config or {},
        "started": "2026-11-22T13:00:00",
        "rounds": rounds,
        "final": {"per_site": per_site(final, regions), **(final_fields or {})} if finished else None,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def table_rows(table):
    rows = [line.strip("|").split("|") for line in table.splitlines() if line.startswith("|")]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows[2:]}, [c.strip() for c in rows[0]]


def is_png(path, min_bytes=10_000):
    data = path.read_bytes()
    return data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > min_bytes


FEDCE_CONTRIBUTIONS = {0: [0.5, 0.4, 0.1], 1: [0.6, 0.3, 0.1]}  # seed -> final contributions; site-3 free rider
FEDAVG_WEIGHTS = [0.5, 0.3, 0.2]  # every round but round 2, where site-3 was rejected: (0.625, 0.375, -)
LOO = {
    "job": "jobs/fedavg",
    "overrides": {"num_rounds": 4},
    "sites": SITES,
    "metric": "dice",
    "full": {"mean": 0.80, "per_site": dict(zip(SITES, [0.80, 0.90, 0.70], strict=True))},
    "without": {"site-1": {"mean": 0.77}, "site-2": {"mean": 0.78}, "site-3": {"mean": 0.81}},
    "marginal": {"site-1": 0.03, "site-2": 0.02, "site-3": -0.01},
}


def fedavg_weights(r):
    return {"weights": dict(zip(SITES, FEDAVG_WEIGHTS, strict=True)) if r != 2 else {"site-1": 0.625, "site-2": 0.375}}


def write_fedce(path, seed, free_riders=("site-3",)):
    """A FedCE (Sum.) run: contributions from round 1 on (round 0 has no leave-one-out model), terms, free riders."""
    final = FEDCE_CONTRIBUTIONS[seed]

    # seed 0 as the sites report free riders today (a training metric), other seeds as older files did (config)
    reported = seed == 0
    train = {s: {"train_loss": 0.5, **({"free_rider": 1.0} if reported and s in free_riders else {})} for s in SITES}

    def fields(r):
        if r == 0:
            return {"weights": dict(zip(SITES, FEDAVG_WEIGHTS, strict=True)), "train": train}
        shares = [1 / 3 + (c - 1 / 3) * r / 3 for c in final]  # from uniform towards the final estimate
        terms = {
            s: {"gradient": 0.4, "data": c, "combined": 0.4 + c, "cosine": 0.9, "error": 0.2}
            for s, c in zip(SITES, final, strict=True)
        }
        return {
            "weights": dict(zip(SITES, shares, strict=True)),
            "contributions": dict(zip(SITES, shares, strict=True)),
            "contribution_terms": terms,
        }

    return write_run(
        path,
        "fedce_sum",
        seed,
        [0.82, 0.91, 0.72],
        config={} if reported else {"free_riders": list(free_riders)},
        round_fields=fields,
        final_fields={
            "contributions": dict(zip(SITES, final, strict=True)),
            "contribution_terms": {
                s: {"gradient": g, "data": d} for s, g, d in zip(SITES, [0.4, 0.4, 0.2], final, strict=True)
            },
        },
    )


def personalised_run(path, seed, scores, held_out=(), method="ditto"):
    """A results.json written by the real ResultsLog: final per-site {site: (dice, global_dice or None)}; the
    held-out sites (the server's exclude_sites) are in config and scored without a global_ copy."""
    from fairfl.results import ResultsLog

    log = ResultsLog(
        str(path), method, "segmentation", "dice", seed, list(scores), {"exclude_sites": list(held_out)}, held_out
    )
    per_site = {
        s: {"dice": d, **({} if g is None else {"global_dice": g}), "personal_model": 1.0}
        for s, (d, g) in scores.items()
    }
    log.add_round(0, 1.0, per_site)
    log.finish(per_site)
    return path


def write_runs(root):
    """Simulator-shaped workspaces under root/runs, one per run of FINAL, plus a Fed-LWR run that never finished;
    returns root/runs."""
    for (method, seed), final in FINAL.items():
        write_run(
            root / "runs" / f"{method}_s{seed}" / "server" / "simulate_job" / "results.json",
            method,
            seed,
            final,
            layer_weights=method == "fedlwr",
        )
    write_run(
        root / "runs" / "fedlwr_s2" / "server" / "simulate_job" / "results.json",
        "fedlwr",
        2,
        [0.5, 0.6, 0.7],
        finished=False,
    )
    return root / "runs"


def write_fedce_runs(runs_dir, loo_file):
    """Into runs_dir: FedAvg with weights and two seeds of FedCE with a free rider; LOO into loo_file. Returns
    runs_dir."""
    write_run(runs_dir / "fedavg_w" / "results.json", "fedavg", 1, [0.80, 0.90, 0.70], round_fields=fedavg_weights)
    for seed in FEDCE_CONTRIBUTIONS:
        write_fedce(runs_dir / f"fedce_s{seed}" / "results.json", seed)
    loo_file.write_text(json.dumps(LOO))
    return runs_dir
