"""Every argument of every fairfl component, declared once: its kind (type and range or choices), its default and
what it means. The constructors check their arguments here (`check_all`), and so do `fairfl run` (with or without
`--set`), the recipe, `fairfl poc submit`, `fairfl submit` and `fairfl export-job` before anything starts
(fairfl.jobconfig.check_job), so a bad value ends in an error naming the component and the argument, never a
traceback, a hang or a huge allocation later.

A component is named by its class path; COMPONENTS maps each to its arguments in the order its job files list them.
The site's executor and the round every controller runs are declared here; a method's controller takes the round's
arguments and those its unit declares (`fairfl.methods.<name>.arguments`), found through the method registry.
No FLARE or torch import here, so the command line checks a job without starting either. Where a module that imports
torch also holds a value declared here or in a unit (a default, a list of modes), tests/core/test_arguments.py
checks that the two agree."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping

from fairfl.argument import MAX_FACTOR, Argument
from fairfl.data.builtin import BUILTIN_DATASETS, MAX_TEST_SCALE, check_test_scale
from fairfl.flare.update_filters import check_privacy_filter
from fairfl.kinds import Boolean, Checked, Integer, ListOf, Nullable, OneOf, Pattern, Real, Text, shown
from fairfl.methods import UNITS
from fairfl.names import safe_name
from fairfl.networks import argument_problem, is_network_name
from fairfl.presets import ADAM_BETAS, PRESETS
from fairfl.privacy import settings as privacy
from fairfl.quorum import check_min_clients
from fairfl.site_settings import MOVED_ARGUMENTS

OWN_NETWORKS = ("unet", "cnn", "resnet18")  # fairfl.models.DEFAULTS; any other network is fairfl.networks
MIN_IMAGE_SIZE = 16  # the smallest image the networks take (the U-Net halves it three times)
MAX_ROUNDS = 100_000
MAX_SECONDS = 30 * 24 * 3600  # a month: any longer wait is a mistake, not a setting
MAX_SEED = 2**32 - 1  # numpy's seeds
MIN_LR = 1e-12  # a site's lr, and the lr the q-FedAvg server accepts from a site (L = 1 / lr)
# arguments that left the sites' executor for a method's controller: a job folder written before still names them
MOVED_TO_SERVER = {
    name: "Fed-LWR's controller (its server config)" for name in ("cka_split", "cka_max_samples", "cka_batch_size")
}


def problem(argument: Argument, value) -> str | None:
    """Why `value` cannot be `argument`, naming it, or None."""
    if argument.kind.allows(value):
        return None
    return f"{argument.name} must be {argument.kind}, got {shown(value)}"


def check_update_ratio(value) -> None:
    """0 (no check) or a finite number in [1, MAX_FACTOR]: a ratio below 1 would reject every site, the median one
    included, as an outlier of the round's median."""
    if not (Real(1, MAX_FACTOR).allows(value) or (Real(0, 0).allows(value))):
        raise ValueError(f"max_update_ratio must be 0 or in [1, {MAX_FACTOR:g}], got {shown(value)}")


def with_defaults(arguments: tuple, **defaults) -> tuple:
    """`arguments` with the defaults of those named changed (a controller's own defaults: Fed-LWR's uniform
    weighting)."""
    unknown = set(defaults) - {a.name for a in arguments}
    if unknown:
        raise ValueError(f"no argument(s) {sorted(unknown)} to change the default of")
    return tuple(dataclasses.replace(a, default=defaults.get(a.name, a.default)) for a in arguments)


def _refuse_network(name) -> bool:
    raise ValueError(f"{shown(name)} is not a network name")


def _site_name(value) -> str:
    return safe_name(value, "site name")


