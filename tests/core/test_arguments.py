"""Every argument of every fairfl component is range-checked where it is declared (fairfl.arguments): a hostile value
is refused, naming the component and the argument, by the constructor NVFlare builds and by `fairfl run --set`,
the recipe and `fairfl poc submit` / `fairfl submit` before anything starts or is written; the server counts the
network a job names on torch's meta device and refuses one above its own cap.

The table of hostile values is plain data (no fairfl.arguments import), so it runs against older code too."""

import importlib
import json
import os
import shutil
from pathlib import Path
from unittest import mock

import pytest
import torch

from fairfl import cli
from fairfl.jobconfig import CLIENT_CONFIG, SERVER_CONFIG
from fairfl.kinds import Boolean, Integer, Nullable, OneOf, Real

from helpers import JOBS, REPO, built_on_meta_only

NAN, INF = float("nan"), float("inf")
# (job, argument) -> hostile values: a value of the wrong kind first, then values out of range. Every argument of every
# component has its entry (test_every_declared_argument_has_hostile_values); the first ones are issue 28's.
HOSTILE = {
    ("fedavg", "num_rounds"): ["20", 0, -5, 10**6, 2.5, True],
    ("fedavg", "eval_every"): ["5", -1, 0, None],
    ("fedavg", "image_size"): ["64", 0, 100_000, 8, 64.0],
    ("fedavg", "lr"): ["1e-3", NAN, 0, -1, INF, 100, 1e-13],  # below the lr the q-FedAvg server accepts
    ("fedavg", "batch_size"): ["8", 0, -1, 10**6],
    ("fedavg", "loader_workers"): ["2", -1, 100_000],
    ("fedavg", "device"): [0, "gpu", "cuda:x", "cuda:99999", "cuda:-1"],
    ("fedlwr", "cka_clip"): ["x", [1, 0], [0.5], [0, 2], [0.2, 0.2], [], [NAN, 1]],
    ("fedlwr", "cka_max_samples"): ["64", 3, 10**9],
    ("fedlwr", "cka_batch_size"): ["32", 2, 10**6],
    ("fedlwr", "cka_split"): [1, "testing"],
    ("fedavg", "task_timeout"): ["1h", -1, NAN, 0, INF, 10**9, 1.5],
    ("fedavg", "straggler_timeout"): ["600", -1, 0, NAN, INF, 10**9],
    ("fedavg", "seed"): ["x", -1, 2**40, 1.5, None],
    ("fedavg", "local_epochs"): ["1", 0, 10**9, -1],
    ("fedavg", "local_steps"): ["10", -1, 10**9],
    ("fedavg", "momentum"): ["0.9", 5, 1.0, -0.1, NAN],
    ("fedavg", "max_update_ratio"): ["10", -1, NAN, INF, 0.5, 1e-300],  # below 1: every site an outlier
    ("fedavg", "trim_fraction"): ["0.2", NAN, 0.5, -0.1],
    ("ditto", "ditto_lambda"): ["0.1", -1, NAN, INF],
    ("fedfloor", "ditto_lambda"): [-1, NAN],
    ("fedism_plus", "rho_max"): ["0.1", -1, NAN, 100],
    ("fedism_plus", "q"): ["2", -1, NAN, 1000, 0],  # Eq. 16 needs q > 0: it ended the first aggregation
    ("qfedavg", "q"): ["1", -1, NAN, 1000],
    ("fedism_plus", "beta"): ["0.5", 0, 2, NAN],
    ("cgsv", "beta"): ["1", 0, -1, NAN, INF],
    ("fedprox", "mu"): ["0.01", -1, NAN, INF],
    ("fednpr", "mu"): [-1, NAN],
    ("fednpr", "npr_weight"): ["1", -1, NAN, 1e300],
    ("fednpr", "npr_logits"): [1, "softmax"],
    ("fedfloor", "mix_grid"): ["0,1", [], [2], [0.5, 0.5], [-0.1], ["x"], [NAN]],
    ("fedavg", "test_scale"): ["2", 0, 1000, NAN, 0.5],
    ("fedavg", "dp_epsilon"): ["8", 0, -1, NAN, INF, True, 1e6],
    ("fedavg", "dp_delta"): ["1e-5", 0, 1, 1.5, -1e-5, NAN, None],
    ("fedavg", "dp_clip"): ["1", 0, -1, NAN, INF, None],
    ("fedavg", "weight_decay"): ["x", -1, NAN, 5],
    ("fedavg", "num_threads"): ["1", -1, 100_000],
    # a filter NVFlare has but a job may not name, unknown or out-of-range arguments, a bad regular expression
    ("fedavg", "privacy_filter"): [
        "dxo_blocker",
        5,
        {"name": "percentile", "percentile": 101},
        {"name": "percentile", "gamma": 0},
        {"name": "svt", "fraction": 0},
        {"name": "svt", "epsilon": NAN},
        {"name": "percentile", "data_kinds": ["WEIGHTS"]},
        {"name": "exclude_vars"},
        {"name": "exclude_vars", "exclude_vars": "(["},
        {"name": "exclude_vars", "exclude_vars": [1]},
        {"percentile": 10},
    ],
    # the rest of the round's arguments
    ("fedavg", "min_clients"): ["most", 0, -2, 1.5, True, []],
    ("fedavg", "data_seed"): ["x", -1, 2**40],
    ("fedavg", "dataset"): [5, "../../etc", "cifar"],
    ("fedavg", "num_classes"): ["2", 0, 10**9, -1],
    ("fedavg", "in_channels"): ["3", 0, 65],
    ("fedavg", "model"): [5, "vgg16", "../evil", "os.system", "a:b:c", "Seg Res", ""],
    ("fedavg", "model_args"): [
        "x",
        [1],
        {"pretrained": True},
        {"weights_path": "/etc/passwd"},
        {"url": "http://x"},
        {"a": float("nan")},
        {"1bad": 1},
        {"deep": [[[[[1]]]]]},
        {"many": list(range(2000))},
    ],
    ("fedavg", "bundle"): [5, ["x"], "a\0b", "x" * 5000],
    ("fedavg", "task"): [1, "detection"],
    ("fedavg", "spatial_dims"): ["3", 1, 4, 2.5],
    ("fedavg", "patch_size"): ["64", [64, 64], [0, 64, 64], [64, 64, 4096], [64, 64, "x"]],
    ("fedavg", "patches_per_volume"): ["2", 0, 1000],
    ("fedavg", "spacing"): ["1", [1, 1], [0, 1, 1], [1, 1, NAN], [1, 1, 1000]],
    ("fedavg", "intensity_window"): ["x", [1], [80, 0], [0, NAN], [-1e9, 0]],
    ("fedavg", "intensity_percentiles"): ["x", [99, 1], [-1, 50], [0, 101], [50, 50]],
    ("fedavg", "sliding_window_overlap"): ["0.5", -0.1, 1.0, NAN],
    ("fedlwr", "cka_max_positions"): ["4096", 0, 10**9],
    ("fedavg", "model_channels"): ["16,32", [], [0, 16], [16] * 11, [16, "x"], [99_999]],
    ("fedavg", "model_strides"): ["2", [], [0], [5], [2] * 10],
    ("fedavg", "model_norm"): [5, "layer"],
    ("fedavg", "weighting"): [1, "by_loss"],
    ("fedavg", "exclude_sites"): ["site-1", ["../etc"], ["site-1", "site-1"], [5]],
    ("fedavg", "preset"): [5, "gpu"],
    ("fedavg", "task_check_period"): ["0.1", 0, -1, NAN, 1000],
    ("fedavg", "run_name"): [5, "../../etc", "/tmp/x", "a/b"],
    ("fedavg", "max_samples"): ["many", 0, -1, 10**13, 1.5],
    ("fedavg", "max_share"): ["0.5", 0, 1.5, -0.1, NAN],
    ("fedavg", "robust_aggregation"): [1, "mean"],
    ("fedavg", "local_optimizer"): [1, "rmsprop"],
    ("fedavg", "keep_optimizer_state"): ["yes", 1, None],
    ("fedavg", "adam_betas"): ["0.9,0.999", 0.9, [0.9], [0.9, 1.0], [-0.1, 0.9], [NAN, 0.9], [0.9] * 3, [True, 0]],
    ("fedavg", "average_last"): ["5", 0, -1, 10**6],
    ("fedavg", "cross_site_eval"): ["true", 1],
    # the rest of the sites' arguments
    ("fedavg", "data_root"): [5, ["x"], "a\0b", "x" * 5000],
    ("fedavg", "synthetic_size_scale"): ["2", 0, -1, 1000, NAN],
    ("fedavg", "logit_adjustment"): ["1", -1, NAN, 1000],
    ("fedavg", "augmentation"): ["flip", ["flip", "flip"], ["shear"], [1]],
    ("fedavg", "amp"): ["false", 0],
    # the rest of the methods' arguments
    ("fedce", "combine"): [1, "max"],
    ("fedlwr", "weighting"): [0, "by_loss"],
    ("fedism_plus", "tau"): ["0.5", -1, NAN, 1000],
    ("fedism_plus", "variant"): [1, "X", "s"],
    ("fedism_plus", "gsam_alpha"): ["0.1", -1, 2, NAN],
    ("fedism_plus", "saga"): ["true", 1],
    ("qfedavg", "lipschitz"): ["x", -1, NAN, INF],
    ("fednpr", "num_subclusters"): ["4", 0, 10**9, 1.5],
    ("fednpr", "sinkhorn_epsilon"): ["0.05", 0, -1, NAN],
    ("fednpr", "sinkhorn_iterations"): ["50", 0, 10**12],
    ("fednpr", "temperature"): ["1", 0, INF, -1],
    ("fednpr", "personal_head"): ["yes", 1],
    ("cffl", "alpha"): ["5", 0, -1, 1000, NAN],
    ("cffl", "reputation_threshold"): ["0", 1, -0.1, NAN],
    ("cgsv", "alpha"): ["0.95", 2, -1, NAN],
    ("cgsv", "gamma"): ["x", 0, -1, NAN],
}
# a well-formed device the site lacks: only the site can tell (its constructor), never the command line
SITE_ONLY = {("fedavg", "device"): ["cuda:99"]}


