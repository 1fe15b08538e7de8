"""Full-size GGUF files of real models' shapes, random blocks, for the real-scale benchmarks.

    python benchmarks/real_scale_files.py [qwen3|mixtral|qwen3-tiny|all] [--plan] [--smoke]

`--smoke`: describes and writes only the toy-sized SMOKE file (~10 MB), into a temporary folder (then removed).

- `qwen3-30b-a3b-q4_k_m.gguf` (~18.6 GB): Qwen3-30B-A3B's shape (resources/qwen3-30b-a3b-config.json),
  arch `qwen3moe`: 48 layers, hidden 2048, 128 experts of width 768, top-8, 32/4 heads of 128,
  vocab 151,936.
- `mixtral-8x7b-q4_k_m.gguf` (~26.4 GB, more than this machine's RAM): Mixtral-8x7B's shape
  (resources/mixtral-8x7b-config.json), arch `llama` with experts (blk.N.ffn_*_exps).
- `qwen3-30b-a3b-tiny-q4_k_m.gguf` (`--tiny` of benchmarks/real_scale.py): the Qwen3 shape with 4
  layers of 16 experts and the full vocabulary (~0.6 GB), to rehearse the harness quickly.

Tensor names, shapes and order as llama.cpp's converter writes them; each tensor's type is what
llama-quantize's Q4_K_M mix gives it (engine/files/gguf/writer.py `_llama_quantize_types`, the one copy
of llama-quant.cpp's rules in the project: Q4_K by default; Q6_K for attn_v and ffn_down(_exps) on
the use_more_bits layers and for output; for 8-expert models attn_v/attn_k Q8_0 and attn_output
Q5_K), norms and the router F32. Blocks are random bytes with small fp16 scales (Q4_K d/dmin
~3e-5, Q6_K d ~5e-6; Q8_0/Q5_K alike) so activations stay finite through every layer; the router
is random normal, so tokens spread over the experts as a trained router's do. The tokenizer is a
synthetic byte-level BPE of the real vocabulary size (byte tokens, a few hundred merges, filler
tokens, the family's special tokens at their real ids) with the family's chat template.

Written once under .bench/ (benchmarks/common.py CACHE), tensor by tensor and chunk by chunk in
constant memory (well under 1 GB RSS), into NAME.part, renamed when complete. Deterministic (each
chunk seeded by its tensor and chunk index), so an interrupted write resumes where it stopped: the
header is compared, the bytes already in the .part are kept. A file whose size is the planned one
is not written again.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gguf  # noqa: E402
from gguf import GGMLQuantizationType as GT, LlamaFileType as FT  # noqa: E402
from gguf.constants import GGML_QUANT_SIZES  # noqa: E402

from benchmarks.common import CACHE  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ALIGN = 32  # GGUF's default data alignment (GGUFWriter's)
CHUNK = 64 << 20  # bytes generated and written at once
SEED = 20261202

MISTRAL_TEMPLATE = (  # Mixtral-8x7B-Instruct-v0.1's published chat template
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")

# Qwen2/Qwen3's added tokens from id 151643 on (tokenizer.json's added_tokens), the rest up to the
# embedding's 151,936 rows are the converter's [PADi] (UNUSED)
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
                "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
                "<tool_response>", "</tool_response>", "<think>", "</think>"]
QWEN_REGULAR = 151643  # Qwen's BPE vocabulary before the added tokens


@dataclass(frozen=True)
class Shape:
    """One model's shape, as its GGUF metadata says it."""
    name: str          # the file's stem
    arch: str          # gguf's architecture name
    layers: int
    hidden: int
    experts: int
    expert_ffn: int
    top_k: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    ctx: int
    rope_theta: float
    rms_eps: float
    dense_ffn: int     # {arch}.feed_forward_length
    family: str        # "qwen3" | "mixtral": tokenizer, template, q/k norms

    @property
    def path(self) -> Path:
        return CACHE / f"{self.name}.gguf"


