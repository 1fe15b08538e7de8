"""A GGUF model as the engine's checkpoint: engine.files.checkpoint.Checkpoint's duck type over the file.

The engine reads tensors by their Hugging Face names (engine/files/checkpoint.py dense_shapes and the
families' expert keys); here each one is found in the file (engine/files/gguf/names.py) and checked at
open: present, its shape the one the metadata implies, its type one Mixdesk reads. `read` gives
the exact dequantisation (gguf.quants.dequantize of the file's rows; F32/F16/BF16 tensors as
stored), so every existing path of the engine runs a GGUF file unchanged; `read_raw`, `expert_raw`
and `expert_mxfp4` give the file's own blocks to the tiers that keep them (engine/experts/gguf_tiers.py).
Where the converter rearranged a dense tensor (llama's q/k rows, Qwen3.5's value heads, +1 norms,
-exp(A_log), deepseek2's kv_b_proj split in two), a Fix per HF name (engine/files/gguf/layout.py) makes every
read give the HF form. Expert layer l is the file's block Dims.decoder(l) (GLM's leading dense blocks).

Shapes: E experts, D hidden, I expert ffn. GGUF fuses a layer's experts: ffn_gate_exps and
ffn_up_exps [E, I, D], ffn_down_exps [E, D, I] (torch order; the file lists ne0 first), each
expert's matrix a contiguous run of rows, read alone.
"""
from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import torch
from gguf import GGMLQuantizationType as GT
from gguf.constants import GGML_QUANT_SIZES, LlamaFileType

from ..checkpoint import check_config, dense_shapes, dims_from_config, hf_config
from ...protocol.errors import ModelError
from ...families import FAMILIES
from .mxfp4 import to_release
from .config import hf_config_dict
from .expected import EXPERT_NAME, Expected, Info, WhereMap
import engine.files.gguf.glm_lite as glm_lite  # (as modules, not `from . import`: no edge to the package)
import engine.files.gguf.qwen35 as qwen35
from .header import TensorInfo
from .layout import Fix
from .names import PERMUTED_QK, ExpertRef, expert_ref, expert_tensor_name, gguf_name, unpermute_rows
from .reader import SPLIT, GGUFFile
from .values import FLOATS, SUPPORTED, dequantize_rows, unsupported

ST_DTYPE = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.uint8: "U8"}
_FUSED = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)(_blocks|_scales|_bias)?$")


