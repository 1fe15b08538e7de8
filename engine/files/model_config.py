"""A model's config.json, read and range-checked before anything is sized from it: `Dims` (the shapes
and the parts each layer is built from), `check_config` (every field Mixdesk sizes from, named when
wrong), `hf_config` (transformers' own config class parses it) and `dims_from_config`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ..protocol.errors import ModelError
from ..families import FAMILIES, Family, family_of


@dataclass(frozen=True)
class Dims:
    """Shapes from config.json. Legend used across the engine: D hidden, I ffn, E experts, K top-k.
    `layers` counts the layers with experts (the placement's rows); a model may have `dense_first`
    decoder layers before them whose feed-forward is a dense MLP (GLM-4.5), so decoder layer
    `decoder(l)` holds MoE layer l."""

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
    # Layers composed of parts (engine/layers): each layer's mixer, "attention" or "deltanet" (None: all attention)
    mixers: tuple | None = None
    linear: tuple | None = None     # Gated DeltaNet's (key heads, key dim, value heads, value dim, conv taps)
    attn_gate: bool = False         # q_proj also yields a per-head output gate (Qwen3.5, Qwen3-Next)
    rot_dim: int = 0                # the rotary dims of a head (0: all head_dim; Qwen3.5 rotates a quarter)
    norm_offset: bool = False       # RMSNorm weights stored zero-centred: x is scaled by 1 + w
    deltanet_inputs: str = "split"  # how DeltaNet's input projections are stored (engine/layers/deltanet.py)
    tiled_heads: bool = False       # DeltaNet value head h uses key head h % Hk (a GGUF's order), not h // (Hv/Hk)
    # GLM-4.5 (engine/families/glm4_moe.py)
    dense_first: int = 0            # leading decoder layers with a dense MLP instead of experts
    dense_ffn: int = 0              # their MLP's width
    route_groups: tuple = (1, 1)    # sigmoid routing's (n_group, topk_group)
    route_scale: float = 1.0        # routed_scaling_factor: the route weights' multiplier
    shared_gated: bool = True       # the shared expert scaled by sigmoid(gate(x)) (Qwen); else added as is
    # multi-head latent attention (engine/layers/mla.py): (q rank or 0, kv rank, no-rope, rope, value head dims)
    mla: tuple | None = None
    rope_interleave: bool = False   # rope rotates interleaved pairs (DeepSeek) rather than halves
    # Gemma 4 (engine/families/gemma4.py, engine/layers/sandwich.py)
    sandwich: bool = False          # norms after the mixer and the feed-forward too; a per-layer output scalar
    parallel_ffn: int = 0           # width of a dense MLP beside the experts in every layer (0: none)
    embed_scale: bool = False       # the embedding scaled by sqrt(hidden)
    softcap: float | None = None    # final logits: cap * tanh(logits / cap)
    attn_scale: float | None = None  # attention's logit scale (None: 1/sqrt(head dim))
    v_norm: bool = False            # values RMS-normalised (no weight) before attention
    # per layer, where they differ: (kv heads, head dim, keys are values, rope key) (None: kv_heads, head_dim)
    layer_attn: tuple | None = None

    def attn_of(self, layer: int) -> tuple[int, int, bool, str | None]:
        """Decoder layer `layer`'s attention: (kv heads, head dim, values are its keys, rope table key)."""
        return self.layer_attn[layer] if self.layer_attn is not None else (self.kv_heads, self.head_dim, False, None)

    @property
    def kv_shape(self) -> tuple[int, int, int]:
        """What the KV cache holds a token per attending layer: (heads, key width, value width); MLA: one
        row of [latent; rope key] and no separate values."""
        if self.mla is not None:
            return 1, self.mla[1] + self.mla[3], 0
        if self.layer_attn is not None:  # the widest layer's (layers of several widths keep their own rows)
            g, hd = max(a[0] for a in self.layer_attn), max(a[1] for a in self.layer_attn)
            return g, hd, hd
        return self.kv_heads, self.head_dim, self.head_dim

    @property
    def decoder_layers(self) -> int:
        return self.dense_first + self.layers

    def decoder(self, layer: int) -> int:
        """The decoder layer holding MoE layer `layer`."""
        return layer + self.dense_first

    def window(self, layer: int) -> int | None:
        """The sliding window of one layer's attention (None: it sees every earlier position)."""
        return self.layer_windows[layer] if self.layer_windows is not None else self.sliding_window

    def mixer(self, layer: int) -> str:
        return self.mixers[layer] if self.mixers is not None else "attention"

    @property
    def attention_layers(self) -> int:
        """Layers whose mixer keeps keys and values (the others keep a fixed-size state)."""
        return self.decoder_layers if self.mixers is None else sum(k != "deltanet" for k in self.mixers)

    def state_bytes(self) -> int:
        """Bytes of one sequence's recurrent state (fp32 conv and delta-rule states of every DeltaNet layer)."""
        if self.linear is None:
            return 0
        hk, dk, hv, dv, k = self.linear
        return 4 * (self.decoder_layers - self.attention_layers) * ((2 * hk * dk + hv * dv) * (k - 1) + hv * dk * dv)

    def sequence_bytes(self, ctx: int, elem: int = 2) -> tuple[int, int]:
        """One sequence's memory at ctx tokens: (keys and values of the attention layers at elem bytes a
        value, the linear-attention state with the copies a cache keeps: engine/layers/state.py)."""
        from ..layers.state import SNAPSHOTS

        g, hk, hv = self.kv_shape
        kv = self.attention_layers * g * (hk + hv) * ctx * elem
        return kv, self.state_bytes() * (1 + SNAPSHOTS)

    @property
    def rotary(self) -> int:
        return self.rot_dim or self.head_dim

    @property
    def adapter(self) -> Family:
        return FAMILIES[self.family]

    def expert_params(self) -> int:
        return 3 * self.hidden * self.ffn


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
    pre = ""
    if fam.text_config:  # a VLM release: the language model's fields are in text_config
        raw, pre = raw.get("text_config"), "text_config."
        if not isinstance(raw, dict):
            raise ModelError(path, f"lacks the object 'text_config' (a {fam.name} release keeps the language "
                             "model's fields there)")

    def field(name: str, required: bool = True, lo: int = 1):
        v = raw.get(name)
        if v is None:
            if required:
                raise ModelError(path, f"lacks the field '{pre}{name}'")
            return None
        if not isinstance(v, int) or isinstance(v, bool):
            raise ModelError(path, f"'{pre}{name}' is {v!r}; it must be a whole number")
        if not lo <= v <= LIMITS.get(name, 1 << 20):
            raise ModelError(path, f"'{pre}{name}' is {v:,}; Mixdesk accepts {lo} to {LIMITS.get(name, 1 << 20):,}")
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
    k = raw.get(fam.top_k_field)
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= experts:
        raise ModelError(path, f"'{pre}{fam.top_k_field}' is {k!r}; it must be a whole number from 1 to "
                         f"{experts_name} ({experts})")
    if fam.dense_first:  # GLM: leading dense layers, then experts in every layer
        kinds = raw.get(fam.dense_first)
        if isinstance(kinds, list):  # mlp_layer_types: "dense" layers first, then "sparse" ones
            first = next((i for i, t in enumerate(kinds) if t != "dense"), len(kinds))
            if len(kinds) != layers or any(t != "sparse" for t in kinds[first:]):
                raise ModelError(path, f"'{pre}{fam.dense_first}' must list {layers} entries, the dense layers first "
                                 "and then only 'sparse' ones")
        else:
            first = field(fam.dense_first, required=False, lo=0) or 0
        if first >= layers:
            raise ModelError(path, f"'{pre}{fam.dense_first}' is {first}; it must be below "
                             f"'{pre}num_hidden_layers' ({layers}): a model with no expert layers is not an MoE")
        field("intermediate_size", required=first > 0)
        for name in ("n_group", "topk_group", "n_shared_experts"):
            field(name, required=False, lo=0 if name == "n_shared_experts" else 1)
        groups, chosen = raw.get("n_group") or 1, raw.get("topk_group") or 1
        if experts % groups or chosen > groups or k > experts // groups * chosen:
            raise ModelError(path, f"'{pre}n_group' ({groups}) must divide the {experts} experts, "
                             f"'{pre}topk_group' ({chosen}) be at most n_group, and the chosen groups hold "
                             f"at least 'num_experts_per_tok' ({k}) experts")
    rp = raw.get("rope_parameters") or {}
    f = rp.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)) if isinstance(rp, dict) else 1.0
    if not isinstance(f, (int, float)) or isinstance(f, bool) or not 0 < f <= 1 or int(head_dim * f) % 2:
        raise ModelError(path, f"'{pre}rope_parameters.partial_rotary_factor' is {f!r}; it must be in (0, 1] and "
                         f"rotate an even number of each head's {head_dim} dims")
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
    if fam.sandwich:  # Gemma 4: Mixdesk runs its MoE models, without per-layer inputs or shared keys
        if raw.get("enable_moe_block") is not True:
            raise ModelError(path, f"'{pre}enable_moe_block' is {raw.get('enable_moe_block')!r}: a dense Gemma 4; "
                             "Mixdesk runs Mixture-of-Experts models (Gemma 4 26B-A4B)")
        for name in ("hidden_size_per_layer_input", "num_kv_shared_layers"):
            if raw.get(name):
                raise ModelError(path, f"'{pre}{name}' is {raw[name]!r}; Mixdesk runs Gemma 4 models without "
                                 "per-layer inputs and shared keys (the MoE release has neither)")
    if fam.mixer == "mla":
        from ..layers import mla

        mla.check_config(raw, field, lambda why: ModelError(path, why), pre, hidden)
    if fam.mixers:  # layers of parts: each part checks its own fields (engine/layers)
        from ..layers import check_mixers

        check_mixers(raw, fam, layers, hidden, field, lambda why: ModelError(path, why), pre)
    params = (layers * ((experts * ffn + (shared or 0)) * 3 * hidden + hidden * (heads + 2 * kv) * head_dim * 2)
              + 2 * vocab * hidden)
    if params > MAX_PARAMS:
        raise ModelError(path, f"describes a model of {params / 1e12:,.1f} trillion parameters; the largest "
                         f"Mixdesk accepts is {MAX_PARAMS / 1e12:.0f} trillion")


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
    if fam.text_config:
        cfg = cfg.text_config
    try:
        heads = cfg.num_attention_heads
        if fam.sandwich:  # Gemma 4: per layer (Dims.layer_attn); the model-wide values are the first layer's
            head_dim, kv_heads = cfg.per_layer_config[0].head_dim, cfg.per_layer_config[0].num_key_value_heads
        else:
            head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
            kv_heads = cfg.num_key_value_heads
        window = getattr(cfg, "sliding_window", None) or None
        if getattr(cfg, "use_sliding_window", True) is False:
            window = None
        clip = getattr(cfg, "clip_qkv", None) if fam.clip_qkv else None
        dense_first = _dense_first(cfg, fam)
        qk_norm = fam.qk_norm if not fam.qk_norm_field or getattr(cfg, fam.qk_norm_field, False) else None
        partial = float((getattr(cfg, "rope_parameters", None) or {}).get("partial_rotary_factor", 1.0))
        rot = int(head_dim * partial)
        shared = int(getattr(cfg, "shared_expert_intermediate_size", 0) or 0)
        if fam.shared_expert and not fam.shared_gated:  # GLM: n_shared_experts of the routed experts' width
            shared = cfg.moe_intermediate_size * int(getattr(cfg, "n_shared_experts", 1) or 0)
        fields = dict(
            layers=cfg.num_hidden_layers - dense_first, hidden=cfg.hidden_size, ffn=getattr(cfg, fam.expert_ffn_field),
            experts=getattr(cfg, fam.experts_field, None) or cfg.num_local_experts, top_k=getattr(cfg, fam.top_k_field),
            heads=heads,
            kv_heads=kv_heads, head_dim=head_dim, vocab=cfg.vocab_size,
            rms_eps=float(cfg.rms_norm_eps), max_positions=cfg.max_position_embeddings,
            tie_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)), sliding_window=window,
            family=fam.model_type, norm_topk=bool(getattr(cfg, "norm_topk_prob", fam.norm_topk_default)),
            qk_norm=qk_norm, qkv_bias=bool(getattr(cfg, fam.qkv_bias, False)) if fam.qkv_bias else False,
            shared_ffn=shared if fam.shared_expert else 0, shared_gated=fam.shared_gated,
            clip_qkv=float(clip) if clip is not None else None,
            router_kind=fam.router_kind, router_bias=fam.router_bias, act=fam.act,
            swiglu=(float(getattr(cfg, "swiglu_alpha", 1.702)), float(getattr(cfg, "swiglu_limit", 7.0))),
            attn_sinks=fam.attn_sinks, o_bias=bool(getattr(cfg, fam.o_bias, False)) if fam.o_bias else False,
            layer_windows=tuple(window if t == "sliding_attention" else None for t in cfg.layer_types)
            if fam.layer_types else None,
            rot_dim=rot if rot != head_dim else 0, dense_first=dense_first,
            dense_ffn=int(cfg.intermediate_size) if dense_first else 0,
            route_groups=(int(getattr(cfg, "n_group", 1) or 1), int(getattr(cfg, "topk_group", 1) or 1)),
            route_scale=float(getattr(cfg, "routed_scaling_factor", 1.0) or 1.0),
        )
        fields.update(_parts(cfg, fam) if fam.mixers else {})
        fields.update(_latent(cfg, fam) if fam.mixer == "mla" else {})
        fields.update(_sandwich(cfg, fam) if fam.sandwich else {})
        return Dims(**fields)
    except (AttributeError, TypeError, ZeroDivisionError) as e:
        raise ModelError(path, f"lacks a field Mixdesk needs: {e}") from None