# --- the server: every controller's round (fairfl.flare.engine.FairRoundController) ----------------------------------
ROUND = (
    Argument("num_rounds", Integer(1, MAX_ROUNDS), 20, "communication rounds (the paper: 200; CPU default 20)"),
    Argument(
        "eval_every",
        Integer(1, MAX_ROUNDS),
        5,
        "evaluate the global model on every site's test split every N rounds and at the end",
    ),
    Argument(
        "min_clients",
        Checked(check_min_clients, 'null or "majority" (more than half the sites), "all" or a positive number'),
        None,
        "how many of the sites that train must answer a task for the round to go on (fairfl.quorum): null or "
        '"majority" = more than half of them (2 of 3, 4 of 6), "all", or a number. The others are recorded absent or '
        "failed for the round; fewer answers end the job with a clear message",
    ),
    Argument(
        "task_timeout",
        Integer(1, MAX_SECONDS),
        3600,
        "seconds (whole: NVFlare's tasks count whole seconds) to wait for a task's answers before going on with those "
        "received",
    ),
    Argument("seed", Integer(0, MAX_SEED), 0, "seed of the initial global model"),
    Argument("data_seed", Integer(0, MAX_SEED), 0, "seed of the built-in synthetic data (ignored with a data root)"),
    Argument(
        "dataset",
        OneOf(tuple(BUILTIN_DATASETS)),
        "prostate",
        'built-in data of sites without a data root, and so the task: segmentation "prostate" (T2 MRI slices), '
        '"prostate3d" (T2 MRI volumes, 3-D) or "fundus" (RGB, disc/cup); classification under quality shift "skin" '
        '(8 dermoscopy classes, RGB) or "ich" (5 hemorrhage subtypes, CT), with Gaussian-noise corrupted sites, or '
        '"skin_blur", "ich_blur" with motion blur; "skin_imbalanced", "ich_imbalanced" (FedNPR). With a data root, '
        "name the built-in dataset of the same task",
    ),
    # the ranges of the model spec a site accepts (fairfl.models.SPEC_INTS, SPEC_LISTS)
    Argument(
        "num_classes",
        Nullable(Integer(1, 100_000)),
        None,
        "classes of the data, background included; null = the built-in dataset's (prostate 2, fundus 3, skin 8, ich 5)",
    ),
    Argument(
        "in_channels",
        Nullable(Integer(1, 64)),
        None,
        "image channels; null = the built-in dataset's (prostate 1, fundus 3, skin 3, ich 1)",
    ),
    Argument(
        "task",
        Nullable(OneOf(("segmentation", "classification"))),
        None,
        "what the data is for; null = the built-in dataset's. Your own data declares it in its dataset.json (read "
        "when --set names a data_root), and each site refuses a task its dataset.json contradicts",
    ),
    Argument(
        "spatial_dims",
        Nullable(Integer(2, 3)),
        None,
        "2 (images, slices) or 3 (volumes); null = the built-in dataset's (prostate3d 3, the others 2)",
    ),
    Argument(
        "model",
        Nullable(
            Checked(
                lambda name: name in OWN_NETWORKS or is_network_name(name) or _refuse_network(name),
                '"unet", "cnn", "resnet18", a class of monai.networks.nets or a package.module:function factory',
            )
        ),
        None,
        '"unet", "cnn" (small CNN) or "resnet18" (MONAI, never pretrained); any class of monai.networks.nets '
        '(e.g. "SegResNet", "DenseNet121", with model_args); or a hospital\'s own "package.module:function" that '
        "every site (and the server) admits in its FAIRFL_MODEL_FACTORIES (fairfl.networks); null = unet for "
        "segmentation, cnn for classification",
    ),
    Argument(
        "model_args",
        Nullable(Checked(argument_problem, "an object of the constructor's arguments (JSON values)", reports=True)),
        None,
        "the arguments of a model that is not fairfl's own, as its constructor names them (e.g. SegResNet "
        '{"init_filters": 8}); the task gives in_channels, num_classes and spatial_dims. Nothing that fetches '
        "weights (pretrained, a path): the federation's start comes from the server",
    ),
    Argument(
        "bundle",
        Text(),
        "",
        "a MONAI bundle folder on the server (configs/, models/model.pt; fairfl.bundle): its network_def is the "
        "network, its preprocessing replaces fairfl's normalisation at the sites and its weights, when it has them, "
        "are the global model of round 0. Only its data is read, never its code: model, model_args and the network "
        "arguments below are then unused",
    ),
    Argument(
        "model_channels",
        Nullable(ListOf(Integer(1, 8192), 1, 10)),
        None,
        "channels per level of the U-Net, or per block of the CNN; null = the task's ([16, 32, 64, 128] for the "
        "U-Net, [16, 32, 64] for the CNN). The network may have at most FAIRFL_SERVER_MAX_MODEL_PARAMETERS parameters",
    ),
    Argument(
        "model_strides", ListOf(Integer(1, 4), 1, 9), (2, 2, 2), "the U-Net's strides, one fewer than its channels"
    ),
    Argument(
        "model_norm",
        Nullable(OneOf(("batch", "group", "instance"))),
        None,
        'fairfl\'s own networks\' normalisation, "batch", "group" (classification networks) or "instance"; null = '
        "the network's default (unet: instance, without affine parameters; cnn: group; resnet18: batch). Another "
        "network takes its own in model_args (a job's default here, e.g. FedBN's, does not apply to it)",
    ),
    Argument(
        "weighting",
        OneOf(("samples", "uniform")),
        "samples",
        '"samples" (FedAvg of McMahan et al., by training-set size) or "uniform" (1/K)',
    ),
    Argument(
        "exclude_sites",
        ListOf(Checked(_site_name, "a site name"), 0, 10_000, distinct=True),
        (),
        "sites held out of the federation: they never train nor enter aggregation but are scored with the global "
        "model as it is (a new hospital joining later; leave-one-out runs). Every evaluated record summarises them "
        "(held_out) apart from the federation's sites (federation). Not with Solo (no global model)",
    ),
    Argument(
        "preset",
        OneOf(("", *PRESETS)),
        "",
        "named settings bundle (fairfl.presets); FAIRFL_PRESET overrides it",
    ),
    Argument(
        "task_check_period",
        Real(0.01, 60),
        0.1,
        "how often the controller checks for answers, in seconds (NVFlare's ModelController: 0.5)",
    ),
    Argument(
        "straggler_timeout",
        Real(0, MAX_SECONDS, low_open=True),
        600,
        "once min_clients sites have answered a task, wait at most this many more seconds (rounded up to whole "
        "seconds) for the others; those still missing are recorded absent for the round (a crashed or disconnected "
        "site). A stalled site costs a round at most this, never task_timeout",
    ),
    Argument(
        "run_name",
        Checked(lambda name: name == "" or safe_name(name, "run_name"), '"" or a safe name (fairfl.names)'),
        "",
        '"" = an ordinary run. A name makes the run resumable: after every round the server keeps a checkpoint '
        "(round, global model, the method's state, the results so far) and the sites keep their state under that "
        "name outside the job's folder; the same job submitted again after a restart continues from the last "
        "completed round. Its settings must be unchanged (num_rounds, eval_every, min_clients and the timeouts may "
        "change). It becomes a folder name on the server and every site",
    ),
    # fairfl.site_checks.MAX_SAMPLES
    Argument(
        "max_samples",
        Integer(1, 10**12),
        10_000_000,
        "a site reporting more training samples than this, or more than it reported in its first round, is rejected "
        "for the round (its sample count weighs its model)",
    ),
    Argument(
        "max_update_ratio",
        Checked(check_update_ratio, "0 (no check) or a finite number in [1, 1e+06]"),
        10.0,
        "a site whose update (its trained model minus the model it started from) has a norm more than this many "
        "times the round's median is rejected for the round; 0 = no check (below 1 every site would be an outlier)",
    ),
    Argument(
        "max_share",
        Nullable(Real(0, 1, low_open=True)),
        None,
        "no site weighs more than this share of an aggregation (sample counts, FedCE's contributions, SAGA's and "
        "q-FedAvg's weights, AFL's lambda, Fed-LWR's layer weights, CFFL's and CGSV's reputations) when at least 3 "
        "sites are aggregated: a larger weight is cut and the rest shared in proportion; 1 = no cap. null = the "
        "method's default (0.5; Fed-LWR 1, whose ordinary layer weights exceed 0.5)",
    ),
    # fairfl.aggregation.ROBUST_MODES
    Argument(
        "robust_aggregation",
        OneOf(("none", "median", "trimmed_mean")),
        "none",
        '"none" (the method\'s weighted average), "median" or "trimmed_mean": the averaging step becomes an unweighted '
        "coordinate-wise median or trimmed mean of the accepted sites' models (CFFL, CGSV: of their updates), so a "
        "method's weights (AFL's lambda among them) weigh nothing. q-FedAvg's step is not an average: refused there",
    ),
    Argument(
        "trim_fraction",
        Real(0, 0.5, high_open=True),
        0.2,
        "trimmed_mean drops floor(trim_fraction * K) of the K values at each end, per coordinate, but at least one "
        "from 3 sites on (fairfl.aggregation.trim_count); a run with fewer than 3 training sites is refused",
    ),
    # fairfl.training.OPTIMIZERS; the momentum a site accepts (check_optimizer_settings)
    Argument(
        "local_optimizer",
        OneOf(("adam", "sgd")),
        "adam",
        'the sites\' local optimiser, "adam" (the papers\' segmentation and FedISM+ settings) or "sgd" (with '
        "momentum; q-FedAvg's authors' local solver), at the sites' lr",
    ),
    Argument("momentum", Real(0, 1, high_open=True), 0.0, "the momentum of sgd"),
    Argument(
        "keep_optimizer_state",
        Boolean(),
        False,
        "false (fairfl's default, not the papers' code): every round starts a fresh optimiser; true (Fed-LWR's and "
        "FedNPR's authors' code): each site keeps its optimiser's state (Adam's step count and moment estimates) from "
        "its previous round, in its state folder",
    ),
    # fairfl.presets.ADAM_BETAS
    Argument(
        "adam_betas",
        ListOf(Real(0, 1, high_open=True), 2, 2),
        list(ADAM_BETAS),
        "Adam's beta1 and beta2 at the sites (PyTorch's default; Fed-LWR's authors' code: [0.9, 0.99]); "
        'unused with local_optimizer "sgd"',
    ),
    Argument(
        "average_last",
        Integer(1, MAX_ROUNDS),
        1,
        "evaluate each of the last N rounds too, and add to the final record mean_of_last: each site's metrics "
        "averaged over those N evaluations (FedISM+ reports the mean of the last 5); 1 = only the last round",
    ),
    Argument(
        "test_scale",
        Checked(check_test_scale, f"a number in [1, {MAX_TEST_SCALE}]"),
        1.0,
        "the built-in data's test splits hold about this many times their items (1 to 20), the extra ones drawn from "
        "each site's own distribution; training and validation data are unchanged. A site with a data root ignores it",
    ),
    Argument(
        "cross_site_eval",
        Boolean(),
        False,
        "after the last round, every federation site's own model (Solo's local model, Ditto's personal model, the "
        "global model with FedNPR-Per's head or FedBN's normalisation layers) is sent to every site and scored on its "
        "test split: results.json cross_site. Only for the methods that score each site with a model of its own",
    ),
    # fairfl.privacy: DP-SGD at the sites (docs/running.md, "Differential privacy")
    Argument(
        "dp_epsilon",
        privacy.EPSILON,
        None,
        "null = no differential privacy. A number: every site trains with DP-SGD (per-item gradient clipping, "
        "Gaussian noise, Poisson sampling) so that the model it sends is (dp_epsilon, dp_delta)-DP for one training "
        "item over the whole run (all rounds). Refused for the methods whose local training it cannot cover, with "
        "batch norm and with cross_site_eval",
    ),
    Argument("dp_delta", privacy.DELTA, 1e-5, "the delta of dp_epsilon's guarantee (below 1 / training items)"),
    Argument(
        "dp_clip",
        privacy.CLIP,
        1.0,
        "DP-SGD: each training item's gradient is clipped to this L2 norm (over all the weights) before the noise",
    ),
)

