"""The bad-input figure of docs/deployment.md ("Security model"), counted here from the tests' own case tables, never
by hand: each category's number is how many hostile inputs its tests try, each of which they require to end in a
clear error naming the file, field or argument, or in the site rejected for the round with the job alive. The figure is
a floor: a category the tests try fewer inputs of than it shows fails here, with the table to paste; one that grew (a
method added since brings its own fields and arguments, fuzzed with no edit elsewhere) leaves it true."""

import os
import re

import test_answer_fuzzer
import test_arguments
import test_bad_command_line
import test_bad_configuration
import test_bad_data_files
import test_client_steps
import test_dashboard_passwords
import test_jobs_config
import test_loo
import test_report_inputs
import test_site_checks
import test_tracking

from fairfl.methods import VARIANTS

from helpers import REPO

START, END = "<!-- bad-input figure: tests/core/test_bad_input_figure.py -->", "<!-- end of the bad-input figure -->"


def categories(tmp_path) -> list:
    """[(what was tried, how many, the tests that try them)]."""
    fuzzed = sum(len(test_answer_fuzzer.fuzzed_cases(name, tmp_path)[2]) for name in VARIANTS)
    return [
        (
            "data files, datalists, site settings and configurations at a site; command-line arguments",
            len(test_bad_data_files.DATA_CASES)
            + len(test_bad_data_files.SITE_CASES)
            + len(test_bad_configuration.CONFIG_CASES)
            + len(test_bad_command_line.CLI_CASES)
            + len(test_bad_data_files.HUGE_IMAGES),
            "`tests/core/test_bad_data_files.py`, `tests/core/test_bad_configuration.py`, "
            "`tests/core/test_bad_command_line.py`",
        ),
        (
            "a method setting the server sends a site, each hostile value in each declared task field",
            len(test_client_steps.hostile_task_cases()),
            "`tests/core/test_client_steps.py`",
        ),
        (
            "job arguments, at every component and at `fairfl run --set`; job configuration files of the wrong shape",
            len(test_arguments.CONSTRUCTOR_CASES)
            + len(test_jobs_config.BAD_JOB_CONFIGS)
            + len(test_jobs_config.BAD_META),
            "`tests/core/test_arguments.py`, `tests/core/test_jobs_config.py`",
        ),
        (
            "a site's answer: chosen hostile models, sample counts and metrics",
            len(test_site_checks.TRAIN_CASES) + len(test_site_checks.EVAL_CASES) + len(test_site_checks.GLOBAL_CASES),
            "`tests/core/test_site_checks.py`",
        ),
        (
            "a site's answer: 10 hostile values in every field the server reads, for every method variant",
            fuzzed,
            "`tests/core/test_answer_fuzzer.py`",
        ),
        (
            "results and leave-one-out files other centres send (`fairfl report`): hostile names, fields of the "
            "wrong kind",
            len(test_report_inputs.HOSTILE_SITES)
            + len(test_report_inputs.WRONG_TYPES)
            + len(test_report_inputs.NOT_RESULTS)
            + 1  # a mean of the last rounds of the wrong kind
            + len(test_loo.BAD_LOO_FILES)
            + 2,  # a loo.json nested too deep; one with hostile site names
            "`tests/core/test_report_inputs.py`, `tests/core/test_loo.py`",
        ),
        (
            "the server's MLflow tracking URI; the dashboard's admin password",
            len(test_tracking.REFUSED) + len(test_dashboard_passwords.WEAK),
            "`tests/core/test_tracking.py`, `tests/core/test_dashboard_passwords.py`",
        ),
    ]


def figure(rows) -> str:
    lines = [
        START,
        "| hostile inputs | tried | handled | tests |",
        "|---|---|---|---|",
        *(f"| {what} | {count} | {count} | {where} |" for what, count, where in rows),
        f"| all | {sum(c for _, c, _ in rows)} | {sum(c for _, c, _ in rows)} | |",
        END,
    ]
    return "\n".join(lines)


ROW = re.compile(r"^\| (?P<what>.*) \| (?P<tried>\d+) \| (?P<handled>\d+) \| (?P<tests>.*) \|$")


def shown_rows(figure_text: str) -> list:
    """[(what, tried, tests)] of the figure's rows in the docs, the total row left out."""
    rows = []
    for line in figure_text.splitlines():
        match = ROW.match(line)
        if match and match["what"] != "all":
            assert match["tried"] == match["handled"], line
            rows.append((match["what"], int(match["tried"]), match["tests"]))
    return rows


def test_the_bad_input_figure_in_the_docs_is_one_the_tests_reach(tmp_path):
    with open(os.path.join(REPO, "docs", "deployment.md")) as f:
        text = f.read()
    counted = categories(tmp_path)
    expected = figure(counted)
    assert START in text and END in text, f"docs/deployment.md lacks the figure; paste:\n{expected}"
    shown = START + text.split(START, 1)[1].split(END, 1)[0] + END
    rows = shown_rows(shown)
    assert shown == figure(rows), f"docs/deployment.md's figure is not in the figure's form; paste:\n{expected}"
    assert [(what, where) for what, _, where in rows] == [(what, where) for what, _, where in counted], expected
    short = [what for (what, number, _), (_, count, _) in zip(rows, counted, strict=True) if number > count]
    assert not short, f"docs/deployment.md claims more than the tests try for {short}; paste:\n{expected}"
    total = sum(number for _, number, _ in rows)
    with open(os.path.join(REPO, "README.md")) as f:
        assert f"The tests try at least {total} hostile inputs" in f.read(), f"README.md: the figure's total is {total}"
