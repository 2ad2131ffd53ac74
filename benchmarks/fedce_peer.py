"""Peer comparison: FedCE through NVFlare's own `FedCERecipe` and through our `jobs/fedce`, side by side.

The same model (the MONAI U-Net of `fairfl.models.build_model`, the same seeded initial weights), the same
built-in data, rounds and seeds, the same local training and evaluation code (fairfl's), both run by the
NVFlare simulator with one client process per site. Per seed both sides run back to back, alternating which
goes first. Recorded: the simulator's wall time (and each round's), the aggregation weights of every round
and of the last one with their Pearson correlation, and the final per-site test Dice.

    python benchmarks/fedce_peer.py --rounds 20 --seeds 0 1 2 --sites 6 --mode sum --out benchmarks/results/fedce_peer

Resumable: a side whose run finished (OUT/runs/<side>-seed<N>.json says so) is not run again. Workspaces go to
OUT/runs/ (not committed); summary.json and SUMMARY.md to OUT.
NVFlare side: `benchmarks/nvflare_fedce_client.py` (client script and a server-side weight recorder).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: inherited by every simulator process

import torch  # noqa: E402

from fairfl.data.builtin import ensure_builtin  # noqa: E402
from fairfl.fairness import contribution_agreement  # noqa: E402
from fairfl.jobconfig import customize_job  # noqa: E402
from fairfl.models import build_model, initial_state, state_to_torch  # noqa: E402
from fairfl.report.runs import load_runs  # noqa: E402
from fairfl.report.site_tables import paper_table  # noqa: E402
from fairfl.results import ResultsLog, site_key  # noqa: E402
from fairfl.simulate import SIMULATOR_OUTPUT, SimulatorRun, collect_errors, run_simulator  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from fairness import versions, write_summary  # noqa: E402  (benchmarks/fairness.py)
from nvflare_fedce_client import ROUNDS_FILE, SITE_LOG, FedCERoundRecorder, model_spec  # noqa: E402

CLIENT_SCRIPT = os.path.join(HERE, "nvflare_fedce_client.py")
NVFLARE_MODE = {"sum": "plus", "product": "times"}  # our `combine` -> FedCERecipe's `fedce_mode`
SIDES = ("fairfl", "nvflare")
FINAL_MODEL = "SRV_FL_global_model.pt"  # the final global model in NVFlare's cross_val_results.json


# ---------------------------------------------------------------- the two sides


def run_fairfl(seed, args, run_dir) -> dict:
    """jobs/fedce through `nvflare simulator`; returns {"seconds", "results"} (results.json in our schema)."""
    job_args = {
        "num_rounds": args.rounds,
        "eval_every": args.rounds,
        "seed": seed,
        "combine": args.mode,
        "dataset": args.dataset,
        "model_channels": list(args.channels),
        "model_strides": list(args.strides),
        "image_size": args.image_size,
        "synthetic_size_scale": args.size_scale,
    }
    job = customize_job(os.path.join(REPO, "jobs", "fedce"), run_dir + "_job", job_args)
    run = run_simulator(job, run_dir, n_clients=args.sites)
    if not run.ok:
        raise RuntimeError(f"jobs/fedce seed {seed} failed:\n{run.describe_failure()}")
    return {"seconds": run.seconds, "results": run.results_path}


def unet_config(model) -> dict:
    """FedCERecipe's dict form of a MONAI U-Net built by fairfl.models.build_model.

    Passing the nn.Module itself does not work with the MONAI U-Net in NVFlare 2.9: the Job API re-creates the
    model on the server from the attributes named like its constructor's arguments, and UNet keeps
    `spatial_dims` as `dimensions` (the server would fail to build it), and it copies the source of every module
    the model's module imports (monai, torch, sympy, ...: over a thousand files) into the job's custom folder.
    Either form re-creates the model on the server, so the seeded initial weights go in as `initial_ckpt`."""
    names = ("in_channels", "out_channels", "channels", "strides", "num_res_units", "norm")
    args = {
        "spatial_dims": model.dimensions,
        **{k: list(v) if isinstance(v, tuple) else v for k, v in ((k, getattr(model, k)) for k in names)},
    }
    return {"class_path": f"{type(model).__module__}.{type(model).__name__}", "args": args}


def run_nvflare(seed, args, run_dir) -> dict:
    """FedCERecipe + SimEnv; returns {"seconds", "results"}, the run converted into our results schema."""
    from nvflare.app_opt.pt.recipes import FedCERecipe
    from nvflare.recipe.utils import add_final_global_evaluation

    if os.path.exists(run_dir):
        shutil.rmtree(run_dir)
    os.makedirs(run_dir)
    spec = model_spec(args.dataset, args.channels, args.strides)
    model = build_model(spec)
    model.load_state_dict(state_to_torch(initial_state(spec, seed)))  # exactly our controller's initial model
    checkpoint = os.path.join(run_dir, "initial_model.pt")
    torch.save(model.state_dict(), checkpoint)
    # relative: bundled into the server app (an absolute path would also be listed as a model to evaluate by the
    # final evaluation, costing NVFlare a second validation per site)
    checkpoint = os.path.relpath(checkpoint)
    state_dir = os.path.join(run_dir, "sites")
    train_args = [
        "--state-dir",
        state_dir,
        "--dataset",
        args.dataset,
        "--channels",
        *args.channels,
        "--strides",
        *args.strides,
        "--image-size",
        args.image_size,
        "--data-seed",
        args.data_seed,
        "--num-sites",
        max(6, args.sites),
        "--size-scale",
        args.size_scale,
        "--seed",
        seed,
    ]
    recipe = FedCERecipe(
        name="fedce",
        model=unet_config(model),
        initial_ckpt=checkpoint,
        trainable_param_names=[n for n, p in model.named_parameters() if p.requires_grad],
        min_clients=args.sites,
        num_rounds=args.rounds,
        train_script=CLIENT_SCRIPT,
        train_args=" ".join(map(str, train_args)),
        fedce_mode=NVFLARE_MODE[args.mode],
        key_metric="dice",
    )
    add_final_global_evaluation(recipe)  # NVFlare's own final evaluation: CrossSiteModelEval, global model only
    # the recipe has no public hook for a server component; NVFlare's recipe utilities use _job the same way
    recipe._job.to_server(FedCERoundRecorder(), id="fedce_round_recorder")
    run, run_file = run_recipe(recipe, args.sites, run_dir, f"FedCERecipe seed {seed}")
    return {"seconds": run.seconds, "results": nvflare_results(seed, args, run_dir, run.workspace, run_file)}


def run_recipe(recipe, sites: int, run_dir: str, what: str) -> tuple[SimulatorRun, str]:
    """Run an NVFlare recipe (with a FedCERoundRecorder on its server) in SimEnv with `sites` sites under `run_dir`,
    its output to a file as run_simulator's; (the run, the recorder's rounds file). A failed run, or one whose recorder
    wrote nothing, is a RuntimeError naming `what`."""
    from nvflare.recipe import SimEnv

    env = SimEnv(num_clients=sites, workspace_root=run_dir)
    started = time.time()
    try:
        with redirected_output(os.path.join(run_dir, SIMULATOR_OUTPUT)):  # as run_simulator: output to a file
            recipe.run(env)
        failure = None
    except RuntimeError as e:  # SimEnv raises on a non-zero simulator exit code
        failure = str(e)
    workspace = os.path.join(run_dir, recipe.name)
    run = SimulatorRun(workspace, 0 if failure is None else 1, time.time() - started, collect_errors(workspace))
    rounds_file = os.path.join(workspace, "server", "simulate_job", ROUNDS_FILE)
    if failure or run.errors or not os.path.exists(rounds_file):
        raise RuntimeError(f"{what} failed: {failure or ''}\n{run.describe_failure()}")
    return run, rounds_file


@contextlib.contextmanager
def redirected_output(path):
    """Send this process's stdout and stderr (and so its subprocesses') to a file for the duration."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(path, "w") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in zip((1, 2), saved, strict=True):
                os.dup2(copy, fd)
                os.close(copy)


