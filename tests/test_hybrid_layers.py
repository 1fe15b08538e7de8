"""Qwen3.5-MoE's hybrid layers (engine/layers): the Gated DeltaNet state beside the KV cache carries a
conversation across turns exactly (its copies at turn boundaries), bad configs are refused by field,
and what Mixdesk does not run (the vision tower, an MTP head) is skipped and said once."""
import json
import logging

import pytest
import torch

from engine.files.checkpoint import Checkpoint
from engine.protocol.errors import ModelError
from engine.runtime.generate import Done, SamplingParams, drive
from engine.kv.cache import KVCaches
from engine.runtime.load import load
from engine.sources.tiny_model import write_tiny_model


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("q35"), "qwen3_5_moe", layers=4, seed=7)


def test_a_conversation_resumes_from_the_turn_boundary_state_exactly(hybrid):
    """Three turns in the chat's cache: each later turn reuses the earlier prompt (from the copy of the
    DeltaNet state taken when that prompt was read) and gives the tokens a cold prefill gives."""
    loaded = load(hybrid, "cpu", device="cpu", dtype="fp32", ctx=256)
    gen = loaded.generator
    caches = KVCaches(gen.new_cache, 1)

    def chat(prompt, n, fresh=False):
        cache = caches.claim("chat", prompt, fresh)
        events = list(drive(gen.sequence(prompt, SamplingParams(max_new_tokens=n), None, cache), gen.forward))
        assert isinstance(events[-1], Done)
        return events[-1]

    msgs = [{"role": "user", "content": "hello"}]
    p1 = loaded.prompts.chat(msgs)
    first = chat(p1, 6)
    assert caches.chat.state is not None and len(p1) in caches.chat.state.snapshots
    for word in ("world", "again"):
        msgs += [{"role": "assistant", "content": first.text}, {"role": "user", "content": word}]
        p = loaded.prompts.chat(msgs)
        warm = chat(p, 8)
        # the live state stands for the reply's tokens too, which the template renders differently:
        # the turn resumes from the copy of the state at the earlier prompt's end
        assert 0 < warm.reused_tokens < len(p) and warm.reused_tokens in caches.chat.state.snapshots
        cold = chat(p, 8, fresh=True)
        assert cold.reused_tokens == 0 and cold.token_ids == warm.token_ids
        first = warm


def test_the_live_state_is_kept_when_the_prompt_extends_every_cached_token(hybrid):
    loaded = load(hybrid, "cpu", device="cpu", dtype="fp32", ctx=128)
    gen = loaded.generator
    caches = KVCaches(gen.new_cache, 1)
    prompt = [5, 9, 13, 40, 41, 42]
    cache = caches.claim("chat", prompt)
    first = list(drive(gen.sequence(prompt, SamplingParams(max_new_tokens=4), None, cache), gen.forward))[-1]
    more = cache.tokens + [7, 8]  # what was read (the prompt, then all but the last reply token) and more
    cache = caches.claim("chat", more)
    assert len(cache.tokens) == len(prompt) + len(first.token_ids) - 1  # the live state, not a copy
    warm = list(drive(gen.sequence(more, SamplingParams(max_new_tokens=5), None, cache), gen.forward))[-1]
    cold = list(drive(gen.sequence(more, SamplingParams(max_new_tokens=5), None, gen.new_cache()), gen.forward))[-1]
    assert warm.token_ids == cold.token_ids and warm.reused_tokens == len(more) - 2


def _config(folder):
    return json.loads((folder / "config.json").read_text())


@pytest.mark.parametrize("change, field", [
    (lambda t: t.update(layer_types=t["layer_types"][:-1]), r"'text_config.layer_types' is 3 entries"),
    (lambda t: t.update(linear_num_value_heads=3), r"'text_config.linear_num_value_heads' \(3\) must be a multiple"),
    (lambda t: t.update(layer_types=["linear_attention"] * 3 + ["mamba"]), r"'text_config.layer_types' names 'mamba'"),
    (lambda t: t.update(linear_conv_kernel_dim=0), r"'text_config.linear_conv_kernel_dim' is 0"),
    (lambda t: t.update(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 1.5}),
     r"'text_config.rope_parameters.partial_rotary_factor' is 1.5"),
])
def test_an_inconsistent_hybrid_config_is_one_error_naming_the_field(hybrid, tmp_path, change, field):
    import shutil

    folder = tmp_path / "bad"
    shutil.copytree(hybrid, folder)
    cfg = _config(folder)
    change(cfg["text_config"])
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="config.json: " + field):
        Checkpoint(folder)