def values_against(kind) -> list:
    """Hostile values read off an argument's kind: a string for a number, non-finite and out-of-range numbers, a
    stranger to a choice. An argument HOSTILE has no hand-picked values for (a method added since) is
    still tried at every component and at `fairfl run --set`, with no edit here."""
    if isinstance(kind, Nullable):
        return values_against(kind.kind)
    if isinstance(kind, Real):
        values = [str(kind.example()), NAN, INF, kind.low - 1, kind.high + 1]
        return values + [
            bound for bound, is_open in ((kind.low, kind.low_open), (kind.high, kind.high_open)) if is_open
        ]
    if isinstance(kind, Integer):
        return [str(kind.example()), kind.low - 1, kind.high + 1, 1.5]
    if isinstance(kind, Boolean):
        return ["true", 1]
    if isinstance(kind, OneOf):
        return [5, "none-of-" + "-".join(map(str, kind.choices))]
    raise AssertionError(f"no hostile values can be read off {kind}: give the argument hand-picked ones in HOSTILE")


def derived_cases() -> list:
    """(job, argument, value) for every argument of every registered job that HOSTILE does not name."""
    from fairfl.arguments import COMPONENTS
    from fairfl.methods import JOBS as SPEC_JOBS

    named = {name for _, name in HOSTILE}
    return [
        (job, argument.name, value)
        for job in sorted(SPEC_JOBS)
        for path, _ in job_components(job)
        for argument in COMPONENTS[path]
        if argument.name not in named
        for value in values_against(argument.kind)
    ]