def _qwen3() -> Shape:
    c = json.loads((ROOT / "resources" / "qwen3-30b-a3b-config.json").read_text())
    return Shape("qwen3-30b-a3b-q4_k_m", "qwen3moe", c["num_hidden_layers"], c["hidden_size"], c["num_experts"],
                 c["moe_intermediate_size"], c["num_experts_per_tok"], c["num_attention_heads"],
                 c["num_key_value_heads"], c["head_dim"], c["vocab_size"], c["max_position_embeddings"],
                 float(c["rope_theta"]), float(c["rms_norm_eps"]), c["intermediate_size"], "qwen3")


def _mixtral() -> Shape:
    c = json.loads((ROOT / "resources" / "mixtral-8x7b-config.json").read_text())
    return Shape("mixtral-8x7b-q4_k_m", "llama", c["num_hidden_layers"], c["hidden_size"], c["num_local_experts"],
                 c["intermediate_size"], c["num_experts_per_tok"], c["num_attention_heads"], c["num_key_value_heads"],
                 c["hidden_size"] // c["num_attention_heads"], c["vocab_size"], c["max_position_embeddings"],
                 float(c["rope_theta"]), float(c["rms_norm_eps"]), c["intermediate_size"], "mixtral")


QWEN3 = _qwen3()
MIXTRAL = _mixtral()
# 4 layers of 16 experts (top-8), the full vocabulary and widths: ~0.6 GB
QWEN3_TINY = replace(QWEN3, name="qwen3-30b-a3b-tiny-q4_k_m", layers=4, experts=16)
SHAPES = {"qwen3": QWEN3, "mixtral": MIXTRAL, "qwen3-tiny": QWEN3_TINY}
# the benchmarks' --smoke file: the Qwen3 file's kinds of tensors and types at toy sizes (2 layers of 16
# experts, hidden 512, vocab 2,048: ~10 MB), written in well under a second; not one of SHAPES (`all`)
SMOKE = replace(QWEN3, name="qwen3-smoke-q4_k_m", layers=2, hidden=512, experts=16, expert_ffn=256, top_k=4,
                heads=4, kv_heads=2, vocab=2048)


# --- the tensor plan --------------------------------------------------------------------------------

def plan(s: Shape):
    """The file's tensors in the converter's order: engine/files/gguf/writer.Planned (GGUF name, torch-order
    shape [out, in] / [E, out, in], type), typed by llama-quantize's Q4_K_M rules."""
    from engine.files.gguf.writer import Planned, _llama_quantize_types

    D, E, I, hd = s.hidden, s.experts, s.expert_ffn, s.head_dim
    out = [Planned("token_embd.weight", (s.vocab, D), None)]
    for i in range(s.layers):
        b = f"blk.{i}."
        out += [Planned(b + "attn_norm.weight", (D,), None),
                Planned(b + "attn_q.weight", (s.heads * hd, D), None),
                Planned(b + "attn_k.weight", (s.kv_heads * hd, D), None),
                Planned(b + "attn_v.weight", (s.kv_heads * hd, D), None),
                Planned(b + "attn_output.weight", (D, s.heads * hd), None)]
        if s.family == "qwen3":
            out += [Planned(b + "attn_q_norm.weight", (hd,), None), Planned(b + "attn_k_norm.weight", (hd,), None)]
        out += [Planned(b + "ffn_norm.weight", (D,), None),
                Planned(b + "ffn_gate_inp.weight", (E, D), None),
                Planned(b + "ffn_gate_exps.weight", (E, I, D), None),
                Planned(b + "ffn_up_exps.weight", (E, I, D), None),
                Planned(b + "ffn_down_exps.weight", (E, D, I), None)]
    out += [Planned("output_norm.weight", (D,), None), Planned("output.weight", (s.vocab, D), None)]
    _llama_quantize_types(out, FT.MOSTLY_Q4_K_M, E, s.layers)  # quantizable ones; the rest stay F32
    return out


def nbytes(p) -> int:
    block, size = GGML_QUANT_SIZES[p.qtype]
    return int(np.prod(p.shape[:-1])) * p.shape[-1] // block * size


def _pad(n: int) -> int:
    return n + (-n) % ALIGN


def tensor_bytes(s: Shape) -> int:
    return sum(nbytes(p) for p in plan(s))


