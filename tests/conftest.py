import os
import time

import pytest
import torch

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if "XDG_STATE_HOME" not in os.environ:  # the engine's error log (engine/errorlog.py) stays out of $HOME
    import tempfile

    os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="mixdesk-test-state-")
if "XDG_CONFIG_HOME" not in os.environ:  # the window's settings (theme) stay out of $HOME
    import tempfile

    os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="mixdesk-test-config-")
torch.set_num_threads(min(2, os.cpu_count() or 1))
# bitsandbytes' first import logs a failed optional import with the exception as the message's
# argument; pytest's log capture keeps the record, so the traceback kept the frames of whatever
# imported it first (a calibration step, holding the model: a "model freed at shutdown" test then
# fails). Imported here, nothing of the engine's is on the stack.
import bitsandbytes.functional  # noqa: E402,F401


def _pace(generator, per_token_s: float = 0.005) -> None:
    """Holds each of the generator's decode steps to at least per_token_s. Tests that act while a
    reply streams (stop it, move the slider, watch the window) need it to last: with the native
    kernels the tiny model decodes ~6,000 tok/s and a reply can end before the test can act."""
    inner = generator.retrying  # every forward pass, alone or batched, goes through it

    def paced(step):
        time.sleep(per_token_s)
        return inner(step)

    generator.retrying = paced


@pytest.fixture(autouse=True)
def _fresh_window_state():
    """Each test's window starts as on a first start: no remembered slider, geometry or chat
    (app/window_state.py); the settings folder is shared by the whole run."""
    yield
    import sys

    from app import window_state

    window_state.forget()
    if "app.gui_gc" in sys.modules:  # a window left open keeps Python's collector off: hand it back
        sys.modules["app.gui_gc"].reset()


@pytest.fixture
def pace():
    return _pace


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """A tiny random Mixtral (fp32, one safetensors file) with a byte-level tokenizer."""
    from engine.sources.tiny_model import write_tiny_mixtral

    return write_tiny_mixtral(tmp_path_factory.mktemp("tiny"))


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
