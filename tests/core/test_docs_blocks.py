"""The generated blocks of README.md and docs/ (fairfl.docs_blocks, `fairfl update-readme`): rewritten from their
source section, links relative to the page holding them, `--check` changing nothing, and the committed README and
docs equal to what the committed benchmark outputs generate."""

import os

import pytest

from fairfl.cli import main as cli_main
from fairfl.docs_blocks import documentation_files, section, update_generated_blocks

from helpers import REPO


def test_section_and_readme_blocks_are_rewritten_from_their_source(tmp_path):
    out = tmp_path / "benchmarks" / "results" / "x"
    out.mkdir(parents=True)
    (out / "SUMMARY.md").write_text(
        "# Title\n\nintro\n\n## Dice per site\n\n| a |\n\n[report](dice/report.md)\n\n"
        "### detail\n\nkept\n\n## Round time\n\nnot this\n"
    )
    assert (
        section((out / "SUMMARY.md").read_text(), "Dice per site")
        == "| a |\n\n[report](dice/report.md)\n\n### detail\n\nkept\n"
    )
    with pytest.raises(ValueError, match="no section"):
        section("# a\n", "b")
    readme = tmp_path / "README.md"
    readme.write_text(
        "before\n<!-- generated from benchmarks/results/x/SUMMARY.md#Dice per site -->\ntyped by hand\n"
        "<!-- end generated -->\nafter\n"
    )
    assert update_generated_blocks(readme, check=True) == ["benchmarks/results/x/SUMMARY.md#Dice per site"]
    assert "typed by hand" in readme.read_text()  # --check changes nothing
    assert cli_main(["update-readme", str(readme), "--check"]) == 1
    assert cli_main(["update-readme", str(readme)]) == 0
    text = readme.read_text()
    assert "typed by hand" not in text and "| a |" in text and "##### detail" in text and "not this" not in text
    assert "[report](benchmarks/results/x/dice/report.md)" in text and text.endswith("after\n")
    assert update_generated_blocks(readme, check=True) == []


def test_a_docs_page_block_links_relative_to_the_page_and_a_stale_one_is_reported(tmp_path, capsys):
    out = tmp_path / "benchmarks" / "results" / "x"
    out.mkdir(parents=True)
    (out / "SUMMARY.md").write_text(
        "# T\n\n## Dice per site\n\n| a |\n\n[report](dice/report.md) "
        "![fig](../y/plot.png) [web](https://example.org/a.md) [here](#dice-per-site)\n"
    )
    readme = tmp_path / "README.md"
    block = "<!-- generated from {}benchmarks/results/x/SUMMARY.md#Dice per site -->\n{}<!-- end generated -->\n"
    readme.write_text("intro\n")
    (tmp_path / "docs" / "methods").mkdir(parents=True)
    page = tmp_path / "docs" / "benchmarks.md"
    page.write_text("# Benchmarks\n\n" + block.format("../", "old numbers\n"))
    nested = tmp_path / "docs" / "methods" / "fedavg.md"
    nested.write_text(block.format("../../", "") + "tail\n")
    assert documentation_files(tmp_path) == [readme, page, nested]
    files = [str(f) for f in documentation_files(tmp_path)]
    assert cli_main(["update-readme", *files, "--check"]) == 1
    err = capsys.readouterr().err
    assert f"{page}: out of date" in err and f"{nested}: out of date" in err and "README" not in err
    assert "old numbers" in page.read_text()  # --check changes nothing
    assert cli_main(["update-readme", *files]) == 0 and cli_main(["update-readme", *files, "--check"]) == 0
    text = page.read_text()
    assert "old numbers" not in text and "[report](../benchmarks/results/x/dice/report.md)" in text
    assert "![fig](../benchmarks/results/y/plot.png)" in text
    assert "[web](https://example.org/a.md)" in text and "[here](#dice-per-site)" in text  # not file links
    assert "[report](../../benchmarks/results/x/dice/report.md)" in nested.read_text()
    assert nested.read_text().endswith("<!-- end generated -->\ntail\n")
    # a block whose path is written as from the repository root, in a docs page: an error naming the page
    page.write_text(block.format("", ""))
    assert cli_main(["update-readme", str(page), "--check"]) == 1
    err = capsys.readouterr().err
    assert str(page) in err and "relative to the file holding it" in err


def test_the_readme_and_docs_results_are_those_of_the_committed_benchmark_outputs(capsys):
    files = documentation_files(REPO)
    # docs/benchmarks.md is the index of one page per task under docs/benchmarks/, each with its generated blocks
    folder = os.path.join(REPO, "docs", "benchmarks")
    pages = [os.path.join(folder, f"{p}.md") for p in ("segmentation", "quality-shift", "class-imbalance", "cost")]
    assert set(pages) <= set(map(str, files))
    stale = {str(f): update_generated_blocks(f, check=True) for f in files}
    assert not any(stale.values()), f"blocks out of date: {stale}: run `fairfl update-readme`"
    for page in pages:
        with open(page) as f:
            assert "<!-- generated from ../../benchmarks/results/" in f.read(), page  # the moves kept their blocks
    assert cli_main(["update-readme", "--check"]) == 0  # the default: README.md and docs/**/*.md
