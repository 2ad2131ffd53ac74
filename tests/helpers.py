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


def tiny_executor():
    """A site executor at the executor tests' small size (32 px, half the built-in data, batch 8, Adam at 1e-3)."""
    from fairfl.flare.executor import FairflExecutor

    return FairflExecutor(image_size=32, batch_size=8, lr=1e-3, weight_decay=1e-4, synthetic_size_scale=0.5)


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