def nvflare_results(seed, args, run_dir, workspace, rounds_file) -> str:
    """The NVFlare run in our results schema (method nvflare_fedce_<mode>): per-round weights and seconds from
    the server recorder, per-site train loss and leave-one-out Dice from the site logs, final Dice from the
    sites' answers to the final evaluation."""
    rounds = json.loads(Path(rounds_file).read_text())
    sites = sorted(os.listdir(os.path.join(run_dir, "sites")), key=site_key)
    logs = {s: json.loads(Path(run_dir, "sites", s, SITE_LOG).read_text()) for s in sites}
    evaluation = json.loads(Path(os.path.dirname(rounds_file), "cross_site_val", "cross_val_results.json").read_text())
    final = {s: evaluation.get(s, {}).get(FINAL_MODEL) for s in sites}
    missing = [s for s in sites if not final[s]]
    if missing or len(rounds) != args.rounds:
        raise RuntimeError(f"NVFlare run incomplete: {len(rounds)} of {args.rounds} rounds; no final Dice at {missing}")
    log = ResultsLog(
        os.path.join(run_dir, "results.json"),
        method=f"nvflare_fedce_{args.mode}",
        task="segmentation",
        metric="dice",
        seed=seed,
        sites=sites,
        config={
            "recipe": "nvflare.app_opt.pt.recipes.FedCERecipe",
            "fedce_mode": NVFLARE_MODE[args.mode],
            "num_rounds": args.rounds,
            "image_size": args.image_size,
            "model_spec": model_spec(args.dataset, args.channels, args.strides),
            "workspace": workspace,
        },
    )
    for record in rounds:
        k = record["round"]
        site_rounds = {s: next(r for r in logs[s]["rounds"] if r["round"] == k) for s in sites}
        log.add_round(
            k,
            record["seconds"],
            weights=record["weights"],
            contributions=record["weights"],
            train={s: {"train_loss": r["train_loss"]} for s, r in site_rounds.items()},
            leave_one_out={
                s: {
                    "dice": r["minus_dice"],
                    "score_sent": r["minus_score_sent"],
                    "weight_received": r["weight_received"],
                }
                for s, r in site_rounds.items()
            },
        )
    log.finish({s: {"dice": final[s]["dice"]} for s in sites}, contributions=rounds[-1]["weights"])
    return log.path


