"""The tests' layers (pyproject's markers), given by tests/conftest.py to every test not marked by hand:
`pytest -m unit` (no model, no Qt, no subprocess of the engine: under a minute), `-m engine` (a model, tiny
ones the tests write, or the engine run as a program), `-m window` (a real Qt window or widget, offscreen).
A test is told by its fixtures (qtbot: window) and by what its module makes (a model, a file of one, a run)
or checks a layer against (transformers' model code)."""
import itertools
import re

LAYERS = ("unit", "engine", "window")
ENGINE_FIXTURES = {"tiny", "tiny_sharded", "reference", "cache_seed", "window_cache", "measured_machine",
                   "pinned_machine", "folders"}
ENGINE_WORDS = ("write_tiny", "tiny_model", "Session(", "Client(", "write_gguf", "hf_to_gguf", "gguf_files",
                "engine.tools.cli", "MoEModel", "open_checkpoint", "llama_cpp", "save_pretrained", "write_synthetic",
                "subprocess", "Popen", "from_pretrained",
                # parity with transformers' model code: a layer against the reference (importing it takes ~6 s)
                "from transformers.models")
_SOURCES: dict = {}


def source(path) -> str:
    path = str(path)
    if path not in _SOURCES:
        try:
            _SOURCES[path] = open(path, encoding="utf-8").read()
        except OSError:
            _SOURCES[path] = ""
    return _SOURCES[path]


def makes_models(path) -> bool:
    """Whether a test module makes a model or runs the engine: its tests not marked by hand are then engine
    or window."""
    return any(w in source(path) for w in ENGINE_WORDS)


def holds_no_unit_test(path) -> bool:
    """A module a unit run need not import: it makes models and marks no test unit by hand."""
    return makes_models(path) and "mark.unit" not in source(path)


def layer(item) -> str:
    names = set(getattr(item, "fixturenames", ()))
    if names & {"qtbot", "qapp"}:
        return "window"
    return "engine" if names & ENGINE_FIXTURES or makes_models(item.fspath) else "unit"


def selects_no_model(markexpr: str) -> bool:
    """Whether a `-m` expression can select no engine or window test, whatever other marks it carries
    (`unit`, `unit and not slow`; not `not slow`, `unit or window`): then the modules that make models
    need not even be imported."""
    if not markexpr.strip():
        return False
    from _pytest.mark.expression import Expression

    expr = Expression.compile(markexpr)
    names = sorted(set(re.findall(r"[A-Za-z_]\w*", markexpr)) - {"and", "or", "not", *LAYERS})
    return not any(expr.evaluate(lambda name, **kw: not kw and name in marks)
                   for layer_name in ("engine", "window")
                   for on in itertools.product((False, True), repeat=len(names))
                   for marks in [{layer_name, *(n for n, o in zip(names, on) if o)}])
