"""The docs: the API reference renders every public name and only those; the README stays short."""

from __future__ import annotations

import re
from pathlib import Path

import pincollate

ROOT = Path(__file__).resolve().parent.parent
README_MOST_WORDS = 1_200


def _rendered() -> list[str]:
    """The names the API pages render (``::: pincollate.NAME``)."""
    pages = sorted((ROOT / "docs" / "api").glob("*.md"))
    return [name for page in pages for name in re.findall(r"^::: pincollate\.(\S+)$", page.read_text(), re.MULTILINE)]


def test_the_api_reference_renders_every_public_name_once():
    # The framework callbacks are public too, loaded on first use (not in __all__: a star import would load them).
    public = [*pincollate.__all__, *pincollate._LAZY]
    rendered = _rendered()
    assert sorted(rendered) == sorted(public), (
        f"missing from docs/api: {sorted(set(public) - set(rendered))}; not public: {sorted(set(rendered) - set(public))}"
    )


def test_the_readme_is_under_its_word_limit():
    words = len((ROOT / "README.md").read_text().split())  # as wc -w counts them
    assert words < README_MOST_WORDS, f"README.md has {words} words; keep it under {README_MOST_WORDS}"
