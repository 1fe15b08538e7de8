"""Mixtral (and checkpoints in its layout): `block_sparse_moe.experts.E.w1|w2|w3`, a softmax router
whose top-k weights are renormalised, SwiGLU experts, plain grouped-query attention."""
from .family import Family

MIXTRAL = Family(name="Mixtral", model_type="mixtral", config_class="MixtralConfig", moe="block_sparse_moe")