# --- the sites: the one executor (fairfl.flare.executor.FairflExecutor) --------------------------------------------
EXECUTOR = (
    Argument(
        "data_root",
        Text(),
        "",
        "folder holding <site>.json datalists; empty = the built-in synthetic data. The site's own FAIRFL_DATA_ROOT "
        "overrides it (fairfl.site_settings)",
    ),
    Argument("image_size", Integer(MIN_IMAGE_SIZE, 2048), 64, "2-D: images and masks are resized to this square"),
    # 3-D volumes (fairfl.data.volumes): resampled and oriented, normalised, trained on patches, scored whole
    Argument(
        "patch_size",
        ListOf(Integer(MIN_IMAGE_SIZE, 1024), 3, 3),
        (64, 64, 32),
        "3-D: the training patches and the sliding window, in voxels along the RAS axes (left-right, "
        "posterior-anterior, inferior-superior) after resampling; each a multiple of the network's downsampling",
    ),
    Argument(
        "patches_per_volume",
        Integer(1, 64),
        2,
        "3-D: patches cut from a volume per visit, half centred on the foreground, half on the background (MONAI's "
        "RandCropByPosNegLabeld); a batch holds batch_size volumes' patches",
    ),
    Argument(
        "spacing",
        Nullable(ListOf(Real(0.01, 100), 3, 3)),
        None,
        "3-D: the voxel spacing in mm every volume is resampled to; null = dataset.json's `spacing`, else none",
    ),
    Argument(
        "intensity_window",
        Nullable(ListOf(Real(-1e6, 1e6), 2, 2, increasing=True)),
        None,
        "3-D: [low, high] in the image's own units mapped to [0, 1], clipped (CT: a Hounsfield window, e.g. "
        "[-1000, 1000] for the body or [0, 80] for brain); null = intensity_percentiles",
    ),
    Argument(
        "intensity_percentiles",
        ListOf(Real(0, 100), 2, 2, increasing=True),
        (0.5, 99.5),
        "3-D, without an intensity_window: each volume's [low, high] percentiles mapped to [0, 1], clipped (MR has "
        "no absolute scale)",
    ),
    Argument(
        "sliding_window_overlap",
        Real(0, 0.9),
        0.25,
        "3-D: the overlap of neighbouring windows when a whole volume is scored (MONAI's sliding_window_inference)",
    ),
    Argument(
        "batch_size",
        Nullable(Integer(1, 4096)),
        None,
        "batch size of the local update; null = the task's (fairfl.presets.TASK_DEFAULTS: segmentation 8, "
        "classification 32)",
    ),
    Argument(
        "lr",
        Nullable(Real(MIN_LR, 10)),
        None,
        "learning rate of the local optimiser; null = the task's (segmentation 1e-3, classification 3e-4)",
    ),
    Argument(
        "weight_decay",
        Nullable(Real(0, 1)),
        None,
        "weight decay of the local optimiser; null = the task's (segmentation 1e-4, classification 5e-4)",
    ),
    Argument("local_epochs", Integer(1, 1000), 1, "epochs per round, used when local_steps is 0"),
    Argument(
        "local_steps",
        Integer(0, 1_000_000),
        0,
        "if > 0, a fixed number of optimiser steps per round, equal for every site",
    ),
    Argument(
        "synthetic_size_scale",
        Nullable(Real(0, 100, low_open=True)),
        None,
        "scales the number of cases per site of the built-in data; null = the task's (segmentation 2.0, "
        "classification 1.0)",
    ),
    Argument("seed", Integer(0, MAX_SEED), 0, "base seed; each site derives its own from it and its name"),
    Argument("num_threads", Integer(0, 1024), 1, "torch intra-op threads of this client (0 = torch's default)"),
    Argument(
        "device",
        Pattern(r"auto|cpu|cuda(:[0-9]{1,4})?", '"auto", "cpu", "cuda" or "cuda:N"'),
        "auto",
        '"auto" (CUDA when present), "cpu", "cuda", "cuda:1", ...; a CUDA device the site lacks is refused there',
    ),
    Argument(
        "logit_adjustment",
        Real(0, 100),
        1.0,
        "classification only: tau of the logit-adjusted cross-entropy (Menon et al.; FedISM+ uses 1) against the "
        "site's label skew; 0 = plain cross-entropy",
    ),
    Argument("preset", OneOf(("", *PRESETS)), "", "named settings bundle (fairfl.presets); FAIRFL_PRESET overrides it"),
    # fairfl.data.loaders.AUGMENTATIONS
    Argument(
        "augmentation",
        Nullable(ListOf(OneOf(("flip", "rotate90", "intensity")), 0, 3, distinct=True)),
        None,
        'the training augmentation, a list of "flip" (mirroring along both axes), "rotate90" (quarter turns) and '
        '"intensity" (scale/shift); [] = none; null = the task\'s (all three). Leave out flip and rotate90 where '
        "orientation carries meaning",
    ),
    Argument(
        "amp",
        Boolean(),
        False,
        "mixed precision (fairfl.training.mixed_precision): the forward passes of local training, the methods' probes "
        "and evaluation under torch.autocast (float16 with a gradient scaler on CUDA, bfloat16 on CPU); false: "
        "everything in float32",
    ),
    Argument(
        "loader_workers",
        Integer(0, 64),
        0,
        "worker processes that augment the training batches beside the training (make_loader's num_workers), for a "
        "GPU site whose one loading thread cannot keep up; 0 = in the site process",
    ),
    Argument(
        "privacy_filter",
        Nullable(Checked(check_privacy_filter, 'null, "none", "exclude_vars", "percentile", "svt" or an object')),
        None,
        "NVFlare's privacy filter on the update a site's training sends (fairfl.flare.update_filters; "
        'docs/privacy.md): "percentile" (only the largest changes, clipped: Shokri and Shmatikov), "svt" (sparse '
        'vector technique), "exclude_vars" (named tensors stay on the site); an object {"name": ..., and the '
        'filter\'s own arguments} sets them, e.g. {"name": "percentile", "percentile": 90, "gamma": 0.01}; null = none',
    ),
)


