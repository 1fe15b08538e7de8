"""GGUF files for the tests, written with gguf.GGUFWriter from tiny transformers models, the way
llama.cpp's convert_hf_to_gguf.py writes them (its names, metadata keys, fused experts, llama's
q/k row permutation, GPT-OSS's MXFP4 blocks), so engine/files/gguf reads what users hold.

`hf_to_gguf(folder, out, qtype=...)`: every matrix in qtype (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
Q5_1 through gguf.quants; Q4_K, Q5_K, Q6_K as random blocks with sane scales, since gguf.quants
cannot quantise K-quants), norms and biases in F32. `corrupt` helpers edit a written file's bytes.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as GT, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import quantize

ARCH = {"mixtral": "llama", "qwen3_moe": "qwen3moe", "qwen2_moe": "qwen2moe", "olmoe": "olmoe", "gpt_oss": "gpt-oss"}
K_QUANTS = (GT.Q4_K, GT.Q5_K, GT.Q6_K)
QUANTISABLE = (GT.F32, GT.F16, GT.BF16, GT.Q8_0, GT.Q4_0, GT.Q4_1, GT.Q5_0, GT.Q5_1, GT.MXFP4)  # by gguf.quants


def permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's LlamaModel.permute (convert_hf_to_gguf.py), as its converter applies it to q and k."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def k_quant_rows(rows: int, k: int, qtype: GT, seed: int = 0) -> np.ndarray:
    """Random K-quant blocks whose f16 scales are small finite numbers: [rows, row_bytes] uint8."""
    block, size = GGML_QUANT_SIZES[qtype]
    g = np.random.default_rng(seed)
    raw = g.integers(0, 256, size=(rows, k // block, size), dtype=np.uint8)
    scale = (g.uniform(0.001, 0.01, size=(rows, k // block, 2)).astype(np.float16)).view(np.uint8)
    if qtype == GT.Q6_K:  # ql, qh, scales (int8), then d
        raw[..., size - 2:] = scale[..., :2]
    else:  # d and dmin first
        raw[..., :4] = scale.reshape(rows, k // block, 4)
    return raw.reshape(rows, -1)


def encode(w: torch.Tensor, qtype: GT, seed: int = 0) -> tuple[np.ndarray, GT]:
    """A float tensor [..., K] as the file's bytes in qtype (K-quants: random blocks of that shape)."""
    a = w.detach().float().numpy()
    if qtype == GT.F32:
        return a.astype(np.float32), GT.F32
    if qtype == GT.F16:
        return a.astype(np.float16), GT.F16
    if qtype in K_QUANTS or qtype not in QUANTISABLE:
        rows = int(np.prod(a.shape[:-1]))
        raw = k_quant_rows(rows, a.shape[-1], qtype, seed)
        return raw.reshape(*a.shape[:-1], raw.shape[-1]), qtype
    return quantize(a, qtype), qtype


def release_to_ggml_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> np.ndarray:
    """The release's MXFP4 (blocks [..., G, 16], element 2i low / 2i+1 high; scales [..., G]) as
    ggml block_mxfp4 rows [..., G * 17] (scale byte, then byte j = element j | element j+16 << 4)."""
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).reshape(*blocks.shape[:-1], 32)
    qs = codes[..., :16] | (codes[..., 16:] << 4)
    raw = torch.cat([scales.unsqueeze(-1), qs], dim=-1)
    return raw.reshape(*blocks.shape[:-2], -1).numpy()


