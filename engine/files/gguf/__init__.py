"""GGUF checkpoints (llama.cpp's format, as users hold their models: Q4_K_M above all), read in
place: engine/files/gguf/header.py parses a file's header with every length bounded, reader.py finds the
files (one, a folder, a split set) and reads tensors with positional reads, names.py and config.py
map GGUF's names and metadata to the Hugging Face ones the engine uses (qwen35.py, glm.py and
glm_lite.py an architecture's own metadata, fixes and converter steps), checkpoint.py is the
engine's checkpoint over the file, mxfp4.py GPT-OSS's blocks in the release's layout, tokenizer.py
the tokenizer from the metadata, tiers.py what each tier keeps of a GGUF expert, writer.py files
for tests and benchmarks."""
from __future__ import annotations

from pathlib import Path

from .reader import is_gguf


def open_gguf(path: str | Path):
    """A GGUF model opened and validated (no tensor data read): a GGUFCheckpoint."""
    from .checkpoint import GGUFCheckpoint

    return GGUFCheckpoint(path)


__all__ = ["is_gguf", "open_gguf"]