class GGUFCheckpoint:
    """Open and validate a GGUF model (a file, a folder holding one, or a split set); read lazily."""

    is_gguf = True

    def __init__(self, path: str | Path):
        self.file = GGUFFile(path)
        try:
            self._open()
        except BaseException:
            self.file.close()
            raise

    def _open(self) -> None:
        f = self.file
        self.path = f.path                  # the first .gguf: messages name it
        self.folder = f.path                # the model's identity (profile key, display name)
        self.config_path = f.path
        m = SPLIT.match(self.path.name)
        self.name = m["prefix"] if m else self.path.stem
        self.arch = f.get("general.architecture")
        self.raw_config = hf_config_dict(f)
        check_config(self.raw_config, self.path)
        self.config = hf_config(self.raw_config, self.path)
        self.dims = d = dims_from_config(self.config, self.path)
        if self.arch == qwen35.ARCH and d.linear is not None and d.linear[0] != d.linear[2]:
            self.dims = d = replace(d, tiled_heads=True)  # value heads in the file's order (engine/files/gguf/qwen35.py)
        self.family = FAMILIES[d.family]
        self._fixes = self._layout_fixes()  # HF name -> how the file's form differs (engine/files/gguf/layout.py)
        self._dense: dict[str, TensorInfo] = {}
        for hf, shape in dense_shapes(d).items():
            self._dense[hf] = self._find_dense(hf, shape)
        self._experts: dict[tuple[int, str], list[ExpertRef]] = {}
        for l in range(d.layers):
            for w in ("w1", "w2", "w3"):
                self._experts[l, w] = self._find_experts(l, w)
        gate = self.expert_raw_info(0, 0, "w1")
        self.mxfp4 = self.family.fused_experts and gate.qtype == GT.MXFP4
        if self.family.fused_experts:
            self._biases = {}
            for l in range(d.layers):
                for w, n in (("w1", d.ffn), ("w3", d.ffn), ("w2", d.hidden)):
                    name = expert_tensor_name(l, w).replace(".weight", ".bias")
                    self._biases[l, w] = self._need(name, (d.experts, n))
        # the experts' source precision: the stored float type, or fp32 for the exact dequantisation
        # of quantised blocks (MXFP4 is exact in bf16, as for safetensors releases)
        self.dtype = FLOATS.get(gate.qtype, torch.bfloat16 if self.mxfp4 else torch.float32)
        self.expected = Expected(dense_shapes(d), d, self.mxfp4)
        self.where = WhereMap(self)

    def _layout_fixes(self) -> dict[str, Fix]:
        d = self.dims
        if self.arch in PERMUTED_QK:  # llama's q and k rows in its rope order
            return {f"model.layers.{l}.self_attn.{w}_proj.weight": Fix(rows=unpermute_rows(
                (d.heads if w == "q" else d.kv_heads) * d.head_dim, d.heads if w == "q" else d.kv_heads))
                for l in range(d.layers) for w in "qk"}
        if self.arch == qwen35.ARCH:
            return qwen35.fixes(d)
        if self.arch == glm_lite.ARCH:
            return glm_lite.fixes(d, self.file.tensors)
        return {}

    # ---- validation ------------------------------------------------------------------------------
    def _need(self, name: str, shape: tuple[int, ...]) -> TensorInfo:
        t = self.file.tensors.get(name)
        if t is None:
            raise ModelError(self.path, f"is missing tensor '{name}'")
        if t.qtype not in SUPPORTED:
            raise ModelError(t.path, unsupported(t))
        if t.shape != shape and t.shape != tuple(s for s in shape if s != 1):
            raise ModelError(t.path, f"tensor '{name}' has shape {list(t.shape)} but the metadata implies "
                             f"{list(shape)}")
        return t

    def _find_dense(self, hf: str, shape: tuple[int, ...]) -> TensorInfo:
        fix = self._fixes.get(hf)
        if fix is not None and fix.parts:  # split by the converter: every part checked, the first stands for it
            return [self._need(name, s) for name, s in fix.parts][0]
        name = gguf_name(hf, self.arch)
        if name is None:
            raise ModelError(self.path, f"has no GGUF name for tensor '{hf}'")
        return self._need(name, shape)

    def _find_experts(self, l: int, w: str) -> list[ExpertRef]:
        d, t = self.dims, self.file.tensors
        rows, k = (d.hidden, d.ffn) if w == "w2" else (d.ffn, d.hidden)
        b = d.decoder(l)  # the file's block
        first = expert_ref(t, b, 0, w, d.ffn)
        if first is None:
            raise ModelError(self.path, f"is missing tensor '{expert_tensor_name(b, w)}'")
        if first.expert is None:  # one tensor per expert (the first Mixtral GGUFs)
            refs = [expert_ref(t, b, e, w, d.ffn) for e in range(d.experts)]
            for e, r in enumerate(refs):
                if r is None:
                    raise ModelError(self.path, f"is missing tensor 'blk.{b}.ffn_{w}.{e}.weight'")
                self._need(r.tensor, (rows, k))
            return refs
        fused_rows = 2 * d.ffn if "gate_up" in first.tensor else rows
        self._need(first.tensor, (d.experts, fused_rows, k))
        return [ExpertRef(first.tensor, e, first.row0, rows) for e in range(d.experts)]

    # ---- the file's own blocks -------------------------------------------------------------------
    def expert_raw_info(self, layer: int, expert: int, w: str) -> TensorInfo:
        return self.file.tensors[self._experts[layer, w][expert].tensor]

    def _rows(self, t: TensorInfo, row0: int, rows: int) -> torch.Tensor:
        rb = t.row_bytes
        out = torch.empty(rows, rb, dtype=torch.uint8)
        return self.file.read_bytes(t, row0 * rb, rows * rb, out)

    def tensor_type(self, hf_name: str) -> GT:
        """The GGUF type the file stores a tensor in (an expert's: its layer's tensor's); F32 for a
        dense tensor whose blocks cannot be given in the HF order (it is presented dequantised)."""
        t = self._info_of(hf_name)
        fix = self._fixes.get(hf_name)
        return t.qtype if fix is None or fix.blocks_ok(t.qtype) else GT.F32

    def read_raw(self, hf_name: str) -> torch.Tensor:
        """A dense tensor's rows in tensor_type, [rows, row_bytes] uint8, in the HF order: the file's
        own blocks (rows or whole-block column groups reordered where the converter moved them), or
        for a tensor presented dequantised its fp32 values' bytes."""
        t = self._dense[hf_name]
        fix = self._fixes.get(hf_name)
        if fix is not None and not fix.blocks_ok(t.qtype):
            v = self.read(hf_name)
            return v.reshape(-1, v.shape[-1]).contiguous().view(torch.uint8)
        raw = self._rows(t, 0, t.rows)
        return raw if fix is None else fix.raw(raw, t.qtype)

    def expert_raw(self, layer: int, expert: int, w: str) -> tuple[GT, torch.Tensor]:
        """(type, rows [R, row_bytes] uint8) of expert (layer, expert)'s w1 (gate), w3 (up) or w2
        (down), read alone from its layer's tensor."""
        r = self._experts[layer, w][expert]
        t = self.file.tensors[r.tensor]
        base = 0 if r.expert is None else r.expert * (t.rows // self.dims.experts)
        return t.qtype, self._rows(t, base + r.row0, r.rows)

    def expert_view(self, layer: int, expert: int, w: str) -> tuple[GT, torch.Tensor]:
        """As expert_raw, but the rows where the file is mapped (engine/files/gguf/reader.py `view`): no
        copy, read-only, file-backed memory."""
        r = self._experts[layer, w][expert]
        t = self.file.tensors[r.tensor]
        base = 0 if r.expert is None else r.expert * (t.rows // self.dims.experts)
        rb = t.row_bytes
        return t.qtype, self.file.view(t, (base + r.row0) * rb, r.rows * rb).view(r.rows, rb)

    def raw_view_ok(self, hf_name: str) -> bool:
        """Whether raw_view gives this dense tensor (the file holds it in the engine's form and order)."""
        return hf_name not in self._fixes

    def raw_view(self, hf_name: str) -> torch.Tensor | None:
        """A dense tensor's rows where the file is mapped, [rows, row_bytes] uint8, or None where the
        file's form is not the engine's (engine/files/gguf/layout.py: read_raw reorders, read undoes)."""
        if not self.raw_view_ok(hf_name):
            return None
        t = self._dense[hf_name]
        return self.file.view(t).view(t.rows, t.row_bytes)

    def expert_float(self, layer: int, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The exact dequantisation in fp32: w13 [2I, D] (gate rows, then up rows), w2 [D, I]."""
        return self.expert_part_float(layer, expert, 0), self.expert_part_float(layer, expert, 1)

    def expert_part_float(self, layer: int, expert: int, which: int) -> torch.Tensor:
        """One of expert_float's two matrices: 0 w13, 1 w2."""
        d = self.dims
        if which:
            return dequantize_rows(*self.expert_raw(layer, expert, "w2"), d.ffn).float()
        gate, up = (dequantize_rows(*self.expert_raw(layer, expert, w), d.hidden).float() for w in ("w1", "w3"))
        return torch.cat([gate, up])

    def expert_mxfp4(self, layer: int, expert: int):
        """An MXFP4 expert (GPT-OSS) in the release's layout: ((blocks13 [2I, D/32, 16], scales13
        [2I, D/32]), (blocks2 [D, I/32, 16], scales2 [D, I/32])), gate rows then up rows."""
        d = self.dims
        parts = {}
        for w, k in (("w1", d.hidden), ("w3", d.hidden), ("w2", d.ffn)):
            qtype, raw = self.expert_raw(layer, expert, w)
            if qtype != GT.MXFP4:
                raise ValueError(f"expert {expert} of layer {layer}: {w} is {qtype.name}, not MXFP4")
            parts[w] = to_release(raw, k)
        b13 = torch.cat([parts["w1"][0], parts["w3"][0]])
        s13 = torch.cat([parts["w1"][1], parts["w3"][1]])
        return (b13, s13), parts["w2"]

    def expert_biases(self, layer: int, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
        """GPT-OSS: the expert's biases in fp32, b13 [2I] (gate half first) and b2 [D]."""
        def row(w):
            t = self._biases[layer, w]
            return dequantize_rows(t.qtype, self._rows(t, expert, 1), t.ne[0]).reshape(-1).float()
        return torch.cat([row("w1"), row("w3")]), row("w2")

    def expert_formats(self) -> set[GT]:
        return {self.file.tensors[refs[0].tensor].qtype for refs in self._experts.values()}

    def _expert_bits(self) -> float:
        d = self.dims
        bits = 0.0
        for (l, w), refs in self._experts.items():
            block, size = GGML_QUANT_SIZES[self.file.tensors[refs[0].tensor].qtype]
            bits += 8.0 * size / block
        return bits / len(self._experts) if d.layers else 0.0

    def format_label(self) -> str:
        """e.g. 'Q4_K_M GGUF, experts at 4.8 bits' (general.file_type, and the experts' real bits)."""
        ft = self.file.get("general.file_type")
        try:
            name = LlamaFileType(ft).name.replace("MOSTLY_", "").replace("ALL_", "")
        except (ValueError, TypeError):
            name = "/".join(sorted(q.name for q in self.expert_formats()))
        return f"{name} GGUF, experts at {self._expert_bits():.1f} bits"

    # ---- Checkpoint's duck type ------------------------------------------------------------------
    def expert_key(self, layer: int, expert: int, w: str) -> str:
        return self.family.expert_key(self.dims.decoder(layer), expert, w)

    def _info_of(self, hf: str) -> TensorInfo:
        if hf in self._dense:
            return self._dense[hf]
        m = _FUSED.match(hf)
        if m:  # a GPT-OSS layer tensor: its gate (or down) tensor in the file
            l, w = int(m[1]), "w2" if m[2] == "down_proj" else "w1"
            return self._biases[l, w] if m[3] == "_bias" else self.expert_raw_info(l, 0, w)
        l, e, w = self._parse_expert(hf)
        return self.expert_raw_info(l, e, w)

    def _parse_expert(self, hf: str) -> tuple[int, int, str]:
        m = EXPERT_NAME.match(hf)  # model.layers.L.[<moe>.]experts.E.<weight>.weight
        try:
            l, e = int(m[1]) - self.dims.dense_first, int(m[2])
            w = next(k for k, v in self.family.weights.items() if v == m[3])
        except (TypeError, StopIteration):
            raise KeyError(hf) from None
        if (l, "w1") not in self._experts or not 0 <= e < self.dims.experts:
            raise KeyError(hf)
        return l, e, w

    def info(self, name: str) -> Info:
        shape = self.expected[name]
        if name in self._dense:
            return Info(shape, ST_DTYPE[FLOATS.get(self.tensor_type(name), torch.float32)], self._nbytes(name))
        if self.family.fused_experts:
            dtype = "U8" if name.endswith(("_blocks", "_scales")) else ST_DTYPE[self.dtype]
            if name.endswith("_bias"):
                dtype = ST_DTYPE[FLOATS.get(self._info_of(name).qtype, torch.float32)]
            return Info(shape, dtype, self._info_of(name).nbytes)
        l, e, w = self._parse_expert(name)
        r = self._experts[l, w][e]
        return Info(shape, ST_DTYPE[self.dtype], r.rows * self.file.tensors[r.tensor].row_bytes)

    def read(self, name: str, out: torch.Tensor | None = None) -> torch.Tensor:
        """The tensor's exact values: the stored floats, or the dequantised blocks in fp32."""
        shape = self.expected[name]
        if name in self._dense:
            v = self._read_dense(name, shape)
        elif self.family.fused_experts:
            v = self.read_rows(name, 0, shape[0])
        else:
            l, e, w = self._parse_expert(name)
            qtype, raw = self.expert_raw(l, e, w)
            v = dequantize_rows(qtype, raw, shape[1]).to(self.dtype)
        if out is not None:
            out.copy_(v)
            return out
        return v.contiguous()

    def _read_dense(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        t = self._dense[name]
        fix = self._fixes.get(name)
        if fix is None or fix.blocks_ok(t.qtype):
            return dequantize_rows(t.qtype, self.read_raw(name), t.ne[0]).reshape(shape)
        if fix.parts:  # joined from the tensors the converter split it into
            ts = [self.file.tensors[n] for n, _ in fix.parts]
            return fix.join([dequantize_rows(p.qtype, self._rows(p, 0, p.rows), p.ne[0]).float().reshape(s)
                             for p, (_, s) in zip(ts, fix.parts)]).reshape(shape)
        try:
            return fix.floats(dequantize_rows(t.qtype, self._rows(t, 0, t.rows), t.ne[0]), shape)
        except ValueError as e:  # a value the converter cannot have written
            raise ModelError(t.path, f"tensor '{t.name}' {e}") from None

    def read_rows(self, name: str, first: int, count: int) -> torch.Tensor:
        """Rows of a tensor's first dimension: for a GPT-OSS layer tensor, experts first..first+count-1
        in the release's layout (gate and up interleaved, as engine/files/fused_experts.py reads them)."""
        m = _FUSED.match(name) if self.family.fused_experts else None
        if m is None:
            return self.read(name)[first:first + count]
        return torch.stack([self._fused_expert(int(m[1]), e, m[2], m[3]) for e in range(first, first + count)])

    def _fused_expert(self, l: int, e: int, which: str, part: str | None) -> torch.Tensor:
        def interleave(g, u):  # gate row i -> 2i, up row i -> 2i + 1 (the release's gate_up order)
            return torch.stack([g, u], dim=1).reshape(2 * g.shape[0], *g.shape[1:])
        d = self.dims
        if part == "_bias":
            b13, b2 = self.expert_biases(l, e)  # in the type the file stores them (F32 as converted)
            dtype = FLOATS.get(self._biases[l, "w2"].qtype, torch.float32)
            return interleave(b13[:d.ffn], b13[d.ffn:]).to(dtype) if which == "gate_up_proj" else b2.to(dtype)
        if part in ("_blocks", "_scales"):
            (b13, s13), (b2, s2) = self.expert_mxfp4(l, e)
            t = (b13 if part == "_blocks" else s13) if which == "gate_up_proj" else (b2 if part == "_blocks" else s2)
            return interleave(t[:d.ffn], t[d.ffn:]) if which == "gate_up_proj" else t
        w13, w2 = self.expert_float(l, e)  # 16-bit release layout: applied as x @ W
        if which == "gate_up_proj":
            return interleave(w13[:d.ffn], w13[d.ffn:]).t().to(self.dtype)
        return w2.t().to(self.dtype)

    def expert_nbytes(self) -> int:
        """Bytes of one expert in the file (the average over layer 0's experts: its own blocks)."""
        total = 0
        for w in ("w1", "w2", "w3"):
            r = self._experts[0, w][0]
            t = self.file.tensors[r.tensor]
            total += r.rows * t.row_bytes
        return total

    def _nbytes(self, hf: str) -> int:
        """A dense tensor's bytes in the file (all of its parts where the converter split it)."""
        fix = self._fixes.get(hf)
        if fix is not None and fix.parts:
            return sum(self.file.tensors[n].nbytes for n, _ in fix.parts)
        return self._dense[hf].nbytes

    def dense_nbytes(self) -> int:
        return sum(self._nbytes(hf) for hf in self._dense)

    def load_tokenizer(self):
        """The tokenizer from the file's metadata (engine/files/gguf/tokenizer.py), which must carry a chat
        template: checked first, so a file without one is refused before any conversion is cached."""
        template = self.file.get("tokenizer.chat_template")
        if not isinstance(template, str) or not template.strip():
            raise ModelError(self.path, "has no chat template (tokenizer.chat_template); Mixdesk is a chat app")
        try:
            from .tokenizer import tokenizer_from_metadata
        except ImportError:
            tokenizer_from_metadata = None
        if tokenizer_from_metadata is not None:
            tok = tokenizer_from_metadata(self.file.header, self.path)
        else:  # without engine/files/gguf/tokenizer.py: transformers' own GGUF reader
            from transformers import AutoTokenizer

            try:
                tok = AutoTokenizer.from_pretrained(str(self.path.parent), gguf_file=self.path.name)
            except Exception as e:
                raise ModelError(self.path, f"has a tokenizer that could not be loaded: {e}") from None
        if not getattr(tok, "chat_template", None):
            raise ModelError(self.path, "has no chat template (tokenizer.chat_template); Mixdesk is a chat app")
        return tok

    def eos_token_ids(self, tokenizer) -> set[int]:
        ids = set()
        for k in ("eos", "eot", "eom"):
            v = self.file.get(f"tokenizer.ggml.{k}_token_id")
            if isinstance(v, int) and not isinstance(v, bool):
                ids.add(v)
        if getattr(tokenizer, "eos_token_id", None) is not None:
            ids.add(int(tokenizer.eos_token_id))
        return ids

    def find_damage(self) -> str | None:
        """After NaN or Inf scores: the first block whose scale is not a number, named (engine/files/gguf/damage.py:
        reads the whole file once), or None."""
        from .damage import find

        return find(self.file)

    def close(self) -> None:
        self.file.close()
