"""fairfl's site training without fairfl's server: the one copy that the cost benchmark's floor and NVFlare's own FedAvg
(`benchmarks/cost.py`) share.

- `FedAvgSites`: the sites of one process as jobs/fedavg trains them. jobs/fedavg's controller arguments (on the
  dataset asked for) give the task meta a train task carries and the initial model, its executor arguments the
  executors, and a round at a site is the executor's own train step (`FairflExecutor._train`: same data, loaders,
  model, optimiser, loss and per-site-and-round seeds as in a run). `work` is what a round's training costs a site
  (optimiser steps and images), read from the datalist the executor loads and its train settings.
- `main`: the Client API script every site runs under NVFlare's `FedAvgRecipe` (its `train_script`): it receives the
  global model, trains it with `FedAvgSites.train` for its own site and returns what the executor returns (the
  weight DIFF and NVFlare's NUM_STEPS_CURRENT_ROUND, by which NVFlare's FedAvg weighs the sites; fairfl's FedAvg
  weighs them by training samples). The PyTorch Client API hands the script tensors and converts the tensors it
  sends back to NumPy for the server (the recipe's default exchange format), so the script converts the executor's
  NumPy arrays to tensors and back without copying.

Only the standard library is imported at the top: benchmarks/cost.py imports this module for `job_args` and the
floor without loading torch first.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

SERVER_CONFIG = "config_fed_server.json"  # fairfl.jobconfig's names, not imported here: torch-free at the top
CLIENT_CONFIG = "config_fed_client.json"
SITE_LOG = "fedavg_site.json"  # in <state dir>/<site>/: the rounds this site trained


def job_args(jobs_dir: str, job: str) -> tuple[dict, dict]:
    """The server controller's and the site executor's arguments of `jobs_dir`/`job`."""
    config = Path(jobs_dir, job, "app", "config")
    server = json.loads((config / SERVER_CONFIG).read_text())["workflows"][0]["args"]
    client = json.loads((config / CLIENT_CONFIG).read_text())["executors"][0]["executor"]["args"]
    return server, client


def job_intervals(jobs_dir: str, job: str = "fedavg") -> dict:
    """The task intervals of `job`: the server's `task_request_interval` (NVFlare's default 2 s where the job sets
    none) and its controller's `task_check_period`."""
    config = json.loads(Path(jobs_dir, job, "app", "config", SERVER_CONFIG).read_text())
    return {
        "task_request_interval": config.get("server", {}).get("task_request_interval", 2.0),
        "task_check_period": config["workflows"][0]["args"]["task_check_period"],
    }


def steps_per_round(images: int, batch_size: int, local_epochs: int, local_steps: int) -> int:
    """The optimiser steps `fairfl.training.train_local` takes in a round over `images` training images (a loader
    that keeps the last, smaller batch): `local_steps` when set, else `local_epochs` passes of ceil(images / batch)."""
    if local_steps > 0:
        return local_steps
    return local_epochs * math.ceil(images / batch_size)


class FedAvgSites:
    """`sites`, trained as jobs/fedavg trains them on `dataset` with `num_sites` sites in the run."""

    def __init__(self, jobs_dir: str, dataset: str, num_sites: int, sites: list[str]):
        from fairfl.flare import protocol
        from fairfl.flare.executor import FairflExecutor
        from fairfl.methods.fedavg.controller import FedAvgController
        from fairfl.presets import apply_preset
        from fairfl.training import configure_threads

        server, client = job_args(jobs_dir, "fedavg")
        controller = FedAvgController(**{**server, "dataset": dataset})
        controller.settings = controller.settings.with_preset()
        self.controller = controller
        # what the controller's train task carries (FairRoundController._train_round), FedAvg's start: the model sent
        self.meta = {
            **controller.common_task_meta([f"site-{k + 1}" for k in range(num_sites)]),
            protocol.START_FROM: controller.start_from,
            protocol.SEND_PARAMS: controller.start_from == protocol.FROM_GLOBAL,
        }
        self.executors = {site: FairflExecutor(**client) for site in sites}
        for executor in self.executors.values():  # what the executor does on every task before its handler
            apply_preset(executor, executor.preset, controller.task)
        configure_threads(client["num_threads"])

    def model_spec(self) -> dict:
        return self.controller.model_spec()

    def initial_params(self) -> dict:
        """The run's initial global model (the controller's), as NumPy arrays: what round 0 sends."""
        import torch

        from fairfl.models import initial_state

        state = initial_state(self.model_spec(), self.controller.settings.seed)
        return {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in state.items()}

    def task(self, site: str, params: dict, round_num: int):
        """The train task of `round_num` with `params` (NumPy arrays), as the executor reads it."""
        from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

        from fairfl.flare.site_task import SiteTask

        meta = {**self.meta, **self.controller.train_meta(round_num)}
        return SiteTask.of(
            site, FLModel(params_type=ParamsType.FULL, params=params, current_round=round_num, meta=meta)
        )

    def train(self, site: str, params: dict, round_num: int, state_dir: str):
        """One round of `site`'s local training from `params`: the executor's FLModel answer (weight DIFF)."""
        return self.executors[site]._train(self.task(site, params, round_num), state_dir)

    def work(self, site: str) -> dict:
        """What a round's training costs `site`: {"steps": optimiser steps, "images": training images} (2-D data:
        one image a sample)."""
        executor = self.executors[site]
        task = self.task(site, {}, 0)
        images = len(executor._load_datalist(task)["training"])
        settings = executor._train_settings(task)
        steps = steps_per_round(images, settings.batch_size, settings.local_epochs, settings.local_steps)
        return {"steps": steps, "images": images}


