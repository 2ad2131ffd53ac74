"""A MONAI bundle as the federation's model (fairfl.bundle): its network_def becomes the model spec, its preprocessing a
task field the sites check and build, its models/model.pt the global model of round 0. A bundle's configs can name any
callable and hold Python expressions, so fairfl reads them as data only: what it takes is checked (a class of
monai.networks.nets or monai.transforms, plain arguments, references followed, expressions and macros refused), what it
does not take is never evaluated, and the weights are loaded as tensors only. Every refusal is a ValueError naming the
config file (or the weights file).

The fixture, tests/fixtures/tiny_bundle, is a 2-D BasicUNet whose weights were saved after torch.manual_seed(7)."""

import builtins
import copy
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from fairfl.bundle import (
    Bundle,
    build_transforms,
    bundle_weights,
    check_transform,
    preprocessing_problem,
    read_bundle,
)
from fairfl.errors import DataError
from fairfl.flare import protocol
from fairfl.models import build_model, check_model_spec, initial_state

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "tiny_bundle"
CONFIG = json.loads((FIXTURE / "configs" / "inference.json").read_text())
NETWORK = {
    "name": "BasicUNet",
    "in_channels": 1,
    "num_classes": 2,
    "spatial_dims": 2,
    "args": {"features": [4, 4, 8, 8, 16, 4]},
}
SCALING = {
    "name": "ScaleIntensityRangePercentilesd",
    "args": {"keys": "image", "lower": 1, "upper": 99, "b_min": 0.0, "b_max": 1.0, "clip": True},
}


def write_bundle(folder: Path, config, name: str = "inference.json", weights=None) -> Path:
    """A bundle in `folder`: configs/<name> holding `config` (a dict or list: JSON or YAML by the name; a str: the
    file's text as it is) and, given `weights`, models/model.pt saved from them."""
    (folder / "configs").mkdir(parents=True)
    if not isinstance(config, str):
        config = json.dumps(config) if name.endswith(".json") else yaml.safe_dump(config)
    (folder / "configs" / name).write_text(config)
    if weights is not None:
        (folder / "models").mkdir()
        torch.save(weights, folder / "models" / "model.pt")
    return folder


def changed(**entries) -> dict:
    """The fixture's config with top-level `entries` replaced (None: removed)."""
    config = copy.deepcopy(CONFIG)
    for key, value in entries.items():
        if value is None:
            config.pop(key)
        else:
            config[key] = value
    return config


def network_def(**arguments) -> dict:
    """The fixture's config with its network_def's `arguments` replaced (None: removed)."""
    definition = {**CONFIG["network_def"], **arguments}
    return changed(network_def={k: v for k, v in definition.items() if v is not None})


def transforms(*items) -> dict:
    """The fixture's config whose preprocessing Compose lists `items` after the loading transforms."""
    return changed(
        preprocessing={"_target_": "Compose", "transforms": [*CONFIG["preprocessing"]["transforms"][:2], *items]}
    )


def scaling(**arguments) -> dict:
    """The fixture's intensity scaling as the config writes it, with `arguments` replaced."""
    return {**CONFIG["preprocessing"]["transforms"][2], **arguments}


# --- the fixture: data only ------------------------------------------------------------------------------------------
def test_the_fixture_bundle_is_read_as_its_network_preprocessing_and_weights(monkeypatch):
    """The network_def with its references followed (@num_classes, @features), the preprocessing without the loading
    the sites do themselves, and the weights file; the config's expressions ($ entries: imports, device, network) are
    never evaluated."""
    assert {"imports", "device", "network"} <= set(CONFIG) and CONFIG["network"].startswith("$")
    assert CONFIG["network_def"]["out_channels"] == "@num_classes"

    def refuse(*args, **kwargs):
        raise AssertionError("a bundle's expression was evaluated")

    monkeypatch.setattr(builtins, "eval", refuse)
    bundle = read_bundle(FIXTURE)
    assert bundle == Bundle(FIXTURE, NETWORK, [SCALING], FIXTURE / "models" / "model.pt")
    assert check_model_spec(bundle.network, 10**6) is None
    assert read_bundle(str(FIXTURE)) == bundle  # a path as text, as the job's argument gives it


