import os
import threading
import time

import pytest

import layer_marks

if os.environ.get("PYTEST_XDIST_WORKER"):  # two test processes share the cores (pyproject's -n): torch's
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # idle OpenMP threads sleep, not spin on the other's core
import torch  # noqa: E402

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The engine's error log (engine/runtime/errorlog.py), the window's settings and the cache (the hardware profile,
# calibrations) stay out of $HOME, in folders of this test process: each of pyproject's parallel workers
# makes its own (the controller's, which they inherit, would be shared: one worker's window remembered
# another's slider). A folder set before the run is kept. Tests that need their own set one (window_cache
# below: a copy of a measured one).
_OURS = os.environ.get("MIXDESK_TEST_XDG", "").split(os.pathsep)
for _var, _prefix in (("XDG_STATE_HOME", "state"), ("XDG_CONFIG_HOME", "config"), ("XDG_CACHE_HOME", "cache")):
    if _var not in os.environ or os.environ[_var] in _OURS:
        import tempfile

        os.environ[_var] = tempfile.mkdtemp(prefix=f"mixdesk-test-{_prefix}-")
        _OURS.append(os.environ[_var])
os.environ["MIXDESK_TEST_XDG"] = os.pathsep.join(d for d in _OURS if d)
torch.set_num_threads(min(2, os.cpu_count() or 1))


def _pace(generator, per_token_s: float = 0.005) -> None:
    """Holds each of the generator's decode steps to at least per_token_s. Tests that act while a
    reply streams (stop it, move the slider, watch the window) need it to last: with the native
    kernels the tiny model decodes ~6,000 tok/s and a reply can end before the test can act."""
    inner = generator.retrying  # every forward pass, alone or batched, goes through it

    def paced(step):
        time.sleep(per_token_s)
        return inner(step)

    generator.retrying = paced


_MEASURED: dict = {}  # accelerator kind -> this machine's HardwareProfile, measured once a run
_MEASURING = threading.Lock()


@pytest.fixture(autouse=True)
def _machine_measured_once(request, monkeypatch):
    """The machine's hardware profile (engine/measures/hardware.py: 10-20 s on 2 cores) is measured once a
    run: a later test's first start, re-measure or damaged profile gets a copy of that measure at once,
    through the same path (the window's "Measuring this machine", the file written). Tests of the
    measuring itself are marked `measures_machine`. Subprocesses (the CLI tests) share the run's cache
    folder, so they measure once too. Split across workers, the run's one measure is the controller's."""
    if request.node.get_closest_marker("measures_machine"):
        yield
        return
    import copy

    import engine.measures.hardware as hardware

    real = hardware.measure

    def once(accel):
        with _MEASURING:
            if accel.type not in _MEASURED:
                _MEASURED[accel.type] = _profile_of_the_run(real, accel)
            return copy.deepcopy(_MEASURED[accel.type])

    monkeypatch.setattr(hardware, "measure", once)
    yield


def _profile_of_the_run(real, accel):
    """The controller's measure (pytest_configure below) where the run is split across workers, else real's."""
    from pathlib import Path

    import engine.measures.hardware as hardware

    path = os.environ.get("MIXDESK_TEST_HARDWARE")
    prof = hardware.cached(Path(path)) if accel.type == "cpu" and path else None
    return prof if prof is not None else real(accel)


def pytest_configure(config):
    """With the run split across worker processes (pyproject's `-n`), the machine is measured once here,
    before they start: measured inside a worker it would be measured while the other worker computes, and
    each worker would measure its own (a plan's batched rate came out no faster than one stream's)."""
    if os.environ.get("PYTEST_XDIST_WORKER") or not getattr(config.option, "numprocesses", None):
        return
    import tempfile
    from pathlib import Path

    import engine.measures.hardware as hardware

    path = Path(tempfile.mkdtemp(prefix="mixdesk-test-hardware-")) / "hardware.json"
    hardware.save(hardware.measure(torch.device("cpu")), path)
    os.environ["MIXDESK_TEST_HARDWARE"] = str(path)


@pytest.fixture(autouse=True)
def _fresh_window_state():
    """Each test's window starts as on a first start: no remembered slider, geometry or chat
    (app/window_state.py); the settings folder is shared by the whole run."""
    yield
    import sys

    try:
        from app import window_state
    except ImportError:  # no PySide6 (the GPU machine's image runs the gpu tests without it)
        return
    window_state.forget()
    # Windows closed by this test (pytest-qt calls deleteLater on them before this teardown) are
    # destroyed now, in their own test: left to the next test's event loop they were destroyed during
    # that test's model load, with its engine thread running, which is where the run's rare
    # segfaults were seen (twice in test_composer_flows, once in test_chat_settings).
    from PySide6.QtCore import QCoreApplication, QEvent

    if QCoreApplication.instance() is not None:
        QCoreApplication.sendPostedEvents(None, QEvent.DeferredDelete)
    if "app.gui_gc" in sys.modules:  # a window left open keeps Python's collector off: hand it back
        sys.modules["app.gui_gc"].reset()


@pytest.fixture(params=[0, 1, 2], ids=["portable", "avx2", "avx512"])
def path(request):
    """Each native kernel path this CPU has, in turn (skipped where it lacks one); the best one after."""
    from engine import native

    lib = native.lib()
    if lib is None:
        pytest.skip("native library not built")
    if lib.mdk_select_path(request.param) != request.param:
        lib.mdk_select_path(2)
        pytest.skip("this CPU lacks that path")
    yield request.param
    lib.mdk_select_path(2)


@pytest.fixture
def pace():
    return _pace


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """A tiny random Mixtral (fp32, one safetensors file) with a byte-level tokenizer."""
    from engine.sources.tiny_model import write_tiny_mixtral

    return write_tiny_mixtral(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def cache_seed(tiny, tmp_path_factory):
    """A cache folder as the window leaves it after its first start on the tiny model (cpu, fp32):
    this machine's hardware profile and the model's calibration, measured once per run. Tests copy
    it (`window_cache`), so none measures them again and none sees another's changes."""
    import threading

    from engine.protocol import ErrorEvent, Load, Loaded
    from engine.runtime.session import Session

    seed = tmp_path_factory.mktemp("cache-seed")
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(seed)
    ready, errors = threading.Event(), []

    def emit(ev):
        if isinstance(ev, ErrorEvent):
            errors.append(ev.message)
        if isinstance(ev, (Loaded, ErrorEvent)):
            ready.set()

    s = Session(emit, poll_s=0.1).start()
    try:
        s.submit(Load(path=str(tiny), device="cpu", dtype="fp32"))
        assert ready.wait(300) and not errors, errors
        deadline, profiles = time.monotonic() + 300, seed / "mixdesk" / "profiles"
        while (s.controller.calibrating or not any(profiles.glob("*.json"))) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not s.controller.calibrating and any(profiles.glob("*.json")), "the tiny model was not calibrated"
    finally:
        s.shutdown()
        if before is None:
            os.environ.pop("XDG_CACHE_HOME", None)
        else:
            os.environ["XDG_CACHE_HOME"] = before
    return seed


@pytest.fixture
def window_cache(cache_seed, tmp_path, monkeypatch):
    """This test's own cache folder, a copy of the run's seed (hardware and calibration measured):
    a window on the tiny model starts as on any start after the first."""
    import shutil

    folder = tmp_path / "cache"
    shutil.copytree(cache_seed, folder)
    monkeypatch.setenv("XDG_CACHE_HOME", str(folder))
    return folder


@pytest.fixture
def measured_machine(cache_seed, tmp_path, monkeypatch):
    """This test's cache folder (tmp_path / "cache") holding only this machine's hardware profile, from
    the run's seed: a model's first start (its dense timings and calibration still to come) on a
    machine measured before, without measuring the machine again (~5 s a test). A test of the machine's
    own first measuring keeps an empty cache."""
    import shutil

    folder = tmp_path / "cache"
    (folder / "mixdesk").mkdir(parents=True, exist_ok=True)
    shutil.copy2(cache_seed / "mixdesk" / "hardware.json", folder / "mixdesk" / "hardware.json")
    monkeypatch.setenv("XDG_CACHE_HOME", str(folder))
    return folder


@pytest.fixture
def pinned_machine(tmp_path, monkeypatch):
    """This test's cache folder (tmp_path / "cache") holding a fixed hardware profile, not this machine's:
    the profile measured on a 2-core AVX2 AMD EPYC on 2026-12-05 (tests/machines/), stamped with this
    machine's id so it is taken as measured here. For tests of what the planner makes of a machine (how
    many points a frontier has, which tiers its fastest end holds): measured, those depend on the CPU
    (on CI's machine of 12-05 the 2- and 3-bit CPU tiers were no faster than cpu-4, and a config's
    frontier had 10 points where this one gives 180)."""
    import json
    from pathlib import Path

    import engine.measures.hardware as hardware

    data = json.loads((Path(__file__).parent / "machines" / "amd-epyc-avx2-2-cores.json").read_text())
    data["machine"] = hardware.machine_id()
    folder = tmp_path / "cache"
    hardware.save(hardware.HardwareProfile(**data), folder / "mixdesk" / "hardware.json")
    monkeypatch.setenv("XDG_CACHE_HOME", str(folder))
    return folder


@pytest.fixture(scope="session")
def tiny_sharded(tmp_path_factory):
    """The same kind of model, written as several shards with model.safetensors.index.json."""
    from engine.sources.tiny_model import write_tiny_mixtral

    return write_tiny_mixtral(tmp_path_factory.mktemp("tiny_sharded"), seed=1, shard_size="60KB")


@pytest.fixture(scope="session")
def reference():
    """transformers' own MixtralForCausalLM, loaded fp32, per folder (cached)."""
    from transformers import MixtralForCausalLM

    cache = {}

    def get(folder):
        if folder not in cache:
            cache[folder] = MixtralForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
        return cache[folder]

    return get


# ---- the tests' layers (pyproject's markers), told by tests/layer_marks.py


def pytest_ignore_collect(collection_path, config):
    """A run that can select no engine or window test (`-m unit`) skips importing the modules that make
    models (~15 s of imports)."""
    if not hasattr(config, "_mixdesk_no_model"):
        config._mixdesk_no_model = layer_marks.selects_no_model(config.option.markexpr or "")
    if collection_path.name.startswith("test_") and collection_path.suffix == ".py" \
            and config._mixdesk_no_model and layer_marks.holds_no_unit_test(collection_path):
        return True
    return None


def pytest_collection_finish(session):
    """bitsandbytes' first import logs a failed optional import with the exception as the message's
    argument; pytest's log capture keeps the record, so the traceback kept the frames of whatever
    imported it first (a calibration step, holding the model: a "model freed at shutdown" test then
    fails). Imported here, before any test runs, nothing of the engine's is on the stack; a run of unit
    tests alone (no model) does without its ~4 s import."""
    if any(not item.get_closest_marker("unit") for item in session.items):
        import bitsandbytes.functional  # noqa: F401


def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(item.get_closest_marker(m) for m in layer_marks.LAYERS):
            continue
        layer = layer_marks.layer(item)
        if layer == "unit" and (item.get_closest_marker("slow") or item.get_closest_marker("gpu")):
            continue  # `-m unit` replaces the default `-m`: the long and the GPU tests stay out of it
        item.add_marker(getattr(pytest.mark, layer))
