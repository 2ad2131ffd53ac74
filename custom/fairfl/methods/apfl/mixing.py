"""APFL's math (Deng, Kamani and Mahdavi, "Adaptive Personalized Federated Learning", arXiv 2003.13461, 2020): the
mixed model, and one round of a site's local steps. Plain PyTorch, no FLARE.

A site holds three things: the copy w of the global model it was sent (trained exactly as FedAvg trains it, and sent
back), its personal model v and its mixing weight alpha in [0, 1], both of which never leave it. Its own model is the
parameter-wise interpolation v_bar = alpha v + (1 - alpha) w. Every local step, on one batch (the paper's Algorithm 1
with its adaptive alpha):

    v     <- v - lr grad_v f(v_bar)          (= alpha grad f(v_bar): the chain rule through v_bar)
    alpha <- clip_[0,1](alpha - lr_alpha grad_alpha f(v_bar)),  grad_alpha f(v_bar) = <v - w, grad f(v_bar)>
    w     <- w - lr grad f(w)                (FedAvg's own step)

all three at the state before the step (v and alpha read w before it moves). The gradients of v and alpha are
autograd's through v_bar (w is held fixed in it); v steps with the site's optimiser (Adam unless the job says SGD),
alpha with plain projected gradient descent, as the paper writes it.

Batch norm: v_bar's forward passes use the personal model's buffers, so v's running statistics are those of the mixed
model on the site's batches (the only forward passes v takes part in). A site is scored with `mixed_state`:
FedFloor's interpolation of every floating tensor, buffers included, so alpha 0 is the global model exactly and alpha 1
the personal model exactly."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch.func import functional_call

from fairfl.methods.fedfloor.mixing import mix_states
from fairfl.training import TrainSettings, forward_loss, gradient_scaler, make_optimizer


def mixed_parameters(personal: torch.nn.Module, global_model: torch.nn.Module, alpha: torch.Tensor) -> dict:
    """{name: alpha v + (1 - alpha) w} of every parameter, differentiable in v (`personal`) and `alpha`; w
    (`global_model`) enters as a constant."""
    held = dict(global_model.named_parameters())
    return {name: alpha * v + (1 - alpha) * held[name].detach() for name, v in personal.named_parameters()}


def mixed_network(personal: torch.nn.Module, global_model: torch.nn.Module, alpha: torch.Tensor):
    """v_bar as a callable network: `personal` run with the mixed parameters and its own buffers (which its batch norm
    layers, in training mode, update in place)."""

    def forward(image):
        return functional_call(personal, mixed_parameters(personal, global_model, alpha), (image,))

    return forward


def mixed_state(global_state: Mapping, personal_state: Mapping, alpha: float) -> dict:
    """The state dict a site is scored with: (1 - alpha) w + alpha v, every floating tensor, buffers included
    (fairfl.methods.fedfloor.mixing.mix_states: exactly w at alpha 0 and exactly v at 1)."""
    return mix_states(global_state, personal_state, alpha)


def check_alpha(alpha) -> float:
    """`alpha` as a float in [0, 1]; an error for anything else (a kept alpha read from a file)."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= float(alpha) <= 1.0:
        raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}")
    return float(alpha)


def train_apfl(
    model: torch.nn.Module,
    personal: torch.nn.Module,
    alpha: float,
    loader,
    settings: TrainSettings,
    device,
    loss_fn,
    mixed_loss_fn,
    optimizer=None,
    alpha_lr: float | None = None,
    amp: bool = False,
) -> dict:
    """One round of APFL's local steps, in place on `model` (w) and `personal` (v), as the module's docstring says:
    per batch first v and alpha on `mixed_loss_fn` at v_bar (w as it is before the step), then w on `loss_fn` with
    `optimizer` (or a fresh one of `settings`), exactly `fairfl.training.train_local`'s step; the same batches, one
    epoch or `settings.local_steps` of them. v steps with a fresh optimiser of `settings`; alpha by gradient descent at
    `alpha_lr` (None: settings.lr; 0: alpha stays), projected onto [0, 1] after every step. amp: forward passes in
    mixed precision, each model's float16 gradients under a loss scaler of its own.

    Returns train_loss (w's mean loss) and steps, as train_local does, with mixed_loss (v_bar's mean loss) and
    alpha (after the round)."""
    check_alpha(alpha)
    alpha_lr = settings.lr if alpha_lr is None else float(alpha_lr)
    if not (math.isfinite(alpha_lr) and alpha_lr >= 0):
        raise ValueError(f"alpha_lr must be a finite number >= 0, got {alpha_lr!r}")
    model.to(device).train()
    personal.to(device).train()
    optimizer = optimizer or make_optimizer(model, settings)
    personal_optimizer = make_optimizer(personal, settings)
    # alpha in float64: its steps at a model's lr can be far below float32's resolution at 0.5 (6e-8), and would be lost
    weight = torch.tensor(float(alpha), dtype=torch.float64, device=device, requires_grad=alpha_lr > 0)
    alpha_optimizer = torch.optim.SGD([weight], lr=alpha_lr) if alpha_lr > 0 else None
    scaler, mixed_scaler = gradient_scaler(device, amp), gradient_scaler(device, amp)
    network = mixed_network(personal, model, weight)
    max_steps = settings.local_steps if settings.local_steps > 0 else settings.local_epochs * len(loader)
    steps, total, total_mixed = 0, 0.0, 0.0
    while steps < max_steps:
        before = steps
        for batch in loader:
            image, label = batch["image"].to(device), batch["label"].to(device)
            # v and alpha, at w before its step
            personal_optimizer.zero_grad(set_to_none=True)
            weight.grad = None
            mixed = forward_loss(network, image, label, mixed_loss_fn, device, amp)
            mixed_scaler.scale(mixed).backward()
            mixed_scaler.step(personal_optimizer)
            if alpha_optimizer is not None:
                mixed_scaler.step(alpha_optimizer)
                with torch.no_grad():
                    weight.clamp_(0.0, 1.0)
            mixed_scaler.update()
            # w: FedAvg's step
            optimizer.zero_grad(set_to_none=True)
            loss = forward_loss(model, image, label, loss_fn, device, amp)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            total, total_mixed = total + float(loss.detach()), total_mixed + float(mixed.detach())
            steps += 1
            if steps >= max_steps:
                break
        if steps == before:  # an empty loader
            break
    return {
        "train_loss": total / max(steps, 1),
        "mixed_loss": total_mixed / max(steps, 1),
        "steps": steps,
        "alpha": float(weight.detach()),
    }
