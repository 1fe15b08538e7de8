"""Issue 14, must show 1: every bad input from the adversarial pass gets exit code 2 and one line
naming the problem: no traceback, nothing written (not in the model folder, not in the user's
data, cache, config or log folders), in bounded time, and the 10^7-layer config in under 2 s and
500 MB.

Most cases run `mixdesk` in this process (engine.tools.cli.main, the same code as the console script);
those that could hang or allocate run it in a child process with a timeout.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from engine.tools.cli import main
from bad_input_helpers import chat, files, home, refused  # noqa: E402,F401 (shared: tests/bad_input_helpers.py)


@pytest.fixture
def model(tiny, tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(tiny, dst)
    return dst


def edit_config(folder: Path, **fields) -> None:
    p = folder / "config.json"
    cfg = json.loads(p.read_text())
    cfg.update(fields)
    p.write_text(json.dumps(cfg))


# ---- config fields, range-checked before anything is allocated ----------------------------------
@pytest.mark.parametrize("field,value,words", [
    ("num_experts_per_tok", 0, ["num_experts_per_tok", "1 to"]),
    ("num_experts_per_tok", -2, ["num_experts_per_tok"]),
    ("num_experts_per_tok", 5, ["num_experts_per_tok", "num_local_experts (4)"]),
    ("num_hidden_layers", 0, ["num_hidden_layers", "accepts 1 to"]),
    ("num_local_experts", 10**7, ["num_local_experts", "10,000,000"]),
    ("max_position_embeddings", -1, ["max_position_embeddings"]),
    ("hidden_size", "64", ["hidden_size", "whole number"]),
    ("rms_norm_eps", -1.0, ["rms_norm_eps"]),
])
def test_config_field_out_of_range(capsys, home, model, field, value, words):
    edit_config(model, **{field: value})
    refused(capsys, home, chat(model), "config.json", *words, folder=model, max_s=10)


def run_child(argv: list[str], env: dict, timeout: float = 60) -> dict:
    """mixdesk argv in a child process; returns its exit code, stderr, the seconds main() took and
    its peak RSS."""
    code = textwrap.dedent(f"""
        import json, sys, time
        from engine.tools.cli import main

        def peak_mb():  # VmHWM: this process's own peak (ru_maxrss would include the forking parent's)
            for line in open("/proc/self/status"):
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        t0 = time.perf_counter()
        try:
            rc = main({argv!r})
        except SystemExit as e:
            rc = e.code
        print(json.dumps({{"rc": rc, "s": time.perf_counter() - t0,
                          "peak_mb": peak_mb()}}))
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                       env=env, cwd=Path(__file__).resolve().parents[1])
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out["stderr"] = p.stderr
    return out


@pytest.mark.parametrize("field", ["num_hidden_layers", "num_local_experts"])
def test_ten_million_layers_or_experts_refused_fast_and_small(home, model, field):
    edit_config(model, **{field: 10**7})
    r = run_child(chat(model), dict(os.environ))
    assert r["rc"] == 2 and "Traceback" not in r["stderr"], r["stderr"]
    assert field in r["stderr"] and "config.json" in r["stderr"]
    assert r["s"] < 2.0, r
    assert r["peak_mb"] < 500, r
    assert files(home) == {}


def test_config_json_that_is_a_fifo_does_not_hang(home, model):
    (model / "config.json").unlink()
    os.mkfifo(model / "config.json")
    r = run_child(chat(model), dict(os.environ), timeout=60)
    assert r["rc"] == 2 and "not a regular file" in r["stderr"] and "config.json" in r["stderr"], r["stderr"]


# ---- weights --------------------------------------------------------------------------------------
def rewrite_weights(folder: Path, fn) -> None:
    from safetensors.torch import load_file, save_file

    p = folder / "model.safetensors"
    t = load_file(p)
    fn(t)
    save_file(t, p, metadata={"format": "pt"})


@pytest.mark.parametrize("where,value", [
    ("model.layers.0.self_attn.q_proj.weight", float("nan")),
    ("model.layers.1.block_sparse_moe.experts.2.w2.weight", float("inf")),
])
def test_nan_or_inf_weights_named(capsys, home, model, where, value):
    rewrite_weights(model, lambda t: t[where].view(-1).__setitem__(3, value))
    line = refused(capsys, home, chat(model), "model.safetensors", "NaN or Inf", folder=model)
    assert "layers.0" in line or "layer 1" in line


def test_inf_weights_with_fp16_say_nan_or_inf_not_range(capsys, home, model):
    rewrite_weights(model, lambda t: t["model.layers.0.self_attn.o_proj.weight"].view(-1).__setitem__(0, float("inf")))
    line = refused(capsys, home, chat(model, "--dtype", "fp16"), "NaN or Inf", folder=model)
    assert "range" not in line


def test_weights_that_overflow_at_run_time_are_caught_in_the_output(capsys, home, model):
    import torch

    def huge(t):
        t["model.norm.weight"] = torch.full_like(t["model.norm.weight"], 3e38)
    rewrite_weights(model, huge)
    refused(capsys, home, chat(model, "--dtype", "fp32"), "NaN/Inf", "likely cause", folder=model)


def header_file(path: Path, header: dict, data: bytes = b"\0" * 64) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


