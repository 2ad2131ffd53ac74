"""report.md, results.csv and the figures of one or more runs (`make_report`): the papers' table, its per-region
variants, the sections (the report's own and those the method units add, `fairfl.report.parts`), the runs, and the
figures with their captions."""

from __future__ import annotations

import re
from pathlib import Path

from fairfl.labels import metric_label_markdown
from fairfl.loo import load_loo
from fairfl.report.baseline import BASELINE_TEXT, baseline_table
from fairfl.report.best_round import BEST_ROUND_TEXT, best_round_table
from fairfl.report.fairness_tables import (
    PERFORMANCE_FAIRNESS_TEXT,
    agreement_text,
    contribution_agreement_table,
    performance_fairness_table,
)
from fairfl.report.figures import plot_convergence, plot_cross_site, plot_per_site
from fairfl.report.global_model import HELD_OUT_TEXT, PERSONAL_GLOBAL_TEXT, held_out_table, personal_global_table
from fairfl.report.parts import GroupFigure, Inputs, RunFigure, Section, method_parts, ordered
from fairfl.report.privacy import PRIVACY_TEXT, privacy_table
from fairfl.report.runs import (
    by_method,
    chosen_metric,
    dataset_of,
    group_name_markdown,
    group_of,
    load_runs,
    region_metrics,
    with_final,
)
from fairfl.report.site_tables import SPREAD_TEXT, SURFACE_TEXT, paper_table, spread_table, surface_table, write_csv
from fairfl.text import markdown_text


def _label(inputs: Inputs) -> str:
    return metric_label_markdown(inputs.metric)


SECTIONS = (  # the report's own, in their order
    Section(
        "spread",
        "Spread across sites",
        lambda inputs: SPREAD_TEXT.format(label=_label(inputs)),
        lambda inputs: spread_table(inputs.runs, inputs.metric),
    ),
    Section(
        "best_round",
        "Best round on test (paper-style, optimistic)",
        lambda inputs: BEST_ROUND_TEXT.format(label=_label(inputs)),
        lambda inputs: best_round_table(inputs.runs, inputs.metric),
    ),
    Section(
        "against_fedavg",
        "Against FedAvg",
        lambda inputs: BASELINE_TEXT.format(label=_label(inputs)),
        lambda inputs: baseline_table(inputs.runs, inputs.metric),
    ),
    Section(
        "surface",
        "Surface distances (volumes)",
        lambda inputs: SURFACE_TEXT,
        lambda inputs: surface_table(inputs.runs),
    ),
    Section(
        "personal_global",
        "Personal and global models",
        lambda inputs: PERSONAL_GLOBAL_TEXT.format(label=_label(inputs)),
        lambda inputs: personal_global_table(inputs.runs, inputs.metric),
    ),
    Section(
        "held_out",
        "Held-out sites",
        lambda inputs: HELD_OUT_TEXT.format(label=_label(inputs)),
        lambda inputs: held_out_table(inputs.runs, inputs.metric),
    ),
    Section("privacy", "Differential privacy", lambda inputs: PRIVACY_TEXT, lambda inputs: privacy_table(inputs.runs)),
    Section(
        "performance_fairness",
        "Performance fairness",
        lambda inputs: PERFORMANCE_FAIRNESS_TEXT.format(label=_label(inputs)),
        lambda inputs: performance_fairness_table(inputs.runs, inputs.metric),
        title="Performance fairness against Solo",
        summarized=True,
    ),
    Section(
        "contribution_agreement",
        "Contribution estimates against leave-one-out",
        lambda inputs: agreement_text(inputs.loo),
        lambda inputs: contribution_agreement_table(inputs.runs, inputs.loo) if inputs.loo else ("", {}),
        summarized=True,
    ),
)
CROSS_SITE = RunFigure(
    "cross_site",
    plot_cross_site,
    lambda run: (
        f"{group_name_markdown(group_of(run))}, seed {run['seed']}: cross-site evaluation, each site's own model "
        f"(rows) scored on every site's test split (columns), in %; outlined: the model's own site "
        f"({markdown_text(run['file'])})"
    ),
)


def report_sections() -> list[Section]:
    """Every section a report may have, in its order: the report's own and the method units'."""
    return ordered(SECTIONS, [part for part in method_parts() if isinstance(part, Section)])


