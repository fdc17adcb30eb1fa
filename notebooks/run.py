"""Execute the notebooks top to bottom, in order, in this folder, and save them with their outputs.

``make notebooks`` runs it. 02 saves the model that 03 evaluates, so the order matters.
"""

from __future__ import annotations

import pathlib
import sys

import nbformat
from nbclient import NotebookClient

HERE = pathlib.Path(__file__).parent
NOTEBOOKS = ["01_quickstart.ipynb", "02_training_loop.ipynb", "03_offline_eval.ipynb"]


def execute(path: pathlib.Path, workdir: pathlib.Path) -> nbformat.NotebookNode:
    """The notebook at ``path`` executed with ``workdir`` as its current directory."""
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(workdir)}}).execute()
    return notebook


def main() -> int:
    for name in NOTEBOOKS:
        print(f"running {name}", file=sys.stderr)
        notebook = execute(HERE / name, HERE)
        nbformat.write(notebook, HERE / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
