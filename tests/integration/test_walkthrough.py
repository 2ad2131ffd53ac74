"""docs/walkthrough.ipynb, executed as a reader runs it (nbclient, a fresh kernel, the notebook's folder as working
directory): a cell that raises fails the test, and the cells that compare FedAvg and Fed-LWR must print both methods'
tables and fairness numbers, the same in the notebook's own reading as in `fairfl report`'s. The committed notebook
carries no outputs."""

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from helpers import REPO

NOTEBOOK = Path(REPO) / "docs" / "walkthrough.ipynb"
NUMBER = r"(\d+\.\d\d)"


def printed(notebook, tag: str) -> str:
    """What the cell tagged `tag` printed."""
    (cell,) = [c for c in notebook.cells if tag in c.metadata.get("tags", [])]
    assert not [o for o in cell.outputs if o.output_type == "error"]
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def test_the_committed_walkthrough_carries_no_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(cell.outputs == [] and cell.execution_count is None for cell in code)


@pytest.mark.slow
def test_the_walkthrough_runs_and_prints_the_comparison(tmp_path, cache_dir, monkeypatch):
    monkeypatch.setenv("FAIRFL_WALKTHROUGH_DIR", str(tmp_path))  # the kernel and the runs inherit it
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    # raises CellExecutionError, naming the cell and its traceback, if any cell fails
    NotebookClient(notebook, timeout=600, resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()

    runs = printed(notebook, "runs")
    assert "--- FedAvg" in runs and "--- Fed-LWR" in runs
    assert len(re.findall(r"^finished 2 round\(s\) in .*dice mean", runs, re.M)) == 2

    report = printed(notebook, "report")
    assert "| Method | site-1 | site-2 | site-3 | Avg. | Std. |" in report
    assert "| Method | Worst | P10 | Median | P90 | Best | Spread | Gini | seeds |" in report
    assert re.search(r"^\| Fed-LWR \|.*\(1 seed\) \| 1 \|$", report, re.M)  # against FedAvg, one paired seed
    per_site = report.split("Spread across sites")[0]  # the first table: each site, then Avg. (best in bold)
    averages = dict(re.findall(rf"^\| (FedAvg|Fed-LWR) \| (?:[\d.]+ \| ){{3}}\**{NUMBER}\**", per_site, re.M))
    assert (tmp_path / "report" / "report.md").is_file()

    fairness = printed(notebook, "fairness")
    read = {}
    for name in ("FedAvg", "Fed-LWR"):
        found = re.search(rf"^{name}: mean {NUMBER}%, worst site-\d {NUMBER}%, spread {NUMBER} points$", fairness, re.M)
        assert found, fairness
        read[name] = found.group(1)
    assert re.search(r"^Fed-LWR - FedAvg: mean [+-]\d+\.\d\d, worst hospital [+-]\d+\.\d\d, spread", fairness, re.M)
    # the notebook's reading of results.json is the report's Avg. column
    assert read == {name: averages[name] for name in read}