def run_side(side, seed, args) -> dict:
    """Run one side for one seed unless done before; return its run.json data."""
    run_dir = os.path.join(args.out, "runs", f"{side}-seed{seed}")
    info_path = run_dir + ".json"
    if os.path.exists(info_path):
        info = json.loads(Path(info_path).read_text())
        if info.get("ok") and os.path.exists(info["results"]):
            print(f"  {side} seed {seed}: done before ({info['seconds']:.0f} s), kept", flush=True)
            return info
    print(f"  {side} seed {seed}: running", flush=True)
    run = run_fairfl if side == "fairfl" else run_nvflare
    info = {"side": side, "seed": seed, "ok": True, **run(seed, args, run_dir)}
    with open(info_path, "w") as f:
        json.dump(info, f, indent=1)
    print(f"  {side} seed {seed}: {info['seconds']:.0f} s", flush=True)
    return info


# ---------------------------------------------------------------- comparison


def middle_rounds(results) -> list:
    """Seconds of the rounds without process start-up (round 0) and without the final evaluation (last round);
    all rounds when there are fewer than 3."""
    rounds = results["rounds"]
    return [r["seconds"] for r in (rounds[1:-1] if len(rounds) > 2 else rounds)]


def agreement(a: dict, b: dict) -> dict:
    """Pearson, cosine and Euclidean distance of two weight vectors over the same sites."""
    values = contribution_agreement(a, b)
    return {k: values[k] for k in ("pearson", "cosine", "euclidean", "note")}


