"""Every checkpoint the engine opens offers one interface (engine/files/model_checkpoint.py): a safetensors
folder, a GGUF file and a synthetic checkpoint each hold every member, and `is_gguf` says which kind it is."""
import pytest


def _members():
    from engine.files.model_checkpoint import ModelCheckpoint

    return [n for n in vars(ModelCheckpoint) if not n.startswith("_")] + list(ModelCheckpoint.__annotations__)


def test_each_format_is_a_model_checkpoint(tiny, tmp_path):
    from engine.files.gguf.writer import write_gguf
    from engine.files.model_checkpoint import ModelCheckpoint
    from engine.runtime.load import open_checkpoint
    from engine.sources.synthetic import write_synthetic

    gguf = write_gguf(tiny, tmp_path / "tiny-f16.gguf", "f16")[0]
    synthetic = write_synthetic(tmp_path / "synthetic", tiny / "config.json")
    kinds = {}
    for path in (tiny, gguf, synthetic):
        ckpt = open_checkpoint(path)
        try:
            missing = [n for n in _members() if not hasattr(ckpt, n)]
            assert not missing and isinstance(ckpt, ModelCheckpoint), (type(ckpt).__name__, missing)
            kinds[type(ckpt).__name__] = ckpt.is_gguf
            name = next(iter(ckpt.expected))
            assert tuple(ckpt.read(name).shape) == tuple(ckpt.expected[name])
        finally:
            ckpt.close()
    assert kinds == {"Checkpoint": False, "GGUFCheckpoint": True, "SyntheticCheckpoint": False}


def test_no_caller_probes_a_checkpoint_for_its_format():
    """`is_gguf` is declared by every checkpoint: read as a field, never probed with getattr or hasattr."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    probes = [f"{f.relative_to(root)}:{i}" for top in ("engine", "app") for f in (root / top).rglob("*.py")
              for i, line in enumerate(f.read_text().splitlines(), 1)
              if re.search(r"(getattr|hasattr)\([^)]*[\"']is_gguf[\"']", line)]
    assert not probes, probes