CASES = [(job, name, value) for (job, name), values in HOSTILE.items() for value in values]
CONSTRUCTOR_CASES = CASES + [(job, name, v) for (job, name), values in SITE_ONLY.items() for v in values]


def case_id(case) -> str:
    job, name, value = case
    return f"{job}-{name}={json.dumps(value)[:24]}"


def job_components(job: str) -> list:
    """[(class path, args)] of the fairfl components of jobs/<job>: its controller, then its executor."""
    server = json.loads(Path(JOBS, job, SERVER_CONFIG).read_text())["workflows"][0]
    client = json.loads(Path(JOBS, job, CLIENT_CONFIG).read_text())["executors"][0]["executor"]
    return [(server["path"], server["args"]), (client["path"], client["args"])]


def load(path: str):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def names(message: str, name: str, components: list) -> bool:
    """Whether an error message names the argument and one of the components holding it."""
    return name in message and any(path.rpartition(".")[2] in message for path in components)


DERIVED_CASES = derived_cases()


@pytest.mark.parametrize("case", CONSTRUCTOR_CASES + DERIVED_CASES, ids=case_id)
def test_every_component_refuses_a_hostile_argument_naming_itself_and_the_argument(case):
    """What NVFlare does at load: build the job's component with its arguments, one of them hostile."""
    job, name, value = case
    holders = [(path, args) for path, args in job_components(job) if name in args]
    assert holders, f"jobs/{job} has no argument {name}"
    for path, args in holders:
        with pytest.raises((ValueError, TypeError)) as info:
            load(path)(**{**args, name: value})
        assert names(str(info.value), name, [path]), str(info.value)


