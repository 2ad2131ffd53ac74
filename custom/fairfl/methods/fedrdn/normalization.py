"""FedRDN's math (Yan et al., "A Simple Data Augmentation for Feature Distribution Skewed Federated Learning", CVPR
2025, arXiv:2306.09363): a site's channel statistics, the normalisation with one site's statistics and with a randomly
drawn site's for each image, and what statistics from another party must be. Plain torch, no FLARE.

A site's statistics (the paper's, as its authors' code computes them): for every training image x_i, the mean
mu(x_i)_c and the standard deviation sigma(x_i)_c of channel c over its spatial positions (population std); the
site's mu_c and sigma_c are their averages over the site's images. Each image is normalised with a site k's
statistics as

    x'_c = (x_c - mu^k_c) / sigma^k_c

with k drawn uniformly from the sites whose statistics the site holds, afresh for every image, in training; with the
site's own statistics at test time. On the wire a site's statistics are one flat record {"mean_0", "std_0", "mean_1",
...}: one pair per channel, every value a finite number in MEAN or STD."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from fairfl.kinds import Real, Record, shown

__all__ = [
    "MEAN",
    "STD",
    "MAX_SITES",
    "statistics_record",
    "record_of",
    "statistics_set_problem",
    "channel_statistics",
    "table",
    "normalise",
    "random_normalise",
    "NormalisedBatches",
    "normalising",
]

# What a site's statistics may be, in the units of the images as the network receives them (fairfl's 2-D images are
# z-scored per image: about 0 and 1; its 3-D volumes are scaled to [0, 1]; a bundle's pre-processing may leave raw
# intensities of 16-bit scanners). A std below 1e-3 is a site of nearly constant images, whose statistics would
# multiply other sites' images a thousandfold; beyond these bounds a value is an error or an attack, never a scanner.
MEAN = Real(-1e5, 1e5)
STD = Real(1e-3, 1e5)
MAX_SITES = 1000  # the most sites' statistics a site accepts in one task (the built-in data's limit too)


def statistics_record(channels: int) -> Record:
    """The kind of one site's statistics of `channels` channels: {"mean_c", "std_c"} for c = 0 .. channels - 1."""
    fields = {}
    for c in range(channels):
        fields[f"mean_{c}"], fields[f"std_{c}"] = MEAN, STD
    return Record(fields)


def record_of(mean: Iterable[float], std: Iterable[float]) -> dict:
    """The wire record of per-channel `mean` and `std` (sequences of one length)."""
    mean, std = [float(m) for m in mean], [float(s) for s in std]
    if len(mean) != len(std) or not mean:
        raise ValueError(f"{len(mean)} means and {len(std)} stds: one pair per channel, at least one")
    record = {}
    for c, (m, s) in enumerate(zip(mean, std, strict=True)):
        record[f"mean_{c}"], record[f"std_{c}"] = m, s
    return record


def _channels(record: Mapping) -> int:
    return len(record) // 2


def statistics_set_problem(value) -> str | None:
    """Why `value` is not a set of sites' statistics as the server sends it ({site name: record}, at least one site, at
    most MAX_SITES, every record of one channel count and within MEAN and STD), or None."""
    if not isinstance(value, Mapping) or not value or len(value) > MAX_SITES:
        return f"{shown(value)} is not an object of 1 to {MAX_SITES} site names to statistics"
    channels = None
    for site, record in value.items():
        if not isinstance(site, str):
            return f"{shown(site)} is not a site name"
        count = _channels(record) if isinstance(record, Mapping) else 0
        problem = statistics_record(max(count, 1)).problem(record)
        if problem:
            return f"[{shown(site)}] {problem}"
        if channels is not None and count != channels:
            return f"[{shown(site)}] has {count} channels, another site {channels}"
        channels = count
    return None


