"""What several test files share: the repository's paths, the tiny job settings, a job copied with them, and checks
of what a run recorded. Plain functions and constants, imported by name (`from helpers import make_job`); pytest's
fixtures and hooks stay in conftest.py."""

import json
import os
from pathlib import Path

import pytest

from fairfl.jobconfig import customize_job
from fairfl.progress import shown_round
from fairfl.tracking import SUMMARY_SOURCE, TB_FOLDER, summary_series

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBS = os.path.join(REPO, "jobs")

# Small enough for CI on 2 cores, large enough that training really runs.
TINY_SERVER = {"num_rounds": 2, "eval_every": 1, "model_channels": [8, 16, 32], "model_strides": [2, 2]}
TINY_CLIENT = {"image_size": 32, "synthetic_size_scale": 0.5}
TINY_METHOD = {"fedlwr": {"cka_max_samples": 16}}  # a method's own tiny settings, by job


def benchmark_module(name: str):
    """benchmarks/<name>.py imported as the benchmarks import each other (their folder first on sys.path while it
    loads; the modules it imports stay in sys.modules)."""
    import importlib
    import sys

    saved = list(sys.path)
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path[:] = saved


def segmentation_task_meta(spec: dict) -> dict:
    """The meta of a server's task to a site of the built-in prostate data (3 sites), training and evaluating the
    model sent (the executor's tests)."""
    from fairfl.flare import protocol

    return {
        protocol.MODEL_SPEC: spec,
        protocol.DATASET: "prostate",
        protocol.TASK: "segmentation",
        protocol.NUM_SITES: 3,
        protocol.DATA_SEED: 0,
        protocol.START_FROM: protocol.FROM_GLOBAL,
        protocol.EVALUATE: protocol.FROM_GLOBAL,
    }


def make_job(
    name: str, dst: str, server: dict = None, client: dict = None, client_extra: dict = None, mlflow=False
) -> str:
    """jobs/<name> copied to dst with tiny settings (plus any overrides; mlflow as `fairfl run --mlflow`); the repo's
    job stays untouched."""
    args = {**TINY_SERVER, **TINY_METHOD.get(name, {}), **TINY_CLIENT, **(server or {}), **(client or {})}
    return customize_job(os.path.join(JOBS, name), dst, args, client_config=client_extra, mlflow=mlflow)


def held_out_personal_run(name: str, tmp_path, **server) -> tuple[dict, Path, dict]:
    """jobs/<name>, a method scoring each site with a model of its own, through NVFlare's real simulator at the tiny
    settings (3 sites, 2 rounds; `server` on top) as the named run "trial" holding out site-3, the sites' state under
    tmp_path/state. Checks what every such run records: results.json strict JSON (a bare NaN fails), its method, site-3
    held out, rounds 0 and 1, each final Dice in [0, 1], and in every round the two training sites aggregated and
    scored with their own models (personal_model 1.0, global_dice beside) and site-3 with the global model alone.
    Returns the results, the state root and the run's final global model (NumPy arrays)."""
    import torch

    from fairfl.models import state_to_numpy
    from fairfl.simulate import run_simulator

    state_root = Path(tmp_path) / "state"
    job = make_job(name, str(Path(tmp_path) / "job"), {"run_name": "trial", "exclude_sites": ["site-3"], **server})
    sim = run_simulator(job, str(Path(tmp_path) / "ws"), 3, 3, env={"FAIRFL_STATE_ROOT": str(state_root)}, timeout=600)
    assert sim.ok, sim.describe_failure()
    with open(sim.results_path) as f:  # strict JSON: a bare NaN fails
        results = json.load(f, parse_constant=lambda c: pytest.fail(f"bare {c} in {sim.results_path}"))
    assert results["method"] == name and results["held_out_sites"] == ["site-3"]
    assert [r["round"] for r in results["rounds"]] == [0, 1]
    assert all(0.0 <= m["dice"] <= 1.0 for m in results["final"]["per_site"].values())
    for record in results["rounds"]:
        assert set(record["weights"]) == {"site-1", "site-2"}
        for site in ("site-1", "site-2"):
            assert record["per_site"][site]["personal_model"] == 1.0 and "global_dice" in record["per_site"][site]
        assert set(record["per_site"]["site-3"]) <= {"dice", "dice_se"}  # the global model alone
    global_state = state_to_numpy(torch.load(os.path.join(os.path.dirname(sim.results_path), "global_model.pt")))
    return results, state_root, global_state


