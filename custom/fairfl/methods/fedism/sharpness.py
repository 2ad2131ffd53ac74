"""FedISM+'s sharpness-aware local training (SALT) and sharpness measurement, as plain PyTorch.

Equations (FedISM+, Wu et al. 2025, unless said otherwise):
- Eq. 12, the search distance of round t of T: rho(t) = rho_max (t / T)^tau            -> `search_distance`
- Eq. 9, the perturbation: eps*(rho) = rho g / ||g||_2, g the loss gradient            -> `gsam_step`,
  `measure_sharpness`
- Eq. 14 with GSAM (Zhuang et al., ICLR 2022, Algorithm 1), the local update SALT uses: g = grad f(w),
  g_p = grad f(w + eps*), g_perp = g - (<g, g_p> / ||g_p||^2) g_p (the part of g orthogonal to g_p), and the
  base optimiser steps along g_p - alpha g_perp                                          -> `gsam_step`, `train_salt`
- Eq. 10 and 11, a site's sharpness S = L(w + eps*) - L(w) and perturbed loss L(w + eps*), on its whole
  training set                                                                            -> `measure_sharpness`

SALT's step is not a plain optimiser step, so it has its own loop here (`train_salt`); like
`fairfl.training.train_local` it takes `TrainSettings` (and optionally an optimiser, `make_optimizer`'s) and
returns the same keys.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from fairfl.training import TrainSettings, forward_loss, make_optimizer

GSAM_ALPHA = 0.1  # FedISM+ and the FFL4MIA code
RHO_MAX = 0.1  # the paper's rho_max (the authors' code defaults to FedISM's fixed 0.05)
TAU = 0.5
PERTURB_EPS = 1e-12  # added to ||g|| and ||g_p|| (as GSAM's code does): a zero gradient gives eps* = 0


def search_distance(round_number: int, num_rounds: int, rho_max: float = RHO_MAX, tau: float = TAU) -> float:
    """Eq. 12: rho(t) = rho_max (t / T)^tau for round t = 1..T (Algorithm 1 counts from 1).

    FLARE counts rounds from 0: round r of a job is t = r + 1, so the last round searches at rho_max. tau = 0
    gives FedISM's fixed rho = rho_max (0^0 = 1)."""
    if num_rounds < 1:
        raise ValueError(f"num_rounds must be >= 1, got {num_rounds}")
    if not 0 <= round_number <= num_rounds:
        raise ValueError(f"round_number must be in [0, {num_rounds}] (t of Eq. 12 counts from 1), got {round_number}")
    if not (rho_max >= 0 and tau >= 0):
        raise ValueError(f"rho_max and tau must be >= 0, got {rho_max}, {tau}")
    return float(rho_max * (round_number / num_rounds) ** tau)


@contextlib.contextmanager
def frozen_norm_statistics(model: torch.nn.Module) -> Iterator[None]:
    """Batch (and instance) norm layers normalise with the batch's statistics as in training but do not update
    their running statistics or counters: a second forward pass at perturbed weights must not count twice."""
    layers = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._NormBase)]
    tracked = [m.track_running_stats for m in layers]
    try:
        for m in layers:
            m.track_running_stats = False  # in train mode: batch statistics, buffers untouched
        yield
    finally:
        for m, t in zip(layers, tracked, strict=True):
            m.track_running_stats = t


def _global_norm(tensors) -> torch.Tensor:
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t) for t in tensors]))