def _describe(run) -> str:
    rounds = run["rounds"]
    seconds = sum(r.get("seconds", 0.0) for r in rounds)
    evaluated = sum(1 for r in rounds if r.get("per_site"))
    rejected = sum(len(r.get("rejected") or {}) for r in rounds)
    return (
        f"- {markdown_text(run['file'])}: {group_name_markdown(group_of(run))}, seed {run['seed']}, {len(rounds)} "
        f"rounds ({evaluated} evaluated), {seconds:.1f} s, {rejected} rejected site update(s)"
        + ("" if run["final"] else ", **not finished**")
    )


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")


def _run_figure(out: Path, kind: str, run, taken) -> Path:
    """out/<kind>_<method>_seed<seed>.png, one file per run however many runs share a method and seed (`taken`)."""
    name = f"{kind}_{_slug(run['method'])}_seed{run['seed']}"  # the method's name from the file: never a path
    while (out / f"{name}.png") in taken:
        name += "_"
    return out / f"{name}.png"


def _figures(runs, metric, out: Path, parts) -> dict:
    """{figure path: caption} of every figure drawn: convergence and per site, each group's, each run's (the method
    units' first, then the cross-site evaluation)."""
    label = metric_label_markdown(metric)
    captions = {
        plot_convergence(
            runs, out / "convergence.png", metric
        ): f"(a) Avg. and (b) Std. of {label} across sites versus communication round",
        plot_per_site(runs, out / "per_site.png", metric): f"Final {label} per site",
    }
    group_figures = [part for part in parts if isinstance(part, GroupFigure)]
    for key, group in by_method(runs).items():
        for figure in group_figures:
            captions[figure.draw(key, group, out / f"{figure.kind}_{_slug(key)}.png")] = figure.caption(key, group)
    run_figures = [part for part in parts if isinstance(part, RunFigure)] + [CROSS_SITE]
    for run in runs:
        for figure in run_figures:
            captions[figure.draw(run, _run_figure(out, figure.kind, run, captions))] = figure.caption(run)
    captions.pop(None, None)
    return captions


def make_report(paths, out_dir, metric=None, loo=None, final: str = "last") -> dict:
    """Write report.md, results.csv and the figures into out_dir; `loo`: a leave-one-out file (or its folder);
    `final`: which evaluation the tables report (`with_final`).

    Returns {"report", "figures", "table", "region_tables": {metric: table}, "loo", "tables": {section key: markdown},
    and each section's statistics under its key: "spread": {group: stats} (`spread_table`), "performance_fairness",
    "contribution_agreement": {group: {estimate: stats}}, "personal_global", "held_out", and the method units'
    ("contributions": FedCE's; "quality_shift": FedISM+'s, classification runs with a corrupted test set)}."""
    runs = with_final(load_runs(paths), final)
    metric = chosen_metric(runs, metric)
    dataset = dataset_of(runs)
    loo = load_loo(loo) if loo else None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = paper_table(runs, metric)
    region_tables = {region: paper_table(runs, region) for region in region_metrics(runs, metric)}
    sections = report_sections()
    inputs = Inputs(runs, metric, loo)
    tables, stats = {}, {}
    for section in sections:
        tables[section.key], stats[section.key] = section.table(inputs)
    write_csv(runs, out / "results.csv", metric)
    captions = _figures(runs, metric, out, method_parts())
    subject = markdown_text(dataset or ", ".join(sorted({r.get("task", "?") for r in runs})))
    label = metric_label_markdown(metric)
    lines = [
        f"# fairfl report: {subject}, {label}",
        "",
        f"{label} (%) on each site's test set at the end of training. Avg.: mean over sites; "
        f"Std.: population standard deviation across sites; mean ± sd over seeds where a method has several "
        f"runs. Best Avg. and Std. in bold.",
        "",
        table,
        "",
    ]
    for region, region_table in region_tables.items():
        lines += [f"### {metric_label_markdown(region)}", "", region_table, ""]
    for section in sections:
        if tables[section.key]:
            lines += [f"## {section.heading}", "", section.text(inputs), "", tables[section.key], ""]
    lines += [
        "## Runs",
        "",
        *(_describe(r) for group in by_method(runs).values() for r in group),
        "",
        "## Figures",
        "",
    ]
    for figure, caption in captions.items():
        lines += [f"{caption}:", "", f"![{figure.stem}]({figure.name})", ""]
    report = out / "report.md"
    report.write_text("\n".join(lines))
    return {
        "report": report,
        "figures": list(captions),
        "table": table,
        "region_tables": region_tables,
        **stats,
        "loo": loo,
        "tables": tables,
    }