def hf_to_gguf(folder: Path, out: Path, qtype: GT = GT.F32, expert_qtype: GT | None = None,
               split_max_tensors: int = 0, tokenizer: bool = True, skip: tuple = (), extra_kv: dict | None = None,
               legacy_experts: bool = False) -> Path:
    """Convert a tiny model folder (engine/sources/tiny_model.py) to GGUF at `out`. `skip`: GGUF
    tensor names left out; `extra_kv`: metadata (key -> value) set or replaced after the usual."""
    from safetensors.torch import load_file

    cfg = json.loads((folder / "config.json").read_text())
    mt = cfg["model_type"]
    arch = ARCH[mt]
    sd = {}
    for f in sorted(folder.glob("*.safetensors")):
        sd.update(load_file(str(f)))
    expert_qtype = expert_qtype or qtype
    w = GGUFWriter(str(out), arch, split_max_tensors=split_max_tensors)
    L, H, KV = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    E = cfg.get("num_local_experts") or cfg.get("num_experts")
    hd = cfg.get("head_dim") or cfg["hidden_size"] // H
    kv = {f"{arch}.block_count": L, f"{arch}.context_length": cfg["max_position_embeddings"],
          f"{arch}.embedding_length": cfg["hidden_size"], f"{arch}.attention.head_count": H,
          f"{arch}.attention.head_count_kv": KV, f"{arch}.attention.layer_norm_rms_epsilon": cfg["rms_norm_eps"],
          f"{arch}.expert_count": E, f"{arch}.expert_used_count": cfg["num_experts_per_tok"],
          f"{arch}.rope.freq_base": float(cfg["rope_parameters"]["rope_theta"]), f"{arch}.rope.dimension_count": hd,
          f"{arch}.attention.key_length": hd, f"{arch}.attention.value_length": hd, "general.file_type": 0,
          "general.name": folder.name}
    ffn = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    if mt == "mixtral":
        kv[f"{arch}.feed_forward_length"] = ffn
    else:
        kv[f"{arch}.expert_feed_forward_length"] = ffn
    if cfg.get("clip_qkv"):
        kv[f"{arch}.attention.clamp_kqv"] = float(cfg["clip_qkv"])
    if mt == "qwen2_moe":
        kv[f"{arch}.expert_shared_feed_forward_length"] = cfg["shared_expert_intermediate_size"]
    if cfg.get("sliding_window") and mt in ("gpt_oss",):
        kv[f"{arch}.attention.sliding_window"] = cfg["sliding_window"]
    if mt == "gpt_oss":
        rp = cfg["rope_parameters"]
        kv.update({f"{arch}.rope.scaling.type": "yarn", f"{arch}.rope.scaling.factor": float(rp["factor"]),
                   f"{arch}.rope.scaling.original_context_length": rp["original_max_position_embeddings"],
                   f"{arch}.rope.scaling.yarn_beta_fast": float(rp["beta_fast"]),
                   f"{arch}.rope.scaling.yarn_beta_slow": float(rp["beta_slow"])})
    if tokenizer:
        kv.update(tokenizer_kv(folder))
    kv.update(extra_kv or {})
    for k, v in kv.items():
        if v is None:
            continue
        if isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        elif isinstance(v, str):
            w.add_string(k, v)
        else:
            w.add_array(k, v)

    seed = [0]

    def add(name: str, t: torch.Tensor, q: GT | None = None):
        if name in skip:
            return
        seed[0] += 1
        if t.dim() == 1 or q is None:
            data, qt = t.detach().float().numpy().astype(np.float32), GT.F32
        else:
            data, qt = encode(t, q, seed[0])
        w.add_tensor(name, data, raw_dtype=qt if qt not in (GT.F32, GT.F16) else None)

    add("token_embd.weight", sd["model.embed_tokens.weight"], qtype)
    add("output_norm.weight", sd["model.norm.weight"])
    if "lm_head.weight" in sd and not cfg.get("tie_word_embeddings"):
        add("output.weight", sd["lm_head.weight"], qtype)
    moe = "block_sparse_moe" if mt == "mixtral" else "mlp"
    for l in range(L):
        p, b = f"model.layers.{l}.", f"blk.{l}."
        add(b + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        post = "post_attention_norm.weight" if mt == "gpt_oss" else "ffn_norm.weight"
        add(b + post, sd[p + "post_attention_layernorm.weight"])
        for hf, g in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")):
            t = sd[p + f"self_attn.{hf}.weight"]
            if arch == "llama" and hf in ("q_proj", "k_proj"):
                t = permute(t, H if hf == "q_proj" else KV)
            add(b + g + ".weight", t, qtype)
            if p + f"self_attn.{hf}.bias" in sd:
                add(b + g + ".bias", sd[p + f"self_attn.{hf}.bias"])
        for hf, g in (("q_norm", "attn_q_norm"), ("k_norm", "attn_k_norm")):
            if p + f"self_attn.{hf}.weight" in sd:
                add(b + g + ".weight", sd[p + f"self_attn.{hf}.weight"])
        if p + "self_attn.sinks" in sd:
            add(b + "attn_sinks.weight", sd[p + "self_attn.sinks"])
        router = p + f"{moe}.{'router' if mt == 'gpt_oss' else 'gate'}."
        add(b + "ffn_gate_inp.weight", sd[router + "weight"], GT.F32)
        if router + "bias" in sd:
            add(b + "ffn_gate_inp.bias", sd[router + "bias"])
        if mt == "qwen2_moe":
            for hf, g in (("gate_proj", "ffn_gate_shexp"), ("up_proj", "ffn_up_shexp"), ("down_proj", "ffn_down_shexp")):
                add(b + g + ".weight", sd[p + f"mlp.shared_expert.{hf}.weight"], qtype)
            add(b + "ffn_gate_inp_shexp.weight", sd[p + "mlp.shared_expert_gate.weight"].reshape(-1))
        if mt == "gpt_oss":
            _gpt_oss_experts(sd, p, b, add, w, expert_qtype, skip)
            continue
        names = {"mixtral": ("w1", "w3", "w2")}.get(mt, ("gate_proj", "up_proj", "down_proj"))
        for hf, g in zip(names, ("ffn_gate", "ffn_up", "ffn_down")):
            ts = [sd[p + f"{moe}.experts.{e}.{hf}.weight"] for e in range(E)]
            if legacy_experts:
                for e, t in enumerate(ts):
                    add(b + f"{g}.{e}.weight", t, expert_qtype)
            else:
                add(b + g + "_exps.weight", torch.stack(ts), expert_qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _gpt_oss_experts(sd, p, b, add, w, qtype: GT, skip) -> None:
    e = p + "mlp.experts."
    bias = sd[e + "gate_up_proj_bias"]
    add(b + "ffn_gate_exps.bias", bias[:, 0::2])
    add(b + "ffn_up_exps.bias", bias[:, 1::2])
    add(b + "ffn_down_exps.bias", sd[e + "down_proj_bias"])
    if e + "gate_up_proj_blocks" in sd:  # MXFP4 release: rows interleaved gate/up
        blocks, scales = sd[e + "gate_up_proj_blocks"], sd[e + "gate_up_proj_scales"]
        for name, sl in (("ffn_gate_exps.weight", slice(0, None, 2)), ("ffn_up_exps.weight", slice(1, None, 2))):
            if b + name not in skip:
                w.add_tensor(b + name, release_to_ggml_mxfp4(blocks[:, sl], scales[:, sl]), raw_dtype=GT.MXFP4)
        if b + "ffn_down_exps.weight" not in skip:
            w.add_tensor(b + "ffn_down_exps.weight", release_to_ggml_mxfp4(sd[e + "down_proj_blocks"],
                                                                          sd[e + "down_proj_scales"]), raw_dtype=GT.MXFP4)
        return
    gate_up = sd[e + "gate_up_proj"].transpose(1, 2)  # [E, 2I, D]
    add(b + "ffn_gate_exps.weight", gate_up[:, 0::2], qtype)
    add(b + "ffn_up_exps.weight", gate_up[:, 1::2], qtype)
    add(b + "ffn_down_exps.weight", sd[e + "down_proj"].transpose(1, 2), qtype)


def tokenizer_kv(folder: Path) -> dict:
    """A byte-level BPE tokenizer's metadata as the converter writes it (tokenizer.ggml.*)."""
    tj = json.loads((folder / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {a["content"]: a["id"] for a in tj.get("added_tokens", [])}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"].get("merges", [])]
    tc = json.loads((folder / "tokenizer_config.json").read_text())
    tmpl = tc.get("chat_template")
    if tmpl is None and (folder / "chat_template.jinja").exists():
        tmpl = (folder / "chat_template.jinja").read_text()
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [3 if t in special else 1 for t in tokens],
            "tokenizer.ggml.merges": merges, "tokenizer.ggml.bos_token_id": special.get("<s>", 1),
            "tokenizer.ggml.eos_token_id": special.get("</s>", 2), "tokenizer.chat_template": tmpl}


def header_only(out: Path, config: dict, vocab_strings: bool = True, qtype: GT = GT.Q4_K) -> Path:
    """A header-only GGUF of a real model's shape (Qwen3-MoE config), its data a sparse hole: the
    file has its full size and costs no disk. Tensors: every one llama.cpp's converter writes."""
    arch, L, D = "qwen3moe", config["num_hidden_layers"], config["hidden_size"]
    E, I, V = config["num_experts"], config["moe_intermediate_size"], config["vocab_size"]
    H, KV, hd = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    w = GGUFWriter(str(out), arch)
    w.add_block_count(L); w.add_context_length(config["max_position_embeddings"]); w.add_embedding_length(D)
    w.add_head_count(H); w.add_head_count_kv(KV); w.add_key_length(hd); w.add_value_length(hd)
    w.add_layer_norm_rms_eps(config["rms_norm_eps"]); w.add_rope_freq_base(config["rope_theta"])
    w.add_expert_count(E); w.add_expert_used_count(config["num_experts_per_tok"])
    w.add_expert_feed_forward_length(I); w.add_file_type(15); w.add_feed_forward_length(config["intermediate_size"])
    if vocab_strings:  # a real vocabulary's size: 151,936 tokens, as many merges
        w.add_tokenizer_model("gpt2")
        w.add_token_list([f"tok{i}" for i in range(V)])
        w.add_token_types([1] * V)
        w.add_token_merges([f"t{i} k{i}" for i in range(V - 549)])
        w.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")

    def info(name, shape, q):  # shape in torch order
        block, size = GGML_QUANT_SIZES[q]
        nbytes = int(np.prod(shape[:-1])) * shape[-1] // block * size
        w.add_tensor_info(name, [*shape[:-1], shape[-1] // block * size], np.uint8, nbytes, raw_dtype=q)

    info("token_embd.weight", (V, D), qtype); info("output_norm.weight", (D,), GT.F32); info("output.weight", (V, D), GT.Q6_K)
    for l in range(L):
        b = f"blk.{l}."
        for n, s in (("attn_norm", (D,)), ("ffn_norm", (D,)), ("attn_q_norm", (hd,)), ("attn_k_norm", (hd,))):
            info(b + n + ".weight", s, GT.F32)
        info(b + "attn_q.weight", (H * hd, D), qtype); info(b + "attn_k.weight", (KV * hd, D), qtype)
        info(b + "attn_v.weight", (KV * hd, D), GT.Q6_K); info(b + "attn_output.weight", (D, H * hd), qtype)
        info(b + "ffn_gate_inp.weight", (E, D), GT.F32)
        info(b + "ffn_gate_exps.weight", (E, I, D), qtype); info(b + "ffn_up_exps.weight", (E, I, D), qtype)
        info(b + "ffn_down_exps.weight", (E, D, I), GT.Q6_K)
    sizes = [ti.nbytes for ts in w.tensors for ti in ts.values()]
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    total = _gguf_end(out, sizes)
    with open(out, "r+b") as f:
        f.truncate(total)
    return out


def _gguf_end(path: Path, nbytes: list[int], align: int = 32) -> int:
    """Where the data of a header-only file ends: the header padded to the alignment, then each
    tensor padded likewise (as GGUFWriter lays them out)."""
    pad = lambda n: n + (-n) % align  # noqa: E731
    return pad(path.stat().st_size) + sum(pad(n) for n in nbytes)


def info_pos(path: Path, name: str) -> int:
    """Byte offset of tensor `name`'s info record (its u64 name length) in a written file."""
    data = path.read_bytes()
    key = len(name).to_bytes(8, "little") + name.encode()
    pos = data.find(key)
    assert pos > 0, name
    return pos


def type_pos(path: Path, name: str) -> int:
    """Byte offset of tensor `name`'s u32 GGML type (then its u64 data offset)."""
    pos = info_pos(path, name) + 8 + len(name)
    n_dims = int.from_bytes(path.read_bytes()[pos:pos + 4], "little")
    return pos + 4 + 8 * n_dims


def kv_pos(path: Path, key: str) -> int:
    """Byte offset of metadata `key`'s value (after its u32 type)."""
    data = path.read_bytes()
    k = len(key).to_bytes(8, "little") + key.encode()
    pos = data.find(k)
    assert pos >= 0, key
    return pos + len(k) + 4


def flip(path: Path, offset: int, data: bytes) -> None:
    """Overwrite bytes of a written file in place (the tests' corruptions)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)
