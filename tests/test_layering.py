"""engine/ is headless: it never imports Qt or app/ (checked on the source, import by import)."""
import ast
from pathlib import Path

FORBIDDEN = ("PySide6", "PyQt5", "PyQt6", "qasync", "app")


def test_engine_never_imports_qt_or_app():
    root = Path(__file__).resolve().parents[1] / "engine"
    bad = []
    for f in root.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            bad += [f"{f.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert not bad, bad


def test_no_pickle_loading_in_product_code():
    root = Path(__file__).resolve().parents[1]
    for folder in ("engine", "app"):
        for f in (root / folder).rglob("*.py"):
            src = f.read_text()
            assert "torch.load(" not in src and "pickle.load" not in src and "trust_remote_code=True" not in src, f