def test_the_vision_tower_and_an_mtp_head_are_skipped_and_said_once(hybrid, tmp_path, caplog):
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / "with-mtp"
    shutil.copytree(hybrid, folder)
    ts = load_file(str(folder / "model.safetensors"))
    ts["mtp.fc.weight"] = torch.zeros(4, 4)  # as the release ships its multi-token-prediction head
    save_file(ts, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with caplog.at_level(logging.WARNING):
        ck = Checkpoint(folder)
    said = [r.getMessage() for r in caplog.records if "not run" in r.getMessage()]
    assert len(said) == 1 and "the vision tower and the multi-token-prediction head" in said[0]
    assert ck.skipped_note in said[0] and "model.visual" not in " ".join(ck.where)
    assert "model.layers.0.linear_attn.A_log" in ck.where  # the language model's names, read as "model."


def test_the_state_is_counted_per_sequence(hybrid):
    d = Checkpoint(hybrid).dims
    hk, dk, hv, dv, k = d.linear
    assert d.attention_layers == 1 and d.mixers.count("deltanet") == 3
    assert d.state_bytes() == 4 * 3 * ((2 * hk * dk + hv * dv) * (k - 1) + hv * dk * dv)
    loaded = load(hybrid, "cpu", device="cpu", dtype="fp32", ctx=64)
    cache = loaded.generator.new_cache()
    assert cache.k.shape[0] == 1 and cache.state.nbytes == d.state_bytes()


@pytest.mark.parametrize("n, heads, dk, dv", [(8, 4, 16, 24), (64, 2, 16, 16), (150, 3, 32, 40)])
def test_the_chunked_delta_rule_is_the_token_by_token_rule(n, heads, dk, dv):
    """A prompt's chunked form (engine/layers/delta_rule.py) gives the outputs and final state of the
    rule as written, over chunk edges and a padded last chunk, from a non-zero state."""
    from engine.layers import delta_rule

    g = torch.Generator().manual_seed(n)
    q = torch.nn.functional.normalize(torch.randn(n, heads, dk, generator=g), dim=-1) * dk ** -0.5
    k = torch.nn.functional.normalize(torch.randn(n, heads, dk, generator=g), dim=-1)
    v = torch.randn(n, heads, dv, generator=g)
    decay, beta = -2 * torch.rand(n, heads, generator=g), torch.rand(n, heads, generator=g)
    s0 = 0.1 * torch.randn(heads, dk, dv, generator=g)
    s1, s2 = s0.clone(), s0.clone()
    want = delta_rule.recurrent(q, k, v, decay, beta, s1)
    got = delta_rule.chunked(q, k, v, decay, beta, s2, chunk=32)
    assert (got - want).abs().max() < 1e-5 and (s2 - s1).abs().max() < 1e-5


def test_experts_fused_per_layer_are_read_per_expert_from_the_file(hybrid, tmp_path):
    """A release that stores each layer's experts as 3-D gate_up_proj [E, 2I, D] and down_proj [E, D, I]
    (transformers' own layout) runs exactly as the per-expert checkpoint: each expert is a byte range
    of the file, named per expert (engine/files/fused_experts.py split_fused)."""
    import re
    import shutil

    from safetensors.torch import load_file, save_file

    from engine.model.forward import MoEModel
    from engine.placement import Placement, Tier

    folder = tmp_path / "fused"
    shutil.copytree(hybrid, folder)
    ts = load_file(str(folder / "model.safetensors"))
    d = Checkpoint(hybrid).dims
    for l in range(d.layers):
        p = f"model.language_model.layers.{l}.mlp.experts."
        take = lambda w: [ts.pop(f"{p}{e}.{w}.weight") for e in range(d.experts)]  # noqa: E731
        gate, up, down = take("gate_proj"), take("up_proj"), take("down_proj")
        ts[p + "gate_up_proj"] = torch.stack([torch.cat([g, u]) for g, u in zip(gate, up)])
        ts[p + "down_proj"] = torch.stack(down)
    save_file(ts, str(folder / "model.safetensors"), metadata={"format": "pt"})
    assert not any(re.search(r"experts\.\d+\.", n) for n in load_file(str(folder / "model.safetensors")))
    pl = Placement.random(d.layers, d.experts, [Tier.GPU16, Tier.CPU16], seed=4)
    ids = torch.arange(3, 23)
    a, b = (MoEModel(Checkpoint(f), pl, torch.device("cpu"), torch.float32) for f in (hybrid, folder))
    assert torch.equal(a.forward(ids, a.new_cache(32), 0, all_logits=True),
                       b.forward(ids, b.new_cache(32), 0, all_logits=True))


@pytest.mark.parametrize("template, fmt", [("qwen3.5", "qwen_xml"), ("glm-4.7-flash", "glm")])
def test_a_2026_template_picks_its_reply_format_and_opens_the_reasoning(hybrid, tmp_path, template, fmt):
    """A model folder holding Qwen3.5's or GLM-4.7's published template replies in that family's format
    (engine/prompts/formats/qwen_xml.py, glm.py); the prompt ends inside <think>, so the reply starts as reasoning."""
    import shutil
    from pathlib import Path

    folder = tmp_path / "m"
    shutil.copytree(hybrid, folder)
    src = Path(__file__).resolve().parents[1] / "resources" / "templates" / f"{template}-chat_template.jinja"
    (folder / "chat_template.jinja").write_text(src.read_text())
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    loaded = load(folder, "cpu", device="cpu", dtype="fp32", ctx=512)
    assert loaded.prompts.template.format == fmt
    ids = loaded.prompts.chat([{"role": "user", "content": "What is 2+2?"}])
    parser = loaded.prompts.parser(ids)
    deltas = parser.feed("adding\n</think>\n\nIt is 4.") + parser.finish()
    said = {k: "".join(d.text for d in deltas if d.part == k) for k in ("reasoning", "content")}
    assert said["reasoning"].strip() == "adding" and said["content"] == "It is 4."


@pytest.mark.parametrize("family, change, field", [
    ("glm4_moe_lite", {"kv_lora_rank": 4096}, r"'kv_lora_rank' \(4096\) must be smaller than 'hidden_size' \(64\)"),
    ("glm4_moe_lite", {"qk_rope_head_dim": 7}, r"'qk_rope_head_dim' \(7\) must be even"),
    ("glm4_moe", {"n_group": 3}, r"'n_group' \(3\) must divide the 4 experts"),
    ("glm4_moe", {"first_k_dense_replace": 2}, r"'first_k_dense_replace' is 2; it must be below 'num_hidden_layers' \(2\)"),
    ("gemma4", {"enable_moe_block": False}, r"'text_config.enable_moe_block' is False: a dense Gemma 4"),
    ("gemma4", {"hidden_size_per_layer_input": 256}, r"'text_config.hidden_size_per_layer_input' is 256"),
])
def test_an_inconsistent_2026_config_is_one_error_naming_the_field(tmp_path, family, change, field):
    folder = write_tiny_model(tmp_path / family, family, seed=1, tokenizer=False)
    cfg = _config(folder)
    (cfg["text_config"] if "text_config" in cfg else cfg).update(change)
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="config.json: " + field):
        Checkpoint(folder)


