"""Networks beyond fairfl's own three (fairfl.networks through fairfl.models): any class of monai.networks.nets with
plain JSON arguments, or a hospital's own "package.module:function" factory that the building process admits in its
FAIRFL_MODEL_FACTORIES. A spec from the server is checked by check_model_spec before anything is built: every hostile
one gets a reason (a string, never an exception), nothing fetches weights, an unadmitted factory is never imported, and
the network is counted (parameters and buffers) on torch's meta device. Then what the methods read off a network:
FedNPR's classifier head, FedBN's norm layers, and a seeded start.

The networks are tiny (a few thousand parameters, inputs of 16 voxels a side) so that the file runs in seconds."""

import math
import socket
import sys
import uuid
from collections import OrderedDict

import pytest
import torch

from fairfl import models, networks
from fairfl.errors import DataError
from fairfl.models import (
    build_model,
    check_model_spec,
    classifier_head,
    forward_with_features,
    initial_state,
    norm_state_keys,
)

from helpers import built_on_meta_only

CAP = 10**9  # a limit no network here reaches, where the count is not the point
TASK = {"in_channels": 1, "num_classes": 2, "spatial_dims": 2}

SEGRESNET_3D = {
    "name": "SegResNet",
    "in_channels": 1,
    "num_classes": 3,
    "spatial_dims": 3,
    "args": {"init_filters": 8, "blocks_down": [1, 1, 1], "blocks_up": [1, 1]},
}
ATTENTION_UNET_2D = {
    "name": "AttentionUnet",
    "in_channels": 2,
    "num_classes": 3,
    "spatial_dims": 2,
    "args": {"channels": [4, 8, 16], "strides": [2, 2]},
}
DENSENET_3D = {
    "name": "DenseNet121",
    "in_channels": 1,
    "num_classes": 3,
    "spatial_dims": 3,
    "args": {"init_features": 4, "growth_rate": 4, "block_config": [1, 1]},
}
DENSENET_2D = {**DENSENET_3D, "spatial_dims": 2, "num_classes": 4}
# dropout_path_rate > 0: SwinUNETR reads its drop-path rates with .item(), which a meta tensor cannot answer
SWIN_UNETR = {
    "name": "SwinUNETR",
    "in_channels": 1,
    "num_classes": 2,
    "spatial_dims": 3,
    "args": {"feature_size": 12, "depths": [1, 1, 1, 1], "num_heads": [1, 1, 1, 1], "dropout_path_rate": 0.1},
}
EFFICIENTNET = {**TASK, "name": "EfficientNetBN", "args": {"model_name": "efficientnet-b0"}}
NO_NORM_UNET = {**TASK, "name": "UNet", "args": {"channels": [4, 8], "strides": [2], "norm": None}}


def size(model: torch.nn.Module) -> int:
    """What a network takes in memory, in numbers: its parameters and its buffers."""
    return sum(t.numel() for t in (*model.parameters(), *model.buffers()))


def conv_dims(model: torch.nn.Module) -> set:
    """The spatial dimensions of a network's convolutions (transposed ones too)."""
    return {m.weight.dim() - 2 for m in model.modules() if isinstance(m, torch.nn.modules.conv._ConvNd)}


def assert_counted(spec: dict, count: int, environ=None) -> None:
    """check_model_spec counts exactly `count` parameters and buffers: accepted at that limit, refused one below."""
    assert check_model_spec(spec, count, environ=environ) is None
    assert check_model_spec(spec, count - 1, environ=environ) == (
        f"has {count:,} parameters, more than this site's limit of {count - 1:,}"
    )