def step_bytes(s: Shape) -> int:
    """Bytes one decode token reads: top-k of E of every expert tensor, every other tensor except the
    embedding (one row of it), the lm_head."""
    total = 0
    for p in plan(s):
        if "_exps" in p.name:
            total += nbytes(p) * s.top_k // s.experts
        elif p.name != "token_embd.weight":
            total += nbytes(p)
    return total


# --- metadata -----------------------------------------------------------------------------------------

def _byte_chars() -> list[str]:
    """GPT-2's bytes_to_unicode: the 256 characters byte-level BPE spells bytes with, by byte value."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def vocab(s: Shape) -> dict:
    """A synthetic byte-level BPE of s.vocab tokens, valid for llama.cpp and transformers: special
    tokens at the family's ids, the 256 byte tokens, tokens two letters (or space+letter) long with
    their merges, then filler tokens (whole, unique strings); Qwen's [PADi] past its added tokens."""
    if s.family == "qwen3":
        n_regular = QWEN_REGULAR if s.vocab == QWEN3.vocab else s.vocab - len(QWEN_SPECIAL) - 8
        lead, special = [], QWEN_SPECIAL
    else:
        n_regular, lead, special = s.vocab, ["<unk>", "<s>", "</s>"], []
    if n_regular < 300 + len(lead):
        raise ValueError(f"vocab {s.vocab} is too small for the synthetic tokenizer")
    tokens = list(lead) + _byte_chars()
    types = [gguf.TokenType.CONTROL] * len(lead) + [gguf.TokenType.NORMAL] * 256
    alphabet = ["Ġ"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    merges = []
    for a in alphabet:
        for b in alphabet[1:]:
            if len(tokens) >= n_regular - 1:
                break
            merges.append(f"{a} {b}")
            tokens.append(a + b)
            types.append(gguf.TokenType.NORMAL)
    i = 0
    while len(tokens) < n_regular:
        tokens.append(f"Ġtok{i}")
        types.append(gguf.TokenType.NORMAL)
        i += 1
    for t in special:
        tokens.append(t)
        types.append(gguf.TokenType.CONTROL if t.startswith("<|") else gguf.TokenType.USER_DEFINED)
    while len(tokens) < s.vocab:
        tokens.append(f"[PAD{len(tokens)}]")
        types.append(gguf.TokenType.UNUSED)
    if s.family == "qwen3":
        ids = {t: n_regular + k for k, t in enumerate(special)}
        return dict(tokens=tokens, types=types, merges=merges, pre="qwen2", bos=ids["<|endoftext|>"],
                    eos=ids["<|im_end|>"], pad=ids["<|endoftext|>"], add_bos=False,
                    template=(ROOT / "resources" / "templates" / "qwen3-chat_template.jinja").read_text(),
                    regular=(256, n_regular))
    return dict(tokens=tokens, types=types, merges=merges, pre="default", bos=1, eos=2, pad=None, add_bos=True,
                template=MISTRAL_TEMPLATE, regular=(3 + 256, n_regular))


def _writer(s: Shape, tensors) -> gguf.GGUFWriter:
    w = gguf.GGUFWriter(path=None, arch=s.arch)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(f"{s.name} (random weights, Mixdesk benchmark)")
    w.add_block_count(s.layers)
    w.add_context_length(s.ctx)
    w.add_embedding_length(s.hidden)
    w.add_feed_forward_length(s.dense_ffn)
    w.add_head_count(s.heads)
    w.add_head_count_kv(s.kv_heads)
    w.add_rope_freq_base(s.rope_theta)
    w.add_layer_norm_rms_eps(s.rms_eps)
    w.add_expert_count(s.experts)
    w.add_expert_used_count(s.top_k)
    if s.family == "qwen3":
        w.add_key_length(s.head_dim)
        w.add_value_length(s.head_dim)
        w.add_expert_feed_forward_length(s.expert_ffn)
    else:
        w.add_vocab_size(s.vocab)
        w.add_rope_dimension_count(s.head_dim)
    w.add_file_type(FT.MOSTLY_Q4_K_M)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    v = vocab(s)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(v["pre"])
    w.add_token_list(v["tokens"])
    w.add_token_types(v["types"])
    w.add_token_merges(v["merges"])
    w.add_bos_token_id(v["bos"])
    w.add_eos_token_id(v["eos"])
    if v["pad"] is not None:
        w.add_pad_token_id(v["pad"])
    w.add_add_bos_token(v["add_bos"])
    w.add_chat_template(v["template"])
    for p in tensors:
        shape = gguf.quant_shape_to_byte_shape(p.shape, p.qtype)
        w.add_tensor_info(p.name, shape, np.dtype(np.uint8), nbytes(p), raw_dtype=p.qtype)
    return w


def header_bytes(w: gguf.GGUFWriter) -> bytes:
    """The header, metadata and tensor infos, as GGUFWriter writes them (into memory)."""
    buf = io.BytesIO()
    w.fout = [buf]
    w.state = gguf.gguf_writer.WriterState.EMPTY
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    return buf.getvalue()


def expected_size(s: Shape) -> int:
    tensors = plan(s)
    return _pad(len(header_bytes(_writer(s, tensors)))) + sum(_pad(nbytes(p)) for p in tensors)


# --- random data --------------------------------------------------------------------------------------

def _scale_table(mean: float, seed: int) -> np.ndarray:
    """256 fp16 scales spread around `mean` (x0.5 to x1.5), indexed by a random byte of each block."""
    return (np.random.default_rng(seed).uniform(0.5, 1.5, 256) * mean).astype(np.float16)


SCALES = {  # type -> [(byte offset of an fp16 scale in the block, its mean)]
    GT.Q4_K: [(0, 3e-5), (2, 3e-5)],          # d, dmin
    GT.Q5_K: [(0, 3e-5), (2, 3e-5)],          # d, dmin
    GT.Q6_K: [(208, 5e-6)],                  # ql[128] qh[64] scales[16] d
    GT.Q8_0: [(0, 1e-4)],                    # d, qs[32] (int8)
}


class RandomTensor:
    """A tensor's bytes for GGUFWriter.write_tensor_data, made and written chunk by chunk (its
    `tofile`), so memory stays one chunk. Chunks of the range [0, skip) already in the file are
    passed over (seeked), not made again."""

    def __init__(self, p, index: int, skip_to: int, on_bytes: Callable[[int], None]):
        self.p, self.index, self.nbytes, self.skip_to, self.on_bytes = p, index, nbytes(p), skip_to, on_bytes

    def _chunk(self, k: int, n: int) -> np.ndarray:
        g = np.random.Generator(np.random.PCG64([SEED, self.index, k]))
        qt, name = self.p.qtype, self.p.name
        if qt == GT.F32:
            if name.endswith("norm.weight"):
                return np.ones(n // 4, np.float32).view(np.uint8)
            return (g.standard_normal(n // 4, dtype=np.float32) * 0.02).view(np.uint8)  # the router
        size = GGML_QUANT_SIZES[qt][1]
        raw = g.bit_generator.random_raw((n + 7) // 8).view(np.uint8)[:n].reshape(-1, size)
        for j, (off, mean) in enumerate(SCALES[qt]):
            idx = raw[:, (off + 4 + j) % size]  # a random byte outside the scales
            raw[:, off:off + 2] = _scale_table(mean, SEED + j + 7 * int(qt)).view(np.uint8).reshape(-1, 2)[idx]
        return raw.reshape(-1)

    def tofile(self, f) -> None:
        start = f.tell()
        qt = self.p.qtype
        unit = 4 if qt == GT.F32 else GGML_QUANT_SIZES[qt][1]
        step = CHUNK // unit * unit
        for k, off in enumerate(range(0, self.nbytes, step)):
            n = min(step, self.nbytes - off)
            if start + off + n <= self.skip_to:
                f.seek(start + off + n)
            else:
                f.write(self._chunk(k, n).data)
            self.on_bytes(n)


def _drop_cache(f) -> None:
    """Write the dirty pages out and drop them: an 18-26 GB file must not push other programs' memory
    out (the benchmark that follows reads the file cold or warm as it chooses)."""
    try:
        os.fdatasync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    except (OSError, AttributeError):
        pass


def write(s: Shape, out: Path | None = None, log: Callable[[str], None] = print) -> Path:
    """Write s as a GGUF at `out` (default s.path) unless it is there with the planned size."""
    out = Path(out or s.path)
    tensors = plan(s)
    w = _writer(s, tensors)
    head = header_bytes(w)
    total = _pad(len(head)) + sum(_pad(nbytes(p)) for p in tensors)
    if out.exists() and out.stat().st_size == total:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(out.name + ".part")
    done = 0
    if part.exists():
        with open(part, "rb") as f:
            if f.read(len(head)) == head:
                done = part.stat().st_size
    free = os.statvfs(out.parent).f_bavail * os.statvfs(out.parent).f_frsize
    if free < total - done + (1 << 30):
        raise SystemExit(f"{out}: needs {(total - done) / 1e9:.1f} GB more, {free / 1e9:.1f} GB free")
    log(f"writing {out} ({total / 1e9:.2f} GB, {len(tensors)} tensors)"
        + (f", resuming at {done / 1e9:.2f} GB" if done else ""))
    t0, state = time.perf_counter(), {"bytes": 0, "shown": 0.0, "since_drop": 0}
    with open(part, "r+b" if done else "wb", buffering=0) as f:
        f.write(head)
        w.fout = [f]  # header_bytes left the writer at TI_DATA, its tensor infos queued in order
        current = [""]

        def on_bytes(n: int) -> None:
            state["bytes"] += n
            state["since_drop"] += n
            if state["since_drop"] >= 1 << 30:
                _drop_cache(f)
                state["since_drop"] = 0
            now = time.perf_counter()
            if now - state["shown"] >= 10:
                state["shown"] = now
                el = now - t0
                b = state["bytes"]
                log(f"  {b / 1e9:6.2f} / {(total - len(head)) / 1e9:.2f} GB  {b / max(el, 1e-9) / 1e6:5.0f} MB/s  "
                    f"{el:5.0f} s  {current[0]}")

        for i, p in enumerate(tensors):
            current[0] = p.name
            w.write_tensor_data(RandomTensor(p, i, done, on_bytes))
        if f.tell() != total:
            raise RuntimeError(f"{part}: wrote {f.tell()} bytes, planned {total}")
        _drop_cache(f)
    part.rename(out)
    log(f"wrote {out} ({total / 1e9:.2f} GB) in {time.perf_counter() - t0:.0f} s")
    return out


def ensure(name: str, log: Callable[[str], None] = print) -> Path:
    return write(SHAPES[name], log=log)


def describe(s: Shape) -> str:
    from collections import Counter

    tensors = plan(s)
    by = Counter()
    for p in tensors:
        by[p.qtype.name] += nbytes(p)
    kinds = ", ".join(f"{k} {v / 1e9:.2f} GB" for k, v in sorted(by.items(), key=lambda kv: -kv[1]))
    return (f"{s.name}: {len(tensors)} tensors, {tensor_bytes(s) / 1e9:.2f} GB of tensors ({kinds}); "
            f"a decode token reads {step_bytes(s) / 1e9:.2f} GB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("which", nargs="?", default="qwen3", choices=[*SHAPES, "all"])
    ap.add_argument("--plan", action="store_true", help="print the plan (types, sizes) and write nothing")
    ap.add_argument("--smoke", action="store_true", help="the smallest run through every stage (a test runs it)")
    a = ap.parse_args()
    if a.smoke:  # the whole writer (header, every tensor type, the rename), fresh each time, nothing kept
        import tempfile

        print(describe(SMOKE), flush=True)
        if not a.plan:
            with tempfile.TemporaryDirectory() as tmp:
                out = write(SMOKE, Path(tmp) / SMOKE.path.name, log=lambda m: print(m, flush=True))
                if out.stat().st_size != expected_size(SMOKE):
                    raise SystemExit(f"{out}: {out.stat().st_size} bytes, planned {expected_size(SMOKE)}")
                print(out)
        return
    for name in (SHAPES if a.which == "all" else [a.which]):
        print(describe(SHAPES[name]), flush=True)
        if not a.plan:
            print(ensure(name, log=lambda m: print(m, flush=True)))


if __name__ == "__main__":
    main()
