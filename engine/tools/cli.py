"""`mixdesk` command line: chat, bench, tiny-model. Errors print one line, never a traceback."""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

from ..runtime.client import for_terminal, progress_bar
from .cli_reply import ReadingBar, Reply
from ..protocol.errors import MixdeskError


def _int(lo: int, hi: int = 10**9):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{v} is out of range: it must be between {lo:,} and {hi:,}")
        return v
    return parse


def _float(lo: float, hi: float, lo_open: bool = False):
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(v) or v < lo or v > hi or (lo_open and v == lo):
            raise argparse.ArgumentTypeError(f"{text} is out of range: it must be {'above' if lo_open else 'at least'} "
                                             f"{lo:g} and at most {hi:g}")
        return v
    return parse


def _placement(text: str) -> str:
    if text in ("auto", "gpu", "cpu"):
        return text
    if text.startswith("random:"):
        seed = text.split(":", 1)[1]
        if not seed.isdigit():
            raise argparse.ArgumentTypeError(f"{text!r}: the seed after 'random:' must be a whole number")
        return text
    if text.endswith(".json"):
        return text
    raise argparse.ArgumentTypeError(f"{text!r} is not a placement: use auto, gpu, cpu, random:SEED or a .json file")


def _device(text: str) -> str:
    if text in ("cpu", "cuda") or (text.startswith("cuda:") and text[5:].isdigit()):
        return text
    raise argparse.ArgumentTypeError(f"{text!r} is not a device: use cpu, cuda or cuda:N")


MAX_CTX = 1 << 20