def rescored_final(results: dict, meta: dict, global_state: dict, state_dir, site: str) -> tuple[dict, dict]:
    """`site`'s final evaluation of a `held_out_personal_run` again in-process: the validate task `meta` of round 1 on
    the run's final `global_state`, from what the site kept in `state_dir` (a fresh `tiny_executor()`: an executor
    keeps its one site's loaders), checked to give the Dice the run recorded. Returns the metrics it computed and the
    final ones the run recorded."""
    scores = site_validate(tiny_executor(), site, meta, global_state, state_dir, 1).metrics
    final = results["final"]["per_site"][site]
    assert final["dice"] == pytest.approx(scores["dice"], abs=1e-6), site
    return scores, final


def screened(controller, round_num, updates, rejected) -> dict:
    """`updates` ({site: SiteUpdate}) without the sites whose answer the round loop would reject for a field the
    method reads (`answer_problem`), which go to `rejected`: for tests that call a controller's `aggregate`
    directly, as the round loop does only after screening."""
    from fairfl.flare import protocol

    kept = {}
    for site, update in updates.items():
        problem = controller.answer_problem(protocol.TASK_TRAIN, round_num, update.meta)
        if problem:
            rejected[site] = problem
        else:
            kept[site] = update
    return kept


def recorded(results, site):
    """{metric: {round as trackers show it (from 1): value}} of `site` in results.json: its accepted training and
    evaluation metrics; of SUMMARY_SOURCE, each evaluated round's fairness summary of the main metric."""
    found = {}
    for record in results["rounds"]:
        if site == SUMMARY_SOURCE:
            values = summary_series(record, results["metric"])
        else:
            values = {k: v for part in ("train", "per_site") for k, v in (record.get(part) or {}).get(site, {}).items()}
        for name, value in values.items():
            found.setdefault(name, {})[shown_round(record["round"])] = value
    return found


