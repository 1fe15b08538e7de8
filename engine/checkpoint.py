"""A Hugging Face model folder, validated up front and read lazily, expert by expert.

Only safetensors are read: a pickle checkpoint is refused, never unpickled, and no remote code runs.
Every problem becomes one ModelError naming the file and what is wrong with it.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import ModelError
from .families import FAMILIES, SUPPORTED_MODEL_TYPES, Family, family_of, fused
from .model_files import check_inside, check_links
from .safetensors_file import DTYPES, SafetensorsFile, regular_file

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
# Tensor-name endings that give away a pre-quantised checkpoint, and the format each belongs to.
QUANT_MARKERS = {
    ".qweight": "GPTQ/AWQ",
    ".qzeros": "GPTQ/AWQ",
    ".g_idx": "GPTQ",
    ".absmax": "bitsandbytes",
    ".quant_state.bitsandbytes__nf4": "bitsandbytes",
    ".quant_state.bitsandbytes__fp4": "bitsandbytes",
    ".SCB": "bitsandbytes (8-bit)",
    ".W_q": "HQQ",
}
QUANT_METHOD_NAMES = {"gptq": "GPTQ", "awq": "AWQ", "bitsandbytes": "bitsandbytes", "hqq": "HQQ",
                      "aqlm": "AQLM", "exl2": "EXL2", "fp8": "FP8", "compressed-tensors": "compressed-tensors"}


@dataclass(frozen=True)
class Dims:
    """Shapes from config.json. Legend used across the engine: D hidden, I ffn, E experts, K top-k."""

    layers: int
    hidden: int
    ffn: int
    experts: int
    top_k: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    rms_eps: float
    max_positions: int
    tie_embeddings: bool
    sliding_window: int | None
    family: str = "mixtral"         # the config's model_type: engine/families holds what it means
    norm_topk: bool = True          # the top-k route weights are renormalised to sum to 1
    qk_norm: str | None = None      # "head" or "full": RMSNorm of q and k before rope
    qkv_bias: bool = False
    shared_ffn: int = 0             # width of the always-active shared expert (0: none)
    clip_qkv: float | None = None
    # GPT-OSS (engine/families/gpt_oss.py)
    router_kind: str = "softmax_topk"   # or "topk_softmax"
    router_bias: bool = False
    act: str = "silu"                   # or "swiglu_oai"
    swiglu: tuple[float, float] = (1.702, 7.0)  # swiglu_oai's (alpha, limit)
    attn_sinks: bool = False
    o_bias: bool = False
    layer_windows: tuple | None = None  # per layer: its sliding window, or None (full attention)

    def window(self, layer: int) -> int | None:
        """The sliding window of one layer's attention (None: it sees every earlier position)."""
        return self.layer_windows[layer] if self.layer_windows is not None else self.sliding_window

    @property
    def adapter(self) -> Family:
        return FAMILIES[self.family]

    def expert_params(self) -> int:
        return 3 * self.hidden * self.ffn


def expert_key(layer: int, expert: int, w: str, d: Dims | None = None) -> str:
    """The checkpoint name of expert (layer, expert)'s w1 (gate), w2 (down) or w3 (up)."""
    return (d.adapter if d is not None else FAMILIES["mixtral"]).expert_key(layer, expert, w)


def dense_shapes(d: Dims) -> dict[str, tuple[int, ...]]:
    """Every non-expert tensor the model needs, with its shape."""
    s = {"model.embed_tokens.weight": (d.vocab, d.hidden), "model.norm.weight": (d.hidden,)}
    if not d.tie_embeddings:
        s["lm_head.weight"] = (d.vocab, d.hidden)
    fam = d.adapter
    q, kv = d.heads * d.head_dim, d.kv_heads * d.head_dim
    for l in range(d.layers):
        p = f"model.layers.{l}."
        s[p + "input_layernorm.weight"] = (d.hidden,)
        s[p + "post_attention_layernorm.weight"] = (d.hidden,)
        s[p + "self_attn.q_proj.weight"] = (q, d.hidden)
        s[p + "self_attn.k_proj.weight"] = (kv, d.hidden)
        s[p + "self_attn.v_proj.weight"] = (kv, d.hidden)
        s[p + "self_attn.o_proj.weight"] = (d.hidden, q)
        if d.o_bias:
            s[p + "self_attn.o_proj.bias"] = (d.hidden,)
        if d.attn_sinks:
            s[p + "self_attn.sinks"] = (d.heads,)
        if d.router_bias:
            s[fam.router_key(l, bias=True)] = (d.experts,)
        if d.qkv_bias:
            s[p + "self_attn.q_proj.bias"], s[p + "self_attn.k_proj.bias"], s[p + "self_attn.v_proj.bias"] = (q,), (kv,), (kv,)
        if d.qk_norm:
            head = d.qk_norm == "head"
            s[p + "self_attn.q_norm.weight"] = (d.head_dim,) if head else (q,)
            s[p + "self_attn.k_norm.weight"] = (d.head_dim,) if head else (kv,)
        s[fam.router_key(l)] = (d.experts, d.hidden)
        if d.shared_ffn:
            s[fam.shared_key(l, "w1")] = s[fam.shared_key(l, "w3")] = (d.shared_ffn, d.hidden)
            s[fam.shared_key(l, "w2")] = (d.hidden, d.shared_ffn)
            s[fam.shared_key(l, "gate")] = (1, d.hidden)
    return s


