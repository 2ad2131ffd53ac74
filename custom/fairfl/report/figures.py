"""The report's figures of every method's runs (convergence, final result per site, cross-site evaluation) and the
drawing helpers a method unit's own figures use (`fairfl.methods.<unit>.report`). matplotlib is imported only when
a figure is drawn, and without pyplot: no global state, no GUI backend."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from fairfl.labels import metric_label
from fairfl.progress import shown_round
from fairfl.report.runs import by_method, chosen_metric, finished, group_name, group_of, sites_of
from fairfl.report.statistics import avg_std, is_number, mean_per_site, mean_sd, site_scores
from fairfl.results import site_key

MAX_NAMED = 40  # more sites (or layers) than this are not named one by one in a figure: unreadable, and slow to draw


def figure(**kwargs):
    from matplotlib.figure import Figure

    return Figure(layout="constrained", **kwargs)


def literal_text(plot):
    """`plot` drawing every text as it is: names from a results file go into labels, titles and legends, and
    matplotlib would read what lies between two `$` as a formula (refusing an invalid one, `x$^$`, with an error)."""

    @functools.wraps(plot)
    def drawn_literally(*args, **kwargs):
        from matplotlib import rc_context

        with rc_context({"text.parse_math": False}):  # texts read it when made, tick labels when drawn
            return plot(*args, **kwargs)

    return drawn_literally


def _colors(runs) -> dict[str, str]:
    """One colour per method, the same in every figure of a report."""
    return {m: f"C{i % 10}" for i, m in enumerate(by_method(runs))}


def extent(count: int, per_item: float, base: float) -> float:
    """A figure's width or height in inches for `count` named items (at most MAX_NAMED counted)."""
    return base + per_item * min(count, MAX_NAMED)


def name_ticks(set_ticks, names, **style) -> None:
    """Ticks naming `names` (an axis' `set_xticks` or `set_yticks`), none where there are more than MAX_NAMED."""
    if len(names) <= MAX_NAMED:
        set_ticks(range(len(names)), names, **style)
    else:
        set_ticks([])


def _legend_label(method: str, group: list) -> str:
    return group_name(method) + (f" ({len(group)} seeds)" if len(group) > 1 else "")


def line_with_band(ax, x, samples, band: bool, color, **style) -> None:
    """The mean of each x's samples (e.g. one per seed) as a line, with a ±sd band over them if `band`."""
    stats = [mean_sd(values) for values in samples]
    mean = np.array([m for m, _ in stats])
    ax.plot(x, mean, color=color, **style)
    if band:
        sd = np.array([s or 0.0 for _, s in stats])
        ax.fill_between(x, mean - sd, mean + sd, color=color, alpha=0.2, lw=0)


def convergence_points(runs, metric) -> dict:
    """{group: {round: [(Avg., Std.) across sites of each run]}} of every evaluated round, the rounds counted from 1
    as the console shows them (`fairfl.progress.shown_round`); groups without an evaluated round left out."""
    points = {}
    for method, group in by_method(runs).items():
        per_round: dict[int, list] = {}
        for run in group:
            for record in run["rounds"]:
                if scores := site_scores(record, metric):
                    per_round.setdefault(shown_round(record["round"]), []).append(avg_std(scores))
        if per_round:
            points[method] = per_round
    return points


@literal_text
def plot_convergence(runs, path, metric=None) -> Path | None:
    """Fig. 2 of Fed-LWR: (a) Avg. and (b) Std. across sites versus round, one line per method (± sd over seeds)."""
    metric = chosen_metric(runs, metric)
    fig = figure(figsize=(11, 4))
    axes = fig.subplots(1, 2)
    colors, evaluated = _colors(runs), set()
    groups = by_method(runs)
    for method, per_round in convergence_points(runs, metric).items():
        group = groups[method]
        x = sorted(per_round)
        evaluated.update(x)
        for i, ax in enumerate(axes):
            line_with_band(
                ax,
                x,
                [[v[i] for v in per_round[t]] for t in x],
                len(group) > 1,
                color=colors[method],
                label=_legend_label(method, group),
                marker="o" if len(x) <= 25 else None,
                ms=3,
            )
    if not evaluated:
        return None
    label = metric_label(metric)
    for ax, title, ylabel in zip(
        axes,
        ("(a) Avg.", "(b) Std."),
        (f"mean {label} over sites (%)", f"std of {label} across sites (%)"),
        strict=True,
    ):
        ax.set(title=title, xlabel="communication round", ylabel=ylabel)
        if len(evaluated) <= 12:  # a short run: a tick at each evaluated round
            ax.set_xticks(sorted(evaluated))
        else:
            ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.savefig(path, dpi=120)
    return Path(path)