def gsam_step(
    model: torch.nn.Module,
    closure: Callable[[], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    rho: float,
    alpha: float = GSAM_ALPHA,
) -> dict:
    """One GSAM step (Zhuang et al. 2022, Algorithm 1) with any base optimiser (FedISM+: Adam).

    Args:
        model: the network being trained (in train mode); its parameters with a gradient are perturbed.
        closure: computes the mini-batch loss with a forward pass and returns it (no backward, no zero_grad);
            it is called twice, at w and at w + eps*.
        optimizer: the base optimiser over the model's parameters; its `step` runs at w with the GSAM
            gradient in `.grad` (weight decay, if any, is applied by it as usual).
        rho: search distance (Eq. 12). rho = 0 is a plain step of the base optimiser (one pass).
        alpha: weight of the surrogate-gap term; alpha = 0 is SAM.

    Returns:
        {"loss": f(w), "perturbed_loss": f(w + eps*)} of the mini-batch.
    """
    optimizer.zero_grad(set_to_none=True)
    loss = closure()
    loss.backward()
    params = [p for p in model.parameters() if p.grad is not None]
    if rho == 0 or not params:
        optimizer.step()
        return {"loss": float(loss.detach()), "perturbed_loss": float(loss.detach())}
    with torch.no_grad():
        grad = [p.grad.detach().clone() for p in params if p.grad is not None]  # all of params; the test types p.grad
        scale = rho / (_global_norm(grad) + PERTURB_EPS)
        origin = [p.detach().clone() for p in params]
        for p, g in zip(params, grad, strict=True):
            p.add_(g * scale)  # w + eps*, Eq. 9
    optimizer.zero_grad(set_to_none=True)
    with frozen_norm_statistics(model):
        perturbed = closure()
        perturbed.backward()
    with torch.no_grad():
        for p, w in zip(params, origin, strict=True):
            p.copy_(w)  # back to w: restored exactly, not by subtracting eps*
        g_p = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        inner = sum(torch.sum(a * b) for a, b in zip(grad, g_p, strict=True))
        parallel = inner / (_global_norm(g_p) ** 2 + PERTURB_EPS)
        for p, g, gp in zip(params, grad, g_p, strict=True):
            p.grad = gp - alpha * (g - parallel * gp)  # g_p - alpha g_perp
    optimizer.step()
    return {"loss": float(loss.detach()), "perturbed_loss": float(perturbed.detach())}


def _steps(loader, max_steps: int) -> Iterator[dict]:
    """Batches from `loader`, cycling over it, `max_steps` in all (fewer only if the loader is empty)."""
    done = 0
    while done < max_steps:
        before = done
        for batch in loader:
            yield batch
            done += 1
            if done >= max_steps:
                return
        if done == before:
            return


def train_salt(
    model,
    loader,
    settings: TrainSettings,
    device,
    loss_fn,
    rho: float,
    alpha: float = GSAM_ALPHA,
    optimizer=None,
    amp: bool = False,
) -> dict:
    """SALT: one round of local training in place with GSAM over Adam (FedISM+ Algorithm 1, line 8).

    The counterpart of `fairfl.training.train_local`: same settings (lr, weight decay, one epoch or a fixed
    number of steps), same returned keys, plus the mean perturbed loss and the rho used. The base optimiser is
    `optimizer`, or a fresh one of `settings` (Adam with its betas, or SGD). amp: forward passes in bfloat16
    (`fairfl.training.mixed_precision`; GSAM uses the gradients' norms, which a float16 loss scale would distort)."""
    model.to(device).train()
    optimizer = optimizer or make_optimizer(model, settings)
    max_steps = settings.local_steps if settings.local_steps > 0 else settings.local_epochs * len(loader)
    steps, total, total_perturbed = 0, 0.0, 0.0
    for batch in _steps(loader, max_steps):
        image, label = batch["image"].to(device), batch["label"].to(device)
        closure = lambda: forward_loss(model, image, label, loss_fn, device, amp, float16=False)  # noqa: E731, B023
        losses = gsam_step(model, closure, optimizer, rho, alpha)
        total += losses["loss"]
        total_perturbed += losses["perturbed_loss"]
        steps += 1
    return {
        "train_loss": total / max(steps, 1),
        "train_perturbed_loss": total_perturbed / max(steps, 1),
        "steps": steps,
        "rho": rho,
    }


def _batch_losses(model, loader, loss_fn, device, amp: bool) -> Iterator[tuple[torch.Tensor, int]]:
    """(mean loss of the batch, batch size) for every batch of `loader`; amp: forward passes in bfloat16."""
    for batch in loader:
        image, label = batch["image"].to(device), batch["label"].to(device)
        yield forward_loss(model, image, label, loss_fn, device, amp, float16=False), int(image.shape[0])


@torch.no_grad()
def dataset_loss(model, loader, loss_fn, device, amp: bool = False) -> float:
    """The mean loss of `model` over every sample of `loader`, as it is (the caller sets eval or train mode):
    batch losses weighted by batch size, summed in float64. NaN for an empty loader."""
    total, count = 0.0, 0
    for loss, n in _batch_losses(model, loader, loss_fn, device, amp):
        total += float(loss) * n
        count += n
    return total / count if count else float("nan")


def measure_sharpness(model, loader, loss_fn, rho: float, device, amp: bool = False) -> dict:
    """A site's loss, perturbed loss and sharpness (Eq. 9-11) of `model` over the whole of `loader`.

    The paper measures them on the global model received at the start of the round, over the site's full
    training set (Eq. 10-11 are over the site's training data): pass an unshuffled, unaugmented loader of the
    training split. The model is put
    in eval mode (running statistics of batch norm, no dropout) and left with its weights, mode and gradients
    as they were. eps* follows the gradient of the loss over the whole set (one perturbation for the set, as
    in the FFL4MIA code), not one per batch.

    Returns:
        {"loss": L(w), "perturbed_loss": L(w + eps*), "sharpness": L(w + eps*) - L(w), "rho": rho,
        "grad_norm": ||grad L(w)||, "samples": n}. rho = 0 (or a zero gradient) gives sharpness 0.
    """
    was_training = model.training
    model.to(device).eval()
    params = [p for p in model.parameters() if p.requires_grad]
    saved_grads = [p.grad for p in params]
    try:
        for p in params:
            p.grad = None
        total, count = 0.0, 0
        for loss, n in _batch_losses(model, loader, loss_fn, device, amp):
            # the gradient of the summed loss: its direction is the full-set mean's, which is all eps* needs
            (loss * n).backward()
            total += float(loss.detach()) * n
            count += n
        if count == 0:
            raise ValueError("measure_sharpness: the loader is empty")
        loss_value = total / count
        grads = [p.grad for p in params if p.grad is not None]
        summed_norm = float(_global_norm(grads)) if grads else 0.0
        perturbed = loss_value
        if rho != 0 and summed_norm > 0.0:
            with torch.no_grad():
                origin = [p.detach().clone() for p in params]
                for p in params:
                    if p.grad is not None:
                        p.add_(p.grad * (rho / (summed_norm + PERTURB_EPS)))  # Eq. 9
                try:
                    perturbed = dataset_loss(model, loader, loss_fn, device, amp)
                finally:
                    for p, w in zip(params, origin, strict=True):
                        p.copy_(w)
    finally:
        for p, g in zip(params, saved_grads, strict=True):
            p.grad = g
        model.train(was_training)
    return {
        "loss": loss_value,
        "perturbed_loss": perturbed,
        "sharpness": perturbed - loss_value,
        "rho": rho,
        "grad_norm": summed_norm / count,
        "samples": count,
    }
