"""DP-SGD's settings: the kinds of the round arguments dp_epsilon, dp_delta and dp_clip (fairfl.arguments), the record
a site's task carries, and which methods' local training DP-SGD can cover. No torch import: the command line checks a
job with these."""

from __future__ import annotations

import dataclasses

from fairfl.kinds import Integer, Nullable, Real, Record

MAX_EPSILON = 1000.0  # beyond this a budget protects nothing
MAX_CLIP = 1e6
EPSILON = Nullable(Real(0.0, MAX_EPSILON, low_open=True))
DELTA = Real(0.0, 1.0, low_open=True, high_open=True)
CLIP = Real(0.0, MAX_CLIP, low_open=True)


def task_field_kind(max_rounds: int) -> Record:
    """The kind of the task field a site reads (fairfl.flare.protocol.PRIVACY): the run's budget, the clip norm and
    the run's rounds, at most `max_rounds`."""
    return Record({"epsilon": EPSILON.kind, "delta": DELTA, "clip": CLIP, "rounds": Integer(1, max_rounds)})


# what a site reports with its training metrics: its own statement of the budget it has spent so far
METRICS = ("dp_epsilon", "dp_noise_multiplier", "dp_sample_rate")


@dataclasses.dataclass(frozen=True)
class PrivacySettings:
    """DP-SGD for one training task: (epsilon, delta) over the whole run of `rounds` rounds, items' gradients clipped
    to `clip`; `round` is the task's (0-based)."""

    epsilon: float
    delta: float
    clip: float
    rounds: int
    round: int

    @classmethod
    def of(cls, field: dict | None, round_num: int) -> PrivacySettings | None:
        """The settings of a task field checked against `task_field_kind`, or None when the task asks for no DP."""
        if not field:
            return None
        return cls(
            float(field["epsilon"]), float(field["delta"]), float(field["clip"]), int(field["rounds"]), round_num
        )


def task_field(epsilon: float | None, delta: float, clip: float, rounds: int) -> dict | None:
    """The task field of the round arguments (`task_field_kind`), None without a budget (no DP)."""
    if epsilon is None:
        return None
    return {"epsilon": float(epsilon), "delta": float(delta), "clip": float(clip), "rounds": int(rounds)}


def step_refusal(step_classes) -> str | None:
    """Why DP-SGD cannot cover the local training of a task that runs `step_classes` (fairfl.methods.steps.ClientStep
    subclasses), or None. The private loop clips each item's gradient of the usual per-item loss; a term of the weights
    alone may be added outside that sum (a step declaring `private_loss`, FedProx's proximal term), but not a loop of
    a step's own nor a loss that replaces the usual one (it may mix a batch's items, as prototypes or sharpness do)."""
    from fairfl.methods.steps import ClientStep  # imports torch: only when asked

    for cls in step_classes:
        if cls.train is not ClientStep.train:
            return f"its site step {cls.__name__} trains with a loop of its own, which per-item clipping does not cover"
        if cls.replaces_loss:
            return f"its site step {cls.__name__} replaces the local loss with an objective that mixes a batch's items"
        if cls.loss is not ClientStep.loss and not getattr(cls, "private_loss", False):
            return f"its site step {cls.__name__} adds a loss term DP-SGD cannot keep apart from the items' losses"
    return None


def batch_norm_refusal(model) -> str | None:
    """Why DP-SGD cannot train the torch `model`: batch norm layers mix a batch's items in training; None without."""
    from torch.nn.modules.batchnorm import _BatchNorm

    layers = [name for name, m in model.named_modules() if isinstance(m, _BatchNorm)]
    if not layers:
        return None
    return (
        f"the network has batch norm ({', '.join(layers[:3])}{', ...' if len(layers) > 3 else ''}), which mixes a "
        f"batch's items in training: set model_norm to 'instance' or 'group', or use a network without BatchNorm"
    )


def job_refusal(method: str, meta: dict) -> str | None:
    """Why the server must refuse a run asking for DP-SGD: the steps its train task `meta` switches on
    (`step_refusal`) or its network (`batch_norm_refusal`, built on torch's meta device); None when DP-SGD covers it."""
    import torch

    from fairfl.flare import protocol
    from fairfl.methods.steps import applying
    from fairfl.models import build_model

    with torch.device("meta"):
        network = build_model(meta[protocol.MODEL_SPEC])
    problem = step_refusal(applying(meta)) or batch_norm_refusal(network)
    return f"dp_epsilon: {method} cannot train with DP-SGD: {problem}" if problem else None