def expert_shapes(d: Dims, mxfp4: bool = False) -> dict[str, tuple[int, ...]]:
    if d.adapter.fused_experts:
        return fused.shapes(d, mxfp4)
    s = {}
    key = d.adapter.expert_key
    for l in range(d.layers):
        for e in range(d.experts):
            s[key(l, e, "w1")] = (d.ffn, d.hidden)
            s[key(l, e, "w2")] = (d.hidden, d.ffn)
            s[key(l, e, "w3")] = (d.ffn, d.hidden)
    return s


# The largest model Mixdesk accepts, checked before anything is allocated: a config past these is
# refused with the field named. Generous for 2026's open MoE models (DeepSeek-V3/Kimi K2: 61 layers,
# 256-384 experts, ~1T parameters; Qwen3-235B: 94 layers, 128 experts).
LIMITS = {
    "num_hidden_layers": 512, "num_local_experts": 1024, "hidden_size": 65536, "intermediate_size": 262144,
    "num_attention_heads": 1024, "num_key_value_heads": 1024, "head_dim": 2048, "vocab_size": 4_000_000,
    "max_position_embeddings": 1 << 24, "sliding_window": 1 << 24, "num_experts": 1024,
    "moe_intermediate_size": 262144, "shared_expert_intermediate_size": 262144,
}
MAX_PARAMS = 3 * 10**12  # about three times the largest open MoE model (Kimi K2, ~1T)
MAX_JSON_BYTES = 64 << 20


def check_config(raw: dict, path: Path) -> None:
    """Range-check the fields Mixdesk sizes things from, before any of them is used (the family's
    own field names: num_local_experts or num_experts, intermediate_size or moe_intermediate_size)."""
    fam = family_of(raw.get("model_type")) or FAMILIES["mixtral"]
    def field(name: str, required: bool = True, lo: int = 1):
        v = raw.get(name)
        if v is None:
            if required:
                raise ModelError(path, f"lacks the field '{name}'")
            return None
        if not isinstance(v, int) or isinstance(v, bool):
            raise ModelError(path, f"'{name}' is {v!r}; it must be a whole number")
        if not lo <= v <= LIMITS[name]:
            raise ModelError(path, f"'{name}' is {v:,}; Mixdesk accepts {lo} to {LIMITS[name]:,}")
        return v

    # transformers 5 writes num_local_experts for every family; published Qwen/OLMoE configs say num_experts
    experts_name = next((n for n in (fam.experts_field, "num_local_experts", "num_experts") if n in raw),
                        fam.experts_field)
    layers, experts = field("num_hidden_layers"), field(experts_name)
    hidden, ffn = field("hidden_size"), field(fam.expert_ffn_field)
    heads = field("num_attention_heads")
    kv = field("num_key_value_heads", required=False) or heads
    head_dim = field("head_dim", required=False) or hidden // heads
    vocab = field("vocab_size")
    field("max_position_embeddings")
    field("sliding_window", required=False, lo=0)
    shared = field("shared_expert_intermediate_size", required=False, lo=0) if fam.shared_expert else 0
    k = raw.get("num_experts_per_tok")
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= experts:
        raise ModelError(path, f"'num_experts_per_tok' is {k!r}; it must be a whole number from 1 to "
                         f"{experts_name} ({experts})")
    dense = raw.get("mlp_only_layers") or []
    step = raw.get("decoder_sparse_step", 1)
    if dense or step not in (None, 1):
        raise ModelError(path, f"has dense MLP layers between its MoE layers (mlp_only_layers {dense!r}, "
                         f"decoder_sparse_step {step!r}); Mixdesk runs models with MoE in every layer")
    if fam.model_type == "qwen3_moe" and raw.get("attention_bias"):
        raise ModelError(path, "'attention_bias' is true; Mixdesk runs Qwen3-MoE models without attention biases")
    if kv > heads or heads % kv:
        raise ModelError(path, f"'num_key_value_heads' ({kv}) must divide 'num_attention_heads' ({heads})")
    if head_dim < 1:
        raise ModelError(path, f"'hidden_size' ({hidden}) is smaller than 'num_attention_heads' ({heads})")
    for name in ("rms_norm_eps", "rope_theta"):
        v = raw.get(name)
        if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0):
            raise ModelError(path, f"'{name}' is {v!r}; it must be a positive number")
    params = (layers * ((experts * ffn + (shared or 0)) * 3 * hidden + hidden * (heads + 2 * kv) * head_dim * 2)
              + 2 * vocab * hidden)
    if params > MAX_PARAMS:
        raise ModelError(path, f"describes a model of {params / 1e12:,.1f} trillion parameters; the largest "
                         f"Mixdesk accepts is {MAX_PARAMS / 1e12:.0f} trillion")


