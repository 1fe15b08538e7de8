"""Tiny models that speak Qwen3's, GPT-OSS's or Gemma 4's chat format, and replies scripted through the real
engine: a tiny model cannot produce reasoning or tool-call markup by chance, so the tests tell the
generator which tokens to pick (Generator.pick) while everything else runs as it does for a user:
the chat template (the published one, resources/templates/), tokenisation, the engine thread, the
reply's parser, the server and the window.

    folder = write_chat_model(tmp_path / "qwen", "qwen3")
    ... load it ...
    script(session.loaded.generator, "<think>\\nhm\\n</think>\\n\\nHello!")

Each new reply takes the next scripted text (then the end-of-sequence token); a reply asked for
after the script ran out gets "(unscripted)".
"""
from __future__ import annotations

import json
import threading
from pathlib import Path

RESOURCES = Path(__file__).resolve().parents[1] / "resources" / "templates"
STYLES = {
    # family of the tiny model, template file, special tokens, tokens that are added but not special, end tokens
    "qwen3": ("qwen3_moe", "qwen3-chat_template.jinja", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
              ["<think>", "</think>", "<tool_call>", "</tool_call>"], ["<|im_end|>"]),
    "harmony": ("gpt_oss", "gpt-oss-chat_template.jinja",
                ["<|endoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>",
                 "<|return|>", "<|call|>", "<|startoftext|>"], [], ["<|return|>", "<|call|>"]),
    # a Gemma 4 whose generation_config names only <turn|> (engine/prompts/formats REPLY_ENDS adds <|tool_response>)
    "gemma4": ("gemma4", "gemma-4-chat_template.jinja",
               ["<|endoftext|>", "<bos>", "<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|tool_call>",
                "<tool_call|>", "<|tool_response>", "<tool_response|>", "<|tool>", "<tool|>", '<|"|>'], [],
               ["<turn|>"]),
}


def write_chat_model(folder: str | Path, style: str) -> Path:
    """A tiny random model of the style's family with a byte-level tokenizer that knows the
    format's markup and the style's published chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from engine.sources.tiny_model import CORPUS, write_tiny_model

    family, template, specials, added, ends = STYLES[style]
    folder = write_tiny_model(folder, family, tokenizer=False, vocab=400)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=360, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=ends[0], pad_token="<|endoftext|>")
    fast.add_tokens(added)
    fast.chat_template = (RESOURCES / template).read_text()
    fast.save_pretrained(str(folder))
    eos = [fast.convert_tokens_to_ids(t) for t in ends]
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    cfg = json.loads((folder / "config.json").read_text())
    cfg["eos_token_id"] = eos if len(eos) > 1 else eos[0]
    cfg["max_position_embeddings"] = 4096  # prompts with tools: a byte-level tokenizer of a tiny corpus is long-winded
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


class Script:
    """Generator.pick for scripted replies: each sequence (its history list) takes the next text."""

    def __init__(self, generator, replies):
        self.tok, self.eos = generator.tok, min(generator.eos_ids)
        self.replies = list(replies)
        self.lock = threading.Lock()
        self.running: dict[int, tuple[list, list[int]]] = {}  # id(history) -> (history, ids left)

    def __call__(self, logits, params, history, gen):
        with self.lock:
            key = id(history)
            if key not in self.running or self.running[key][0] is not history:
                text = self.replies.pop(0) if self.replies else "(unscripted)"
                ids = self.tok.encode(text, add_special_tokens=False) + [self.eos]
                self.running[key] = (history, ids)
            left = self.running[key][1]
            return left.pop(0) if left else self.eos


def script(generator, *replies: str) -> Script:
    """From now on, the generator's replies are these texts, in order."""
    s = generator.pick = Script(generator, replies)
    return s