# --- MONAI's networks: built, trained, counted ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "shape"),
    [(SEGRESNET_3D, (2, 1, 16, 16, 16)), (ATTENTION_UNET_2D, (2, 2, 16, 16)), (DENSENET_3D, (2, 1, 16, 16, 16))],
    ids=["SegResNet-3d", "AttentionUnet-2d", "DenseNet121-3d"],
)
def test_a_monai_network_builds_with_the_task_s_shape_trains_a_step_and_is_counted_exactly(spec, shape):
    """The task's in_channels, num_classes and spatial_dims reach the constructor under its own names (a 3-D spec
    makes 3-D convolutions, the classes are the output's channels), the loss reaches every weight and one optimiser
    step moves those with a gradient, and the spec check's count on the meta device is the real network's."""
    torch.manual_seed(0)
    model = build_model(spec)
    assert type(model).__name__ == spec["name"]
    assert conv_dims(model) == {spec["spatial_dims"]}

    images = torch.randn(shape)
    out = model(images)
    segmentation = out.dim() > 2
    assert out.shape == (shape[0], spec["num_classes"], *(shape[2:] if segmentation else ()))
    targets = torch.randint(0, spec["num_classes"], (shape[0], *shape[2:]) if segmentation else (shape[0],))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    loss = torch.nn.functional.cross_entropy(out, targets)
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert math.isfinite(loss.item())
    unreached = [name for name, p in model.named_parameters() if p.grad is None]
    assert not unreached, f"weights the loss does not reach: {unreached}"
    # every weight with a gradient moved (a convolution's bias right before batch norm has none: the norm removes it)
    unmoved = [n for n, p in model.named_parameters() if p.grad.abs().max() > 1e-6 and torch.equal(p, before[n])]
    assert not unmoved and sum(not torch.equal(p, before[n]) for n, p in model.named_parameters()) > 0.5 * len(before)

    assert_counted(spec, size(model))


def test_fairfl_s_own_networks_are_2d_or_3d_as_the_spec_says():
    """unet, cnn and resnet18 with spatial_dims 3 are volume networks (3-D convolutions, a volume in, the task's classes
    out); a resnet18 with group norm has no batch norm left in 3-D either (MONAI passes `norm` to the stem only)."""
    volume = torch.randn(2, 1, 16, 16, 16)
    specs = {
        "unet": {"name": "unet", "channels": [4, 8], "strides": [2]},
        "cnn": {"name": "cnn", "channels": [4, 8], "norm_groups": 2},
        "resnet18": {"name": "resnet18", "norm": "group", "norm_groups": 4},
    }
    for name, spec in specs.items():
        spec = {**spec, "in_channels": 1, "num_classes": 3, "spatial_dims": 3}
        model = build_model(spec)
        assert conv_dims(model) == {3}, name
        out = model(volume)
        assert out.shape == ((2, 3, 16, 16, 16) if name == "unet" else (2, 3)), name
        assert_counted(spec, size(model))
    batch_norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    assert not batch_norms and any(isinstance(m, torch.nn.GroupNorm) for m in model.modules())


def test_swin_unetr_is_counted_on_the_meta_device_without_allocating(monkeypatch):
    """SwinUNETR reads values out of tensors while it is built (`.item()` of its drop-path rates), which a meta tensor
    cannot answer: the spec check still builds it only on the meta device and counts what the real build holds."""
    real = size(build_model(SWIN_UNETR))
    with torch.device("meta"), pytest.raises(Exception, match="meta"):
        build_model(SWIN_UNETR)  # what _SizeOnly is there for: plain meta building fails
    devices = built_on_meta_only(monkeypatch)
    assert_counted(SWIN_UNETR, real)
    assert devices == ["meta"]  # built once: the second check reads the count it remembers


def test_efficientnet_is_built_without_fetching_and_fetching_arguments_are_refused(monkeypatch):
    """EfficientNetBN's constructor downloads ImageNet weights by default (pretrained=True): fairfl tells it
    pretrained=False, so it builds offline; a job's argument that would fetch or read weights is refused, naming it."""
    from monai.networks.nets import efficientnet

    fetched = []

    def no_fetching(url, *args, **kwargs):
        fetched.append(url)
        raise AssertionError(f"fetched {url}")

    def no_network(*args):
        raise AssertionError("opened a network connection")

    monkeypatch.setattr(efficientnet.model_zoo, "load_url", no_fetching)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    with pytest.raises(AssertionError, match="fetched"):  # the guard catches MONAI's own default
        efficientnet.EfficientNetBN("efficientnet-b0", in_channels=1, num_classes=2)
    fetched.clear()

    model = build_model(EFFICIENTNET).eval()
    assert model(torch.randn(1, 1, 32, 32)).shape == (1, 2)
    assert check_model_spec(EFFICIENTNET, CAP) is None
    assert check_model_spec({**EFFICIENTNET, "args": {**EFFICIENTNET["args"], "pretrained": False}}, CAP) is None
    assert fetched == []
    for key, value in (("pretrained", True), ("pretrained_path", "/x"), ("weights_url", "http://")):
        problem = check_model_spec({**EFFICIENTNET, "args": {**EFFICIENTNET["args"], key: value}}, CAP)
        assert isinstance(problem, str) and f"argument {key}=" in problem and "fetch" in problem, problem
    assert check_model_spec({**EFFICIENTNET, "args": {**EFFICIENTNET["args"], "progress": False}}, CAP) is None
    assert fetched == []


