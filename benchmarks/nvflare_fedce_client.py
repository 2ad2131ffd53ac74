"""NVFlare's own FedCE path of the peer benchmark (`benchmarks/fedce_peer.py`).

Two pieces that `FedCERecipe` runs:

- the Client API training script every site runs (`python nvflare_fedce_client.py --state-dir ...` as the
  recipe's `train_script`), built from the same fairfl pieces as our `FairflExecutor` (built-in data,
  datalist, MONAI loaders, `train_local`, `evaluate_dice`, per-site seeds), so the framework path is the only
  difference. It follows NVFlare's FedCE research example (`research/fed-ce/jobs/fedce_prostate/client.py`):
  before training it validates the leave-one-out ("minus") model
  `PTFedCEHelper.make_minus_model(global, previous local model, own weight)` on the site's validation split and
  sends `fedce_minus_val = 1 - mean(minus Dice of rounds 0..k)`, round 0 counting as Dice 0 (no previous local
  model yet); the error, since the aggregator reads larger values as larger contributions. It returns the
  weight DIFF, and answers the final `validate` task (`add_final_global_evaluation`) with the global model's
  Dice on the site's test split.
- `FedCERoundRecorder`, a server component that records, after each aggregation, the weights
  `FedCEModelAggregator` used (the new global model's meta `fedce_coef`) and the round's time. The last
  round's weights never reach a client (no train task follows), so they are read here.

A site keeps its trained model and a per-round log on disk (`<state dir>/<site>/`), not in memory, so a
restarted client process (simulator `-t` < `-n`) still has its previous local model. The module imports
only NVFlare and the standard library at the top: the server imports it for the recorder.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from nvflare.apis.event_type import EventType
from nvflare.apis.fl_component import FLComponent
from nvflare.app_common.app_constant import AppConstants
from nvflare.app_common.app_event_type import AppEventType
from nvflare.app_opt.pt.fedce import FedCEConstants

ROUNDS_FILE = "fedce_rounds.json"  # in the server's run directory
SITE_LOG = "fedce_site.json"  # in <state dir>/<site>/
LOCAL_MODEL = "local_model.pt"


def write_json(path: str, data) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


class FedCERoundRecorder(FLComponent):
    """Server side: `[{"round", "started", "aggregated", "seconds", "weights"}, ...]` into
    `<run dir>/fedce_rounds.json`.

    `seconds` runs from the round's start (ROUND_STARTED) to the end of its aggregation (AFTER_AGGREGATION):
    sending the model, local work at the sites, answers, aggregation."""

    def __init__(self):
        super().__init__()
        self._rounds = []
        self._started = None

    def handle_event(self, event_type: str, fl_ctx):
        if event_type == AppEventType.ROUND_STARTED:
            self._started = time.time()
        elif event_type == AppEventType.AFTER_AGGREGATION:
            result = fl_ctx.get_prop(AppConstants.AGGREGATION_RESULT)
            weights = dict(sorted(((result.meta or {}).get(FedCEConstants.CONTRIBUTION_WEIGHTS) or {}).items()))
            now = time.time()
            self._rounds.append(
                {
                    "round": fl_ctx.get_prop(AppConstants.CURRENT_ROUND),
                    "started": self._started,
                    "aggregated": now,
                    "seconds": now - self._started,
                    "weights": weights,
                }
            )
            run_dir = fl_ctx.get_engine().get_workspace().get_run_dir(fl_ctx.get_job_id())
            write_json(os.path.join(run_dir, ROUNDS_FILE), self._rounds)
        elif event_type == EventType.END_RUN and not self._rounds:
            self.log_error(fl_ctx, "FedCERoundRecorder saw no aggregation")


# ---------------------------------------------------------------- the site's training script


def model_spec(dataset: str, channels, strides) -> dict:
    """The U-Net spec our FedCEController sends its sites (FairRoundController.model_spec)."""
    from fairfl.data.builtin import builtin_dataset

    info = builtin_dataset(dataset)
    return {
        "name": "unet",
        "in_channels": info.in_channels,
        "num_classes": info.num_classes,
        "channels": list(channels),
        "strides": list(strides),
    }


def parse_args(argv=None):
    """The recipe's train_args reach the script split at whitespace with quotes kept: no argument may hold
    a space or a quote."""
    parser = argparse.ArgumentParser(description="FedCE site script for NVFlare's FedCERecipe (Client API)")
    parser.add_argument("--state-dir", required=True, help="the site keeps <state-dir>/<site>/ (local model, log)")
    parser.add_argument("--dataset", default="prostate", help="fairfl built-in dataset")
    parser.add_argument("--channels", type=int, nargs="+", default=[16, 32, 64, 128], help="U-Net channels")
    parser.add_argument("--strides", type=int, nargs="+", default=[2, 2, 2], help="U-Net strides")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--num-sites", type=int, default=6, help="sites of the built-in data (at least 6)")
    parser.add_argument("--size-scale", type=float, default=2.0, help="synthetic_size_scale of our jobs")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--weight-decay", type=float, default=1e-4)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0, help="base seed; per site and round as our executor")
    parser.add_argument("--num-threads", type=int, default=1)
    parser.add_argument("--device", default="auto")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # no effect once torch is loaded; the driver sets it too
    import nvflare.client as flare
    import torch
    from nvflare.apis.fl_constant import FLMetaKey
    from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
    from nvflare.app_opt.pt.fedce import PTFedCEHelper

    from fairfl.data.builtin import ensure_builtin
    from fairfl.data.datalist import load_datalist
    from fairfl.data.loaders import make_loader
    from fairfl.models import build_model
    from fairfl.training import (
        TrainSettings,
        configure_threads,
        evaluate_dice,
        save_model,
        seed_everything,
        select_device,
        site_seed,
        train_local,
    )

    flare.init()
    site = flare.get_site_name()
    configure_threads(args.num_threads)
    device = select_device(args.device)
    spec = model_spec(args.dataset, args.channels, args.strides)
    num_classes = spec["num_classes"]
    root = ensure_builtin(
        args.dataset, args.image_size, seed=args.data_seed, num_sites=args.num_sites, size_scale=args.size_scale
    )
    datalist = load_datalist(root, site, num_classes=num_classes)
    loaders = {
        split: make_loader(
            datalist[split],
            image_size=args.image_size,
            num_classes=num_classes,
            batch_size=args.batch_size,
            train=split == "training",
            seed=args.seed,
            in_channels=spec["in_channels"],
        )
        for split in ("training", "validation", "testing")
    }
    settings = TrainSettings(
        lr=args.lr, weight_decay=args.weight_decay, batch_size=args.batch_size, local_epochs=args.local_epochs
    )
    state_dir = os.path.join(args.state_dir, site)
    os.makedirs(state_dir, exist_ok=True)
    log_path, local_path = os.path.join(state_dir, SITE_LOG), os.path.join(state_dir, LOCAL_MODEL)
    log = (
        json.loads(Path(log_path).read_text())
        if os.path.exists(log_path)
        else {"site": site, "rounds": [], "final": None}
    )

    def dice(model, split) -> float:
        value = evaluate_dice(model, loaders[split], num_classes, device)["dice"]
        if value != value:
            raise RuntimeError(f"{site}: Dice on {split} is NaN (no foreground in the split)")
        return value

    while flare.is_running():
        task = flare.receive()
        if task is None:
            break
        started = time.time()
        current_round = task.current_round or 0
        if flare.is_evaluate():  # the final global model, sent by add_final_global_evaluation's CrossSiteModelEval
            model = build_model(spec)
            model.load_state_dict(task.params)
            log["final"] = {"dice": dice(model, "testing"), "seconds": time.time() - started}
            write_json(log_path, log)
            flare.send(FLModel(metrics={"dice": log["final"]["dice"]}))
            continue
        if not flare.is_train():
            raise RuntimeError(f"{site}: unexpected task {flare.get_task_name()!r}")

        # as FairflExecutor._train: one seed per site and round, set before the model is built
        seed = site_seed(args.seed, site) + current_round
        seed_everything(seed)
        model = build_model(spec)
        model.load_state_dict(task.params)
        initial = {name: value.detach().clone() for name, value in model.state_dict().items()}

        weight = PTFedCEHelper.get_contribution_weight(task, site)
        if current_round == 0:
            minus_dice = None  # no previous local model: NVFlare's example counts this round as Dice 0
        elif not os.path.exists(local_path):
            raise RuntimeError(f"{site}: round {current_round} but no local model from the previous round")
        else:
            previous = torch.load(local_path, map_location="cpu", weights_only=True)
            minus_dice = dice(PTFedCEHelper.make_minus_model(model, previous, weight), "validation")
        history = [r["minus_dice"] or 0.0 for r in log["rounds"] if r["round"] < current_round] + [minus_dice or 0.0]
        score = 1.0 - sum(history) / len(history)

        loader = loaders["training"]  # re-seeded per round exactly as FairflExecutor._loader does
        loader.generator.manual_seed(seed)
        loader.dataset.transform.set_random_state(seed=seed % (2**32))
        stats = train_local(model, loader, settings, device)
        save_model(model, local_path)
        trained = model.state_dict()
        diff = {
            name: (value.detach().cpu() - initial[name].cpu())
            if value.is_floating_point()
            else torch.zeros_like(value, device="cpu")
            for name, value in trained.items()
        }
        result = FLModel(
            params=diff,
            params_type=ParamsType.DIFF,
            metrics={"train_loss": stats["train_loss"]},
            meta={FLMetaKey.NUM_STEPS_CURRENT_ROUND: stats["steps"]},
        )
        PTFedCEHelper.set_minus_model_score(result, score)
        log["rounds"] = [r for r in log["rounds"] if r["round"] != current_round] + [
            {
                "round": current_round,
                "weight_received": weight,
                "minus_dice": minus_dice,
                "minus_score_sent": score,
                "train_loss": stats["train_loss"],
                "steps": stats["steps"],
                "seconds": time.time() - started,
            }
        ]
        write_json(log_path, log)
        flare.send(result)


if __name__ == "__main__":
    main()