def test_a_bundle_s_unused_expressions_are_never_run(tmp_path):
    """Expressions in entries fairfl does not take (and the imports MONAI's own parser runs first) leave no trace:
    MONAI's ConfigParser, given the same config, runs them."""
    from monai.bundle import ConfigParser

    def touching(marker: Path) -> str:
        return f"$__import__('pathlib').Path({str(marker)!r}).touch()"

    planted = tmp_path / "planted"
    config = changed(imports=[touching(planted)], device=touching(planted), network=touching(planted))
    bundle = read_bundle(write_bundle(tmp_path / "bundle", config))
    assert bundle.network == NETWORK and bundle.preprocessing == [SCALING] and bundle.weights is None
    assert not planted.exists()
    ConfigParser(changed(device=touching(tmp_path / "monai_ran_it"))).get_parsed_content("device")
    assert (tmp_path / "monai_ran_it").exists()  # the test's expression is a working one


# --- the weights ------------------------------------------------------------------------------------------------------
def test_the_bundle_s_weights_are_round_0_s_model_whatever_the_seed():
    """initial_state with the bundle's weights is model.pt exactly, for any seed; without them it is a seeded start
    (the fixture's weights are seed 7's build, which seed 0 does not give)."""
    bundle = read_bundle(FIXTURE)
    weights = bundle_weights(bundle)
    saved = torch.load(FIXTURE / "models" / "model.pt", weights_only=True)
    assert list(weights) == list(saved) and all(torch.equal(weights[k], saved[k]) for k in saved)
    for seed in (0, 12345):
        state = initial_state(bundle.network, seed, weights)
        assert list(state) == list(saved)
        assert all(np.array_equal(state[k], saved[k].numpy()) for k in saved), seed
    torch.manual_seed(7)
    assert all(torch.equal(v, saved[k]) for k, v in build_model(bundle.network).state_dict().items())
    seeded = initial_state(bundle.network, 0)
    assert any(not np.array_equal(seeded[k], saved[k].numpy()) for k in saved)


def test_a_checkpoint_holding_the_model_is_unwrapped(tmp_path):
    """A model.pt saved as a training checkpoint ({"model": state, "epoch": ...}) gives the model's state."""
    saved = torch.load(FIXTURE / "models" / "model.pt", weights_only=True)
    folder = write_bundle(tmp_path / "b", CONFIG, weights={"model": saved, "epoch": 3})
    state = initial_state(NETWORK, 0, bundle_weights(read_bundle(folder)))
    assert all(np.array_equal(state[k], saved[k].numpy()) for k in saved)


def test_weights_of_another_network_do_not_fit(tmp_path):
    """Weights of other shapes, or with a key missing, are a ValueError saying they do not fit, never a partial load."""
    other = build_model({**NETWORK, "args": {"features": [4, 4, 8, 8, 8, 4]}}).state_dict()
    with pytest.raises(ValueError, match="do not fit"):
        initial_state(NETWORK, 0, bundle_weights(read_bundle(write_bundle(tmp_path / "a", CONFIG, weights=other))))
    saved = torch.load(FIXTURE / "models" / "model.pt", weights_only=True)
    saved.pop(next(iter(saved)))
    with pytest.raises(ValueError, match="do not fit"):
        initial_state(NETWORK, 0, bundle_weights(read_bundle(write_bundle(tmp_path / "b", CONFIG, weights=saved))))