def tensorboard_scalars(run_dir, site):
    """{tag: {step: value}} that TensorBoard shows for `site` (tb_events/<site>/; {} when there is none)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folder = os.path.join(run_dir, TB_FOLDER, site)
    if not os.path.isdir(folder):
        return {}
    events = EventAccumulator(folder)
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def check_tracking(run_dir, results, sites):
    """TensorBoard shows exactly what results.json records, per site (and the fairness summary, SUMMARY_SOURCE),
    metric (tag) and round (step): accepted numbers only (TensorBoard keeps 32-bit floats)."""
    sources = [*sites, SUMMARY_SOURCE]
    assert set(os.listdir(os.path.join(run_dir, TB_FOLDER))) == {s for s in sources if recorded(results, s)}
    for source in sources:
        shown, expected = tensorboard_scalars(run_dir, source), recorded(results, source)
        assert shown == {name: pytest.approx(steps, rel=1e-6) for name, steps in expected.items()}, source


def extra_test_entries(base: Path, scaled: Path) -> dict:
    """What a test_scale > 1 added to each site's datalist (`scaled`, against `base`: the same data at test_scale 1),
    after asserting that it added nothing else: the same splits, the training and validation entries unchanged, each
    test split (testing, testing_corrupted) keeping its entries in front, and every file those name byte for byte the
    same; the added entries name new files, absent from `base`. Returns {site: {split: the added entries}}."""
    added = {}
    for path in sorted(Path(base).glob("site-*.json")):
        before, after = json.loads(path.read_text()), json.loads((Path(scaled) / path.name).read_text())
        assert list(before) == list(after), path.name
        for split, entries in before.items():
            assert after[split][: len(entries)] == entries, (path.name, split)
            grown = after[split][len(entries) :]
            assert not grown or split.startswith("testing"), (path.name, split)
            for entry in entries:
                for file in (entry["image"], entry["label"]):
                    if isinstance(file, str):
                        assert (base / file).read_bytes() == (scaled / file).read_bytes(), file
            new_files = [e["image"] for e in grown] + [e["label"] for e in grown if isinstance(e["label"], str)]
            assert len(set(new_files)) == len(new_files), (path.name, split)
            assert all((scaled / f).is_file() and not (base / f).exists() for f in new_files), (path.name, split)
            added.setdefault(path.stem, {})[split] = grown
    return added


def generated_at_test_scales(name: str, test_scale: float, cache: Path, **settings) -> tuple[Path, Path, dict]:
    """The built-in dataset `name` at test_scale 1 and at `test_scale` (ensure_builtin, cached in `cache`), checked:
    the second cache folder is the first's name plus `-t<test_scale>`, dataset.json records test_scale (nothing at 1),
    and `extra_test_entries` holds. Returns the two roots and what the larger test_scale added."""
    from fairfl.data.builtin import ensure_builtin

    base = ensure_builtin(name, cache_dir=cache, **settings)
    scaled = ensure_builtin(name, cache_dir=cache, test_scale=test_scale, **settings)
    assert scaled.name == f"{base.name}-t{float(test_scale)!r}"
    parameters = [json.loads((root / "dataset.json").read_text())["parameters"] for root in (base, scaled)]
    assert "test_scale" not in parameters[0] and parameters[1]["test_scale"] == test_scale
    return base, scaled, extra_test_entries(base, scaled)


def site_task(meta: dict, site: str):
    """A server task of `meta` as `site` reads it (fairfl.flare.site_task.SiteTask), without its weights."""
    from nvflare.app_common.abstract.fl_model import FLModel

    from fairfl.flare.site_task import SiteTask

    return SiteTask.of(site, FLModel(meta=meta))


def tiny_executor(**settings):
    """A site executor at the executor tests' small size (32 px, half the built-in data, batch 8, Adam at 1e-3), with
    `settings` on top (data_root: another copy of the built-in data)."""
    from fairfl.flare.executor import FairflExecutor

    return FairflExecutor(
        **{"image_size": 32, "batch_size": 8, "lr": 1e-3, "weight_decay": 1e-4, "synthetic_size_scale": 0.5, **settings}
    )


def initial_states(controller, count: int = 2) -> list[dict]:
    """The first `count` models a test sends: the initial weights (NumPy arrays) of `controller`'s network with seeds
    0, 1, ..."""
    from fairfl.models import initial_state

    return [initial_state(controller.model_spec(), seed) for seed in range(count)]


def unit_meta(controller) -> dict:
    """The meta of a method unit's task to a site of the built-in prostate data: `segmentation_task_meta` of
    `controller`'s network, with the controller's `site_meta` fields."""
    return {**segmentation_task_meta(controller.model_spec()), **controller.site_meta()}


def unit_site(controller) -> tuple:
    """What a method unit's executor tests start from: `controller`, its `unit_meta` and a `tiny_executor()`."""
    return controller, unit_meta(controller), tiny_executor()


def shuffled(entries: list) -> list:
    """`entries` in another order (a seeded permutation, checked to move them)."""
    import numpy as np

    order = np.random.default_rng(0).permutation(len(entries))
    assert len(order) > 2 and list(order) != sorted(order)
    return [entries[i] for i in order]


def reordered_executor(executor, meta: dict, site: str, folder, split: str, change=shuffled):
    """A `tiny_executor()` reading a copy, in `folder`, of the data `executor` gives `site` for the task `meta`, with
    `site`'s `split` datalist changed by `change` (default: `shuffled`); checked to read the copy."""
    import shutil

    read = site_task(meta, site)
    root = Path(executor._data_root(read))
    shutil.copytree(root, folder)
    datalist = json.loads((root / f"{site}.json").read_text())
    datalist[split] = change(datalist[split])
    (Path(folder) / f"{site}.json").write_text(json.dumps(datalist))
    reordered = tiny_executor(data_root=str(folder))
    assert reordered._data_root(read) == str(folder)
    return reordered


