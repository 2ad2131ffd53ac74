"""The documentation (README.md and docs/): links that lead somewhere, every job argument documented on the right
page, every method page built on docs/methods/_template.md and either backed by committed benchmark outputs or
saying "Not benchmarked yet", the README's job table and method chooser backed by the committed outputs, and the
CI's test command."""

import json
import os
import re

import pytest

from fairfl.arguments import COMPONENTS
from fairfl.docs_blocks import LINK, documentation_files
from fairfl.jobconfig import component_arguments, job_arguments
from fairfl.methods import UNITS

from helpers import REPO

# docs/methods/<page>.md -> the jobs it documents, from the method units' specs
METHOD_PAGES = {}
for unit in UNITS:
    METHOD_PAGES.setdefault(os.path.splitext(os.path.basename(unit.doc))[0], []).extend(j.name for j in unit.jobs)
DOCS = os.path.join(REPO, "docs")
# the skeleton of a method page: its headings, its argument table's header and its "not benchmarked" statement are
# the ones every method page has (a file of docs/methods/ whose name starts with "_" is no method page)
TEMPLATE = os.path.join(DOCS, "methods", "_template.md")
RESULTS = "## Expected results"
NOT_BENCHMARKED = "Not benchmarked yet"


def read(path):
    with open(path) as f:
        return f.read()


def relative_links(text: str) -> list[str]:
    """The file part of every relative link (anchors dropped; web, absolute and same-page links left out)."""
    return [m.group(2).partition("#")[0] for m in LINK.finditer(text) if m.group(2).partition("#")[0]]


def dead_links(files) -> list[str]:
    return [
        f"{file}: {target}"
        for file in files
        for target in relative_links(read(file))
        if not os.path.exists(os.path.join(os.path.dirname(file), target))
    ]


def test_every_relative_link_of_the_readme_and_docs_leads_to_a_file():
    files = documentation_files(REPO)
    assert len(files) > 10 and all(os.path.isfile(f) for f in files)
    assert sum(len(relative_links(read(f))) for f in files) > 100  # the check sees the links
    assert dead_links(files) == []


def test_a_link_written_from_the_wrong_folder_is_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "a.md").write_text("x")
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "[ok](../benchmarks/a.md#part) [web](https://x.org/b.md) [here](#top) ![gone](benchmarks/a.md)\n"
        "[also gone](../benchmarks/b.md)"
    )
    assert dead_links([str(page)]) == [f"{page}: benchmarks/a.md", f"{page}: ../benchmarks/b.md"]


def argument_table_header() -> str:
    """The header row of an argument table, as the method page template has it."""
    return next(line for line in read(TEMPLATE).splitlines() if line.startswith("| argument |"))


def table_rows(text: str) -> list[tuple[list[str], str]]:
    """(argument names, default cell) of every row of every argument table (the template's header)."""
    header = argument_table_header()
    rows, in_table = [], False
    for line in text.splitlines():
        if line.startswith("| argument |"):
            assert line == header, f"an argument table's header is not the template's {header!r}: {line!r}"
            in_table = True
        elif not line.startswith("|"):
            in_table = False
        elif in_table and not line.startswith("|---"):
            cells = line.split("|")
            rows.append((re.findall(r"`(\w+)`", cells[1]), cells[2].strip()))
    return rows


def argument_rows(text: str) -> set[str]:
    """The argument names in the first column of every argument table."""
    return {name for names, _ in table_rows(text) for name in names}


def test_every_job_argument_is_documented_and_a_method_page_only_its_own_jobs():
    common = argument_rows(read(os.path.join(DOCS, "running.md")))
    pages = {page: argument_rows(read(os.path.join(DOCS, "methods", f"{page}.md"))) for page in METHOD_PAGES}
    jobs = sorted(os.listdir(os.path.join(REPO, "jobs")))
    assert sorted(j for js in METHOD_PAGES.values() for j in js) == jobs  # every job has its page
    documented = common.union(*pages.values())
    for job in jobs:
        missing = set(job_arguments(os.path.join(REPO, "jobs", job))) - documented
        assert not missing, f"jobs/{job}: {sorted(missing)} in no argument table of docs/"
    for page, names in pages.items():
        own = set().union(*(job_arguments(os.path.join(REPO, "jobs", j)) for j in METHOD_PAGES[page]))
        assert names - own == set(), f"docs/methods/{page}.md documents arguments its jobs do not have"
        assert not names & common - {"logit_adjustment"}, f"docs/methods/{page}.md repeats a common argument"


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """`text` split at `sep` outside brackets and parentheses."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += (char in "[(") - (char in "])")
        if char == sep and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    return [*parts, current.strip()]


def documented_defaults(text: str) -> list[tuple[str, object]]:
    """(argument, documented default) of every row of every argument table: the default column without its
    parenthesised remarks ("0.01 (FedNPR: 0)"), its values in the order of the row's names, or one value for all."""
    found = []
    for names, cell in table_rows(text):
        values = [v.split(" (")[0] for v in split_top_level(cell)]
        values = values if len(values) == len(names) else values * len(names)
        for name, value in zip(names, values, strict=True):
            try:
                found.append((name, json.loads(value)))
            except json.JSONDecodeError:
                found.append((name, value))
    return found


