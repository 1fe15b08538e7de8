"""What the install gives: every package of the source tree in the wheel's package list (the
packaged installer builds from it; engine/prompts/formats, engine/files/gguf and engine/placement were missing),
and a PySide6 that counts its references to None (6.12.0 did not: Python 3.11 aborted with
"none_dealloc" after some ten thousand void Qt calls, which one streamed reply makes)."""
from __future__ import annotations

import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_in_the_wheel():
    from setuptools import find_packages

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    listed = set(find_packages(where=str(ROOT), include=include))  # what setuptools puts in the wheel
    found = {".".join(p.parent.relative_to(ROOT).parts) for top in ("engine", "app")
             for p in (ROOT / top).rglob("__init__.py")}
    assert found - listed == set(), f"packages missing from pyproject.toml: {sorted(found - listed)}"


def test_void_qt_calls_do_not_lose_references_to_none(qapp):
    from PySide6.QtWidgets import QLabel

    label = QLabel()
    before = sys.getrefcount(None)
    for i in range(3000):  # well under what aborts a 3.11 interpreter (the count starts near 5,000)
        label.setText("x")
    assert sys.getrefcount(None) >= before - 100, "this PySide6 leaks references to None (6.12.0 did): see pyproject.toml"
