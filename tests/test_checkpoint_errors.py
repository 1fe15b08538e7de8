"""Bad input: one clear error naming the file and the problem; nothing written into the folder."""
import json
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.files.checkpoint import Checkpoint
from engine.protocol.errors import ModelError


@pytest.fixture
def copy(tiny, tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(tiny, dst)
    return dst


def snapshot(folder):
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()}


def expect(folder, file_name, words):
    before = snapshot(folder)
    with pytest.raises(ModelError) as ei:
        ck = Checkpoint(folder)
        ck.load_tokenizer()
    err = ei.value
    assert file_name in err.path, err
    for w in words:
        assert w in str(err).lower(), err
    assert snapshot(folder) == before  # nothing written into the model folder
    return err


def test_missing_config(copy):
    (copy / "config.json").unlink()
    expect(copy, "config.json", ["missing"])


def test_not_mixtral(copy):
    cfg = json.loads((copy / "config.json").read_text())
    cfg["model_type"] = "bert"
    (copy / "config.json").write_text(json.dumps(cfg))
    expect(copy, "config.json", ["bert", "mixtral"])


def test_truncated_safetensors(copy):
    f = copy / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    expect(copy, "model.safetensors", ["truncated"])


def test_garbage_safetensors(copy):
    (copy / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!" + b"\0" * 64)
    expect(copy, "model.safetensors", ["corrupt"])


def test_missing_tensor(copy):
    f = copy / "model.safetensors"
    sd = load_file(f)
    del sd["model.layers.1.block_sparse_moe.experts.2.w3.weight"]
    save_file(sd, f, metadata={"format": "pt"})
    err = expect(copy, "model.safetensors", ["missing tensor", "experts.2.w3"])
    assert "layers.1" in str(err)


def test_shape_mismatch(copy):
    f = copy / "model.safetensors"
    sd = load_file(f)
    sd["model.layers.0.block_sparse_moe.experts.0.w1.weight"] = torch.zeros(7, 64)
    save_file(sd, f, metadata={"format": "pt"})
    expect(copy, "model.safetensors", ["shape [7, 64]", "config.json implies [128, 64]"])


def test_no_chat_template(copy):
    cfg = json.loads((copy / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (copy / "tokenizer_config.json").write_text(json.dumps(cfg))
    for extra in copy.glob("chat_template.*"):
        extra.unlink()
    expect(copy, "tokenizer_config.json", ["no chat template"])


def test_pickle_checkpoint_refused(copy):
    import pickle

    (copy / "model.safetensors").unlink()
    # a pickle that would run code if it were ever unpickled
    (copy / "pytorch_model.bin").write_bytes(pickle.dumps({"x": 1}))
    err = expect(copy, "pytorch_model.bin", ["pickle", "safetensors"])
    assert "arbitrary code" in str(err)


def test_pickle_file_given_directly(copy):
    (copy / "model.pt").write_bytes(b"\x80\x04K\x01.")
    with pytest.raises(ModelError, match="pickle"):
        Checkpoint(copy / "model.pt")


def test_missing_shard(tiny_sharded, tmp_path):
    dst = tmp_path / "m"
    shutil.copytree(tiny_sharded, dst)
    shard = sorted(dst.glob("model-0000*.safetensors"))[-1]
    shard.unlink()
    expect(dst, shard.name, ["missing", "index"])


@pytest.mark.parametrize("method,fmt", [("gptq", "GPTQ"), ("awq", "AWQ"), ("bitsandbytes", "bitsandbytes"),
                                        ("hqq", "HQQ")])
def test_prequantised_checkpoint_refused(copy, method, fmt):
    cfg = json.loads((copy / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": method, "bits": 4}
    (copy / "config.json").write_text(json.dumps(cfg))
    err = expect(copy, "config.json", ["quantised"])
    assert fmt in str(err)


def test_cli_prints_one_line_no_traceback(copy):
    (copy / "config.json").unlink()
    r = subprocess.run([sys.executable, "-m", "engine.tools.cli", "chat", "--model", str(copy), "--prompt", "hi"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and "config.json" in lines[0] and "missing" in lines[0], r.stderr