def _read_json(path: Path) -> dict:
    regular_file(path)
    if path.stat().st_size > MAX_JSON_BYTES:
        raise ModelError(path, f"is larger than {MAX_JSON_BYTES >> 20} MB; it is not a model's JSON file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelError(path, "is missing") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(path, f"is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ModelError(path, "is not a JSON object")
    return data


class Checkpoint:
    """Open and validate a model folder; read tensors on demand. Never writes into the folder."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder).expanduser()
        if self.folder.is_file():
            if self.folder.suffix in PICKLE_SUFFIXES:
                raise ModelError(self.folder, _pickle_refusal())
            raise ModelError(self.folder, "is a file; give the model's folder (with config.json and *.safetensors)")
        if not self.folder.is_dir():
            raise ModelError(self.folder, "does not exist or is not a folder")
        self.config_path = self.folder / "config.json"
        self._check_files()
        self.raw_config = _read_json(self.config_path)
        self._check_model_type()
        check_config(self.raw_config, self.config_path)
        self.config = self._hf_config()
        self.dims = dims_from_config(self.config, self.config_path)
        self.files = self._open_weights()
        self.where: dict[str, SafetensorsFile] = {}
        for f in self.files:
            for name in f.tensors:
                self.where[name] = f
        self._check_quantised()
        self.expected = {**dense_shapes(self.dims), **expert_shapes(self.dims, self.mxfp4)}
        self._check_tensors()
        # the experts' 16-bit source: MXFP4 is exact in bf16 (engine/families/fused.py)
        self.dtype = torch.bfloat16 if self.mxfp4 else DTYPES[self.info(self.expert_key(0, 0, "w1")).dtype]

    # ---- validation -------------------------------------------------------------------------
    def _check_files(self) -> None:
        """Every entry leads inside the folder; every file the engine or the tokenizer may open is
        a regular file."""
        check_links(self.folder)
        for p in self.folder.iterdir():
            if p.suffix in (".json", ".safetensors", ".jinja", ".model", ".txt") or p.name.startswith("tokenizer"):
                if not p.is_dir():
                    regular_file(p)

    def _check_model_type(self) -> None:
        mt = self.raw_config.get("model_type")
        if mt in FAMILIES and not FAMILIES[mt].runs:
            raise ModelError(self.config_path, f"is a {FAMILIES[mt].name} model; Mixdesk plans it from its config "
                             "(mixdesk plan --config-only) but does not run its weights yet")
        if mt not in SUPPORTED_MODEL_TYPES:
            names = ", ".join(f"{f.name} ({t})" for t, f in FAMILIES.items() if f.runs)
            raise ModelError(self.config_path, f"model_type is {mt!r}; Mixdesk runs these Mixture-of-Experts "
                             f"families: {names}")
        self.family = FAMILIES[mt]
        qc = self.raw_config.get("quantization_config")
        # MXFP4 experts, as gpt-oss ships: read (engine/families/fused.py); any other format is refused
        self.mxfp4 = isinstance(qc, dict) and str(qc.get("quant_method", "")).lower() == "mxfp4" and \
            self.family.fused_experts
        if isinstance(qc, dict) and not self.mxfp4:
            method = str(qc.get("quant_method", "unknown"))
            raise ModelError(self.config_path, _quant_refusal(QUANT_METHOD_NAMES.get(method.lower(), method)))

    def _hf_config(self):
        return hf_config(self.raw_config, self.config_path)

    def _open_weights(self) -> list[SafetensorsFile]:
        index = self.folder / "model.safetensors.index.json"
        single = self.folder / "model.safetensors"
        if index.exists():
            weight_map = _read_json(index).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise ModelError(index, "has no weight_map")
            bad = next((k for k, v in weight_map.items() if not isinstance(v, str) or not v), None)
            if bad is not None:
                raise ModelError(index, f"maps tensor '{bad}' to {weight_map[bad]!r}, not to a file name")
            names = sorted(set(weight_map.values()))
            for n in names:
                check_inside(self.folder, self.folder / n, index)
                if not (self.folder / n).exists():
                    raise ModelError(self.folder / n, f"is missing (listed in {index.name})")
                regular_file(self.folder / n)
            self.index_map = weight_map
            return [SafetensorsFile(self.folder / n) for n in names]
        self.index_map = None
        if single.exists():
            return [SafetensorsFile(check_inside(self.folder, single))]
        shards = sorted(self.folder.glob("*.safetensors"))
        if shards:
            return [SafetensorsFile(check_inside(self.folder, p)) for p in shards]
        pickles = [p for p in self.folder.iterdir() if p.suffix in PICKLE_SUFFIXES]
        if pickles:
            raise ModelError(pickles[0], _pickle_refusal())
        raise ModelError(self.folder, "holds no .safetensors weights")

    def _check_quantised(self) -> None:
        for name, f in self.where.items():
            for marker, fmt in QUANT_MARKERS.items():
                if name.endswith(marker):
                    raise ModelError(f.path, _quant_refusal(fmt) + f" (tensor '{name}')")

    def _check_tensors(self) -> None:
        for name, shape in self.expected.items():
            f = self.where.get(name)
            if f is None:
                where = self.folder / "model.safetensors.index.json" if self.index_map else self.files[0].path
                if self.index_map and name in self.index_map:
                    where = self.folder / self.index_map[name]
                raise ModelError(where, f"is missing tensor '{name}'")
            got = f.tensors[name].shape
            if tuple(got) != shape:
                raise ModelError(
                    f.path,
                    f"tensor '{name}' has shape {list(got)} but config.json implies {list(shape)}",
                )
            packed = name.endswith(("_blocks", "_scales"))  # MXFP4's bytes; everything else is a float
            if (f.tensors[name].dtype == "U8") != packed:
                raise ModelError(f.path, f"tensor '{name}' has dtype {f.tensors[name].dtype}; Mixdesk reads 16- "
                                 "and 32-bit float checkpoints (BF16, F16, F32), and MXFP4 experts (U8)")

    # ---- reading ----------------------------------------------------------------------------
    def expert_key(self, layer: int, expert: int, w: str) -> str:
        return self.family.expert_key(layer, expert, w)

    def info(self, name: str):
        return self.where[name].tensors[name]

    def read(self, name: str, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.where[name].read(name, out)

    def view(self, name: str) -> torch.Tensor:
        """The tensor where its file is mapped, read-only, no copy (engine/safetensors_file.py)."""
        return self.where[name].view(name)

    def read_rows(self, name: str, first: int, count: int) -> torch.Tensor:
        """Rows of a tensor's first dimension (one expert of a fused layer tensor)."""
        return self.where[name].read_rows(name, first, count)

    def expert_nbytes(self) -> int:
        """Bytes of one expert at the checkpoint's precision."""
        if self.family.fused_experts:
            return sum(self.info(n).nbytes for n in expert_shapes(self.dims, self.mxfp4)
                       if n.startswith("model.layers.0.")) // self.dims.experts
        return sum(self.info(self.expert_key(0, 0, w)).nbytes for w in ("w1", "w2", "w3"))

    def dense_nbytes(self) -> int:
        return sum(self.info(n).nbytes for n in dense_shapes(self.dims))

    def load_tokenizer(self):
        """The tokenizer, which must carry a chat template (Mixdesk is a chat app)."""
        from transformers import AutoTokenizer

        has_files = any((self.folder / n).exists() for n in ("tokenizer.json", "tokenizer.model", "vocab.json"))
        if not has_files:
            raise ModelError(self.folder, "has no tokenizer (tokenizer.json or tokenizer.model)")
        try:
            tok = AutoTokenizer.from_pretrained(str(self.folder), local_files_only=True)
        except Exception as e:
            raise ModelError(self.folder / "tokenizer.json", f"could not be loaded: {e}") from None
        if not getattr(tok, "chat_template", None):
            raise ModelError(
                self.folder / "tokenizer_config.json",
                "has no chat template; add one (tokenizer_config.json 'chat_template' or chat_template.jinja)",
            )
        return tok

    def eos_token_ids(self, tokenizer) -> set[int]:
        ids: set[int] = set()
        gen = self.folder / "generation_config.json"
        for source in (_read_json(gen) if gen.exists() else {}, self.raw_config):
            v = source.get("eos_token_id")
            ids.update(v if isinstance(v, list) else [v] if isinstance(v, int) else [])
        if tokenizer.eos_token_id is not None:
            ids.add(int(tokenizer.eos_token_id))
        return ids

    def close(self) -> None:
        for f in self.files:
            f.close()


def hf_config(raw: dict, path: Path):
    """transformers' own config class for the family parses and normalises config.json (rope
    parameters, defaults); no remote code runs."""
    import transformers

    fam = family_of(raw.get("model_type")) or FAMILIES["mixtral"]
    try:
        return getattr(transformers, fam.config_class).from_dict(raw)
    except Exception as e:  # a malformed field: name it, don't dump a traceback
        raise ModelError(path, f"could not be read as a {fam.name} config: {e}") from None


def dims_from_config(cfg, path: Path) -> Dims:
    fam = family_of(getattr(cfg, "model_type", "mixtral")) or FAMILIES["mixtral"]
    try:
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        window = getattr(cfg, "sliding_window", None) or None
        if getattr(cfg, "use_sliding_window", True) is False:
            window = None
        clip = getattr(cfg, "clip_qkv", None) if fam.clip_qkv else None
        return Dims(
            layers=cfg.num_hidden_layers, hidden=cfg.hidden_size, ffn=getattr(cfg, fam.expert_ffn_field),
            experts=getattr(cfg, fam.experts_field, None) or cfg.num_local_experts, top_k=cfg.num_experts_per_tok,
            heads=heads,
            kv_heads=cfg.num_key_value_heads, head_dim=head_dim, vocab=cfg.vocab_size,
            rms_eps=float(cfg.rms_norm_eps), max_positions=cfg.max_position_embeddings,
            tie_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)), sliding_window=window,
            family=fam.model_type, norm_topk=bool(getattr(cfg, "norm_topk_prob", fam.norm_topk_default)),
            qk_norm=fam.qk_norm, qkv_bias=bool(getattr(cfg, fam.qkv_bias, False)) if fam.qkv_bias else False,
            shared_ffn=int(getattr(cfg, "shared_expert_intermediate_size", 0) or 0) if fam.shared_expert else 0,
            clip_qkv=float(clip) if clip is not None else None,
            router_kind=fam.router_kind, router_bias=fam.router_bias, act=fam.act,
            swiglu=(float(getattr(cfg, "swiglu_alpha", 1.702)), float(getattr(cfg, "swiglu_limit", 7.0))),
            attn_sinks=fam.attn_sinks, o_bias=bool(getattr(cfg, fam.o_bias, False)) if fam.o_bias else False,
            layer_windows=tuple(window if t == "sliding_attention" else None for t in cfg.layer_types)
            if fam.layer_types else None,
        )
    except (AttributeError, TypeError, ZeroDivisionError) as e:
        raise ModelError(path, f"lacks a field Mixdesk needs: {e}") from None


def _pickle_refusal() -> str:
    return ("is a pickle checkpoint, which can run arbitrary code when loaded; Mixdesk reads only "
            ".safetensors (convert it with a trusted tool, or download the safetensors version)")


def _quant_refusal(fmt: str) -> str:
    return (f"is a {fmt}-quantised checkpoint, which Mixdesk does not read; use the 16-bit "
            "safetensors checkpoint (Mixdesk quantises experts itself, per expert)")
