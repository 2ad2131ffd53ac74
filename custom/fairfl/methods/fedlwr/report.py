"""Fed-LWR's part of `fairfl report`: for each run, a heatmap of the layer-by-site aggregation weights its rounds
record (`layer_weights`), the final round's and the mean over rounds."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from fairfl.progress import shown_round
from fairfl.report.figures import extent, figure, literal_text, name_ticks
from fairfl.report.parts import RunFigure
from fairfl.report.runs import group_name, group_name_markdown, group_of
from fairfl.results import site_key
from fairfl.text import markdown_text


def short_names(names: list[str]) -> list[str]:
    """Unique readable labels: the leading parts common to all dropped, and words of more than 4 letters
    shortened to their initial except in the last part, e.g. "model.1.submodule.0.conv.unit0.conv" ->
    "1.s.0.conv.unit0.conv" (MONAI's nested U-Net names share their last three parts)."""
    parts = [n.split(".") for n in names]
    common = 0
    while all(len(p) > common + 1 and p[common] == parts[0][common] for p in parts):
        common += 1
    parts = [p[common:] for p in parts]
    labels = [".".join([t[0] if t.isalpha() and len(t) > 4 else t for t in p[:-1]] + p[-1:]) for p in parts]
    return labels if len(set(labels)) == len(labels) else [".".join(p) for p in parts]


UNET_PARTS = (  # the inside of one level of MONAI's UNet (ResidualUnit convolutions; Convolution up-sampling)
    (r"conv\.unit(\d+)\.conv", "conv{}"),
    (r"conv\.unit(\d+)\.adn\.A", "act{}"),
    (r"residual", "residual"),
    (r"0\.conv", "up-conv"),
    (r"0\.adn\.A", "up-conv act"),
    (r"1\.conv\.unit(\d+)\.conv", "conv{}"),
    (r"1\.conv\.unit(\d+)\.adn\.A", "act{}"),
)


def unet_layer_name(name: str) -> str | None:
    """A readable label of a layer of MONAI's UNet, from its module path: the level (enc1 the first encoder level,
    bottom, dec1 the last decoder level, which makes the output) and the part inside it (conv1, act1, residual,
    up-conv), e.g. "model.1.submodule.0.conv.unit0.conv" -> "enc2 conv1". The path is MONAI's nesting: each
    "1.submodule" one level deeper, then "0" the level's encoder, "2" its decoder, or neither at the bottom. None for
    a name of another shape (another network)."""
    parts = name.split(".")
    if parts[0] != "model":
        return None
    parts, depth = parts[1:], 1
    while parts[:2] == ["1", "submodule"]:
        parts, depth = parts[2:], depth + 1
    if parts[:1] == ["0"]:
        level, parts = f"enc{depth}", parts[1:]
    elif parts[:1] == ["2"]:
        level, parts = f"dec{depth}", parts[1:]
    else:
        level = "bottom"
    for pattern, label in UNET_PARTS:
        found = re.fullmatch(pattern, ".".join(parts))
        if found:  # units count from 0 in the path, from 1 in the label
            return f"{level} {label.format(*(int(unit) + 1 for unit in found.groups()))}"
    return None


def layer_labels(names: list[str]) -> list[str]:
    """The heatmap's labels of `names` (network order): `unet_layer_name` when every name is one of MONAI's UNet and
    the labels differ, else `short_names`. results.json keeps the full names."""
    labels = [unet_layer_name(n) for n in names]
    if all(labels) and len(set(labels)) == len(labels):
        return [str(label) for label in labels]
    return short_names(names)


@literal_text
def plot_layer_weights(run, path) -> Path | None:
    """Fed-LWR's layer-by-site aggregation weights: the final round's and the mean over rounds; None without any."""
    from matplotlib.colors import TwoSlopeNorm

    records = [(r["round"], r["layer_weights"]) for r in run["rounds"] if r.get("layer_weights")]
    if not records:
        return None
    layers = list(dict.fromkeys(layer for _, lw in records for layer in lw))  # network order
    sites = sorted({s for _, lw in records for w in lw.values() for s in w}, key=site_key)
    grids = [np.array([[lw.get(layer, {}).get(s, np.nan) for s in sites] for layer in layers]) for _, lw in records]
    final, mean = grids[-1], np.nanmean(grids, axis=0)
    uniform = 1.0 / len(sites)
    # white = uniform 1/K; weights live in [0, 1], so the two sides of the scale differ in length
    top = max(float(np.nanmax(np.stack([final, mean]))), uniform + 1e-3)
    norm = TwoSlopeNorm(vcenter=uniform, vmin=0.0, vmax=top)
    fig = figure(figsize=(extent(len(sites), 1.3, 3.5), extent(len(layers), 0.24, 1.6)))
    axes = fig.subplots(1, 2, sharey=True)
    annotate = len(layers) * len(sites) <= 400
    titles = (f"round {shown_round(records[-1][0])} (final)", f"mean over {len(records)} rounds")
    for ax, grid, title in zip(axes, (final, mean), titles, strict=True):
        image = ax.imshow(grid, cmap="RdBu_r", norm=norm, aspect="auto", interpolation="nearest")
        name_ticks(ax.set_xticks, sites, rotation=45, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        if annotate:
            for (i, j), value in np.ndenumerate(grid):
                ax.text(
                    j,
                    i,
                    f"{value:.3f}",
                    ha="center",
                    va="center",
                    fontsize=6,
                    color="white" if abs(norm(value) - 0.5) > 0.3 else "black",
                )
    name_ticks(axes[0].set_yticks, layer_labels(layers), fontsize=7)
    axes[0].set_ylabel("layer (network order)")
    fig.colorbar(image, ax=list(axes), label="aggregation weight", shrink=0.8)
    fig.suptitle(
        f"{group_name(group_of(run))} layer weights, seed {run['seed']}: uniform 1/K = 1/{len(sites)} = "
        f"{uniform:.3f} (white)",
        fontsize=11,
    )
    fig.savefig(path, dpi=120)
    return Path(path)


PARTS = (
    RunFigure(
        "layer_weights",
        plot_layer_weights,
        lambda run: (
            f"{group_name_markdown(group_of(run))} layer weights by site, seed {run['seed']} "
            f"({markdown_text(run['file'])})"
        ),
    ),
)