# ---------------------------------------------------------------- NVFlare's FedAvgRecipe: the server's model


def network(**spec):
    """The network a fairfl model spec describes (`fairfl.models.build_model`): what NVFlare's server builds for
    FedAvgRecipe's model config (`model_config`)."""
    from fairfl.models import build_model

    return build_model(spec)


def model_config(spec: dict) -> dict:
    """FedAvgRecipe's dict model config of any fairfl network (the U-Net, the classification CNN, ...): `network` with
    the spec's keys as its arguments. The server imports this module from the job's custom folder, where the recipe
    puts the train script. NVFlare's config reader would take a nested dict with a "name" or "path" for a component
    and a text with braces for an expression: a spec holding either is refused here."""
    for key, value in spec.items():
        if isinstance(value, dict) or (isinstance(value, str) and ("{" in value or "}" in value)):
            raise ValueError(f"model spec {key!r}: {value!r} would not reach NVFlare's server as it is")
    return {"class_path": "nvflare_fedavg_client.network", "args": dict(spec)}


# ---------------------------------------------------------------- NVFlare's FedAvgRecipe: the site's training script


def train_args(jobs_dir: str, dataset: str, num_sites: int, state_dir: str) -> str:
    """The recipe's `train_args` for `main`: split at whitespace, so no argument may hold a space or a quote."""
    values = ["--jobs-dir", jobs_dir, "--dataset", dataset, "--num-sites", str(num_sites), "--state-dir", state_dir]
    bad = [v for v in values if any(c.isspace() or c in "'\"" for c in v)]
    if bad:
        raise ValueError(f"NVFlare's script runner splits train_args at whitespace: {bad} cannot be passed")
    return " ".join(values)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="fairfl's site training for NVFlare's FedAvgRecipe (Client API)")
    parser.add_argument("--jobs-dir", required=True, help="the bundle's jobs/ folder (jobs/fedavg's arguments)")
    parser.add_argument("--dataset", default="prostate", help="fairfl built-in dataset")
    parser.add_argument("--num-sites", type=int, default=6, help="sites in the run")
    parser.add_argument("--state-dir", required=True, help="the site keeps <state-dir>/<site>/ (local model, log)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # no effect once torch is loaded; the driver sets it too
    import nvflare.client as flare
    import torch

    from fairfl.files import write_json_atomic

    flare.init()
    site = flare.get_site_name()
    sites = FedAvgSites(args.jobs_dir, args.dataset, args.num_sites, [site])
    state_dir = os.path.join(args.state_dir, site)
    os.makedirs(state_dir, exist_ok=True)
    log: dict = {"site": site, "rounds": []}
    while flare.is_running():
        task = flare.receive()
        if task is None:
            break
        if not flare.is_train():
            raise RuntimeError(f"{site}: unexpected task {flare.get_task_name()!r}")
        started = time.time()
        params = {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in (task.params or {}).items()}
        result = sites.train(site, params, task.current_round or 0, state_dir)
        result.params = {k: torch.as_tensor(v) for k, v in (result.params or {}).items()}  # no copy
        log["rounds"].append({"round": task.current_round, "seconds": time.time() - started, **(result.metrics or {})})
        write_json_atomic(os.path.join(state_dir, SITE_LOG), log)
        flare.send(result)


if __name__ == "__main__":
    main()
