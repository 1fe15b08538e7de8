"""engine/'s layers as import-linter contracts (pyproject's [tool.importlinter]: the folders' layers, no Qt or
app/, no torch in protocol/ or planning/, no import cycle), and what they cannot say: no pickle, no private names
across modules, the protocol importable without torch."""
import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True, no_logo=True))"


def _lint(cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LINT], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_engine_keeps_every_import_contract():
    r = _lint(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "6 kept, 0 broken" in r.stdout, r.stdout


@pytest.mark.parametrize("module, line, broken", [
    ("engine/prompts/prompt.py", "import engine.control.migrator", "engine's folders are layers"),  # no cycle
    ("engine/machine/memory.py", "import PySide6", "engine never imports app or Qt"),
    ("engine/protocol/events.py", "import torch", "protocol imports no torch"),  # (errors.py: planning too)
    ("engine/planning/batch_scaling.py", "import torch", "planning imports no torch"),
    ("app/store/export.py", "import PySide6", "the chats on disk"),
    ("engine/runtime/scheduler.py", "import engine.runtime.session", "no import cycle"),
], ids=["layers", "qt", "protocol-torch", "planning-torch", "store-qt", "cycle"])
def test_each_contract_fails_on_a_violation(tmp_path, module, line, broken):
    """A copy of the tree with one import that breaks one contract: that contract, and only it, is broken."""
    for part in ("engine", "app"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.dll"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    with open(tmp_path / module, "a") as f:
        f.write(f"\n{line}  # a deliberate violation\n")
    r = _lint(tmp_path)
    assert r.returncode == 1 and "5 kept, 1 broken" in r.stdout, r.stdout + r.stderr
    assert broken in r.stdout.split("Broken contracts", 1)[1], r.stdout


def test_no_pickle_loading_in_product_code():
    root = Path(__file__).resolve().parents[1]
    for folder in ("engine", "app"):
        for f in (root / folder).rglob("*.py"):
            src = f.read_text()
            assert "torch.load(" not in src and "pickle.load" not in src and "trust_remote_code=True" not in src, f


def _imports(f: Path, package: str):
    """(module imported, names imported) for each import in f, resolved to dotted names."""
    here = f.relative_to(f.parents[len(f.relative_to(Path(__file__).resolve().parents[1]).parts) - 1]).with_suffix("")
    parts = list(here.parts)
    for node in ast.walk(ast.parse(f.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = parts[: len(parts) - node.level]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            yield mod, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, []


def test_no_module_imports_another_modules_private_names():
    root = Path(__file__).resolve().parents[1]
    bad = []
    for folder in ("engine", "app"):
        for f in (root / folder).rglob("*.py"):
            for mod, names in _imports(f, folder):
                bad += [f"{f.relative_to(root)}: {mod}.{n}" for n in names if n.startswith("_") and not n.startswith("__")]
    assert not bad, bad


def test_the_engine_contract_imports_no_model_code():
    """The messages (commands, events, SamplingParams, Placement, Tier) are plain values: a client
    imports them without torch or any model module (checked in a fresh interpreter)."""
    import subprocess
    import sys

    code = ("import sys\n"
            "import engine.protocol, engine.protocol.commands, engine.protocol.events, engine.protocol.sampling\n"
            "from engine.protocol import Generate, Load, Loaded, Done, Token, SamplingParams\n"
            "from engine.placement import Placement, Tier\n"
            "heavy = [m for m in ('torch', 'engine.model.forward', 'engine.runtime.generate', 'engine.runtime.session', 'transformers')\n"
            "         if m in sys.modules]\n"
            "print(heavy)\n")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_the_readmes_tree_names_every_folder_and_no_other():
    """README's "How it is built" draws engine/ and app/ a folder a line: it stays the tree."""
    import re

    text = (ROOT / "README.md").read_text().split("## How it is built", 1)[1].split("```")[1]
    drawn = set()
    top = None
    for line in text.splitlines():
        m = re.match(r"^(\s*)([a-z_]+)/\s", line + " ")
        if m and not m.group(1):
            top = m.group(2)
        elif m and top in ("engine", "app"):
            drawn.add(f"{top}/{m.group(2)}")
    real = {f"{top}/{p.name}" for top in ("engine", "app") for p in (ROOT / top).iterdir()
            if (p / "__init__.py").is_file()}
    assert drawn == real, (sorted(real - drawn), sorted(drawn - real))


@pytest.mark.parametrize("markexpr,no_model", [
    ("unit", True), ("unit and not slow", True), ("not engine and not window", True), ("unit and window", True),
    ("", False), ("not slow and not gpu", False), ("engine", False), ("unit or window", False),
    ("not unit", False), ("slow", False)])
def test_only_a_run_that_selects_no_model_skips_the_modules_that_make_them(markexpr, no_model):
    """`pytest -m unit` leaves the modules that make models unimported (tests/conftest.py); any
    expression that could select an engine or window test imports them all."""
    import layer_marks

    assert layer_marks.selects_no_model(markexpr) is no_model
