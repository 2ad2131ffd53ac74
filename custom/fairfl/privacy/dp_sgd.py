"""DP-SGD at a site (Abadi et al. 2016): every step draws each training item with probability q (Poisson sampling),
clips each drawn item's whole gradient to L2 norm `clip`, sums them, adds N(0, (sigma * clip)^2) to every coordinate
and divides by the expected batch q * N; the site's optimiser then steps on that gradient (post-processing).

Per-item gradients come from torch.func on the network as it is (no wrapper: state_dict keys are unchanged), so any
network whose items do not mix in training works: batch norm is refused. The loss is called on each item alone, so
however it reduces a batch it never mixes items; a term of the weights alone (`SeparableLoss`: FedProx's proximal
term) is added outside the clipped sum. The sampling and the noise come from the operating system's randomness,
never from the job's seed: the server knows that seed and could subtract noise drawn from it."""

from __future__ import annotations

import secrets
from collections.abc import Callable

import torch
from torch.func import functional_call, grad, vmap

from fairfl.privacy.accountant import epsilon_spent, noise_multiplier, sample_rate, steps_per_round
from fairfl.privacy.settings import PrivacySettings, batch_norm_refusal


class SeparableLoss:
    """data_loss(logits, target) + weight_term(device), the second a function of the weights alone: DP-SGD clips the
    first per item and adds the second's gradient unclipped; called, it is the sum, as any loss."""

    def __init__(self, data_loss: Callable, weight_term: Callable[[torch.device], torch.Tensor]):
        self.data_loss, self.weight_term = data_loss, weight_term

    def __call__(self, logits, target):
        return self.data_loss(logits, target) + self.weight_term(logits.device)


def poisson_sample(num_items: int, rate: float, generator: torch.Generator) -> torch.Tensor:
    """The indices of the items a step draws: one uniform number per item index, item i drawn when its number is below
    `rate`, so a mask belongs to items, not to positions in a batch."""
    return torch.nonzero(torch.rand(num_items, generator=generator) < rate).flatten()


def per_item_gradients(model, items: torch.Tensor, labels: torch.Tensor, loss_fn) -> tuple[dict, torch.Tensor]:
    """({parameter name: [k, *shape]} each item's gradient of loss_fn on that item alone, [k] the items' losses) for
    `items` [k, P, ...] (each item P inputs: a 2-D image, a volume's patches) and their `labels` [k, P, ...].

    loss_fn runs on each item's output outside torch.func (a loss such as MONAI's Dice writes in place, which vmap
    cannot batch); its gradient with respect to the output is then pulled back through the network per item, by
    vmap(grad(...)) of <network(item), that gradient>."""
    params = {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}
    buffers = dict(model.named_buffers())

    def forward(weights, inputs):
        return functional_call(model, (weights, buffers), (inputs,))

    with torch.no_grad():
        outputs = vmap(forward, in_dims=(None, 0), randomness="different")(params, items)
    cotangents, losses = [], []
    for output, label in zip(outputs, labels, strict=True):
        output = output.detach().requires_grad_(True)
        loss = loss_fn(output, label)
        cotangents.append(torch.autograd.grad(loss, output)[0])
        losses.append(loss.detach())

    def pulled_back(weights, inputs, cotangent):
        return (forward(weights, inputs) * cotangent).sum()

    grads = vmap(grad(pulled_back), in_dims=(None, 0, 0), randomness="different")(
        params, items, torch.stack(cotangents)
    )
    return grads, torch.stack(losses)


def clipped_sum(grads: dict, clip: float) -> dict:
    """Sum over items of each item's gradient scaled to L2 norm at most `clip` (its norm over all parameters)."""
    norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(dim=1) for g in grads.values()))
    scale = (clip / (norms + 1e-12)).clamp(max=1.0)
    return {name: torch.einsum("i,i...->...", scale, g) for name, g in grads.items()}


