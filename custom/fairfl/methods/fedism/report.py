"""FedISM+'s section of `fairfl report`: its Tables II-III (clean, corrupted and average ACC and AUC) and Table IV
(std of AUC across sites), from the classification runs with a corrupted test set, whatever their method."""

from __future__ import annotations

from fairfl.report.markdown import cell, table_lines
from fairfl.report.parts import Section
from fairfl.report.runs import group_name_markdown, group_of
from fairfl.report.statistics import avg_std, mean_sd, site_scores

QUALITY_COLUMNS = (("Clean", "clean"), ("Corrupted", "corrupted"), ("Average", None))
QUALITY_SHIFT_TEXT = (
    "As FedISM+'s Tables II-III and IV, in %: accuracy (ACC) and macro one-vs-rest AUC on the clean test set and on "
    "the same images corrupted as the corrupted sites' are, and their average; Std. AUC: population std across "
    "sites of the AUC each site measures on the test set of its own image quality (the papers' client-level "
    "testing). Mean ± sd over seeds; best in bold."
)


def _quality_row(run) -> dict | None:
    """One run's FedISM+ Tables II-III and IV values in percent: {"Clean ACC", "Clean AUC", "Corrupted ACC",
    "Corrupted AUC", "Average ACC", "Average AUC" (of clean and corrupted), "Std. AUC" (population std across
    sites of the AUC on each site's own-quality test set)}; None if its final evaluation has no corrupted AUC."""
    final = run.get("final") or {}
    if not site_scores(final, "corrupted_auc"):
        return None
    row = {}
    for short, metric in (("ACC", "accuracy"), ("AUC", "auc")):
        clean, corrupted = (avg_std(site_scores(final, f"{q}_{metric}"))[0] for q in ("clean", "corrupted"))
        row.update(
            {f"Clean {short}": clean, f"Corrupted {short}": corrupted, f"Average {short}": (clean + corrupted) / 2}
        )
    row["Std. AUC"] = avg_std(site_scores(final, "auc"))[1]
    return row


def _rounded_mean(value: tuple[float, float | None] | None) -> float:
    """The mean of a table cell (`mean_sd` over a group's runs) to 2 places; a group has a run, so a mean."""
    assert value is not None
    return round(value[0], 2)


def quality_shift_table(runs) -> tuple[str, dict]:
    """FedISM+'s Tables II-III (clean, corrupted and average ACC and AUC, %) and Table IV (std of AUC across sites)
    from the classification runs' final evaluations, mean ± sd over seeds; ("", {}) when no run has them."""
    groups: dict[str, list[dict]] = {}
    for run in runs:
        row = _quality_row(run)
        if row:
            groups.setdefault(group_of(run), []).append(row)
    if not groups:
        return "", {}
    columns = [f"{q} {m}" for q, _ in QUALITY_COLUMNS for m in ("ACC", "AUC")] + ["Std. AUC"]
    stats = {g: {c: mean_sd(r[c] for r in rows) for c in columns} for g, rows in groups.items()}
    best = {c: (min if c == "Std. AUC" else max)(_rounded_mean(v[c]) for v in stats.values()) for c in columns}
    lines = table_lines(
        ["Method", *columns],
        (
            [group_name_markdown(g), *(cell(v[c], _rounded_mean(v[c]) == best[c]) for c in columns)]
            for g, v in stats.items()
        ),
    )
    return "\n".join(lines), stats


PARTS = (
    Section(
        "quality_shift",
        "Clean and corrupted test sets",
        lambda inputs: QUALITY_SHIFT_TEXT,
        lambda inputs: quality_shift_table(inputs.runs),
        after="spread",
        printed=False,  # in report.md and SUMMARY.md, not among the tables `fairfl report` prints
        summarized=True,
    ),
)