def channel_statistics(images: Iterable[torch.Tensor]) -> dict:
    """The statistics record of a site's images, each batch [B, C, *spatial] (2-D or 3-D): the per-image, per-channel
    mean and population std over the spatial positions, averaged over the images (module docstring). Accumulated in
    float64; the order of the images changes nothing but the rounding."""
    mean_sum = std_sum = None
    count = 0
    for batch in images:
        flat = torch.as_tensor(batch).detach().as_subclass(torch.Tensor).flatten(2).to(torch.float64)
        means, stds = flat.mean(dim=2), flat.std(dim=2, correction=0)  # [B, C]
        mean_sum = means.sum(0) if mean_sum is None else mean_sum + means.sum(0)
        std_sum = stds.sum(0) if std_sum is None else std_sum + stds.sum(0)
        count += flat.shape[0]
    if not count or mean_sum is None or std_sum is None:
        raise ValueError("no images to compute statistics on")
    return record_of((mean_sum / count).tolist(), (std_sum / count).tolist())


def table(statistics: Mapping[str, Mapping]) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """(site names sorted, means [K, C], stds [K, C]) of {site: record}: the sites a draw chooses among, in an order
    that does not depend on the order they were sent in."""
    names = sorted(statistics)
    if not names:
        raise ValueError("no site's statistics")
    channels = _channels(statistics[names[0]])
    means = torch.tensor([[float(statistics[s][f"mean_{c}"]) for c in range(channels)] for s in names])
    stds = torch.tensor([[float(statistics[s][f"std_{c}"]) for c in range(channels)] for s in names])
    return names, means, stds


def _per_channel(values: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    """[C] or [B, C] values shaped to broadcast over [B, C, *spatial] images, in their dtype and device."""
    values = values.to(device=images.device, dtype=images.dtype)
    shape = (values.shape[0], images.shape[1]) if values.dim() == 2 else (1, images.shape[1])
    return values.reshape(*shape, *([1] * (images.dim() - 2)))


def normalise(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """(images - mean) / std per channel, images [B, C, *spatial]; mean and std [C] (one site's, every image) or
    [B, C] (each image its own). A new tensor: the images are never changed in place."""
    if images.dim() < 3 or mean.shape[-1] != images.shape[1] or std.shape != mean.shape:
        raise ValueError(
            f"images {tuple(images.shape)} and statistics {tuple(mean.shape)}, {tuple(std.shape)}: one mean and std "
            f"per channel of [B, C, *spatial] images"
        )
    return (images - _per_channel(mean, images)) / _per_channel(std, images)


def random_normalise(
    images: torch.Tensor, means: torch.Tensor, stds: torch.Tensor, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """(images normalised each with a site drawn uniformly from the K rows of means and stds [K, C], the drawn rows
    [B]): FedRDN's training transform. The draw comes from `generator` (on the CPU), so a seed repeats it."""
    chosen = torch.randint(means.shape[0], (images.shape[0],), generator=generator)
    return normalise(images, means[chosen], stds[chosen]), chosen


class NormalisedBatches:
    """The batches of `loader` ({"image", "label", ...} dicts) with each image normalised by `random_normalise`, the
    images moved to `device` first (None: where they are); as long as the loader. `drawn` counts how often each of
    the K sites was drawn."""

    def __init__(self, loader, means: torch.Tensor, stds: torch.Tensor, generator: torch.Generator, device=None):
        self.loader, self.means, self.stds, self.generator, self.device = loader, means, stds, generator, device
        self.drawn = torch.zeros(means.shape[0], dtype=torch.long)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            images = batch["image"] if self.device is None else batch["image"].to(self.device)
            images, chosen = random_normalise(images, self.means, self.stds, self.generator)
            self.drawn += torch.bincount(chosen, minlength=len(self.drawn))
            yield {**batch, "image": images}


def normalising(model: torch.nn.Module, mean: torch.Tensor, std: torch.Tensor) -> torch.nn.Module:
    """`model`, its inputs normalised with one site's statistics ([C] each) before every forward pass (a forward
    pre-hook: its weights and state dict stay as they are). FedRDN's test-time rule with the site's own statistics."""

    def hook(module, args):
        return (normalise(args[0], mean, std), *args[1:])

    model.register_forward_pre_hook(hook)
    return model
