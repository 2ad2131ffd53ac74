"""The settings of the round every controller runs: the round arguments (fairfl.arguments.ROUND), checked there and
resolved here once into one frozen object, so the engine, its mixins and the methods read one typed value per name.

Resolved means what the round runs with: a null num_classes, in_channels or model_channels is the dataset's or the
task's, a null max_share the method's default, the whole-second waits rounded up. The active preset (`preset`,
FAIRFL_PRESET) applies when the run starts (`with_preset`), as a new object: nothing changes a settings object."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from types import SimpleNamespace

from fairfl.data.builtin import builtin_dataset
from fairfl.presets import apply_preset, fill_task_defaults
from fairfl.privacy.settings import task_field

DEFAULT_MODEL = {"segmentation": "unet", "classification": "cnn"}  # the network of a null `model`, per task


@dataclasses.dataclass(frozen=True)
class RoundSettings:
    """One field per round argument (tests/core/test_round_settings.py keeps them equal to fairfl.arguments.ROUND);
    each means what fairfl.arguments says. Frozen: no field is ever reassigned; the list fields stay lists, as the job
    gave them and config() records them."""

    num_rounds: int
    eval_every: int
    min_clients: int | str | None  # fairfl.quorum: null, "majority", "all" or a number
    task_timeout: int
    seed: int
    data_seed: int
    dataset: str
    num_classes: int  # resolved: the dataset's when null
    in_channels: int  # resolved: the dataset's when null
    task: str  # resolved: the dataset's when null ("segmentation" or "classification")
    spatial_dims: int  # resolved: the dataset's when null
    model: str | None  # null: the task's network (`network`)
    model_args: dict | None  # a network's own arguments (fairfl.networks): only for one that is not fairfl's own
    bundle: str  # a MONAI bundle folder on the server ("" none): its network replaces model and model_args
    model_channels: list[int]  # resolved: the task's when null
    model_strides: list[int]
    model_norm: str | None
    weighting: str
    exclude_sites: list[str]  # sorted
    preset: str
    task_check_period: float
    straggler_timeout: int  # resolved: whole seconds, rounded up
    run_name: str
    max_samples: int
    max_update_ratio: float
    max_share: float  # resolved: the method's default when null
    robust_aggregation: str
    trim_fraction: float
    local_optimizer: str
    momentum: float
    keep_optimizer_state: bool
    adam_betas: list[float]  # Adam's (beta1, beta2) at the sites
    average_last: int
    test_scale: float
    cross_site_eval: bool
    dp_epsilon: float | None  # null: no DP-SGD at the sites (fairfl.privacy)
    dp_delta: float
    dp_clip: float

    @classmethod
    def resolve(cls, checked: Mapping, default_max_share: float) -> RoundSettings:
        """The settings from `checked` (fairfl.arguments.check_all's values, the method's own arguments among them:
        those are left out), with a null max_share taking the method's `default_max_share`."""
        values = SimpleNamespace(**{field.name: checked[field.name] for field in dataclasses.fields(cls)})
        data = builtin_dataset(values.dataset)
        task = values.task or data.task
        network = values.model or DEFAULT_MODEL[task]
        if values.model_norm == "group" and network == "unet":
            raise ValueError("model_norm 'group' is for the classification networks; the U-Net takes batch or instance")
        own_network = network in ("unet", "cnn", "resnet18")
        if own_network and values.model_args is not None:
            raise ValueError(
                f"model_args is for a network that is not fairfl's own; {network} takes model_channels, model_strides "
                f"and model_norm"
            )
        if values.dp_epsilon is not None and values.cross_site_eval:
            raise ValueError(
                "dp_epsilon with cross_site_eval: cross-site evaluation sends each site's own model, which a method "
                "may train outside DP-SGD (a personal model); leave one of them out"
            )
        fill_task_defaults(values, task)
        return cls(
            **{
                **vars(values),
                "task": task,
                "spatial_dims": int(values.spatial_dims or data.spatial_dims),
                "num_classes": int(values.num_classes or data.num_classes),
                "in_channels": int(values.in_channels or data.in_channels),
                "model_strides": list(values.model_strides),
                "exclude_sites": sorted(values.exclude_sites),
                # NVFlare waits whole seconds: round up, so a fraction of a second never becomes no wait at all
                "straggler_timeout": math.ceil(values.straggler_timeout),
                "max_share": float(default_max_share if values.max_share is None else values.max_share),
                "max_update_ratio": float(values.max_update_ratio),
                "trim_fraction": float(values.trim_fraction),
                "momentum": float(values.momentum),
                "adam_betas": [float(beta) for beta in values.adam_betas],
                "test_scale": float(values.test_scale),
                "dp_epsilon": None if values.dp_epsilon is None else float(values.dp_epsilon),
                "dp_delta": float(values.dp_delta),
                "dp_clip": float(values.dp_clip),
            }
        )

    def with_preset(self) -> RoundSettings:
        """These settings with the overrides of the active preset for the task (fairfl.presets: FAIRFL_PRESET wins
        over `preset`)."""
        values = SimpleNamespace(**{field.name: getattr(self, field.name) for field in dataclasses.fields(self)})
        apply_preset(values, self.preset, self.task)
        return dataclasses.replace(self, **vars(values))

    @property
    def optimizer(self) -> dict:
        """The task field of the sites' local optimiser (fairfl.flare.protocol.OPTIMIZER)."""
        return {
            "name": self.local_optimizer,
            "momentum": self.momentum,
            "keep_state": self.keep_optimizer_state,
            "betas": list(self.adam_betas),
        }

    @property
    def privacy(self) -> dict | None:
        """The task field of DP-SGD (fairfl.flare.protocol.PRIVACY), None without dp_epsilon."""
        return task_field(self.dp_epsilon, self.dp_delta, self.dp_clip, self.num_rounds)

    def model_spec(self) -> dict:
        """The network these settings name, as fairfl.models.build_model takes it."""
        spec = {"name": self.network, "in_channels": self.in_channels, "num_classes": self.num_classes}
        if self.spatial_dims != 2:  # left out for 2-D: the spec every 2-D run has sent stays as it was
            spec["spatial_dims"] = self.spatial_dims
        if self.network not in ("unet", "cnn", "resnet18"):
            return {**spec, "args": dict(self.model_args or {})}
        if self.network in ("unet", "cnn"):
            spec["channels"] = list(self.model_channels)
        if self.network == "unet":
            spec["strides"] = list(self.model_strides)
        if self.model_norm:
            spec["norm"] = self.model_norm
        return spec

    @property
    def network(self) -> str:
        """The network's name: `model`, or the task's default."""
        return self.model or DEFAULT_MODEL[self.task]


# the names of the round's arguments: every other argument of a controller is its method's own
ROUND_ARGUMENTS = frozenset(field.name for field in dataclasses.fields(RoundSettings))
