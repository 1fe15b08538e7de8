"""Shared by several test modules (moved out of tests/test_gguf_hybrid_llama_cpp.py, which uses them too): CONVERT, converter."""
from __future__ import annotations
import os
import tarfile
from pathlib import Path
import pytest


CONVERT = """
import runpy, sys
llama = sys.argv[1]
sys.path[:0] = [llama, llama + "/gguf-py"]
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "default"  # a tiny vocabulary's hash it cannot know
sys.argv = [llama + "/convert_hf_to_gguf.py"] + sys.argv[2:]
runpy.run_path(llama + "/convert_hf_to_gguf.py", run_name="__main__")
"""


@pytest.fixture(scope="module")
def converter(tmp_path_factory) -> Path:
    """llama.cpp's convert_hf_to_gguf.py, conversion/ and gguf-py/, from the llama-cpp-python 0.3.36 sdist
    (ggml-org/llama.cpp@0c1e57098) where it is here: $LLAMA_CPP_SDIST or test_gguf_write's SDIST."""
    from gguf_sdist import SDIST, SDIST_ROOT

    sdist = Path(os.environ.get("LLAMA_CPP_SDIST") or SDIST)
    if not sdist.is_file():
        pytest.skip(f"{sdist} is not here (set LLAMA_CPP_SDIST to llama-cpp-python's sdist)")
    root = tmp_path_factory.mktemp("llamacpp")
    with tarfile.open(sdist) as tar:
        tar.extractall(root, members=[m for m in tar.getmembers() if m.name.startswith(
            tuple(SDIST_ROOT + p for p in ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")))], filter="data")
    return root / SDIST_ROOT

