"""The notebooks: committed with their outputs, and each runs top to bottom with nothing on stderr."""

from __future__ import annotations

import pathlib
import re
import shutil
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("sklearn")

FOLDER = pathlib.Path(__file__).parent.parent / "notebooks"
sys.path.insert(0, str(FOLDER))
from run import KEY, NOTEBOOKS, code_hash, execute, is_current, main  # noqa: E402

pytestmark = pytest.mark.slow


def _problems(notebook) -> list[str]:
    """Errors, stderr and warnings printed by any cell."""
    found = []
    for index, cell in enumerate(notebook.cells):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                found.append(f"cell {index}: {output.get('ename')}: {output.get('evalue')}")
            elif output.get("output_type") == "stream" and output.get("name") == "stderr":
                found.append(f"cell {index} wrote to stderr: {output.get('text', '')[:200]}")
    return found


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_the_committed_notebook_has_its_outputs_and_no_stderr(name):
    notebook = nbformat.read(FOLDER / name, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.get("outputs") for cell in code), "run `make notebooks` and commit the outputs"
    assert not _problems(notebook)
    assert any(o.get("data", {}).get("image/png") for cell in code for o in cell.outputs), "a plot is shown"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_the_committed_outputs_were_made_by_the_committed_code(name):
    # So `make notebooks` on a fresh clone runs nothing and leaves `git status` clean.
    notebook = nbformat.read(FOLDER / name, as_version=4)
    assert is_current(notebook), "the code changed since its outputs were made: run `make notebooks` and commit"
    assert not any("execution" in cell.metadata for cell in notebook.cells), "execution timestamps were committed"


def test_make_notebooks_leaves_current_notebooks_untouched(tmp_path):
    for name in NOTEBOOKS:
        shutil.copy(FOLDER / name, tmp_path / name)
    assert main([], folder=tmp_path) == 0
    assert all((tmp_path / name).read_bytes() == (FOLDER / name).read_bytes() for name in NOTEBOOKS)


def test_a_changed_code_cell_makes_a_notebook_stale_and_a_changed_text_cell_does_not():
    notebook = nbformat.read(FOLDER / NOTEBOOKS[0], as_version=4)
    notebook.metadata[KEY] = {"code": code_hash(notebook)}
    markdown = next(cell for cell in notebook.cells if cell.cell_type == "markdown")
    markdown.source += " More words."
    assert is_current(notebook)
    code = next(cell for cell in notebook.cells if cell.cell_type == "code")
    code.source += "\n1 + 1"
    assert not is_current(notebook)


def test_the_committed_training_notebook_reaches_90_percent_held_out():
    notebook = nbformat.read(FOLDER / "02_training_loop.ipynb", as_version=4)
    text = "".join(o.get("text", "") for cell in notebook.cells for o in cell.get("outputs", []))
    accuracies = [float(a) for a in re.findall(r"held-out accuracy (\d+\.\d)%", text)]
    assert accuracies and accuracies[-1] >= 90.0


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("notebooks")


@pytest.mark.parametrize("name", NOTEBOOKS)  # in order: 02 saves the model 03 evaluates
def test_the_notebook_runs_top_to_bottom_with_nothing_on_stderr(name, workdir):
    copy = workdir / name
    shutil.copy(FOLDER / name, copy)
    notebook = execute(copy, workdir)
    assert not _problems(notebook)
    assert is_current(notebook) and not any("execution" in cell.metadata for cell in notebook.cells)


def _texts(notebook) -> list[str]:
    """Each code cell's printed and shown text, in order (plots and images left out)."""
    return [
        "".join(o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in cell.get("outputs", []))
        for cell in notebook.cells
        if cell.cell_type == "code"
    ]


def test_the_quickstarts_committed_outputs_are_what_the_package_prints_now(tmp_path):
    # The quickstart measures nothing: every output it shows follows from the package (a buffer's
    # layout, say), so a change to the package that changes one must come with the notebook run
    # again. Its code's hash alone cannot tell (the code did not change).
    name = "01_quickstart.ipynb"
    copy = tmp_path / name
    shutil.copy(FOLDER / name, copy)
    committed = nbformat.read(FOLDER / name, as_version=4)
    assert _texts(execute(copy, tmp_path)) == _texts(committed), "run `make notebooks FORCE=1` and commit"