def _dense_first(cfg, fam: Family) -> int:
    """Leading decoder layers with a dense MLP: a count field, or mlp_layer_types' leading "dense" entries."""
    if not fam.dense_first:
        return 0
    v = getattr(cfg, fam.dense_first, 0) or 0
    if isinstance(v, (list, tuple)):
        return next((i for i, t in enumerate(v) if t != "dense"), len(v))
    return int(v)


def _sandwich(cfg, fam: Family) -> dict:
    """The Dims fields of Gemma 4: its per-layer attention shapes, rope tables, norms and MLP beside the experts."""
    per, kinds = cfg.per_layer_config, cfg.layer_types
    attn = tuple((per[i].num_key_value_heads, per[i].head_dim,
                  bool(cfg.attention_k_eq_v) and kinds[i] != "sliding_attention", kinds[i]) for i in range(len(kinds)))
    window = cfg.sliding_window
    return dict(sandwich=True, parallel_ffn=int(cfg.intermediate_size), embed_scale=True,
                softcap=float(cfg.final_logit_softcapping) if cfg.final_logit_softcapping else None, attn_scale=1.0,
                v_norm=True, layer_attn=attn, act="gelu_tanh", router_kind="gemma", rot_dim=0,
                layer_windows=tuple(window if k == "sliding_attention" else None for k in kinds))


def _latent(cfg, fam: Family) -> dict:
    """The Dims fields of a family whose attention is MLA (GLM-4.7-Flash)."""
    n = cfg.num_hidden_layers
    return dict(mixers=("mla",) * n, kv_heads=1, head_dim=cfg.qk_rope_head_dim,
                mla=(cfg.q_lora_rank or 0, cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim,
                     cfg.v_head_dim), rope_interleave=bool(getattr(cfg, "rope_interleave", True)))


def _parts(cfg, fam: Family) -> dict:
    """The Dims fields of a family whose layers are parts of several kinds (Qwen3.5-MoE)."""
    mixers = tuple(fam.mixers[t] for t in cfg.layer_types)
    linear = None
    if "deltanet" in mixers:
        linear = (cfg.linear_num_key_heads, cfg.linear_key_head_dim, cfg.linear_num_value_heads,
                  cfg.linear_value_head_dim, cfg.linear_conv_kernel_dim)
    return dict(mixers=mixers, linear=linear, attn_gate=fam.attn_gate, norm_offset=fam.norm_offset, deltanet_inputs=fam.deltanet_inputs)