def declared_defaults(paths) -> dict:
    """{argument: [its declared defaults]} of the fairfl components `paths`, tuples as lists."""
    defaults = {}
    for path in paths:
        for name, value in component_arguments(path).items():
            defaults.setdefault(name, []).append(value)
    return defaults


def test_every_documented_default_is_the_declared_one():
    """The argument tables of docs/running.md and the method pages give each argument's default as fairfl.arguments
    declares it (for a method page: in one of its jobs' components)."""
    pages = {os.path.join(DOCS, "running.md"): list(COMPONENTS)}
    for unit in UNITS:
        paths = [j.controller for j in unit.jobs] + ["fairfl.flare.executor.FairflExecutor"]
        pages.setdefault(os.path.join(DOCS, unit.doc), []).extend(paths)
    checked = 0
    for page, paths in pages.items():
        declared = declared_defaults(paths)
        for name, documented in documented_defaults(read(page)):
            assert name in declared, f"{page}: {name} is no argument of its components"
            assert documented in declared[name], f"{page}: {name} documented {documented!r}, declared {declared[name]}"
            checked += 1
    assert checked >= 70
    wrong = "| argument | default | meaning |\n|---|---|---|\n| `num_rounds`, `seed` | 20, 1 (paper: 200) | x |\n"
    assert documented_defaults(wrong) == [("num_rounds", 20), ("seed", 1)]  # 1 is caught: seed's default is 0
    assert 1 not in declared_defaults(COMPONENTS)["seed"]


def headings(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("## ")]


def test_every_method_page_has_the_template_s_headings_in_order_and_its_site_missing_paragraph():
    template = read(TEMPLATE)
    required = headings(template)
    # the checks below read these sections, and the template is a page in the format they read
    assert len(required) >= 5 and required[-1] == RESULTS and "## Arguments" in required, required
    assert "**A site missing from a round**" in template and [names for names, _ in table_rows(template)] == [
        ["argument_name"]
    ]
    for page in METHOD_PAGES:
        text = read(os.path.join(DOCS, "methods", f"{page}.md"))
        assert headings(text) == required, page
        assert "**A site missing from a round**" in text, page


def test_every_page_in_docs_methods_is_a_method_unit_s_page_and_the_template_is_none():
    names = sorted(f[:-3] for f in os.listdir(os.path.join(DOCS, "methods")) if f.endswith(".md"))
    assert [n for n in names if not n.startswith("_")] == sorted(METHOD_PAGES)
    assert "_template" in names and "_template" not in METHOD_PAGES


def chooser_rows(readme: str) -> list[str]:
    part = readme.split("## Method chooser", 1)[1].split("\n## ", 1)[0]
    return [line for line in part.splitlines() if line.startswith("| ") and not line.startswith("| problem")]


def unbacked_numbers(text: str, folder: str = REPO) -> list[str]:
    """The numbers of `text` (links relative to `folder`) that are in none of the committed outputs
    (benchmarks/results/...) it links to."""
    outputs = [read(os.path.join(folder, t)) for t in relative_links(text) if "benchmarks/results/" in t]
    assert outputs, f"links no committed output: {text[:60]}"
    return [n for n in re.findall(r"\d+\.\d+", text) if not any(n in output for output in outputs)]


def test_every_number_of_the_method_chooser_is_in_a_committed_output_its_row_links_to():
    rows = chooser_rows(read(os.path.join(REPO, "README.md")))
    assert len(rows) >= 5 and all(re.search(r"\d+\.\d+", row) for row in rows)
    for row in rows:
        assert unbacked_numbers(row) == [], row[:60]
        for page in (t for t in relative_links(row) if t.startswith("docs/methods/")):  # only benchmarked methods
            assert benchmarked(read(os.path.join(REPO, page))), f"{page} is in the chooser but not benchmarked yet"
    prostate = next(row for row in rows if "worst_off/prostate" in row)
    assert unbacked_numbers(prostate.replace("+0.95", "+12.34")) == ["12.34"]  # a typo is caught
    wrong = prostate.replace("worst_off/GOAL.md", "fedfloor/fundus/SUMMARY.md")  # GOAL.md holds every task
    wrong = wrong.replace("worst_off/prostate", "worst_off/fundus")
    assert {"8.27", "12.72"} <= set(unbacked_numbers(wrong))  # the wrong outputs: the prostate worst site
    with pytest.raises(AssertionError, match="links no committed output"):
        unbacked_numbers("| x | y | 1.5 ([doc](docs/data.md)) |")


