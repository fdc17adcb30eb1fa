"""Execute the notebooks top to bottom, in order, in this folder, and save them with their outputs.

``make notebooks`` runs it. A notebook whose code has not changed since its outputs were
made is left as it is (``--force`` runs every one again): its outputs are what that code
printed, measured on the machine that ran it, and a run that changes nothing leaves no
diff. Each saved notebook records the hash of the code that made its outputs, and no
execution timestamps. 02 saves the model that 03 evaluates, so the order matters: a
notebook to run has every notebook before it run first (saved only if it too changed).
"""

from __future__ import annotations

import argparse
import hashlib
import pathlib
import sys

import nbformat
from nbclient import NotebookClient

HERE = pathlib.Path(__file__).parent
NOTEBOOKS = ["01_quickstart.ipynb", "02_training_loop.ipynb", "03_offline_eval.ipynb"]
#: Where in a notebook's metadata the hash of the code that made its outputs is kept.
KEY = "pincollate"


def code_hash(notebook: nbformat.NotebookNode) -> str:
    """The hash of a notebook's code cells, in order: what its outputs depend on."""
    digest = hashlib.sha256()
    for cell in notebook.cells:
        if cell.cell_type == "code":
            digest.update(cell.source.encode())
            digest.update(b"\0")
    return digest.hexdigest()


def is_current(notebook: nbformat.NotebookNode) -> bool:
    """Whether the notebook's outputs were made by its code as it is."""
    return notebook.metadata.get(KEY, {}).get("code") == code_hash(notebook)


def strip_volatile(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Drop what changes from run to run without the outputs changing: each cell's execution timestamps."""
    for cell in notebook.cells:
        cell.metadata.pop("execution", None)
    return notebook


def execute(path: pathlib.Path, workdir: pathlib.Path) -> nbformat.NotebookNode:
    """The notebook at ``path`` executed with ``workdir`` as its current directory, stamped with its code's hash."""
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(workdir)}}).execute()
    notebook.metadata[KEY] = {"code": code_hash(notebook)}
    return strip_volatile(notebook)


def main(argv: list[str] | None = None, folder: pathlib.Path = HERE) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--force", action="store_true", help="run every notebook, changed or not")
    args = parser.parse_args(argv)
    stale = [name for name in NOTEBOOKS if args.force or not is_current(nbformat.read(folder / name, as_version=4))]
    if not stale:
        print("notebooks: every one is current (--force runs them again)", file=sys.stderr)
        return 0
    last = max(NOTEBOOKS.index(name) for name in stale)
    for name in NOTEBOOKS[: last + 1]:
        print(f"running {name}" + ("" if name in stale else " (for the notebooks after it; not saved)"), file=sys.stderr)
        notebook = execute(folder / name, folder)
        if name in stale:
            nbformat.write(notebook, folder / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
