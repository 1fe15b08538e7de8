"""A decoder layer is parts: a mixer (attention of a kind: engine/layers/attention.py; or Gated
DeltaNet linear attention: engine/layers/deltanet.py) and a feed-forward (the MoE block: routed
experts with a router, optionally a shared expert: engine/model/moe.py), each behind an RMSNorm, each
adding to the residual stream. A family (engine/families) is the recipe: its config says which mixer
each layer has (`Dims.mixers`) and the parts read their own tensors and fields. Placement, tiers,
planner and migration see only the experts."""
from __future__ import annotations

from . import attention, deltanet, mla

MIXERS = {"attention": attention, "deltanet": deltanet, "mla": mla}


class Layer:
    """One decoder layer: x += mixer(ln1(x)); x += ffn(ln2(x)). The feed-forward is the layer's MoE
    block (also in model.moe, by MoE layer) or a dense MLP (engine/model/feed_forward.py)."""

    def __init__(self, ln1, mixer, ln2, ffn):
        self.ln1, self.mixer, self.ln2, self.ffn = ln1, mixer, ln2, ffn

    def tensors(self) -> list:
        """The layer's dense weights (a MoE block's are counted with the blocks: model._dense_weights)."""
        own = self.ffn.tensors() if hasattr(self.ffn, "tensors") else []
        return [self.ln1, self.ln2] + self.mixer.tensors() + own

    def forward(self, m, x, run):
        """x [T, D], the residual stream -> the stream after this layer (m: the model, run: the forward's state)."""
        x = x + self.mixer(m, m._rms(x, self.ln1), run)
        block = self.ffn
        if getattr(block, "record", None) is not None:
            block.residual = x  # calibration measures perturbations relative to the stream
        return x + block(m._rms(x, self.ln2))

    # the attention mixer's matrices, as the native step and the tools read them off a layer
    wqkv = property(lambda s: s.mixer.wqkv, lambda s, w: setattr(s.mixer, "wqkv", w))
    wo = property(lambda s: s.mixer.wo, lambda s, w: setattr(s.mixer, "wo", w))


def shapes(d, layer: int) -> dict[str, tuple[int, ...]]:
    """Layer `layer`'s mixer tensors and norms (the MoE block's are the family's: checkpoint.dense_shapes)."""
    p = f"model.layers.{layer}."
    s = {p + "input_layernorm.weight": (d.hidden,), p + "post_attention_layernorm.weight": (d.hidden,),
         **MIXERS[d.mixer(layer)].shapes(d, p, layer)}
    if d.sandwich:
        from .sandwich import shapes as sandwich_shapes

        s.update(sandwich_shapes(d, p))
    return s


def check_mixers(raw: dict, fam, layers: int, hidden: int, field, error, pre: str) -> None:
    """A family of several mixers: config's layer_types names one known mixer per layer, and each
    mixer's own fields are consistent (one clear error naming the field)."""
    kinds = raw.get("layer_types")
    if not isinstance(kinds, list) or len(kinds) != layers:
        n = f"{len(kinds)} entries" if isinstance(kinds, list) else repr(kinds)
        raise error(f"'{pre}layer_types' is {n}; it must list one mixer for each of the {layers} layers "
                    f"('{pre}num_hidden_layers')")
    bad = next((k for k in kinds if k not in fam.mixers), None)
    if bad is not None:
        raise error(f"'{pre}layer_types' names {bad!r}; a {fam.name} layer is one of {', '.join(fam.mixers)}")
    if "deltanet" in {fam.mixers[k] for k in kinds}:
        deltanet.check_config(raw, field, error, pre)