@pytest.mark.parametrize("case", CASES + DERIVED_CASES, ids=case_id)
def test_fairfl_run_refuses_a_hostile_set_before_anything_is_written_or_started(case, tmp_path, capsys, monkeypatch):
    job, name, value = case
    monkeypatch.chdir(REPO)
    started = mock.Mock(side_effect=AssertionError("the simulator was started"))
    monkeypatch.setattr("fairfl.simulate.run_simulator", started)
    code = cli.main(["run", f"jobs/{job}", "-w", str(tmp_path / "ws"), "--set", f"{name}={json.dumps(value)}"])
    err = capsys.readouterr().err
    assert code == 2 and names(err, name, [p for p, args in job_components(job) if name in args]), err
    assert not started.called and list(tmp_path.iterdir()) == []  # no workspace, no job copy


def bad_job_copy(tmp_path, job: str, side: str, name: str, value) -> str:
    """jobs/<job> copied by hand (not by fairfl, which refuses) with `name` set to `value` on one side."""
    copy = tmp_path / "job"
    shutil.copytree(os.path.join(JOBS, job), copy)
    path = copy / (SERVER_CONFIG if side == "server" else CLIENT_CONFIG)
    config = json.loads(path.read_text())
    component = config["workflows"][0] if side == "server" else config["executors"][0]["executor"]
    component["args"][name] = value
    path.write_text(json.dumps(config))
    return str(copy)


def test_fairfl_run_refuses_a_job_folder_holding_a_bad_value_without_any_set(tmp_path, capsys, monkeypatch):
    job = bad_job_copy(tmp_path, "fedavg", "client", "local_epochs", 0)
    monkeypatch.setattr("fairfl.simulate.run_simulator", mock.Mock(side_effect=AssertionError("started")))
    code = cli.main(["run", job, "-w", str(tmp_path / "ws")])
    err = capsys.readouterr().err
    assert code == 2 and "FairflExecutor: local_epochs must be an integer" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job"]


def test_the_recipe_refuses_a_hostile_argument_before_the_simulator_starts(tmp_path, capsys):
    from fairfl import recipe

    with pytest.raises(ValueError, match="FedProxController: mu must be a finite number"):
        recipe.FairflRecipe("fedprox", mu=NAN)
    with (
        mock.patch.object(recipe.SimEnv, "__init__", side_effect=AssertionError("SimEnv was made")),
        pytest.raises(SystemExit) as info,
    ):
        recipe.main(["fedavg", "--set", "eval_every=-1", "-w", str(tmp_path)])
    assert info.value.code == 2 and "FedAvgController: eval_every" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [["poc", "submit"], ["submit", "--admin", "KIT"]])
def test_poc_and_production_submit_refuse_a_bad_job_before_the_federation_sees_it(command, tmp_path, capsys):
    job = bad_job_copy(tmp_path, "ditto", "server", "ditto_lambda", -1)
    with mock.patch("fairfl.deploy.admin.submit", side_effect=AssertionError("submitted")) as submit:
        code = cli.main([*command, job])
    err = capsys.readouterr().err
    assert code == 1 and "DittoController: ditto_lambda must be" in err and not submit.called, err


def test_a_site_refuses_a_cuda_device_it_lacks_when_it_loads_the_job():
    from fairfl.flare.executor import FairflExecutor

    with mock.patch.object(torch.cuda, "device_count", return_value=2):
        for device in ("auto", "cpu", "cuda", "cuda:0", "cuda:1"):
            assert FairflExecutor(device=device).device == device
        with pytest.raises(ValueError, match=r"device 'cuda:2': this site has CUDA devices cuda:0 to cuda:1"):
            FairflExecutor(device="cuda:2")
    with mock.patch.object(torch.cuda, "device_count", return_value=0):
        for device in ("cuda", "cuda:0"):
            with pytest.raises(ValueError, match="FairflExecutor: device .* this site has no CUDA device"):
                FairflExecutor(device=device)
    if torch.cuda.device_count() < 100:  # the real count of this machine
        with pytest.raises(ValueError, match="cuda:99"):
            FairflExecutor(device="cuda:99")