def compare_seed(seed, infos) -> dict:
    ours, theirs = (json.loads(Path(infos[side]["results"]).read_text()) for side in SIDES)
    sites = ours["sites"]
    per_round = []
    for a, b in zip(ours["rounds"], theirs["rounds"], strict=False):  # the rounds both runs reached
        if a.get("weights") and b.get("weights"):
            per_round.append({"round": a["round"], **agreement(a["weights"], b["weights"])})
    round0_loss = {
        s: (ours["rounds"][0]["train"][s]["train_loss"], theirs["rounds"][0]["train"][s]["train_loss"]) for s in sites
    }
    return {
        "seed": seed,
        "first": infos["first"],
        "wall_seconds": {side: infos[side]["seconds"] for side in SIDES},
        "wall_ratio": infos["fairfl"]["seconds"] / infos["nvflare"]["seconds"],
        "round_seconds_median": {
            "fairfl": statistics.median(middle_rounds(ours)),
            "nvflare": statistics.median(middle_rounds(theirs)),
        },
        "final_weights": {"fairfl": ours["final"]["contributions"], "nvflare": theirs["final"]["contributions"]},
        "final_weights_agreement": agreement(ours["final"]["contributions"], theirs["final"]["contributions"]),
        "round_weights": {
            "fairfl": [r.get("weights") for r in ours["rounds"]],
            "nvflare": [r.get("weights") for r in theirs["rounds"]],
        },
        "round_weights_agreement": per_round,
        "dice": {
            "fairfl": {s: ours["final"]["per_site"][s]["dice"] for s in sites},
            "nvflare": {s: theirs["final"]["per_site"][s]["dice"] for s in sites},
        },
        "round0_train_loss_max_abs_diff": max(abs(a - b) for a, b in round0_loss.values()),
        "results": {side: infos[side]["results"] for side in SIDES},
    }


def mean_sd(values) -> tuple[float, float]:
    values = list(values)
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def summarize_runs(args, per_seed) -> dict:
    sites = sorted(per_seed[0]["dice"]["fairfl"], key=site_key)
    mean_weights = {
        side: {s: statistics.mean(p["final_weights"][side][s] for p in per_seed) for s in sites} for side in SIDES
    }
    return {
        "command": args.command,
        "versions": versions(),
        "rounds": args.rounds,
        "seeds": args.seeds,
        "sites": args.sites,
        "dataset": args.dataset,
        "mode": {"fairfl": args.mode, "nvflare": NVFLARE_MODE[args.mode]},
        "image_size": args.image_size,
        "channels": args.channels,
        "strides": args.strides,
        "wall_ratio_median": statistics.median(p["wall_ratio"] for p in per_seed),
        "round_ratio_median": statistics.median(
            p["round_seconds_median"]["fairfl"] / p["round_seconds_median"]["nvflare"] for p in per_seed
        ),
        "final_weights_mean": mean_weights,
        "final_weights_mean_agreement": agreement(mean_weights["fairfl"], mean_weights["nvflare"]),
        "final_weights_pearson_per_seed": [p["final_weights_agreement"]["pearson"] for p in per_seed],
        "per_seed": per_seed,
    }