def test_prompt_chunks_and_batched_decode_give_the_one_sequence_logits(hybrid):
    """The DeltaNet state carries across a prompt read in chunks (token by token below 8, chunked above)
    and each sequence of a batched decode step reads its own state: the logits of one plain pass."""
    from engine.model.forward import MoEModel
    from engine.placement import Placement, Tier

    ck = Checkpoint(hybrid)
    d = ck.dims
    m = MoEModel(ck, Placement.random(d.layers, d.experts, [Tier.GPU16, Tier.CPU16], seed=1), torch.device("cpu"),
                 torch.float32)
    a, b = torch.arange(3, 23), torch.arange(40, 60)
    whole = m.forward(a, m.new_cache(32), 0, all_logits=True)
    cache = m.new_cache(32)
    parts = [m.forward(a[s:e], cache, s, all_logits=True) for s, e in ((0, 5), (5, 17), (17, 20))]
    assert (torch.cat(parts) - whole).abs().max() < 1e-4
    ca, cb = m.new_cache(32), m.new_cache(32)
    m.forward(a[:-1], ca, 0)
    m.forward(b[:-1], cb, 0)
    both = m.forward(torch.stack([a[-1], b[-1]]), [ca, cb], [19, 19])  # one token each, one forward
    alone_b = m.forward(b, m.new_cache(32), 0)
    assert (both[0] - whole[-1]).abs().max() < 1e-4 and (both[1] - alone_b[-1]).abs().max() < 1e-4