def test_a_fraction_of_a_second_of_straggler_timeout_still_waits():
    """NVFlare waits whole seconds: 0.5 s was int() to 0, no wait at all; it is rounded up now."""
    from fairfl.methods.fedavg.controller import FedAvgController

    assert FedAvgController(straggler_timeout=0.5).settings.straggler_timeout == 1
    assert FedAvgController(straggler_timeout=600).settings.straggler_timeout == 600


def test_customize_job_refuses_a_hostile_value_and_writes_nothing(tmp_path):
    from fairfl.jobconfig import customize_job

    with pytest.raises(ValueError, match="job .*fedavg: FedAvgController: num_rounds must be an integer in"):
        customize_job(os.path.join(JOBS, "fedavg"), str(tmp_path / "copy"), {"num_rounds": 0})
    assert list(tmp_path.iterdir()) == []


# --- the server's network: counted on the meta device, refused above its own cap ---------------------------------
HUGE_CNN = {"dataset": "skin", "model": "cnn", "model_channels": [4096] * 10}  # 1.36 billion parameters, 5 GiB


@pytest.mark.parametrize("controller", ["fedavg.controller.FedAvgController", "fedbn.controller.FedBNController"])
def test_the_server_refuses_a_huge_network_counting_it_on_the_meta_device(controller, monkeypatch):
    devices = built_on_meta_only(monkeypatch)
    cls = load(f"fairfl.methods.{controller}")
    with pytest.raises(ValueError) as info:
        cls(**HUGE_CNN, model_norm="batch")
    message = str(info.value)
    assert "model_channels" in message and "1,359" in message, message
    assert "more than FAIRFL_SERVER_MAX_MODEL_PARAMETERS, the server's limit of 200,000,000" in message
    assert devices == ["meta"]


def test_the_server_s_cap_is_its_own_environment_s(monkeypatch):
    from fairfl.methods.fedavg.controller import FedAvgController

    monkeypatch.setenv("FAIRFL_SERVER_MAX_MODEL_PARAMETERS", "1000")
    with pytest.raises(ValueError, match="401,605 parameters, more than .* limit of 1,000"):
        FedAvgController()  # the default U-Net
    monkeypatch.setenv("FAIRFL_SERVER_MAX_MODEL_PARAMETERS", "lots")
    with pytest.raises(ValueError, match="FAIRFL_SERVER_MAX_MODEL_PARAMETERS 'lots': expected a positive whole"):
        FedAvgController()
    monkeypatch.setenv("FAIRFL_SERVER_MAX_MODEL_PARAMETERS", str(2 * 10**9))
    monkeypatch.setenv("FAIRFL_MAX_MODEL_PARAMETERS", "1000")  # the sites' cap is not the server's
    devices = built_on_meta_only(monkeypatch)
    FedAvgController(**HUGE_CNN)  # counted, not built
    assert devices == ["meta"]


# --- the declarations themselves ------------------------------------------------------------------------------------
def test_every_declared_argument_has_hostile_values_and_a_valid_default():
    from fairfl.arguments import COMPONENTS, problem
    from fairfl.methods import JOBS as SPEC_JOBS

    assert len(CONSTRUCTOR_CASES) >= 47 and all(len(values) >= 2 for values in HOSTILE.values())
    for job in SPEC_JOBS.values():
        for path, args in job_components(job.name):
            for argument in COMPONENTS[path]:
                assert problem(argument, argument.default) is None, (path, argument.name)
                assert problem(argument, args[argument.name]) is None, (job.name, argument.name)
                derived = [v for j, n, v in DERIVED_CASES if (j, n) == (job.name, argument.name)]
                assert any(n == argument.name for _, n in HOSTILE) or len(derived) >= 2, argument.name


def test_every_fairfl_component_is_declared_with_its_bases_arguments():
    """Every controller class of the package and the executor have their arguments in fairfl.arguments, each a
    superset of its base's (an argument added by a subclass cannot go unchecked)."""
    from fairfl.arguments import COMPONENTS, declared
    from fairfl.flare.engine import FairRoundController
    from fairfl.methods import JOBS as SPEC_JOBS

    for job in SPEC_JOBS.values():
        load(job.controller)
    classes, todo = [], [FairRoundController]
    while todo:
        cls = todo.pop()
        classes.append(cls)
        todo += cls.__subclasses__()
    fairfl_classes = [cls for cls in classes if cls.__module__.startswith("fairfl.")]
    assert len(fairfl_classes) >= 15
    for cls in fairfl_classes:
        assert f"{cls.__module__}.{cls.__qualname__}" in COMPONENTS, cls
        parent = cls.__mro__[1]
        if issubclass(parent, FairRoundController):
            assert set(declared(parent)) <= set(declared(cls)), cls
    assert "fairfl.flare.executor.FairflExecutor" in COMPONENTS