def _ctx(text: str):
    """--ctx: auto, or a whole number of tokens in range."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return _int(16, MAX_CTX)(text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{e}; or auto (the model's own context as memory allows)") from None


def _kv_bits(text: str) -> int:
    """--kv-bits: 16 or 8."""
    if text.strip() in ("16", "8"):
        return int(text)
    raise argparse.ArgumentTypeError(f"{text!r} is not a keys-and-values format: use 16 (the model's dtype) "
                                     "or 8 (int8 with a scale per 32 values: about half the memory a token)")


KV_BITS_HELP = ("keys and values stored at 16 bits (default: the model's dtype) or 8 (int8 with a scale per 32 "
                "values: about half the memory a token, so auto opens about twice the context where memory bounds it)")


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="a model folder (safetensors; Mixtral, Qwen3-MoE, OLMoE, Qwen2-MoE or GPT-OSS), a GGUF file "
                   "(or a folder holding one, or the first of split files), or a Hugging Face repo id "
                   "(owner/name, downloaded into the HF cache); default: the built-in demo")
    p.add_argument("--placement", default="auto", type=_placement,
                   help="auto (planned, re-placed live) | gpu | cpu | random:SEED | a JSON placement file; "
                   "anything but auto is kept as given (default: auto)")
    p.add_argument("--device", default=None, type=_device, help="cpu | cuda | cuda:N (default: CUDA when available)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"],
                   help="16-bit compute format; auto = bf16 on GPUs, the faster of bf16/fp16 measured on CPUs")
    p.add_argument("--ctx", type=_ctx, default="auto", metavar="auto|N",
                   help="context length: auto (default: the model's own, as far as memory allows its keys and "
                   "values beside the weights) or N tokens (refused with the figures where memory cannot hold it)")
    p.add_argument("--kv-bits", type=_kv_bits, default=16, metavar="16|8", help=KV_BITS_HELP)


def _params(a):
    from ..protocol.sampling import SamplingParams

    return SamplingParams(max_new_tokens=a.max_new_tokens, temperature=a.temperature, top_p=a.top_p,
                          top_k=a.top_k, repetition_penalty=a.repetition_penalty, seed=a.seed,
                          stop=tuple(a.stop or ())).check()


def _load(client, a, placement: str | None = None):
    return client.load(a.model or "demo", placement or a.placement, a.device, a.dtype, a.ctx, a.kv_bits)


# the terminal chat's slash commands (a line that is one /word is never sent to the model)
CHAT_COMMANDS = (("/help", "list these commands"), ("/exit", "end the chat (also Ctrl+D)"), ("/quit", "the same as /exit"))


def chat_command(line: str) -> str | None:
    """What the terminal chat does with a typed line: "exit", "help", "unknown", or None (a message)."""
    word = line.strip()
    if word in ("/exit", "/quit"):
        return "exit"
    if word == "/help":
        return "help"
    if word.startswith("/") and word[1:].isalpha():
        return "unknown"
    return None


def cmd_chat(a, on_event=None) -> int:
    """The terminal chat: a client of the engine thread, like the window."""
    from ..runtime.client import EngineError

    params = _params(a)
    client = for_terminal(a.quiet, on_event=on_event)
    try:
        loaded = _load(client, a)
        if not a.quiet:
            print(loaded.description, file=sys.stderr)
            print(loaded.context.summary(), file=sys.stderr)
            if loaded.memory:
                print(loaded.memory, file=sys.stderr)
            if a.prompt is None:
                print("Type a message; /help lists the commands, /exit ends the chat.", file=sys.stderr)
        system = [{"role": "system", "content": a.system}] if a.system else []
        turns: list[dict] = []
        prompts = [a.prompt] if a.prompt is not None else None
        while True:
            if prompts is not None:
                if not prompts:
                    return 0
                user = prompts.pop(0)
            else:
                try:
                    user = input("\nyou> ")
                except EOFError:
                    return 0
                command = chat_command(user)
                if command == "exit":
                    return 0
                if command == "help":
                    print("\n".join(f"  {name:<6}  {what}" for name, what in CHAT_COMMANDS))
                    continue
                if command == "unknown":
                    print(f"unknown command {user.strip()}: /help lists the commands")
                    continue
                if not user.strip():
                    continue
            turns.append({"role": "user", "content": user})
            if prompts is None:
                print("mixdesk> ", end="", flush=True)
            bar = ReadingBar(on=not a.quiet, prefix="mixdesk> " if prompts is None else "")
            shown = Reply(bar)
            while True:
                try:
                    fin = client.generate(system + turns, params=params, on_text=shown.content,
                                          on_reasoning=shown.reasoning, on_reading=bar.show)
                    break
                except EngineError as e:
                    if e.kind != "ContextOverflow" or prompts is not None:
                        raise
                    if len(turns) <= 1:  # this message alone does not fit: say so, carry on
                        print(f"\n[{e}]", file=sys.stderr)
                        turns.pop()
                        fin = None
                        break
                    turns = turns[2:]  # drop the oldest exchange and try again
                    print(f"\n[the conversation no longer fits the {loaded.ctx:,}-token context: "
                          "the oldest exchange was dropped]", file=sys.stderr)
            if fin is None:
                continue
            shown.end(fin)
            if fin.reason == "cancelled" and not fin.token_ids and bar.last is not None:
                r = bar.last  # stopped while its prompt was read: what was read stays cached
                print(f"[stopped while reading the prompt: {r.read:,} of {r.total:,} tokens read, kept; send the "
                      "message again to read the rest]")
                turns.pop()
                continue
            if fin.reason == "cancelled":
                print("[stopped]")
            turns.append({"role": "assistant", "content": fin.content})  # its reasoning is not sent back
            if fin.reason == "context":
                print(f"[the reply filled the {loaded.ctx:,}-token context; the oldest turns will be dropped "
                      "to make room]", file=sys.stderr)
            if not a.quiet:
                print(f"[{fin.reason}; prefill {fin.prompt_tokens - fin.reused_tokens} tok in {fin.prefill_s:.2f}s, "
                      f"decode {fin.decode_tok_s:.1f} tok/s]", file=sys.stderr)
    finally:
        client.close()


def cmd_bench(a) -> int:
    if a.what == "kernels":
        from . import bench_kernels

        bench_kernels.run()
        return 0
    import psutil
    import torch

    from ..protocol.sampling import SamplingParams
    from ..machine.memory import PeakRSS

    a.quiet = True
    with PeakRSS() as peak:
        client = for_terminal(True)
        try:
            t0 = time.perf_counter()
            loaded = _load(client, a)
            load_s = time.perf_counter() - t0
            print(loaded.description)
            print(loaded.context.summary())
            if loaded.memory:
                print(loaded.memory)
            g = torch.Generator().manual_seed(0)
            vocab = client.query("vocab")
            prompt = torch.randint(10, vocab, (a.prompt_tokens,), generator=g).tolist()
            results = [client.generate(prompt_ids=prompt, params=SamplingParams(max_new_tokens=a.new_tokens),
                                       fresh=True)  # a cold prefill every time
                       for _ in range(a.repeats)]
            cuda_peak = client.query("peak_vram")
        finally:
            client.close()
    best = max(results, key=lambda f: f.decode_tok_s)
    print(f"load            {load_s:8.2f} s")
    print(f"prefill         {a.prompt_tokens / max(best.prefill_s, 1e-9):8.1f} tok/s ({a.prompt_tokens} tokens)")
    print(f"decode          {best.decode_tok_s:8.2f} tok/s ({len(best.token_ids)} tokens, best of {a.repeats})")
    print(f"peak RSS        {peak.peak / 2**20:8.0f} MiB (now {psutil.Process().memory_info().rss / 2**20:.0f} MiB)")
    if peak.peak_anon:
        print(f"peak anonymous  {peak.peak_anon / 2**20:8.0f} MiB (Mixdesk's own memory)")
        print(f"peak file-backed{peak.peak_file / 2**20:8.0f} MiB (the mapped file's pages: page cache)")
    if cuda_peak is not None:
        print(f"peak VRAM       {cuda_peak / 2**20:8.0f} MiB")
    else:
        print("peak VRAM       n/a (CPU-only)")
    return 0


def cmd_tiny_model(a) -> int:
    from ..sources.tiny_model import write_tiny_mixtral

    out = write_tiny_mixtral(a.out, shard_size=a.shard_size)
    print(f"wrote a tiny random Mixtral to {out}")
    return 0


def cmd_synthetic_model(a) -> int:
    from ..sources.synthetic import write_synthetic

    config = a.config or str(Path(__file__).resolve().parents[2] / "resources" / "mixtral-8x7b-config.json")
    out = write_synthetic(a.out, config, seed=a.seed)
    print(f"wrote a synthetic model (weights generated on demand, nothing stored) to {out}")
    return 0


def cmd_demo_model(a) -> int:
    from ..sources import demo

    out = demo.ensure(a.out, progress=progress_bar(False), log=lambda s: print(s, file=sys.stderr))
    print(out)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The one parser of the `mixdesk` command. With no command it opens the window (app/entry.py),
    or the terminal chat where there is no display; anything unknown is an error (exit code 2)."""
    ap = argparse.ArgumentParser(prog="mixdesk", description="Chat with Mixture-of-Experts models "
                                 "that do not fit in your GPU, with per-expert CPU/GPU placement. "
                                 "With no command: the desktop app.")
    ap.add_argument("--model", dest="window_model", default="demo", metavar="MODEL",
                    help="the model the app opens: a folder, a GGUF file, a hub id (owner/name) or demo (default)")
    ap.add_argument("--device", dest="window_device", default=None, type=_device, metavar="DEVICE",
                    help="cpu | cuda | cuda:N")
    ap.add_argument("--ctx", dest="window_ctx", default=None, type=_ctx, metavar="auto|N",
                    help="the context the app opens the model at (default: the one chosen for it last, else auto)")
    ap.add_argument("--kv-bits", dest="window_kv_bits", default=16, type=_kv_bits, metavar="16|8", help=KV_BITS_HELP)
    ap.add_argument("--self-test", action="store_true", help="check the installation and exit")
    sub = ap.add_subparsers(dest="cmd", metavar="COMMAND")
    c = sub.add_parser("chat", help="interactive terminal chat with streaming")
    _add_model_args(c)
    c.add_argument("--prompt", help="send one message, print the reply and exit (non-interactive)")
    c.add_argument("--system", help="system prompt")
    c.add_argument("--max-new-tokens", type=_int(1), default=512)
    c.add_argument("--temperature", type=_float(0, 100), default=0.0, help="0 = greedy (default)")
    c.add_argument("--top-p", type=_float(0, 1, lo_open=True), default=1.0)
    c.add_argument("--top-k", type=_int(0), default=0)
    c.add_argument("--repetition-penalty", type=_float(0, 100, lo_open=True), default=1.0)
    c.add_argument("--seed", type=_int(0, 2**63 - 1), default=None)
    c.add_argument("--stop", action="append", help="stop string (repeatable)")
    c.add_argument("--quiet", action="store_true", help="print only the reply")
    c.set_defaults(fn=cmd_chat)
    b = sub.add_parser("bench", help="model: prefill and decode tok/s, peak RSS and VRAM; "
                       "kernels: one Mixtral-size expert in every tier, vs read bandwidth")
    b.add_argument("what", nargs="?", choices=["model", "kernels"], default="model")
    _add_model_args(b)
    b.add_argument("--prompt-tokens", type=_int(1, MAX_CTX), default=64)
    b.add_argument("--new-tokens", type=_int(1, MAX_CTX), default=128)
    b.add_argument("--repeats", type=_int(1, 1000), default=2)
    b.set_defaults(fn=cmd_bench)
    m = sub.add_parser("demo-model", help="build the demo model (SmolLM2-135M upcycled to 8 experts)")
    m.add_argument("--out", default=None, help="folder to build into (default: the user data folder)")
    m.set_defaults(fn=cmd_demo_model)
    from .cli_plan import add_parsers
    from .cli_runtime import add_parser as add_runtime_parser
    from .cli_serve import add_parser as add_serve_parser

    add_parsers(sub, _add_model_args, _float)
    add_runtime_parser(sub)
    add_serve_parser(sub, _add_model_args, _int)
    t = sub.add_parser("tiny-model", help="write a tiny random Mixtral (for tests and self-checks)")
    t.add_argument("--out", required=True)
    t.add_argument("--shard-size", default=None)
    t.set_defaults(fn=cmd_tiny_model)
    y = sub.add_parser("synthetic-model", help="a model folder whose weights are seeded random tensors made on "
                       "demand (speed and memory at real size, e.g. Mixtral-8x7B, with nothing downloaded)")
    y.add_argument("--out", required=True)
    y.add_argument("--config", default=None, help="a Mixtral config.json (default: Mixtral-8x7B's)")
    y.add_argument("--seed", type=_int(0, 2**63 - 1), default=0)
    y.set_defaults(fn=cmd_synthetic_model)
    return ap


def run(a) -> int:
    """Run a parsed command; a MixdeskError is one line on stderr and exit code 2."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        return a.fn(a) or 0
    except MixdeskError as e:
        print(f"mixdesk: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def chat_args(model: str | None = None, device: str | None = None, ctx=None, kv_bits: int = 16) -> argparse.Namespace:
    """The arguments of a plain `mixdesk chat` (the headless fallback of the window)."""
    argv = ["chat"] + (["--model", model] if model and model != "demo" else []) + (["--device", device] if device else [])
    argv += ["--ctx", str(ctx)] if ctx is not None else []
    argv += ["--kv-bits", str(kv_bits)] if kv_bits != 16 else []
    return build_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if not getattr(a, "fn", None):  # no command: the terminal chat here (app/entry.py opens the window)
        a = chat_args(a.window_model, a.window_device, a.window_ctx, a.window_kv_bits)
    return run(a)


if __name__ == "__main__":
    sys.exit(main())

