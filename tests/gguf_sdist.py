"""Shared by several test modules (moved out of tests/test_gguf_write.py, which uses them too): SDIST, SDIST_ROOT."""
from __future__ import annotations
from pathlib import Path


SDIST = Path("/work/peer/llama_cpp_python-0.3.36.tar.gz")


SDIST_ROOT = "llama_cpp_python-0.3.36/vendor/llama.cpp/"