def _method_controllers() -> dict[str, tuple]:
    """{class path: arguments} of every method's controller: the round's, then those its unit declares
    (`fairfl.methods.<name>.arguments`, CONTROLLERS), with the defaults the unit changes."""
    found = {}
    for unit in UNITS:
        for path, arguments in importlib.import_module(f"{unit.package}.arguments").CONTROLLERS.items():
            if path in found:
                raise ValueError(f"two method units declare the arguments of {path}")
            clash = sorted({a.name for a in ROUND} & {a.name for a in arguments.own})
            if clash:  # one name, two meanings: the unit's would silently replace the round's
                raise ValueError(f"{path} declares {clash}, which are round arguments already")
            found[path] = with_defaults(ROUND + arguments.own, **arguments.defaults)
    return found


# every fairfl component by class path: its arguments, in the order its job files list them (a class's bases' first)
COMPONENTS: Mapping[str, tuple] = {
    "fairfl.flare.executor.FairflExecutor": EXECUTOR,
    "fairfl.flare.engine.FairRoundController": ROUND,
    **_method_controllers(),
}


def component_path(component) -> str:
    """The registered path of `component`: a class path, or a class (a subclass outside COMPONENTS takes its nearest
    registered base's arguments)."""
    if isinstance(component, str):
        if component not in COMPONENTS:
            raise ValueError(f"{component} is no fairfl component (known: {', '.join(sorted(COMPONENTS))})")
        return component
    for klass in component.__mro__:
        path = f"{klass.__module__}.{klass.__qualname__}"
        if path in COMPONENTS:
            return path
    raise ValueError(
        f"{component.__module__}.{component.__qualname__} declares no arguments (fairfl.arguments or its unit's)"
    )