def test_a_monai_network_that_fetches_by_default_is_refused(monkeypatch):
    """A constructor whose default is a weights name, path or URL (Transchex downloads BERT from its default
    path_or_repo_id "bert-base-uncased") cannot be told not to fetch: refused before it is called."""
    from monai.networks import nets

    called = []

    class FetchingNet(torch.nn.Module):
        def __init__(self, in_channels, out_channels, spatial_dims=2, weights_url="https://example.org/w.pt"):
            super().__init__()
            called.append(weights_url)

    monkeypatch.setattr(nets, "FetchingNet", FetchingNet, raising=False)
    problem = check_model_spec({**TASK, "name": "FetchingNet"}, CAP)
    assert isinstance(problem, str) and "weights_url" in problem, problem
    with pytest.raises(ValueError, match="weights_url"):
        build_model({**TASK, "name": "FetchingNet"})
    assert called == []
    args = {"img_size": [32, 32], "patch_size": [16, 16]}
    args.update(num_language_layers=1, num_vision_layers=1, num_mixed_layers=1)
    problem = check_model_spec({**TASK, "name": "Transchex", "args": args}, CAP)
    assert isinstance(problem, str) and "path_or_repo_id" in problem, problem


# --- hostile specs: a reason each, never an exception --------------------------------------------------------------
HUGE_SEGRESNET = {**TASK, "name": "SegResNet", "args": {"init_filters": 256}}
HOSTILE_SPECS = {
    "not-an-object": (["SegResNet"], "must be an object"),
    "unknown-monai-name": ({**TASK, "name": "NoSuchNet"}, "not a network class of monai.networks.nets"),
    "a-class-not-a-network": ({**TASK, "name": "BlockArgs"}, "not a network class of monai.networks.nets"),
    "a-function": ({**TASK, "name": "MedNeXtS"}, "not a network class of monai.networks.nets"),
    "lowercase": ({**TASK, "name": "segresnet"}, "is not one of unet"),
    "space": ({**TASK, "name": "Seg Res"}, "is not one of unet"),
    "empty": ({**TASK, "name": ""}, "is not one of unet"),
    "a-number": ({**TASK, "name": 5}, "is not one of unet"),
    "dotted-path": ({**TASK, "name": "os.system"}, "is not one of unet"),
    "os:system": ({**TASK, "name": "os:system"}, "not admitted"),
    "path-like-module": ({**TASK, "name": "../x:y"}, "is not one of unet"),
    "two-colons": ({**TASK, "name": "a:b:c"}, "is not one of unet"),
    "no-place-for-channels": ({**TASK, "name": "MILModel"}, "takes none of ['in_channels'"),
    "unknown-key": ({**TASK, "name": "SegResNet", "channels": [4]}, "unknown key(s) ['channels']"),
    # FLARE's messages (msgpack, strict_map_key=False) can carry integer keys
    "integer-key": ({**TASK, "name": "SegResNet", 1: 0, "x": 0}, "unknown key(s)"),
    "integer-key-own": ({"name": "unet", 1: 0, "x": 0}, "unknown key(s)"),
    "args-for-own-network": ({"name": "unet", "args": {}}, "unknown key(s) ['args']"),
    "no-classes": ({"name": "SegResNet", "in_channels": 1}, "needs in_channels and num_classes"),
    "args-text": ({**TASK, "name": "SegResNet", "args": "init_filters=8"}, "args must be an object"),
    "args-list": ({**TASK, "name": "SegResNet", "args": [8]}, "args must be an object"),
    "args-in_channels": ({**TASK, "name": "SegResNet", "args": {"in_channels": 3}}, "are the task's"),
    "args-out_channels": ({**TASK, "name": "SegResNet", "args": {"out_channels": 3}}, "are the task's"),
    # a constructor taking **kwargs (DenseNet121) is still given the task's channels only under fairfl's names
    "args-n_input_channels": ({**TASK, "name": "DenseNet121", "args": {"n_input_channels": 3}}, "are the task's"),
    "args-spatial_dims": ({**TASK, "name": "SegResNet", "args": {"spatial_dims": 3}}, "are the task's"),
    "unknown-argument": ({**TASK, "name": "SegResNet", "args": {"bogus": 1}}, "takes no argument(s) ['bogus']"),
    "nan": ({**TASK, "name": "SegResNet", "args": {"dropout_prob": float("nan")}}, "is not a finite number"),
    "inf": ({**TASK, "name": "SegResNet", "args": {"dropout_prob": float("inf")}}, "is not a finite number"),
    "minus-inf-in-list": (
        {**TASK, "name": "AttentionUnet", "args": {"channels": [4, -math.inf]}},
        "is not a finite number",
    ),
    "nested-5-deep": ({**TASK, "name": "DynUNet", "args": {"kernel_size": [[[[[3]]]]]}}, "nested deeper than 4"),
    "2000-values": ({**TASK, "name": "SegResNet", "args": {"blocks_down": list(range(2000))}}, "more than 1000 values"),
    "integer-argument-name": ({**TASK, "name": "SegResNet", "args": {1: 2}}, "argument name 1 is not an identifier"),
    "argument-name-not-identifier": ({**TASK, "name": "SegResNet", "args": {"1bad": 2}}, "is not an identifier"),
    "integer-key-nested": (
        {**TASK, "name": "SegResNet", "args": {"norm": ["group", {1: 8}]}},
        "dict is not a JSON value",
    ),
    "bytes": ({**TASK, "name": "SegResNet", "args": {"act": b"relu"}}, "bytes is not a JSON value"),
    "a-function-value": ({**TASK, "name": "SegResNet", "args": {"act": print}}, "is not a JSON value"),
    # SegResNet's group norm has 8 groups: 4 filters cannot be split into them
    "constructor-refuses": ({**TASK, "name": "SegResNet", "args": {"init_filters": 4}}, "cannot be built: ValueError"),
    "spatial_dims-4": ({**TASK, "name": "SegResNet", "spatial_dims": 4}, "spatial_dims 4 is not an integer in [2, 3]"),
    "spatial_dims-text": ({**TASK, "name": "SegResNet", "spatial_dims": "3"}, "spatial_dims '3' is not an integer"),
    "in_channels-0": ({**TASK, "name": "SegResNet", "in_channels": 0}, "in_channels 0 is not an integer"),
    "in_channels-bool": ({**TASK, "name": "SegResNet", "in_channels": True}, "in_channels True is not an integer"),
    "a-billion-classes": (
        {**TASK, "name": "SegResNet", "num_classes": 10**9},
        "num_classes 1000000000 is not an integer",
    ),
    "over-the-cap": (HUGE_SEGRESNET, "parameters, more than this site's limit of 100,000,000"),
}