def results_section(text: str) -> str:
    """The part of a method page under its results heading, up to the next `## ` heading."""
    assert f"\n{RESULTS}\n" in text, f"no {RESULTS!r} heading"
    return re.split(r"^## ", text.split(f"\n{RESULTS}\n", 1)[1], flags=re.M)[0]


def benchmarked(text: str, folder: str = os.path.join(DOCS, "methods")) -> bool:
    """A method page's explicit state: True when its results section links a committed benchmark output
    (benchmarks/results/...) and every number there is in an output it links; False when the section opens with
    NOT_BENCHMARKED and gives neither such a link nor a number. Neither, or both, is an AssertionError."""
    results = results_section(text)
    links = [t for t in relative_links(results) if "benchmarks/results/" in t]
    if results.strip().startswith(NOT_BENCHMARKED):
        assert not links, f"says {NOT_BENCHMARKED!r} but links {links}"
        assert not re.findall(r"\d+\.\d+", results), f"says {NOT_BENCHMARKED!r} but gives results"
        return False
    assert links, f"links no committed benchmark output and does not say {NOT_BENCHMARKED!r}"
    assert unbacked_numbers(results, folder) == [], unbacked_numbers(results, folder)
    return True


def test_every_method_page_links_its_committed_benchmark_outputs_or_says_it_is_not_benchmarked_yet():
    states = {page: benchmarked(read(os.path.join(DOCS, "methods", f"{page}.md"))) for page in METHOD_PAGES}
    assert sum(states.values()) >= 5, states
    assert benchmarked(read(TEMPLATE)) is False  # the template's statement is the form a new page opens with
    heading = f"# M\n\n{RESULTS}\n\n"
    output = "([SUMMARY](../../benchmarks/results/compare/prostate/SUMMARY.md))"
    assert benchmarked(f"{heading}{NOT_BENCHMARKED}: `fairfl benchmark prostate` is next.\n") is False
    assert benchmarked(f"{heading}Avg. Dice 70.34 {output}\n") is True
    for wrong, message in [
        ("It is not benchmarked yet.\n", "links no committed benchmark output"),  # silently neither
        (f"{NOT_BENCHMARKED}.\n\nBut see {output}.\n", "but links"),  # both
        (f"{NOT_BENCHMARKED}; about 70.34 Dice.\n", "but gives results"),
        (f"Avg. Dice 12.34 {output}\n", "12.34"),  # a number in no output it links
    ]:
        with pytest.raises(AssertionError, match=message):
            benchmarked(heading + wrong)
    with pytest.raises(AssertionError, match="no '## Expected results' heading"):
        benchmarked(f"# M\n\n## Results\n\n{NOT_BENCHMARKED}.\n")


def job_table(readme: str) -> dict[str, str]:
    """{job: the page its row links} of the README's job table (`| job | method | status |`)."""
    rows, in_table = {}, False
    for line in readme.splitlines():
        if line.startswith("| job | method | status |"):
            in_table = True
        elif not line.startswith("|"):
            in_table = False
        elif in_table and not line.startswith("|---"):
            match = re.match(r"\| \[`jobs/(\w+)`\]\(([^)#]+)\) \|", line)
            assert match, f"README.md: a job table row without its job and page: {line[:60]}"
            assert match.group(1) not in rows, f"README.md: two rows for jobs/{match.group(1)}"
            rows[match.group(1)] = match.group(2)
    return rows


def test_the_readme_job_table_lists_the_jobs_of_the_benchmarked_methods_and_no_other():
    """The rule: a method gets its README row with its first committed benchmark (its page leaves "Not benchmarked
    yet"), so a new method unit, with its job and its page saying "Not benchmarked yet", needs no README edit; the
    README says so. Each row links the page its unit declares."""
    readme = read(os.path.join(REPO, "README.md"))
    expected = {
        job.name: f"docs/{unit.doc}"
        for unit in UNITS
        if benchmarked(read(os.path.join(DOCS, unit.doc)))
        for job in unit.jobs
    }
    rows = job_table(readme)
    assert len(rows) >= 10 and rows == expected
    assert f'"{NOT_BENCHMARKED}"' in readme.split("| job | method | status |", 1)[0]  # the rule, above the table
    with pytest.raises(AssertionError, match="two rows for jobs/fedavg"):
        job_table(readme.replace("| [`jobs/solo`]", "| [`jobs/fedavg`]"))


def test_the_readme_keeps_the_test_command_the_ci_runs():
    readme = read(os.path.join(REPO, "README.md"))
    two = readme.split("## Two commands\n", 1)[1].split("\n## ", 1)[0]
    assert "bash scripts/test.sh" in two and "bash scripts/demo.sh" in two
    assert "bash scripts/test.sh" in read(os.path.join(REPO, ".ci", "run"))