def summary_markdown(summary, table) -> str:
    per_seed = summary["per_seed"]
    sites = list(summary["final_weights_mean"]["fairfl"])
    fmt = lambda v: "–" if v is None or v != v else f"{v:.4f}"  # noqa: E731
    lines = [
        "# FedCE peer comparison: NVFlare's FedCERecipe vs jobs/fedce",
        "",
        f"`{summary['command']}` — {summary['sites']} sites of built-in {summary['dataset']} data, "
        f"{summary['rounds']} rounds, seeds {summary['seeds']}, combine `{summary['mode']['fairfl']}` "
        f'(NVFlare `fedce_mode="{summary["mode"]["nvflare"]}"`), images {summary["image_size"]}², U-Net '
        f"channels {summary['channels']} strides {summary['strides']}; {summary['versions']}.",
        "",
        "## Wall time (whole simulator run, seconds)",
        "",
        "| seed | first | jobs/fedce | FedCERecipe | ratio ours/NVFlare | median round, ours | median round, NVFlare |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for p in per_seed:
        lines.append(
            f"| {p['seed']} | {p['first']} | {p['wall_seconds']['fairfl']:.1f} "
            f"| {p['wall_seconds']['nvflare']:.1f} "
            f"| {p['wall_ratio']:.3f} | {p['round_seconds_median']['fairfl']:.2f} "
            f"| {p['round_seconds_median']['nvflare']:.2f} |"
        )
    lines += [
        "",
        f"**Median wall-time ratio ours/NVFlare: {summary['wall_ratio_median']:.3f}** (target <= 1.0); "
        f"median per-round ratio {summary['round_ratio_median']:.3f} (rounds 1..R-2: no process start-up, "
        f"no final evaluation). "
        "Single runs on a machine that other processes may share at the same time: the per-seed ratios show "
        "the spread.",
        "",
        "## Final test Dice (%)",
        "",
        "FedCE (Sum.) / FedCE (Multi.): jobs/fedce; nvflare_fedce_sum / nvflare_fedce_product: FedCERecipe. "
        "Mean ± sd over seeds; Std.: population std across sites, mean over seeds.",
        "",
        table,
        "",
        "## Aggregation weights of the last round",
        "",
        "Mean over seeds. Ours: `final.contributions` (Eq. 5 after the last round = the last aggregation's "
        "weights); NVFlare: `fedce_coef` of the last aggregation, recorded on the server "
        "(`FedCERoundRecorder`; no client ever receives it).",
        "",
        "| | " + " | ".join(sites) + " |",
        "|---|" + "---:|" * len(sites),
    ]
    for side, name in (("fairfl", "jobs/fedce"), ("nvflare", "FedCERecipe")):
        lines.append(f"| {name} | " + " | ".join(f"{summary['final_weights_mean'][side][s]:.3f}" for s in sites) + " |")
    mean_agreement = summary["final_weights_mean_agreement"]
    lines += [
        "",
        f"Pearson correlation of the mean weights: **{fmt(mean_agreement['pearson'])}** "
        f"(cosine {fmt(mean_agreement['cosine'])}, Euclidean distance {fmt(mean_agreement['euclidean'])}); "
        f"per seed: {', '.join(fmt(v) for v in summary['final_weights_pearson_per_seed'])}.",
        "",
        "Per seed, and the correlation of each round's weights (rounds 0, 1, ..., R-1):",
        "",
    ]
    for p in per_seed:
        lines += [
            f"- seed {p['seed']}: ours "
            + ", ".join(f"{p['final_weights']['fairfl'][s]:.3f}" for s in sites)
            + "; NVFlare "
            + ", ".join(f"{p['final_weights']['nvflare'][s]:.3f}" for s in sites)
            + "; Pearson per round: "
            + " ".join(fmt(r["pearson"]) for r in p["round_weights_agreement"])
            + f"; round-0 train loss max |diff| {p['round0_train_loss_max_abs_diff']:.2e}"
        ]
    lines += ["", DIFFERENCES]
    return "\n".join(lines) + "\n"


DIFFERENCES = """## What differs between the two

Same for both: the U-Net and its seeded initial weights (NVFlare gets them as `initial_ckpt`), the built-in data
(the same `synthetic_size_scale`), the loaders, Adam lr 1e-3 / weight decay 1e-4 / batch 8 / one local epoch,
per-site-and-round seeds, the leave-one-out model (`PTFedCEHelper.make_minus_model` with the site's weight in
the global model it received and its previous local model, kept on disk) validated on the site's validation
split, one torch thread per client, one simulator process per site, the final global model evaluated by every
site on its test split. The round-0 local training is identical (train losses above).

Method (what makes the weights differ):
- **Accumulation.** Ours follows the paper (Eq. 4-5): every round each raw term is normalised over the sites,
  the two are combined (sum or product), the combined terms are summed over rounds and normalised into the
  weights. NVFlare's `FedCEModelAggregator` keeps a running mean of each site's raw cosine similarity
  (server), the client script sends the running mean of its leave-one-out error (NVFlare's FedCE example:
  `1 - mean(minus Dice over rounds 0..k)`), and every round the two running means are normalised, combined and
  normalised into the weights, with no sum of combined terms over rounds. For the sum the two orders give
  different weights; for the product, the product of means is not the mean of products.
- **Round 0.** Ours: no site has a previous local model, so round 0 is a FedAvg round (weights by training-set
  size) and contributions accumulate from round 1. NVFlare: FedCE weights from round 0, with a uniform prior
  (1/N) for the cosine and every site's error counted as 1 (Dice 0) — which then stays in the running mean of
  the error for the whole run, damping the data term.
- **Gradient term details.** NVFlare clips 1 - mean cosine at 0, floors every normalised value at 1e-6 and
  computes the cosine in float32; ours computes it in float64, gives a zero update the term 0 and an update
  whose complement is zero the term 1, and has no floor.
- **Data term.** Ours sends 1 - Dice of this round's leave-one-out model (clamped to [0, 1]); a site with
  (almost) all the weight reports error 1 without evaluating.

Framework path (what makes the times differ):
- Transfer: NVFlare sends PyTorch tensors and the sites return weight DIFFs (the aggregate DIFF is added to
  the global model); ours sends and returns full weights as numpy arrays and averages them. The same model with
  weights summing to 1, up to floating point.
- Workflow: NVFlare's `FedAvg` controller hands each result to the aggregator as it arrives and persists the
  global model every round (`PTFileModelPersistor`); ours waits for all results, screens each one (NaN/Inf,
  missing or mis-shaped tensors are rejected, not fatal) and writes results.json and TensorBoard every round.
- Client: NVFlare runs the Client API script in-process (`ClientAPIExecutor`, `execution_mode` in_process:
  the script starts once per client process and loops over the tasks it receives); ours is an `Executor`
  called per task. Both keep the previous local model on disk.
- Final evaluation: NVFlare's `add_final_global_evaluation` (a `CrossSiteModelEval` workflow that sends the
  persisted global model to every site); ours the `validate` task of the last round (`eval_every` = rounds).
- Our job's simulator is started with `nvflare simulator` (fairfl.simulate), NVFlare's by `SimEnv` (python -m
  nvflare.private.fed.app.simulator.simulator); both time the whole subprocess.
"""


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--sites", type=int, default=6)
    parser.add_argument(
        "--mode",
        choices=list(NVFLARE_MODE),
        default="sum",
        help="our combine; NVFlare's fedce_mode is plus (sum) or times (product)",
    )
    parser.add_argument("--dataset", default="prostate")
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--size-scale", type=float, default=2.0, help="synthetic_size_scale (our jobs' default)")
    parser.add_argument("--channels", type=int, nargs="+", default=[16, 32, 64, 128])
    parser.add_argument("--strides", type=int, nargs="+", default=[2, 2, 2])
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES), help="run only these sides")
    parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "fedce_peer"))
    args = parser.parse_args(argv)
    args.out = os.path.abspath(args.out)
    args.command = " ".join(["python", "benchmarks/fedce_peer.py"] + (argv if argv is not None else sys.argv[1:]))
    os.makedirs(os.path.join(args.out, "runs"), exist_ok=True)
    # generate the built-in data now, so that neither side's time includes it
    ensure_builtin(
        args.dataset, args.image_size, seed=args.data_seed, num_sites=max(6, args.sites), size_scale=args.size_scale
    )

    infos = {}
    for seed in args.seeds:
        order = list(SIDES) if seed % 2 == 0 else list(reversed(SIDES))  # alternate who goes first
        infos[seed] = {"first": order[0]}
        for side in order:
            if side in args.sides:
                infos[seed][side] = run_side(side, seed, args)
    complete = [s for s in args.seeds if all(side in infos[s] for side in SIDES)]
    if not complete:
        print("one side only: no comparison written")
        return
    per_seed = [compare_seed(seed, infos[seed]) for seed in complete]
    summary = summarize_runs(args, per_seed)
    table = paper_table(load_runs([p["results"][side] for p in per_seed for side in SIDES]))
    write_summary(args.out, summary, summary_markdown(summary, table))


if __name__ == "__main__":
    main()