class Planted:
    """Unpickled, it creates the file `marker` (pickle calls what __reduce__ names)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


class Opaque:
    """A plain object: not a tensor, nothing to run."""


def test_a_weights_file_of_pickled_objects_is_refused_without_running_them(tmp_path):
    """torch.load weights_only: a model.pt whose pickle would call code (or build objects that are not tensors) is a
    ValueError naming the file, and the code never runs; an unpickler that runs it would have created the marker."""
    marker = tmp_path / "ran"
    for i, content in enumerate(({"w": Planted(str(marker))}, {"w": Opaque()}, Planted(str(marker)))):
        folder = write_bundle(tmp_path / f"b{i}", CONFIG, weights=content)
        with pytest.raises(ValueError, match="not a file of tensors") as info:
            bundle_weights(read_bundle(folder))
        assert str(folder / "models" / "model.pt") in str(info.value)
        assert not marker.exists()
    torch.load(folder / "models" / "model.pt", weights_only=False)  # what weights_only keeps from happening
    assert marker.exists()

    folder = write_bundle(tmp_path / "numbers", CONFIG, weights={"w": [1.0, 2.0], "b": torch.zeros(1)})
    with pytest.raises(ValueError, match="not a state dict of tensors") as info:
        bundle_weights(read_bundle(folder))
    assert str(folder / "models" / "model.pt") in str(info.value)


# --- hostile bundles --------------------------------------------------------------------------------------------------
def nested_references(levels: int, fan_out: int = 10) -> dict:
    """Entries l0..l<levels>, each a list of `fan_out` references to the one before: l<levels> expands to
    fan_out**levels values ("billion laughs")."""
    entries = {"l0": 4, **{f"l{i}": [f"@l{i - 1}"] * fan_out for i in range(1, levels + 1)}}
    return {**network_def(features=f"@l{levels}"), **entries}


HOSTILE = {
    "no-network_def": (changed(network_def=None), "no network_def"),
    "network_def-not-an-object": (changed(network_def=5), "network_def must be an object with a _target_"),
    "network_def-a-reference-to-an-expression": (changed(network_def="@network"), "Python expression"),
    "target-os.system": (network_def(_target_="os.system"), "_target_ 'os.system' is not in monai.networks.nets"),
    "target-builtins.eval": (network_def(_target_="builtins.eval"), "is not in monai.networks.nets"),
    "target-a-transform": (network_def(_target_="monai.transforms.Compose"), "is not in monai.networks.nets"),
    "target-not-a-network": (network_def(_target_="Compose"), "is not a class of monai.networks.nets"),
    "target-missing": (network_def(_target_=None), "network_def must be an object with a _target_"),
    "target-an-expression": (network_def(_target_="$monai.networks.nets.UNet"), "Python expression"),
    "argument-an-expression": (network_def(features="$[4] * 6"), "Python expression or macro"),
    "argument-a-macro": (network_def(features="%configs/train.json#features"), "Python expression or macro"),
    "argument-fetches": (network_def(pretrained=True), "would fetch or read weights"),
    "argument-requires": (network_def(_requires_="@imports"), "_requires_, _disabled_ and _mode_"),
    "no-classes": (network_def(out_channels=None), "gives no input channels or classes"),
    "reference-cycle": ({**network_def(features="@a"), "a": "@b", "b": "@a"}, "(a cycle?)"),
    "reference-to-itself": ({**network_def(features="@a"), "a": ["@a"]}, "(a cycle?)"),
    "reference-missing": (network_def(features="@nothing"), "reference '@nothing' names no entry"),
    "preprocessing-not-monai": (
        transforms({"_target_": "torchvision.transforms.Normalize", "keys": "image"}),
        "is not in monai.transforms",
    ),
    "preprocessing-os.system": (transforms({"_target_": "os.system", "keys": "image"}), "is not in monai.transforms"),
    "preprocessing-array-transform": (
        transforms({"_target_": "ScaleIntensity", "minv": 0.0}),
        "'ScaleIntensity' is not a dictionary transform",
    ),
    "preprocessing-key-image2": (transforms(scaling(keys="image2")), "keys 'image2' must be among"),
    "preprocessing-key-among-others": (transforms(scaling(keys=["image", "seg"])), "must be among"),
    "preprocessing-expression": (transforms(scaling(b_max="$1.0")), "Python expression or macro"),
    "preprocessing-disabled": (transforms(scaling(_disabled_=False)), "_requires_, _disabled_ and _mode_"),
    "preprocessing-requires": (transforms(scaling(_requires_="@imports")), "_requires_, _disabled_ and _mode_"),
    "preprocessing-mode": (transforms(scaling(_mode_="callable")), "_requires_, _disabled_ and _mode_"),
    "preprocessing-saves-images": (
        transforms({"_target_": "SaveImaged", "keys": "image", "output_dir": "/tmp/collected"}),
        "SaveImaged writes files",
    ),
    "preprocessing-not-a-transform": (transforms("ScaleIntensityd"), "must be an object with a _target_"),
    "preprocessing-not-a-list": (changed(preprocessing=5), "must be a Compose or a list"),
    "preprocessing-too-long": (changed(preprocessing=[scaling()] * 65), "a list of at most 64 transforms"),
    "malformed-json": ('{"network_def": {', "cannot be read"),
    "json-not-an-object": ("[1, 2]", "not an object of named entries"),
}


@pytest.mark.parametrize(("config", "reason"), HOSTILE.values(), ids=HOSTILE)
def test_a_hostile_bundle_is_refused_naming_its_config_file(config, reason, tmp_path):
    """A config fairfl cannot take as data (code, a callable outside MONAI's networks and transforms, keys other than
    image and label, instructions, references that go nowhere or round in a circle, a file that is no config) is a
    ValueError naming the file and saying why: never a RecursionError, never a partial read."""
    folder = write_bundle(tmp_path / "bundle", config)
    with pytest.raises(ValueError) as info:
        read_bundle(folder)
    message = str(info.value)
    assert str(folder / "configs" / "inference.json") in message and reason in message, message


def test_references_that_multiply_are_refused_before_they_are_expanded(tmp_path):
    """A few lines of references to references stand for 10**14 values: refused as soon as the count is passed, not
    after expanding them all (a deadline stops the test instead of hanging it when they are expanded)."""
    import signal

    def too_slow(*args):
        raise TimeoutError("the references were expanded")

    previous = signal.signal(signal.SIGALRM, too_slow)
    signal.setitimer(signal.ITIMER_REAL, 20)
    try:
        with pytest.raises(ValueError, match="values once references are followed"):
            read_bundle(write_bundle(tmp_path / "b", nested_references(7, 100)))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_folder_that_is_no_bundle_is_refused_naming_it(tmp_path):
    """No folder, no configs/, or configs/ without an inference or train config: a ValueError naming the folder."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "metadata-only" / "configs").mkdir(parents=True)
    shutil.copy(FIXTURE / "configs" / "metadata.json", tmp_path / "metadata-only" / "configs")
    for folder in (tmp_path / "missing", tmp_path / "empty", tmp_path / "metadata-only"):
        with pytest.raises(ValueError, match="not a MONAI bundle") as info:
            read_bundle(folder)
        assert str(folder) in str(info.value)


