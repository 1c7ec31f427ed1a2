"""The notebooks in notebooks-data/notebooks/ run from top to bottom (each asserts what it
shows: proven bounds hold, a reproduction matches its committed results), so they never rot."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from conftest import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks-data" / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert {p.stem for p in NOTEBOOKS} >= {"tour", "how-far-from-optimal", "reproduce-evictions", "slos-and-capacity"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path: Path):
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