def test_the_declarations_agree_with_the_modules_that_use_the_same_values():
    """The declarations (fairfl.arguments, the units' arguments modules) import no torch, so they restate what the
    modules that use the values hold: the two must agree."""
    from fairfl import aggregation, arguments, models, site_checks, training
    from fairfl.data.loaders import AUGMENTATIONS
    from fairfl.methods.ditto.arguments import DITTO
    from fairfl.methods.fedce.arguments import FEDCE
    from fairfl.methods.fedce.contribution import COMBINE_MODES
    from fairfl.methods.fedfloor.arguments import FEDFLOOR
    from fairfl.methods.fedfloor.mixing import DEFAULT_GRID
    from fairfl.methods.fedism import saga, sharpness
    from fairfl.methods.fedism.arguments import FEDISM
    from fairfl.methods.fedlwr.arguments import CKA_SAMPLE
    from fairfl.methods.fedlwr.cka import MIN_BATCH
    from fairfl.methods.fednpr import npr
    from fairfl.methods.fednpr.arguments import FEDNPR
    from fairfl.methods.fedprox.arguments import FEDPROX

    round_ = {a.name: a for a in arguments.ROUND}
    assert round_["robust_aggregation"].kind.choices == aggregation.ROBUST_MODES
    assert round_["local_optimizer"].kind.choices == tuple(training.OPTIMIZERS)
    assert round_["max_samples"].default == site_checks.MAX_SAMPLES
    assert set(arguments.OWN_NETWORKS) == set(models.DEFAULTS)
    assert all(round_["model"].kind.allows(name) for name in models.DEFAULTS)
    assert round_["model_norm"].kind.kind.choices == models.NORMS
    channels = round_["model_channels"].kind.kind
    assert (channels.item.low, channels.item.high, channels.longest) == models.SPEC_LISTS["channels"]
    strides = round_["model_strides"].kind
    assert (strides.item.low, strides.item.high, strides.longest) == models.SPEC_LISTS["strides"]
    for name in ("num_classes", "in_channels"):
        assert (round_[name].kind.kind.low, round_[name].kind.kind.high) == models.SPEC_INTS[name]
    executor = {a.name: a for a in arguments.EXECUTOR}
    assert executor["augmentation"].kind.kind.item.choices == AUGMENTATIONS
    cka_sample = {a.name: a for a in CKA_SAMPLE}
    assert cka_sample["cka_max_samples"].kind.low == cka_sample["cka_batch_size"].kind.low == MIN_BATCH
    assert {a.name: a.default for a in FEDCE} == {"combine": COMBINE_MODES[0]}
    assert FEDCE[0].kind.choices == COMBINE_MODES
    assert tuple(FEDFLOOR[0].default) == DEFAULT_GRID
    fedism = {a.name: a.default for a in FEDISM}
    assert (fedism["rho_max"], fedism["tau"], fedism["gsam_alpha"]) == (
        sharpness.RHO_MAX,
        sharpness.TAU,
        sharpness.GSAM_ALPHA,
    )
    assert (fedism["q"], fedism["beta"], fedism["variant"]) == (saga.Q, saga.BETA, "S")
    assert {a.name: a for a in FEDISM}["variant"].kind.choices == tuple(saga.VARIANTS)
    fednpr = {a.name: a for a in FEDNPR}
    assert [fednpr[n].default for n in ("num_subclusters", "npr_weight", "sinkhorn_epsilon")] == [
        npr.NUM_SUBCLUSTERS,
        npr.NPR_WEIGHT,
        npr.EPSILON,
    ]
    assert (fednpr["sinkhorn_iterations"].default, fednpr["temperature"].default) == (
        npr.SINKHORN_ITERATIONS,
        npr.TEMPERATURE,
    )
    assert fednpr["npr_logits"].kind.choices == npr.NPR_LOGITS and fednpr["npr_logits"].default == npr.NPR_LOGITS[0]
    for name in ("num_subclusters", "sinkhorn_iterations"):  # what a site accepts from the server's task
        bounds = npr.NPR_SETTINGS_BOUNDS["k" if name == "num_subclusters" else "iterations"]
        assert (fednpr[name].kind.low, fednpr[name].kind.high) == bounds
    for name in ("npr_weight", "sinkhorn_epsilon", "temperature"):
        assert fednpr[name].kind.high == npr.MAX_NPR_FACTOR
    # what a site accepts of the settings each task carries (the client steps' fields): all a job may set
    from fairfl.methods.ditto.client import PersonalTraining
    from fairfl.methods.fedism.client import ProbeModelSent, SALTTraining
    from fairfl.methods.fedprox.client import ProximalTerm

    rho_max = {a.name: a for a in FEDISM}["rho_max"].kind
    for step, declared in ((ProximalTerm, FEDPROX[0].kind), (PersonalTraining, DITTO[0].kind)):
        assert declared in step.fields.values(), step
    for step in (ProbeModelSent, SALTTraining):
        assert rho_max in step.fields.values(), step