def test_a_yaml_bundle_reads_as_its_json_twin(tmp_path):
    """inference.yaml (or train.json when there is no inference config) is read the same way: the same network and
    preprocessing; YAML's own tags (a Python object) are refused, not built, and errors name the .yaml file."""
    yaml_bundle = read_bundle(write_bundle(tmp_path / "yaml", CONFIG, "inference.yaml"))
    assert (yaml_bundle.network, yaml_bundle.preprocessing) == (NETWORK, [SCALING])
    train = read_bundle(write_bundle(tmp_path / "train", CONFIG, "train.json"))
    assert (train.network, train.preprocessing) == (NETWORK, [SCALING])

    def tagged(marker: Path) -> str:
        return f"network_def: !!python/object/apply:builtins.open ['{marker}', 'w']\n"

    yaml.unsafe_load(tagged(tmp_path / "unsafe_ran_it"))
    assert (tmp_path / "unsafe_ran_it").exists()  # the test's tag is a working one
    marker = tmp_path / "ran"
    for i, (text, reason) in enumerate(
        (
            (tagged(marker), "cannot be read"),
            ("network_def: [", "cannot be read"),
            (yaml.safe_dump(network_def(features="$[4] * 6")), "Python expression"),
        )
    ):
        folder = write_bundle(tmp_path / f"bad{i}", text, "inference.yaml")
        with pytest.raises(ValueError) as info:
            read_bundle(folder)
        message = str(info.value)
        assert str(folder / "configs" / "inference.yaml") in message and reason in message, message
    assert not marker.exists()


# --- the preprocessing at the sites -----------------------------------------------------------------------------------
def test_the_bundle_s_preprocessing_passes_the_site_s_check_and_scales_into_0_1():
    """What read_bundle returns is what a site accepts (check_transform, preprocessing_problem, the task's check) and
    builds: MONAI transform objects that map an image's intensities into [0, 1] and leave the label alone."""
    from monai.transforms import ScaleIntensityRangePercentilesd

    from fairfl.flare.site_task import check_meta

    bundle = read_bundle(FIXTURE)
    assert [check_transform(entry) for entry in bundle.preprocessing] == bundle.preprocessing
    assert preprocessing_problem(bundle.preprocessing) is None
    assert (
        check_meta("site-1", {protocol.MODEL_SPEC: bundle.network, protocol.PREPROCESSING: bundle.preprocessing})
        is None
    )
    built = build_transforms(bundle.preprocessing)
    assert len(built) == 1 and isinstance(built[0], ScaleIntensityRangePercentilesd)

    torch.manual_seed(0)
    image, label = torch.randn(1, 16, 16) * 300 + 1000, torch.randint(0, 2, (1, 16, 16)).float()
    data = {"image": image, "label": label.clone()}
    for transform in built:
        data = transform(data)
    scaled = torch.as_tensor(data["image"])
    assert scaled.min() >= 0 and scaled.max() <= 1 and scaled.max() - scaled.min() > 0.99
    assert torch.equal(torch.as_tensor(data["label"]), label)
    order = image.flatten().argsort()  # a monotone map: the order of the voxels is kept
    assert (scaled.flatten()[order].diff() >= 0).all()