@pytest.mark.parametrize(("spec", "reason"), HOSTILE_SPECS.values(), ids=HOSTILE_SPECS)
def test_a_hostile_spec_gets_a_reason_never_an_exception(spec, reason, monkeypatch):
    """check_model_spec answers every spec a server could send with a reason string (the site turns it into bad task
    data naming model_spec), whatever the spec holds; nothing is built for real (the meta device only)."""
    monkeypatch.delenv(networks.MODEL_FACTORIES_ENV, raising=False)
    devices = built_on_meta_only(monkeypatch)
    problem = check_model_spec(spec, 10**8, environ={})
    assert isinstance(problem, str) and reason in problem, problem
    assert set(devices) <= {"meta"}


# --- a hospital's own factory ----------------------------------------------------------------------------------------
HOSPITAL_SOURCE = """
import torch


class HospitalNet(torch.nn.Module):
    def __init__(self, in_channels, num_classes, width, table):
        super().__init__()
        self.received = {"in_channels": in_channels, "num_classes": num_classes, "width": width}
        self.body = torch.nn.Conv2d(in_channels, width, 3, padding=1)
        self.head = torch.nn.Conv2d(width, num_classes, 1)
        self.register_buffer("table", torch.zeros(table))  # no parameter, memory all the same

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


def make(in_channels, num_classes, width=4, table=0):
    return HospitalNet(in_channels, num_classes, width, table)
"""