def site_dice(executor, meta: dict, site: str, state: dict, split: str = "testing") -> float:
    """The Dice of the task's network with the torch `state` on `site`'s `split`, as the executor evaluates."""
    from fairfl.flare import protocol
    from fairfl.models import build_model

    read = site_task(meta, site)
    model = build_model(meta[protocol.MODEL_SPEC])
    model.load_state_dict(state)
    return executor._evaluate(model, executor._loader(read, split, train=False, seed=executor.seed), read)["dice"]


def kept_local_model(state_dir, name: str = "") -> dict:
    """The local model a site kept in `state_dir` (its LOCAL_MODEL_FILE unless `name` says another version)."""
    import torch

    from fairfl.flare import protocol

    return torch.load(Path(state_dir) / (name or protocol.LOCAL_MODEL_FILE))["model"]


def site_train(executor, site: str, meta: dict, params: dict, state_dir, round_num: int):
    """The executor's real train task for `site` on `params` (NumPy arrays) with task `meta`, its state in
    `state_dir`: the FLModel answer (the method units' executor tests)."""
    from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

    from fairfl.flare.site_task import SiteTask

    task = FLModel(params_type=ParamsType.FULL, params=params, current_round=round_num, meta=meta)
    return executor._train(SiteTask.of(site, task), str(state_dir))


def trained_as_fedavg(
    executor, site: str, meta: dict, fedavg_meta: dict, params: dict, state_dir, fedavg_dir, round_num
):
    """`site`'s train answers to the task `meta` (its state in `state_dir`) and to FedAvg's task `fedavg_meta` (its
    state in `fedavg_dir`) on the same `params`, after asserting that the first sends back what FedAvg's does, bit for
    bit: the same weights, the same number of steps."""
    import numpy as np

    from fairfl.flare import protocol

    answer = site_train(executor, site, meta, params, state_dir, round_num)
    fedavg = site_train(executor, site, fedavg_meta, params, fedavg_dir, round_num)
    assert set(answer.params) == set(fedavg.params), round_num
    assert all(np.array_equal(answer.params[k], fedavg.params[k]) for k in fedavg.params), round_num
    assert answer.meta[protocol.NUM_STEPS] == fedavg.meta[protocol.NUM_STEPS], round_num
    return answer, fedavg


def refused_by_both_tasks(tasks, site: str, path, problem: str) -> None:
    """Each of `tasks` (callables running a site's tasks, validate and train) raises a DataError naming `site` and the
    file `path` and saying `problem`."""
    from fairfl.errors import DataError

    for task in tasks:
        with pytest.raises(DataError) as error:
            task()
        message = str(error.value)
        assert f"[{site}]" in message and str(path) in message and problem in message, message


def site_validate(executor, site: str, meta: dict, params: dict, state_dir, round_num: int = 0, **extra):
    """The executor's real validate task for `site`, scoring as the personalised methods ask (EVALUATE
    FROM_PERSONAL unless `extra` says otherwise)."""
    from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

    from fairfl.flare import protocol
    from fairfl.flare.site_task import SiteTask

    task_meta = {**meta, protocol.EVALUATE: protocol.FROM_PERSONAL, **extra}
    task = FLModel(params_type=ParamsType.FULL, params=params, current_round=round_num, meta=task_meta)
    return executor._validate(SiteTask.of(site, task), str(state_dir))


def torch_state(meta: dict, params: dict) -> dict:
    """`params` (NumPy arrays) as the torch state dict of the task's network."""
    from fairfl.flare import protocol
    from fairfl.models import build_model, load_numpy_state

    return load_numpy_state(build_model(meta[protocol.MODEL_SPEC]), params).state_dict()


