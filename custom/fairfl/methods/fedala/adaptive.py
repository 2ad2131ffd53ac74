"""FedALA's math (Zhang, Hua, Wang, Song, Xue, Ma and Guan, "FedALA: Adaptive Local Aggregation for Personalized
Federated Learning", AAAI 2023): adaptive local aggregation (ALA). Plain PyTorch, no FLARE.

A site keeps its local model theta_i (the model it trained last round) and element-wise aggregation weights W_i in
[0, 1], one per entry of the top `p` parameter tensors of the network (counted from the output end, in the network's
parameter order; the paper's hyper-parameter p). On receiving the global model theta it starts its local training
from (the paper's Eq. 4 and 5)

    theta_hat = theta_i + (theta - theta_i) * W_i     on the top p parameter tensors
    theta_hat = theta                                   on every other tensor (lower layers, buffers)

W_i starts at 1 (theta_hat = theta, FedAvg's start) and is learned before the round's training on the site's own loss
over a random s% of its training data, theta and theta_i held fixed (the paper's Eq. 6):

    W_i <- clip_[0,1](W_i - eta * grad_{theta_hat} L(theta_hat) * (theta - theta_i))    per batch

(the chain rule through theta_hat), theta_hat formed again from the new W_i after every step. In the site's first
ALA (the start phase) the passes over the sample repeat until the loss settles: the population standard deviation of
the last `window` passes' mean losses below `threshold`, or `max_passes` passes; afterwards one pass per round."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch

from fairfl.methods.fedala.arguments import ETA, LAYERS, MAX_PASSES, RAND_PERCENT, THRESHOLD, WINDOW
from fairfl.site_checks import check_site_state
from fairfl.training import forward_loss


def top_parameter_names(model: torch.nn.Module, layers: int) -> list[str]:
    """The names of the last `layers` parameter tensors of `model` (its registration order, which ends at the output
    layer for fairfl's networks and MONAI's): the paper's p, counted as its authors' code counts it."""
    names = [name for name, _ in model.named_parameters()]
    if LAYERS.checked("fedala_layers", layers) > len(names):
        raise ValueError(
            f"fedala_layers is {layers}, more than the {len(names)} parameter tensors of the network: at most "
            f"{len(names)} (every layer)"
        )
    return names[-layers:]


def initial_weights(reference: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """W_i before the site's first ALA: all ones (theta_hat = theta), one tensor per `reference` tensor."""
    return {name: torch.ones_like(tensor, device="cpu") for name, tensor in reference.items()}


def weights_problem(weights, reference: Mapping[str, torch.Tensor]) -> str | None:
    """Why `weights` are no W_i for the top tensors `reference` ({name: tensor}, meta tensors will do): not a dict of
    tensors of exactly those names, shapes and dtypes, or a value that is NaN, Inf or outside [0, 1]; None if they
    are."""
    if not isinstance(weights, dict):
        return f"are a {type(weights).__name__}, not a dict of tensors"
    problem = check_site_state(weights, reference)
    if problem:
        return f"do not fit the network's top {len(reference)} parameter tensors: {problem}"
    for name, w in weights.items():
        if bool(((w < 0) | (w > 1)).any()):
            return f"hold a value outside [0, 1] in {name}"
    return None