@pytest.mark.parametrize("entry,words", [
    ({"dtype": ["F32"], "shape": [4], "data_offsets": [0, 16]}, ["dtype", "not a type name"]),
    ({"dtype": "F32", "shape": [4], "data_offsets": ["0", "16"]}, ["data_offsets"]),
    ({"dtype": "F32", "shape": [4], "data_offsets": [0.0, 16.0]}, ["data_offsets"]),
    ({"dtype": "F32", "shape": "4", "data_offsets": [0, 16]}, ["shape"]),
])
def test_safetensors_header_types(capsys, home, model, entry, words):
    (model / "model.safetensors").unlink()
    header_file(model / "model.safetensors", {"x": entry})
    refused(capsys, home, chat(model), "model.safetensors", *words, folder=model)


def test_safetensors_overlapping_tensors(capsys, home, model):
    (model / "model.safetensors").unlink()
    header_file(model / "model.safetensors", {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                                              "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})
    refused(capsys, home, chat(model), "model.safetensors", "overlap", folder=model)


def sharded(folder: Path, tiny_sharded: Path) -> None:
    for p in folder.glob("*.safetensors"):
        p.unlink()
    for p in tiny_sharded.iterdir():
        if "safetensors" in p.name:
            shutil.copy(p, folder / p.name)


def test_index_value_that_is_an_integer(capsys, home, model, tiny_sharded):
    sharded(model, tiny_sharded)
    idx = model / "model.safetensors.index.json"
    data = json.loads(idx.read_text())
    first = next(iter(data["weight_map"]))
    data["weight_map"][first] = 7
    idx.write_text(json.dumps(data))
    refused(capsys, home, chat(model), "model.safetensors.index.json", first, "not to a file name", folder=model)


def test_index_entry_outside_the_folder(capsys, home, model, tiny_sharded, tmp_path):
    sharded(model, tiny_sharded)
    idx = model / "model.safetensors.index.json"
    data = json.loads(idx.read_text())
    shard = sorted(set(data["weight_map"].values()))[0]
    shutil.copy(model / shard, tmp_path / "elsewhere.safetensors")
    data["weight_map"] = {k: ("../elsewhere.safetensors" if v == shard else v) for k, v in data["weight_map"].items()}
    idx.write_text(json.dumps(data))
    refused(capsys, home, chat(model), "elsewhere.safetensors", "outside the model folder", folder=model)


def test_symlink_to_a_shard_outside_the_folder(capsys, home, model, tmp_path):
    (model / "model.safetensors").rename(tmp_path / "outside.safetensors")
    (model / "model.safetensors").symlink_to(tmp_path / "outside.safetensors")
    refused(capsys, home, chat(model), "model.safetensors", "outside the model folder", folder=model)


# ---- chat templates ---------------------------------------------------------------------------------
def set_template(folder: Path, template: str) -> None:
    p = folder / "tokenizer_config.json"
    cfg = json.loads(p.read_text())
    cfg["chat_template"] = template
    p.write_text(json.dumps(cfg))
    j = folder / "chat_template.jinja"
    if j.exists():
        j.write_text(template)


@pytest.mark.parametrize("template,words", [
    ("{{ raise_exception('this template refuses everything') }}", ["refuses everything"]),
    ("{% for m in messages %}{{ m.content }", ["does not parse"]),
    ("{% if false %}x{% endif %}", ["empty prompt"]),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}",
     # 900,000 items run before the item limit refuses the tenth inner range; on a loaded machine the
     # 2 s time limit can come first: either is the bounded, named refusal this checks
     [("loops over more", "ran for more than")]),
    ("{% for m in messages %}{{ m.content * 100000000 }}{% endfor %}", ["more than"]),
])
def test_chat_templates_that_fail(capsys, home, model, template, words):
    set_template(model, template)
    refused(capsys, home, chat(model), "chat template", *words, max_s=20)


# ---- options --------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv,words", [
    (["chat", "--device", "cuda"], ["--device cuda", "no CUDA GPU"]),
    (["chat", "--placement", "random:abc"], ["--placement", "random:abc"]),
    (["chat", "--temperature", "nan"], ["--temperature"]),
    (["chat", "--top-p", "0"], ["--top-p"]),
    (["chat", "--top-p", "-0.5"], ["--top-p"]),
    (["chat", "--ctx", "-5"], ["--ctx"]),
    (["bench", "--prompt-tokens", "0"], ["--prompt-tokens"]),
    (["bench", "--repeats", "0"], ["--repeats"]),
    (["bench", "--new-tokens", "0"], ["--new-tokens"]),
    (["serve", "--port", "70000"], ["--port"]),
    (["server"], ["invalid choice", "server"]),
    (["runtime", "upgrade"], ["invalid choice", "upgrade"]),
    (["runtime", "install", "--index-url", "ftp://example/simple"], ["--index-url", "http(s)://"]),
    (["chat", "--model", "a..b/c"], ["a..b/c", "repo id"]),
])
def test_bad_options(capsys, home, model, argv, words):
    if "--device" in argv and __import__("torch").cuda.is_available():
        pytest.skip("this machine has a GPU")
    if "--model" not in argv and argv[0] in ("chat", "bench"):
        argv = argv + ["--model", str(model)]
    refused(capsys, home, argv, *words, folder=model)


def test_cached_hardware_profile_holding_null_is_measured_anew(capsys, home, model):
    cache = home / "xdg_cache_home" / "mixdesk"
    cache.mkdir(parents=True)
    (cache / "hardware.json").write_text("null")
    assert main(chat(model, "--placement", "auto", "--dtype", "fp32")) == 0
    assert json.loads((cache / "hardware.json").read_text())["tier_costs"]