def variant_controller(name: str, run_dir, sites: list, **settings):
    """The controller of method variant `name` (its job's server settings, the variant's arguments, then `settings`,
    each where the controller takes it), set up as the round loop sets it up for `sites`, writing into `run_dir`:
    for the tests that hold every registered variant to something without FLARE processes."""
    from fairfl.jobconfig import component_arguments
    from fairfl.methods import JOBS, VARIANTS
    from fairfl.methods.make_jobs import load_class

    variant = VARIANTS[name]
    job = JOBS[variant.job]
    cls = load_class(job.controller)
    known = component_arguments(cls)
    controller = cls(**{k: v for k, v in {**job.server, **variant.arguments, **settings}.items() if k in known})
    controller.get_run_dir = lambda: str(run_dir)
    controller.trainers = controller.sites = list(sites)
    controller.min_responses, controller.absent, controller.failed, controller.task_meta = len(sites), [], {}, {}
    return controller


def built_on_meta_only(monkeypatch) -> list:
    """Make every network build record its device and fail unless on torch's meta device (nothing allocated). What this
    process remembers of specs it built before (fairfl.models: a spec is built once per process) is forgotten first,
    so the builds recorded are the ones the code under test makes."""
    from collections import OrderedDict

    import torch

    from fairfl import models

    monkeypatch.setattr(models, "_SPEC_CACHE", OrderedDict())

    devices, build = [], models.build_model

    def guarded(spec, *args):
        device = torch.empty(0).device.type
        devices.append(device)
        if device != "meta":
            raise AssertionError(f"{spec} built on {device}")
        return build(spec, *args)

    monkeypatch.setattr(models, "build_model", guarded)
    return devices


def trained_weights(result, sent: dict) -> dict:
    """The weights a site's train answer makes from the weights `sent` to it ({name: numpy array}): sites send the
    difference (fairfl.updates), which the server adds back as this does."""
    from nvflare.app_common.abstract.fl_model import ParamsType

    if result.params_type != ParamsType.DIFF:
        return dict(result.params)
    return {k: v if v.dtype == bool else sent[k] + v for k, v in result.params.items()}


def server_round(controller, state: dict, answers: list, round_num: int):
    """One train round of `controller` on these answers through its real screening (`_train_round`, the sending
    replaced) and aggregation (`_server_step`): (new state, rejected, the round's record fields)."""
    controller._ask_models = lambda *args, **kwargs: list(answers)
    updates, rejected, _ = controller._train_round(round_num, state)
    new_state, extras = controller._server_step(round_num, state, updates, rejected)
    return new_state, rejected, extras


def loss_answers(state: dict, round_num: int, samples: dict, losses: dict) -> list:
    """Every site's train answer, in `samples`' order: the sent model moved by a step seeded by the round and the
    site, its training-set size, and, where `losses` has one, the loss it reports for the model it was sent (AFL's
    and FedFloor (minimax)'s `GLOBAL_LOSS`)."""
    import numpy as np
    from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

    from fairfl.flare import protocol
    from fairfl.methods.qfedavg.protocol import GLOBAL_LOSS

    answers = []
    for i, site in enumerate(samples):
        rng = np.random.default_rng(10 * round_num + i)
        params = {
            k: v + 0.01 * rng.standard_normal(v.shape).astype(v.dtype) if v.dtype.kind == "f" else v
            for k, v in state.items()
        }
        meta = {"client_name": site, protocol.NUM_SAMPLES: samples[site]}
        if site in losses:
            meta[GLOBAL_LOSS] = losses[site]
        answers.append(FLModel(params_type=ParamsType.FULL, params=params, metrics={"train_loss": 0.5}, meta=meta))
    return answers


def minimax_in_every_order(mixture: dict, fedavg: dict, losses: dict, *args, **kwargs) -> list:
    """AFL's `minimax_round` on one round with its sites in every order: the mixture reversed, the round's FedAvg
    weights and losses in each permutation of the round's sites (`args`, `kwargs`: the round's settings)."""
    import itertools

    from fairfl.methods.afl.minimax import minimax_round

    reversed_mixture = {s: mixture[s] for s in reversed(list(mixture))}
    return [
        minimax_round(reversed_mixture, {s: fedavg[s] for s in order}, {s: losses[s] for s in order}, *args, **kwargs)
        for order in itertools.permutations(fedavg)
    ]