@literal_text
def plot_per_site(runs, path, metric=None) -> Path | None:
    """Grouped bars of the final metric per site (and Avg.) for each method, ± sd over seeds."""
    metric = chosen_metric(runs, metric)
    done = finished(runs, metric)
    if not done:
        return None
    colors, groups, sites = _colors(runs), by_method(done), sites_of(done)
    if len(sites) > MAX_NAMED:
        return _plot_sorted_sites(groups, colors, path, metric)
    columns = [*sites, "Avg."]
    fig = figure(figsize=(max(6.0, 0.35 * len(columns) * len(groups) + 2.5), 4))
    ax = fig.subplots()
    x, width = np.arange(len(columns)), 0.8 / len(groups)
    low = 100.0
    for i, (method, group) in enumerate(groups.items()):
        per_run = [site_scores(r["final"], metric) for r in group]
        per_run = [{**s, "Avg.": avg_std(s)[0]} for s in per_run]
        stats = [mean_sd(s[c] for s in per_run if c in s) or (np.nan, None) for c in columns]
        mean = np.array([m for m, _ in stats])
        sd = np.array([s or 0.0 for _, s in stats]) if len(group) > 1 else None
        ax.bar(
            x + (i - (len(groups) - 1) / 2) * width,
            mean,
            width,
            yerr=sd,
            capsize=2,
            color=colors[method],
            label=_legend_label(method, group),
        )
        low = min(low, np.nanmin(mean - (sd if sd is not None else 0)))
    ax.axvline(len(sites) - 0.5, color="grey", lw=0.8, ls=":")
    ax.set_xticks(x, columns, rotation=30 if len(columns) > 8 else 0)
    bottom = max(0.0, 5 * np.floor((low - 5) / 5))  # differences of a few points must be visible
    ax.set_ylim(bottom, None)
    title = f"Final {metric_label(metric)} per site" + (" (the axis does not start at 0)" if bottom > 0 else "")
    ax.set(ylabel=f"final {metric_label(metric)} (%)", title=title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.savefig(path, dpi=120)
    return Path(path)


def _plot_sorted_sites(groups: dict, colors: dict, path, metric: str) -> Path:
    """`plot_per_site` for more than MAX_NAMED sites: each method's final metric per site (mean over seeds) from its
    worst site to its best, its Avg. dashed."""
    fig = figure(figsize=(8, 4))
    ax = fig.subplots()
    count = 0
    for method, group in groups.items():
        per_site = mean_per_site([site_scores(r["final"], metric) for r in group])
        values, count = np.sort(np.fromiter(per_site.values(), float)), max(count, len(per_site))
        ax.plot(np.arange(1, len(values) + 1), values, color=colors[method], label=_legend_label(method, group))
        ax.axhline(float(np.mean(values)), color=colors[method], ls="--", lw=0.8)
    label = metric_label(metric)
    ax.set(xlabel="site, from the worst to the best", ylabel=f"final {label} (%)")
    ax.set_title(f"Final {label} per site ({count} sites, too many to name: sorted; dashed: Avg.)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.savefig(path, dpi=120)
    return Path(path)


@literal_text
def plot_cross_site(run, path) -> Path | None:
    """The cross-site evaluation's matrix (`cross_site_eval`) as a heatmap, in %: rows the sites whose model is
    scored, columns the sites whose test split scores it, the diagonal (each model on its own site) outlined; None
    without one. A cell that is not a number (a hostile file) is left blank."""
    from matplotlib.patches import Rectangle

    cross = run.get("cross_site")
    matrix = cross.get("matrix") if isinstance(cross, dict) else None
    if not isinstance(matrix, dict) or not matrix or not all(isinstance(row, dict) for row in matrix.values()):
        return None
    models = sorted(matrix, key=site_key)
    sites = sorted({s for row in matrix.values() for s in row}, key=site_key)
    grid = np.array([[100.0 * v if is_number(v := matrix[m].get(s)) else np.nan for s in sites] for m in models])
    fig = figure(figsize=(extent(len(sites), 0.8, 2.5), extent(len(models), 0.5, 1.5)))
    ax = fig.subplots()
    image = ax.imshow(grid, cmap="viridis", aspect="auto", interpolation="nearest")
    name_ticks(ax.set_xticks, sites, rotation=45, ha="right", fontsize=8)
    name_ticks(ax.set_yticks, models, fontsize=8)
    ax.set_xlabel("test data of")
    ax.set_ylabel("model of")
    if len(models) * len(sites) <= 400:
        middle = np.nanmean(grid) if np.isfinite(grid).any() else 0.0
        for (i, j), value in np.ndenumerate(grid):
            if np.isfinite(value):
                ax.text(
                    j,
                    i,
                    f"{value:.1f}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="black" if value > middle else "white",
                )
    column = {site: j for j, site in enumerate(sites)}
    for i, model in enumerate(models):
        if model in column:
            j = column[model]
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=1.5))
    fig.colorbar(image, ax=ax, label=f"{metric_label(str(cross.get('metric', run['metric'])))} (%)", shrink=0.8)
    fig.suptitle(f"{group_name(group_of(run))}, seed {run['seed']}: cross-site evaluation", fontsize=10)
    fig.savefig(path, dpi=120)
    return Path(path)
