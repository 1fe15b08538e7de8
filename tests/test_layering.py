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


def test_engine_modules_import_no_cycle():
    """Lazy imports included: a cycle (cli <-> cli_plan was one) makes the layers unreadable."""
    root = Path(__file__).resolve().parents[1]
    graph = {}
    for f in (root / "engine").rglob("*.py"):
        name = ".".join(f.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        graph[name] = set()
        for mod, names in _imports(f, "engine"):
            for target in [mod] + [f"{mod}.{n}" for n in names]:
                if target.startswith("engine.") and target != name:
                    graph[name].add(target)
    graph = {k: {t for t in v if t in graph and t != "engine"} for k, v in graph.items()}
    state, cycles = {}, []

    def visit(n, path):
        state[n] = 1
        for m in graph[n]:
            if state.get(m) == 1:
                cycles.append(path[path.index(m):] + [m] if m in path else [n, m])
            elif not state.get(m):
                visit(m, path + [m])
        state[n] = 2

    for n in graph:
        if not state.get(n):
            visit(n, [n])
    assert not cycles, cycles


def test_the_engine_core_never_imports_its_tools():
    """engine/tools/ (the CLI, the server, the runtime installer) sit on top of the engine: the
    modules below them never import them, lazily or not."""
    root = Path(__file__).resolve().parents[1]
    bad = []
    for f in (root / "engine").rglob("*.py"):
        rel = f.relative_to(root)
        if rel.parts[:2] == ("engine", "tools"):
            continue
        for mod, names in _imports(f, "engine"):
            targets = [mod] + [f"{mod}.{n}" for n in names]
            bad += [f"{rel}: {t}" for t in targets if t == "engine.tools" or t.startswith("engine.tools.")]
    assert not bad, bad



def test_the_engine_contract_imports_no_model_code():
    """The messages (commands, events, SamplingParams, Placement, Tier) are plain values: a client
    imports them without torch or any model module (checked in a fresh interpreter)."""
    import subprocess
    import sys

    code = ("import sys\n"
            "import engine.protocol, engine.commands, engine.events, engine.sampling\n"
            "from engine.protocol import Generate, Load, Loaded, Done, Token, SamplingParams\n"
            "from engine.placement import Placement, Tier\n"
            "heavy = [m for m in ('torch', 'engine.model', 'engine.generate', 'engine.session', 'transformers')\n"
            "         if m in sys.modules]\n"
            "print(heavy)\n")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