@pytest.fixture
def hospital(tmp_path, monkeypatch):
    """The name of a fresh module of a hospital's factory `make` on sys.path (never imported by the fixture)."""
    name = f"hospital_nets_{uuid.uuid4().hex[:12]}"
    (tmp_path / f"{name}.py").write_text(HOSPITAL_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(networks.MODEL_FACTORIES_ENV, raising=False)
    yield name
    sys.modules.pop(name, None)


def test_an_unadmitted_factory_is_refused_and_never_imported(hospital):
    """A factory this process's FAIRFL_MODEL_FACTORIES does not list is refused, by the spec check and by the build,
    before its module is imported (importing is running the hospital's code)."""
    spec = {**TASK, "name": f"{hospital}:make", "args": {"width": 6}}
    for environ in (None, {}, {networks.MODEL_FACTORIES_ENV: "other.pkg:make, " + f"{hospital}:other"}):
        problem = check_model_spec(spec, CAP, environ=environ)
        assert isinstance(problem, str) and "not admitted" in problem and networks.MODEL_FACTORIES_ENV in problem
        with pytest.raises(ValueError, match="is not admitted here"):
            build_model(spec, environ)
    assert hospital not in sys.modules


def test_an_admitted_factory_gets_the_task_s_shape_and_is_counted_with_its_buffers(hospital):
    """Admitted (`environ`'s list), the factory gets the task's in_channels and num_classes under its own names and its
    `args`; its count takes in its buffers, so a network with few parameters but a huge buffer is refused."""
    environ = {networks.MODEL_FACTORIES_ENV: f" other.pkg:make ,{hospital}:make"}
    spec = {"name": f"{hospital}:make", "in_channels": 3, "num_classes": 5, "args": {"width": 6}}
    model = build_model(spec, environ)
    assert model.received == {"in_channels": 3, "num_classes": 5, "width": 6}
    assert model(torch.randn(1, 3, 8, 8)).shape == (1, 5, 8, 8)
    parameters = sum(p.numel() for p in model.parameters())
    assert parameters == 3 * 6 * 9 + 6 + 6 * 5 + 5
    assert_counted(spec, parameters, environ)

    big = {**spec, "args": {"width": 6, "table": 10**9}}  # 4 GB of buffer, counted on the meta device
    assert check_model_spec(big, 10**6, environ=environ) == (  # refused while it is built: a far larger buffer
        "cannot be built: ValueError: it makes far more values than the limit allows while it is built"
    )
    fits = {**spec, "args": {"width": 6, "table": 2 * 10**6}}  # over the limit, within what sizing may build
    assert check_model_spec(fits, 10**6, environ=environ) == (
        f"has {parameters + 2 * 10**6:,} parameters, more than this site's limit of 1,000,000"
    )
    assert check_model_spec(big, 10**6) and "not admitted" in check_model_spec(big, 10**6)  # os.environ: not here


def test_a_malformed_factory_list_is_a_clear_error_naming_the_variable(hospital):
    """An entry of FAIRFL_MODEL_FACTORIES that is not package.module:function is the site's own mistake: a ValueError
    naming the variable from the build, a reason naming it from the check; nothing is imported."""
    spec = {**TASK, "name": f"{hospital}:make"}
    for value in (f"{hospital}:make,../evil:x", f"{hospital}:make;os:system", f"{hospital}.make"):
        environ = {networks.MODEL_FACTORIES_ENV: value}
        with pytest.raises(ValueError, match=f"environment variable {networks.MODEL_FACTORIES_ENV}"):
            networks.admitted_factories(environ)
        with pytest.raises(ValueError, match=networks.MODEL_FACTORIES_ENV):
            build_model(spec, environ)
        problem = check_model_spec(spec, CAP, environ=environ)
        assert isinstance(problem, str) and f"environment variable {networks.MODEL_FACTORIES_ENV}" in problem
    assert hospital not in sys.modules


def test_a_site_refuses_a_factory_its_own_environment_does_not_admit(hospital, monkeypatch):
    """The site checks the server's spec with its own FAIRFL_MODEL_FACTORIES: bad task data naming the site and the
    field model_spec when the site does not admit the factory (the server's admitting it is no matter), accepted
    when it does."""
    from fairfl.flare.site_task import check_meta

    spec = {**TASK, "name": f"{hospital}:make", "args": {"width": 4}}
    monkeypatch.setenv(networks.MODEL_FACTORIES_ENV, "other.pkg:make")
    with pytest.raises(DataError) as info:
        check_meta("site-1", {"model_spec": spec})
    assert info.value.site == "site-1" and "model_spec" in str(info.value) and "not admitted" in str(info.value)
    assert hospital not in sys.modules
    monkeypatch.setenv(networks.MODEL_FACTORIES_ENV, f"{hospital}:make")
    assert check_meta("site-1", {"model_spec": spec}) is None
    assert hospital in sys.modules


# --- FedNPR's head, FedBN's norms, a seeded start -------------------------------------------------------------------
class ScaledAfterHead(torch.nn.Module):
    """Scales the logits after its last linear layer: its head's input is not what the logits are read from."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(4, 8)
        self.fc = torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.fc(torch.relu(self.body(x))) * 2


class HeadRegisteredFirst(torch.nn.Module):
    """Its classifier is registered before the body: the last nn.Linear registered is not the last one applied."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 2)
        self.body = torch.nn.Linear(4, 8)

    def forward(self, x):
        return self.fc(torch.relu(self.body(x)))


class UnusedLinear(torch.nn.Module):
    """Has a linear layer its forward never calls."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(4, 2)
        self.spare = torch.nn.Linear(2, 2)

    def forward(self, x):
        return self.body(x)


def test_fednpr_s_head_of_a_monai_classifier_gives_the_logits_from_the_features():
    """DenseNet121's classifier is its last linear layer: the features forward_with_features returns are that layer's
    input (head(features) == logits, exactly), keep their graph to the extractor, and the head's state keys are its."""
    from fairfl.models import head_state_keys

    torch.manual_seed(0)
    model = build_model(DENSENET_2D)
    name, head = classifier_head(model)
    assert name == "class_layers.out" and head.out_features == 4
    features, logits = forward_with_features(model, torch.randn(3, 1, 16, 16))
    assert features.shape == (3, head.in_features) and logits.shape == (3, 4)
    assert torch.equal(head(features), logits)
    features.pow(2).mean().backward()
    assert model.features.conv0.weight.grad is not None and model.features.conv0.weight.grad.abs().sum() > 0
    assert head_state_keys(DENSENET_2D) == ["class_layers.out.weight", "class_layers.out.bias"]


@pytest.mark.parametrize("network", [ScaledAfterHead, HeadRegisteredFirst, UnusedLinear])
def test_a_network_whose_forward_does_not_end_with_its_last_linear_layer_is_refused(network):
    """Features that are not the classifier's input would train FedNPR's prototypes on the wrong thing: refused with a
    ValueError naming the network and the layer taken for the head."""
    model = network()
    name, _ = classifier_head(model)
    with pytest.raises(ValueError, match=f"{network.__name__}'s forward does not end with its last linear layer"):
        forward_with_features(model, torch.randn(2, 4))
    with pytest.raises(ValueError, match=repr(name)):
        forward_with_features(model, torch.randn(2, 4))


def test_a_segmentation_network_has_no_classifier_head():
    with pytest.raises(ValueError, match="SegResNet has no linear classifier head"):
        classifier_head(build_model({**TASK, "name": "SegResNet", "args": {"init_filters": 8}}))


def test_fedbn_finds_the_norm_layers_by_type():
    """norm_state_keys names exactly the state of the normalisation layers (group norm in SegResNet, 3-D batch norm
    with its running statistics in fairfl's 3-D resnet18), from a model or its spec, and nothing for a network
    without norm."""

    def by_type(model, kinds):
        return {f"{n}.{k}" for n, m in model.named_modules() if isinstance(m, kinds) for k in m.state_dict()}

    segresnet = build_model(SEGRESNET_3D)
    keys = norm_state_keys(segresnet)
    assert keys and set(keys) == by_type(segresnet, torch.nn.GroupNorm) and len(keys) == len(set(keys))
    assert norm_state_keys(SEGRESNET_3D) == keys

    resnet = {"name": "resnet18", "in_channels": 1, "num_classes": 2, "spatial_dims": 3}
    model = build_model(resnet)
    keys = norm_state_keys(model)
    assert set(keys) == by_type(model, torch.nn.BatchNorm3d) and not by_type(model, torch.nn.BatchNorm2d)
    assert {"bn1.weight", "bn1.running_mean", "bn1.running_var", "bn1.num_batches_tracked"} <= set(keys)
    assert not any(k.startswith(("conv1.", "fc.")) for k in keys)

    plain = build_model(NO_NORM_UNET)
    assert norm_state_keys(plain) == [] and plain.state_dict()


def test_the_same_seed_builds_the_same_network_and_another_seed_another():
    """initial_state is deterministic in its seed (every site and a resumed server build the same start); another seed
    gives other weights, of the same keys and shapes."""
    for spec in (ATTENTION_UNET_2D, SEGRESNET_3D):
        first, again, other = initial_state(spec, 3), initial_state(spec, 3), initial_state(spec, 4)
        assert list(first) == list(again) == list(other)
        assert all((first[k] == again[k]).all() for k in first)
        assert all(first[k].shape == other[k].shape for k in first)
        assert any(not (first[k] == other[k]).all() for k in first)
        torch.manual_seed(3)
        built = build_model(spec).state_dict()
        assert all((built[k].numpy() == first[k]).all() for k in first)


def test_a_network_of_hundreds_of_layers_is_refused_while_it_is_built_not_after():
    """A hostile server's spec may be legal JSON of a few numbers and still describe a network that takes minutes to
    build even on the meta device (DenseNet121 with a block of thousands of layers): sizing stops once it has made a
    generous multiple of the limit in values, so a site refuses it in bounded time."""
    import time

    spec = {"name": "DenseNet121", "in_channels": 1, "num_classes": 2, "args": {"block_config": [400]}}
    started = time.process_time()
    problem = check_model_spec(spec, 10**6)
    assert problem == "cannot be built: ValueError: it makes far more values than the limit allows while it is built"
    assert time.process_time() - started < 10


def test_a_spec_is_built_once_per_process_for_its_count_and_its_shapes(monkeypatch):
    """Every task carries the spec: a site builds it on the meta device once, for its count and for the shapes a
    received or kept state dict is checked against; another spec, or the same spec where other factories are admitted,
    is built anew. A refusal is never remembered."""
    monkeypatch.setattr(models, "_SPEC_CACHE", OrderedDict())  # nothing remembered from other tests
    spec = {"name": "unet", "in_channels": 1, "num_classes": 2, "channels": [4, 8, 12], "strides": [2, 2]}
    assert check_model_spec(spec, CAP) is None
    shapes = models.meta_state(spec)
    assert all(t.is_meta for t in shapes.values())
    built = []
    real_build = models.build_model
    monkeypatch.setattr(models, "build_model", lambda *a, **k: built.append(a) or real_build(*a, **k))
    again = models.meta_state(spec)
    assert check_model_spec(spec, CAP) is None and all(again[k] is v for k, v in shapes.items()) and not built
    assert check_model_spec(spec, 10) == f"has {sum(t.numel() for t in shapes.values()):,} parameters, more than " + (
        "this site's limit of 10"
    )
    assert not built  # the count is the spec's, the limit the caller's
    wider = {**spec, "channels": [4, 8, 16]}
    assert check_model_spec(wider, CAP) is None and len(built) == 1
    key = next(iter(shapes))
    assert models.meta_state(spec, {networks.MODEL_FACTORIES_ENV: "other.pkg:make"})[key] is not shapes[key]


def test_the_shapes_a_site_checks_against_are_built_on_the_meta_device_for_any_admitted_network(monkeypatch):
    """SwinUNETR reads values out of tensors while it is built; the reference shapes are built as its count is (reads
    give 0), and each caller gets a dict of its own, so removing a key from it changes no later check."""
    monkeypatch.setattr(models, "_SPEC_CACHE", OrderedDict())
    shapes = models.meta_state(SWIN_UNETR)
    assert shapes.keys() == build_model(SWIN_UNETR).state_dict().keys()
    shapes.pop(next(iter(shapes)))
    assert models.meta_state(SWIN_UNETR).keys() == build_model(SWIN_UNETR).state_dict().keys()