def noisy_mean(summed: dict, noise_std: float, expected_batch: float, generator: torch.Generator) -> dict:
    """(sum + N(0, noise_std^2) per coordinate) / expected_batch, the noise drawn in the order of `summed`."""
    return {
        name: (s + noise_std * torch.randn(s.shape, generator=generator, device=s.device, dtype=s.dtype))
        / expected_batch
        for name, s in summed.items()
    }


def private_gradient(model, items, labels, loss_fn, clip, sigma, expected_batch, generator) -> tuple[dict, float]:
    """(DP-SGD's gradient {parameter name: tensor}, the drawn items' mean loss) for one step's drawn `items` [k, P,
    ...] (k may be 0: the step is noise alone)."""
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    if len(items):
        grads, losses = per_item_gradients(model, items, labels, loss_fn)
        summed, loss = clipped_sum(grads, clip), float(losses.mean())
    else:
        summed, loss = {name: torch.zeros_like(p) for name, p in params.items()}, 0.0
    return noisy_mean(summed, sigma * clip, expected_batch, generator), loss


def drawn_batch(dataset, indices: torch.Tensor, collate, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(images [k, P, ...], labels [k, P, ...]) of the dataset items `indices`, as the loader collates them (a 3-D
    item yields P patches, one record), plain tensors on `device`."""
    if len(indices) == 0:  # Poisson sampling drew nothing: the step is noise alone (private_gradient)
        return torch.empty(0, device=device), torch.empty(0, device=device)
    batch = collate([dataset[int(i)] for i in indices])
    images, labels = (torch.as_tensor(batch[key]).as_subclass(torch.Tensor).to(device) for key in ("image", "label"))
    k = len(indices)
    return images.reshape(k, -1, *images.shape[1:]), labels.reshape(k, -1, *labels.shape[1:])


def secret_generator(device, seed: int | None = None) -> torch.Generator:
    """A generator on `device` seeded from the operating system's randomness (`seed`: a test's fixed one)."""
    return torch.Generator(device=device).manual_seed(secrets.randbits(63) if seed is None else seed)


def train_private(
    model, loader, settings, device, loss_fn, optimizer, privacy: PrivacySettings, seed: int | None = None
) -> dict:
    """One round of DP-SGD in place on `model` with `optimizer`, over the items of `loader`'s dataset (the loader's
    shuffling and batching are not used: the sampling is Poisson's), as many steps as the ordinary loop takes
    (`steps_per_round`). The noise multiplier spends `privacy`'s budget over the whole run's steps. Returns the steps
    and the site's statement of its privacy (fairfl.privacy.settings.METRICS): the epsilon spent by the end of this
    round, the noise multiplier, the sampling rate. No loss is returned: it is not part of the private model."""
    problem = batch_norm_refusal(model)
    if problem:
        raise ValueError(f"DP-SGD: {problem}")
    dataset = loader.dataset
    num_items = len(dataset)
    rate = sample_rate(settings.batch_size, num_items)
    steps = steps_per_round(settings.local_steps, settings.local_epochs, settings.batch_size, num_items)
    sigma = noise_multiplier(privacy.epsilon, privacy.delta, rate, steps * privacy.rounds)
    data_loss = loss_fn.data_loss if isinstance(loss_fn, SeparableLoss) else loss_fn
    sampler = secret_generator("cpu", seed)
    noise = secret_generator(device, None if seed is None else seed + 1)
    params = dict(model.named_parameters())
    for _ in range(steps):
        images, labels = drawn_batch(dataset, poisson_sample(num_items, rate, sampler), loader.collate_fn, device)
        optimizer.zero_grad(set_to_none=True)
        if isinstance(loss_fn, SeparableLoss):  # the weights' own term: not data, so neither clipped nor noised
            loss_fn.weight_term(device).backward()
        grads, _ = private_gradient(model, images, labels, data_loss, privacy.clip, sigma, rate * num_items, noise)
        for name, g in grads.items():
            p = params[name]
            p.grad = g if p.grad is None else p.grad + g
        optimizer.step()
    spent = epsilon_spent(sigma, rate, steps * (privacy.round + 1), privacy.delta)
    return {"steps": steps, "dp_epsilon": spent, "dp_noise_multiplier": sigma, "dp_sample_rate": rate}