BAD_PREPROCESSING = {
    "not-a-list": ("ScaleIntensityd", "is not a list of at most 64 transforms"),
    "too-long": ([SCALING] * 65, "is not a list of at most 64 transforms"),
    "extra-field": ([{**SCALING, "code": "x"}], "must be an object of name and args"),
    "not-monai": ([{"name": "os.system", "args": {"keys": "image"}}], "is not in monai.transforms"),
    "not-a-transform": ([{"name": "NoSuchd", "args": {"keys": "image"}}], "is not a class of monai.transforms"),
    "array-transform": ([{"name": "ScaleIntensity", "args": {}}], "is not a dictionary transform"),
    "compose": ([{"name": "Compose", "args": {}}], "is not a dictionary transform"),
    "other-key": ([{"name": "ScaleIntensityd", "args": {"keys": "image2"}}], "must be among ['image', 'label']"),
    "no-keys": ([{"name": "ScaleIntensityd", "args": {}}], "must be among"),
    "not-finite": ([{"name": "ScaleIntensityd", "args": {"keys": "image", "minv": float("nan")}}], "finite"),
    "fetching": ([{"name": "LoadImaged", "args": {"keys": "image", "image_only": True, "reader_path": "/x"}}], "fetch"),
    "saves-images": ([{"name": "SaveImaged", "args": {"keys": "image", "output_dir": "/tmp/c"}}], "writes files"),
    "writes-a-mapping": ([{"name": "WriteFileMappingd", "args": {"keys": "image"}}], "writes files"),
}


@pytest.mark.parametrize(("entries", "reason"), BAD_PREPROCESSING.values(), ids=BAD_PREPROCESSING)
def test_a_site_refuses_preprocessing_it_cannot_use(entries, reason, tmp_path, monkeypatch):
    """The server's preprocessing list reaches every site: one that is not plain dictionary transforms of
    monai.transforms on the image and label, or one that would write the site's images to files, is bad task data
    naming the field; build_transforms checks each entry again and builds nothing from a bad one."""
    from fairfl.flare.site_task import check_meta

    monkeypatch.chdir(tmp_path)  # where a file-writing transform would write by default
    problem = preprocessing_problem(entries)
    assert isinstance(problem, str) and reason in problem, problem
    with pytest.raises(DataError) as info:
        check_meta("site-1", {protocol.MODEL_SPEC: NETWORK, protocol.PREPROCESSING: entries})
    assert info.value.site == "site-1" and protocol.PREPROCESSING in str(info.value) and reason in str(info.value)
    if isinstance(entries, list) and len(entries) == 1:
        with pytest.raises(ValueError, match=reason.replace("[", r"\[").replace("(", r"\(")):
            build_transforms(entries)
    assert list(tmp_path.iterdir()) == []


# --- the engine ------------------------------------------------------------------------------------------------------
def test_a_controller_with_a_bundle_sends_its_network_and_preprocessing():
    """bundle=<folder>: the controller's model spec is the bundle's network, and every task carries its
    preprocessing; without a bundle no task does."""
    from fairfl.methods.fedavg.controller import FedAvgController

    bundle = read_bundle(FIXTURE)
    controller = FedAvgController(bundle=str(FIXTURE))
    assert controller.model_spec() == bundle.network == NETWORK
    meta = controller.common_task_meta(["site-1", "site-2", "site-3"])
    assert meta[protocol.MODEL_SPEC] == NETWORK and meta[protocol.PREPROCESSING] == [SCALING]
    assert protocol.PREPROCESSING not in FedAvgController().common_task_meta(["site-1", "site-2", "site-3"])


def test_a_controller_refuses_a_hostile_or_oversized_bundle_naming_it(tmp_path, monkeypatch):
    """A bundle the server cannot take as data stops the controller's constructor, naming the config file; a bundle
    network above the server's own cap is refused as any network is."""
    from fairfl.methods.fedavg.controller import FedAvgController

    folder = write_bundle(tmp_path / "hostile", network_def(_target_="os.system"))
    with pytest.raises(ValueError, match="os.system") as info:
        FedAvgController(bundle=str(folder))
    assert str(folder / "configs" / "inference.json") in str(info.value)
    with pytest.raises(ValueError, match="not a MONAI bundle"):
        FedAvgController(bundle=str(tmp_path / "nowhere"))
    monkeypatch.setenv("FAIRFL_SERVER_MAX_MODEL_PARAMETERS", "1000")
    with pytest.raises(ValueError, match="more than FAIRFL_SERVER_MAX_MODEL_PARAMETERS, the server's limit of 1,000"):
        FedAvgController(bundle=str(FIXTURE))