def declared(component) -> dict[str, Argument]:
    """{name: Argument} of `component` (a class path or a class), in its job files' order."""
    return {a.name: a for a in COMPONENTS[component_path(component)]}


def defaults(component) -> dict:
    """{name: default} of `component`, tuples as JSON lists (what `fairfl make-jobs` writes)."""
    return {
        name: list(a.default) if isinstance(a.default, tuple) else a.default for name, a in declared(component).items()
    }


def check(component, name: str, value) -> None:
    """ValueError naming the component and the argument if `value` is not one `name` of `component` takes."""
    argument = declared(component).get(name)
    if argument is None:
        raise TypeError(_unknown(component, [name]))
    why = problem(argument, value)
    if why:
        raise ValueError(f"{_short(component)}: {why}")


def check_all(component, args: Mapping) -> dict:
    """Every argument of `component` ({name: value} given, the rest defaults) if each is one it takes: else an error
    naming the component and every bad argument (TypeError for a name it does not have, as Python's own)."""
    arguments = declared(component)
    if not isinstance(args, Mapping):
        raise TypeError(f"{_short(component)}: its arguments must be an object, got {shown(args)}")
    unknown = [name for name in args if name not in arguments]
    if unknown:
        raise TypeError(_unknown(component, unknown))
    values = {name: args.get(name, a.default) for name, a in arguments.items()}
    problems = [why for name, value in values.items() if (why := problem(arguments[name], value))]
    if problems:
        raise ValueError(f"{_short(component)}: " + "; ".join(problems))
    return values


def _short(component) -> str:
    return component_path(component).rpartition(".")[2]


def _unknown(component, names) -> str:
    return (
        f"{_short(component)} got an unexpected keyword argument(s) {', '.join(map(repr, names))}"
        f"{moved_settings(names)}"
    )


def moved_settings(names) -> str:
    """Where each of `names` that was once a job argument went: the site's own settings (its environment), or a
    method's controller."""
    return "".join(
        f"; {name} is the site's own setting {MOVED_ARGUMENTS[name]} (its environment)"
        if name in MOVED_ARGUMENTS
        else f"; {name} moved to {MOVED_TO_SERVER[name]}"
        for name in names
        if name in MOVED_ARGUMENTS or name in MOVED_TO_SERVER
    )