def check_weights(weights, reference: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`weights` if they are W_i for `reference` (`weights_problem`), else a ValueError saying why."""
    problem = weights_problem(weights, reference)
    if problem:
        raise ValueError(f"the aggregation weights {problem}")
    return weights


def refuse_unknown(weights: Mapping, state: Mapping) -> None:
    """A ValueError when `weights` name a tensor `state` (the network's) lacks."""
    unknown = sorted(set(weights) - set(state))
    if unknown:
        raise ValueError(f"aggregation weights for tensors the network lacks: {unknown[:3]}")


def blend(local: torch.Tensor, global_: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """theta_i + (theta - theta_i) * W, element-wise, in theta's dtype and on its device: torch.lerp, exactly theta
    where W is 1 and exactly theta_i where W is 0."""
    if not (local.shape == global_.shape == weights.shape):
        raise ValueError(
            f"global {tuple(global_.shape)}, local {tuple(local.shape)} and W {tuple(weights.shape)} differ in shape"
        )
    local = local.to(global_.device, global_.dtype)
    return torch.lerp(local, global_, weights.to(global_.device, global_.dtype))


def personalised_state(global_state: Mapping, local_state: Mapping, weights: Mapping) -> dict:
    """theta_hat: `blend` on the tensors `weights` names, theta (cloned) on every other tensor of `global_state` (the
    lower layers, every buffer). Nothing given is changed."""
    refuse_unknown(weights, global_state)
    start = {}
    for key, g in global_state.items():
        try:
            start[key] = blend(local_state[key], g, weights[key]) if key in weights else g.clone()
        except ValueError as e:
            raise ValueError(f"{key}: {e}") from e
    return start


def clip_weights(weights: torch.Tensor) -> torch.Tensor:
    """W clipped to [0, 1] in place; a NaN or Inf (a loss gone non-finite) is an error, never clipped into range."""
    if not bool(torch.isfinite(weights).all()):
        raise ValueError("an aggregation weight became NaN or Inf (the sample's loss or its gradient is not finite)")
    return weights.clamp_(0.0, 1.0)


def sample_size(items: int, rand_percent: int) -> int:
    """How many of a site's `items` training items ALA learns W on: rand_percent % of them, rounded down, at least
    one (the paper's s)."""
    RAND_PERCENT.checked("fedala_rand_percent", rand_percent)
    if isinstance(items, bool) or not isinstance(items, int) or items < 1:
        raise ValueError(f"a site needs at least one training item to learn its aggregation weights, got {items!r}")
    return max(1, items * rand_percent // 100)


@dataclass(frozen=True)
class Convergence:
    """When W's passes stop: after one pass, but in the start phase (the site's first ALA) once the population
    standard deviation of the last `window` passes' mean losses is below `threshold`, or after `max_passes`."""

    window: int
    threshold: float
    max_passes: int

    def __post_init__(self):
        for name, kind in (("window", WINDOW), ("threshold", THRESHOLD), ("max_passes", MAX_PASSES)):
            kind.checked(f"fedala_{name}", getattr(self, name))

    def done(self, losses: list[float], start_phase: bool) -> bool:
        if not start_phase or len(losses) >= self.max_passes:
            return bool(losses)
        recent = losses[-self.window :]
        return len(recent) == self.window and statistics.pstdev(recent) < self.threshold


def weight_pass(
    network: torch.nn.Module,
    local_top: Mapping[str, torch.Tensor],
    global_top: Mapping[str, torch.Tensor],
    weights: Mapping[str, torch.Tensor],
    batches: Iterable[dict],
    loss_fn,
    eta: float,
    device,
    amp: bool = False,
) -> float:
    """One pass of W's steps over `batches`, in place on `weights` (on `device`): per batch the top tensors of
    `network` are set to theta_hat, the loss's gradient at theta_hat is taken (only those tensors require one: the
    lower layers are theta, held fixed) and W steps as the module's docstring says, then is clipped. Returns the
    pass's mean loss (each batch's at the W before its step); a pass without a batch is an error."""
    params = dict(network.named_parameters())
    total, count = 0.0, 0
    for batch in batches:
        with torch.no_grad():
            for name, w in weights.items():
                params[name].copy_(blend(local_top[name], global_top[name], w))
        network.zero_grad(set_to_none=True)
        image, label = batch["image"].to(device), batch["label"].to(device)
        loss = forward_loss(network, image, label, loss_fn, device, amp, float16=False)
        loss.backward()
        with torch.no_grad():
            for name, w in weights.items():
                gradient = params[name].grad
                if gradient is not None:  # a tensor the loss does not reach keeps its W
                    w.sub_(eta * gradient * (global_top[name] - local_top[name]))
                clip_weights(w)
        total, count = total + float(loss.detach()), count + 1
    if not count:
        raise ValueError("the sample to learn the aggregation weights on is empty")
    return total / count


def learn_weights(
    network: torch.nn.Module,
    global_state: Mapping[str, torch.Tensor],
    local_state: Mapping[str, torch.Tensor],
    weights: Mapping[str, torch.Tensor],
    passes: Callable[[], Iterable[dict]],
    loss_fn,
    eta: float,
    device,
    start_phase: bool,
    convergence: Convergence,
    amp: bool = False,
) -> tuple[dict[str, torch.Tensor], list[float]]:
    """ALA's weight learning: (the learned W, on the CPU, {name: tensor}; each pass's mean loss). `network` is a
    scratch copy of the job's network (its weights and buffers are overwritten; train mode, as the local training's
    passes run); `passes()` gives one pass's batches (the same sample in the same order each time); `weights` the
    W to start from (not changed). Passes as `convergence` says (one outside the start phase); none at eta 0 (W
    cannot move). The lower layers and buffers of `network` are theta's throughout."""
    ETA.checked("fedala_eta", eta)
    refuse_unknown(weights, global_state)
    check_weights(dict(weights), {name: global_state[name] for name in weights})
    learned = {name: w.detach().to(device, copy=True) for name, w in weights.items()}
    losses: list[float] = []
    if eta > 0:
        network.load_state_dict(dict(global_state))
        network.to(device).train()
        network.requires_grad_(False)
        params = dict(network.named_parameters())
        for name in learned:
            params[name].requires_grad_(True)
        global_top = {name: global_state[name].detach().to(device) for name in learned}
        local_top = {name: local_state[name].detach().to(device, global_top[name].dtype) for name in learned}
        while not convergence.done(losses, start_phase):
            losses.append(weight_pass(network, local_top, global_top, learned, passes(), loss_fn, eta, device, amp))
        network.requires_grad_(True)
    return {name: w.cpu() for name, w in learned.items()}, losses