def test_check_names_the_component_and_every_bad_argument():
    from fairfl.arguments import check, check_all

    with pytest.raises(ValueError) as info:
        check_all("fairfl.methods.ditto.controller.DittoController", {"num_rounds": 0, "ditto_lambda": NAN})
    message = str(info.value)
    assert message.startswith("DittoController: num_rounds must be") and "; ditto_lambda must be" in message
    with pytest.raises(TypeError, match="FairflExecutor got an unexpected keyword argument.*FAIRFL_FREE_RIDERS"):
        check_all("fairfl.flare.executor.FairflExecutor", {"free_riders": ["site-1"]})
    with pytest.raises(ValueError, match="no fairfl component"):
        check_all("fairfl.cli.main", {})
    check("fairfl.flare.executor.FairflExecutor", "image_size", 384)
    with pytest.raises(ValueError, match="FairflExecutor: image_size must be an integer in \\[16, 2048\\]"):
        check("fairfl.flare.executor.FairflExecutor", "image_size", 10**5)


@pytest.mark.parametrize(
    "kind", [Real(0, 1, high_open=True), Real(0, 10, low_open=True), Integer(1, 10), Boolean(), OneOf(("a", "b"))]
)
def test_the_values_read_off_a_kind_are_all_refused_by_it(kind):
    """What a new unit's arguments are tried with when HOSTILE names none of them: each value must be one its kind
    refuses, or the component tests would fail for the wrong reason."""
    values = values_against(kind)
    assert len(values) >= 2 and all(kind.problem(value) for value in values)
    assert all(Nullable(kind).problem(value) for value in values)  # None aside, a nullable kind refuses the same


def test_a_units_argument_may_not_take_a_round_arguments_or_the_engines_name(monkeypatch):
    """One name, two meanings: the unit's argument would silently replace the round's (its default and its meaning),
    or the controller's own attribute (its settings, its method name)."""
    import fairfl.methods.fedprox.arguments as fedprox_arguments
    from fairfl import arguments
    from fairfl.argument import Argument
    from fairfl.kinds import Text
    from fairfl.methods.fedprox.controller import FedProxController
    from fairfl.methods.spec import ControllerArguments

    path = "fairfl.methods.fedprox.controller.FedProxController"
    for name in ("momentum", "seed"):
        clash = ControllerArguments((Argument(name, Real(0, 1), 0.5, "a unit's own meaning"),))
        monkeypatch.setattr(fedprox_arguments, "CONTROLLERS", {path: clash})
        with pytest.raises(ValueError, match=f"declares \\['{name}'\\], which are round arguments already"):
            arguments._method_controllers()
    shadow = (*arguments.COMPONENTS[path], Argument("method", Text(), "x", "shadows the controller's method name"))
    monkeypatch.setitem(arguments.COMPONENTS, path, shadow)
    with pytest.raises(ValueError, match=r"FedProxController: its arguments \['method'\] are names of the controller"):
        FedProxController()


def test_a_job_written_before_the_cka_settings_moved_is_told_where_they_went():
    """Fed-LWR's sample settings were the sites' until its unit owned them: an old client config names them."""
    from fairfl.arguments import check_all

    with pytest.raises(TypeError, match="cka_max_samples moved to Fed-LWR's controller \\(its server config\\)"):
        check_all("fairfl.flare.executor.FairflExecutor", {"cka_max_samples": 64})
