"""engine/files/gguf: GGUF files written here from tiny transformers models (tests/gguf_files.py, in
llama.cpp's layout) open with the same Dims as the model's safetensors, read back exactly (F32:
the source weights; quantised: gguf.quants.dequantize of the rows gguf's own reader finds), slice
experts alone, join split sets, convert MXFP4 losslessly, write nothing, and open a Qwen3-30B-A3B
header in under 200 ms."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as GT, GGUFReader
from gguf.quants import dequantize

import gguf_files
from engine.files.checkpoint import Checkpoint
from engine.files import fused_experts as fused
from engine.files.gguf import is_gguf, open_gguf
from engine.files.gguf.header import Header
from engine.files.gguf.names import gguf_name
from engine.sources.tiny_model import write_tiny_model

FAMILIES = ["mixtral", "qwen3_moe", "olmoe", "qwen2_moe", "gpt_oss"]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    cache = {}

    def get(family: str) -> Path:
        if family not in cache:
            if family == "wide":  # rows of 256: whole K-quant blocks
                cache[family] = write_tiny_model(tmp_path_factory.mktemp(family), "mixtral", hidden=256, ffn=256)
            else:
                cache[family] = write_tiny_model(tmp_path_factory.mktemp(family), family, mxfp4=family == "gpt_oss")
        return cache[family]
    return get


def listing(folder: Path) -> dict:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()}


@pytest.mark.parametrize("family", FAMILIES)
def test_f32_file_reads_back_the_source_exactly(sources, tmp_path, family):
    src = sources(family)
    path = gguf_files.hf_to_gguf(src, tmp_path / f"{family}.gguf")
    before = listing(tmp_path)
    ref, g = Checkpoint(src), open_gguf(path)
    assert g.dims == ref.dims
    assert g.mxfp4 == ref.mxfp4 and g.expected.keys() == ref.expected.keys()
    for name in ref.expected:  # q/k un-permuted for llama; GPT-OSS's MXFP4 in the release's layout
        a, b = ref.read(name), g.read(name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
        assert tuple(g.info(name).shape) == tuple(ref.info(name).shape) and g.info(name).dtype == ref.info(name).dtype
    for layer, expert in ((0, 0), (ref.dims.layers - 1, ref.dims.experts - 1)):
        if ref.family.fused_experts:
            w13, w2 = fused.read_weights(ref, layer, expert)
            assert [torch.equal(x, y) for x, y in zip(fused.read_weights(g, layer, expert), (w13, w2))] == [True] * 2
            assert all(torch.equal(x, y) for x, y in zip(fused.read_biases(g, layer, expert),
                                                          fused.read_biases(ref, layer, expert)))
        else:
            w13 = torch.cat([ref.read(ref.expert_key(layer, expert, w)) for w in ("w1", "w3")])
            w2 = ref.read(ref.expert_key(layer, expert, "w2"))
        f13, f2 = g.expert_float(layer, expert)
        assert torch.equal(f13, w13.float()) and torch.equal(f2, w2.float())
    assert g.config.rope_parameters == ref.config.rope_parameters
    assert g.eos_token_ids(type("T", (), {"eos_token_id": None})()) == {2}
    g.close()
    ref.close()
    assert listing(tmp_path) == before, "something was written next to the file"


def test_mxfp4_experts_convert_losslessly(sources, tmp_path):
    src = sources("gpt_oss")
    g, ref = open_gguf(gguf_files.hf_to_gguf(src, tmp_path / "oss.gguf")), Checkpoint(src)
    assert g.expert_formats() == {GT.MXFP4} and g.dtype == torch.bfloat16
    rd = GGUFReader(g.path)
    gate = next(t for t in rd.tensors if t.name == "blk.1.ffn_gate_exps.weight")
    for e in range(g.dims.experts):
        (b13, s13), (b2, s2) = g.expert_mxfp4(1, e)
        (r13, q13), (r2, q2) = fused.read_mxfp4(ref, 1, e)
        assert torch.equal(b13, r13) and torch.equal(s13, q13) and torch.equal(b2, r2) and torch.equal(s2, q2)
        # the release's values are gguf's own dequantisation of the file's blocks
        ggml = dequantize(np.asarray(gate.data[e]), GT.MXFP4)
        assert torch.equal(fused.mxfp4_to_float(b13[: g.dims.ffn], s13[: g.dims.ffn], torch.float32),
                           torch.from_numpy(ggml))
    g.close()
    ref.close()


def reader_rows(path: Path, name: str) -> np.ndarray:
    """A tensor's rows as gguf's own (memory-mapped) reader finds them: bytes [rows, row_bytes]."""
    t = next(t for t in GGUFReader(path).tensors if t.name == name)
    data = np.asarray(t.data)
    return data.view(np.uint8).reshape(int(np.prod(data.shape[:-1])), -1).copy()


def values(raw: np.ndarray, qtype: GT) -> torch.Tensor:
    return torch.from_numpy(raw.view(np.float16).copy() if qtype == GT.F16 else dequantize(raw, qtype)).float()


@pytest.mark.parametrize("qtype", [GT.Q8_0, GT.Q4_0, GT.Q5_1, GT.Q4_K, GT.Q6_K, GT.F16])
def test_quantised_reads_are_gguf_dequantize(sources, tmp_path, qtype):
    src = sources("wide")
    path = gguf_files.hf_to_gguf(src, tmp_path / "m.gguf", qtype=qtype)
    g = open_gguf(path)
    d = g.dims
    v = g.read("model.layers.1.self_attn.v_proj.weight")  # not permuted: the file's rows as they are
    assert torch.equal(v.float(), values(reader_rows(path, "blk.1.attn_v.weight"), qtype).reshape(v.shape))
    assert g.tensor_type("model.layers.1.self_attn.q_proj.weight") == qtype
    q_raw = g.read_raw("model.layers.1.self_attn.q_proj.weight")
    perm = reader_rows(path, "blk.1.attn_q.weight")
    assert torch.equal(torch.from_numpy(gguf_files.permute(torch.from_numpy(q_raw.numpy()), d.heads).numpy()),
                       torch.from_numpy(perm.copy()))  # permuting our rows again gives the file's
    qt, rows = g.expert_raw(1, 2, "w2")
    fused_rows = reader_rows(path, "blk.1.ffn_down_exps.weight").reshape(d.experts, d.hidden, -1)
    assert qt == qtype and np.array_equal(rows.numpy(), fused_rows[2])
    w13, w2 = g.expert_float(1, 2)
    assert w13.shape == (2 * d.ffn, d.hidden) and w2.shape == (d.hidden, d.ffn) and w13.dtype == torch.float32
    assert torch.equal(w2, values(rows.numpy(), qtype).reshape(w2.shape))
    assert g.dtype == (torch.float16 if qtype == GT.F16 else torch.float32)
    assert g.expert_formats() == {qtype}
    bits = {GT.Q8_0: 8.5, GT.Q4_0: 4.5, GT.Q5_1: 6.0, GT.Q4_K: 4.5, GT.Q6_K: 6.6, GT.F16: 16.0}[qtype]
    assert g.format_label() == f"F32 GGUF, experts at {bits:.1f} bits"
    assert g.expert_nbytes() == 3 * rows.numel()
    g.close()


def test_header_agrees_with_gguf_reader(sources, tmp_path):
    path = gguf_files.hf_to_gguf(sources("qwen2_moe"), tmp_path / "q.gguf", qtype=GT.Q8_0)
    h, r = Header(path), GGUFReader(path)
    assert set(h.metadata) == {k for k in r.fields if not k.startswith("GGUF.")}
    for k, f in r.fields.items():
        if not k.startswith("GGUF."):
            want = f.contents()
            got = h.get(k)
            assert got == want or (isinstance(want, float) and np.float32(got) == np.float32(want)), k
    assert {t.name: (t.tensor_type, tuple(int(x) for x in t.shape), t.data_offset, t.n_bytes) for t in r.tensors} == \
        {n: (t.qtype, t.ne, t.start, t.nbytes) for n, t in h.tensors.items()}


def test_names_agree_with_gguf_tensor_map(sources, tmp_path):
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    for family in ("mixtral", "qwen2_moe", "gpt_oss", "olmoe"):
        g = open_gguf(gguf_files.hf_to_gguf(sources(family), tmp_path / f"{family}.gguf"))
        arch = next(a for a, n in MODEL_ARCH_NAMES.items() if n == g.arch)
        tmap = get_tensor_name_map(arch, g.dims.layers)
        for hf in g._dense:
            base, suffix = hf.rsplit(".", 1)
            want = tmap.get_name(base if suffix in ("weight", "bias") else hf)
            if want is None:  # names gguf maps only with their suffix (sinks)
                continue
            got = gguf_name(hf, g.arch)
            assert got.rsplit(".", 1)[0] == want, (hf, got, want)
        g.close()


def test_legacy_per_expert_tensors(sources, tmp_path):
    src = sources("mixtral")
    g, ref = open_gguf(gguf_files.hf_to_gguf(src, tmp_path / "old.gguf", legacy_experts=True)), Checkpoint(src)
    key = ref.expert_key(1, 3, "w3")
    assert torch.equal(g.read(key), ref.read(key))
    assert torch.equal(g.expert_float(1, 3)[1], ref.read(ref.expert_key(1, 3, "w2")))
    g.close()


def test_split_set_opens_from_first_part_or_folder(sources, tmp_path):
    src = sources("qwen3_moe")
    out = tmp_path / "split" / "model.gguf"
    out.parent.mkdir()
    gguf_files.hf_to_gguf(src, out, split_max_tensors=12)
    parts = sorted(out.parent.glob("*.gguf"))
    assert len(parts) > 2 and parts[0].name == f"model-00001-of-{len(parts):05d}.gguf"
    ref = Checkpoint(src)
    for given in (parts[0], out.parent, parts[1]):
        g = open_gguf(given)
        assert g.path == parts[0] and g.dims == ref.dims and is_gguf(given)
        assert len({g.where[n].path for n in g.expected}) == len(parts)
        for name in ("model.embed_tokens.weight", "model.layers.1.mlp.experts.3.down_proj.weight", "lm_head.weight"):
            assert torch.equal(g.read(name), ref.read(name))
        g.close()


def test_qwen3_30b_header_opens_in_under_200ms(tmp_path):
    cfg = json.loads((Path("/work/shared/configs/qwen3-30b-a3b-config.json") if Path(
        "/work/shared/configs/qwen3-30b-a3b-config.json").exists() else ROOT / "resources" / "qwen3-30b-a3b-config.json"
    ).read_text())
    path = gguf_files.header_only(tmp_path / "Qwen3-30B-A3B-Q4_K_M.gguf", cfg)
    st = path.stat()
    assert st.st_size > 15e9 and st.st_blocks * 512 < 64e6  # full size, sparse on disk
    open_gguf(path).close()  # warm: transformers' config class imported
    times = []
    for _ in range(5):  # best of 5: two cores shared with other work
        t0 = time.perf_counter()
        g = open_gguf(path)
        times.append(time.perf_counter() - t0)
        g.close()
    d = g.dims
    assert (d.layers, d.experts, d.hidden, d.ffn, d.vocab, d.top_k, d.head_dim) == (48, 128, 2048, 768, 151936, 8, 128)
    assert g.format_label() == "Q4_K_M GGUF, experts at 5.2 bits"  # gate, up Q4_K (4.5), down Q6_K (6.56)
    print(f"GGUFCheckpoint open of a Qwen3-30B-A3B header ({st.st_size / 1e9:.1f} GB sparse): "
          f"{min(times) * 1e3:.0f} ms (best of 5)")
    # (gguf.GGUFReader took 22.9 s on the same file on 2026-12-01: why engine/files/gguf parses headers itself)
    assert min(times) < 0.2, times


def test_reads_do_not_map_the_file(sources, tmp_path):
    """Positional reads: after reading every expert, no mapping of the file stays in the process."""
    path = gguf_files.hf_to_gguf(sources("qwen3_moe"), tmp_path / "r.gguf", qtype=GT.Q8_0)
    g = open_gguf(path)
    for l in range(g.dims.layers):
        for e in range(g.dims.experts):
            g.expert_float(l, e)
    maps = Path(f"/proc/{os.getpid()}/maps").read_text()
    assert str(path) not in maps
    g.close()


def test_tokenizer_from_the_file(sources, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    src = sources("qwen3_moe")
    g = open_gguf(gguf_files.hf_to_gguf(src, tmp_path / "t.gguf"))
    tok, ref = g.load_tokenizer(), AutoTokenizer.from_pretrained(str(src))
    text = "The capital of France is Paris. Café 東京 🙂"
    assert tok.encode(text, add_special_tokens=False) == ref.encode(text, add_special_tokens=False)
    assert tok.chat_template == ref.chat_template and g.eos_token_ids(tok) == {2}
    g.close()
