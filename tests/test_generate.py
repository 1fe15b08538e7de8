"""Generation: sampling, stopping, cancellation, streaming text, context limits, prefix reuse."""
import threading

import pytest
import torch

from engine.protocol.errors import ContextOverflow
from engine.runtime.generate import Done, SamplingParams, StopMatcher, TextStream, Token, sample
from engine.runtime.load import load


@pytest.fixture(scope="module")
def loaded(tiny):
    return load(tiny, "random:3", device="cpu", dtype="fp32", ctx=256)


def run(gen, prompt, **kw):
    events = list(gen.stream(prompt, SamplingParams(**kw)))
    assert isinstance(events[-1], Done)
    return [e for e in events if isinstance(e, Token)], events[-1]


def test_chat_template_applied(loaded):
    ids = loaded.prompts.chat([{"role": "user", "content": "hello world"}])
    text = loaded.tokenizer.decode(ids)
    assert text.startswith("<|user|>\nhello world</s>") and text.endswith("<|assistant|>\n")


def test_max_tokens_and_streamed_text_equals_final(loaded):
    prompt = loaded.prompts.chat([{"role": "user", "content": "hello"}])
    toks, fin = run(loaded.generator, prompt, max_new_tokens=17)
    assert fin.reason == "length" and len(fin.token_ids) == 17
    assert "".join(t.text for t in toks) == fin.text
    assert fin.text == loaded.tokenizer.decode(fin.token_ids, skip_special_tokens=True)


def test_seeded_sampling_is_reproducible_and_differs_from_greedy(loaded):
    prompt = loaded.prompts.chat([{"role": "user", "content": "hello"}])
    kw = dict(max_new_tokens=20, temperature=1.5, top_p=0.95, top_k=50, repetition_penalty=1.2)
    a = run(loaded.generator, prompt, seed=11, **kw)[1].token_ids
    b = run(loaded.generator, prompt, seed=11, **kw)[1].token_ids
    c = run(loaded.generator, prompt, seed=12, **kw)[1].token_ids
    greedy = run(loaded.generator, prompt, max_new_tokens=20)[1].token_ids
    assert a == b
    assert a != c and a != greedy


def test_sample_filters():
    logits = torch.tensor([0.0, 5.0, 4.9, -3.0])
    g = torch.Generator().manual_seed(0)
    assert sample(logits, SamplingParams(), [], None) == 1
    # top_k=1 is greedy whatever the temperature
    assert all(sample(logits, SamplingParams(temperature=5.0, top_k=1), [], g) == 1 for _ in range(20))
    # top_p small keeps only the most likely token
    assert all(sample(logits, SamplingParams(temperature=1.0, top_p=0.1), [], g) == 1 for _ in range(20))
    # repetition penalty pushes a seen token below the next one
    assert sample(logits, SamplingParams(repetition_penalty=2.0), [1], None) == 2


def test_eos_stops(loaded):
    gen = loaded.generator
    prompt = loaded.prompts.chat([{"role": "user", "content": "hello"}])
    first = run(gen, prompt, max_new_tokens=3)[1].token_ids
    gen.eos_ids.add(first[1])
    try:
        fin = run(gen, prompt, max_new_tokens=30)[1]
    finally:
        gen.eos_ids.discard(first[1])
    assert fin.reason == "eos" and fin.token_ids == first[:2]


def test_stop_string_truncates_and_is_never_streamed(loaded):
    gen = loaded.generator
    prompt = loaded.prompts.chat([{"role": "user", "content": "hello"}])
    full = run(gen, prompt, max_new_tokens=30)[1].text
    stop = full[5:8]
    assert len(stop) == 3
    toks, fin = run(gen, prompt, max_new_tokens=30, stop=(stop,))
    assert fin.reason == "stop"
    assert fin.text == full[: full.find(stop)]
    assert "".join(t.text for t in toks) == fin.text


def test_stop_matcher_holds_back_partial_matches():
    m = StopMatcher(("</end>",))
    out = [m.feed(s) for s in ["Hello </", "e", "nd", "> tail"]]
    assert "".join(o for o, _ in out) == "Hello "
    assert out[-1][1] is True


def test_cancel_from_another_thread(loaded):
    gen = loaded.generator
    prompt = loaded.prompts.chat([{"role": "user", "content": "hello"}])
    cancel = threading.Event()
    seen = []
    for ev in gen.stream(prompt, SamplingParams(max_new_tokens=200), cancel):
        if isinstance(ev, Token):
            seen.append(ev)
            if len(seen) == 5:
                threading.Thread(target=cancel.set).start()
                threading.Event().wait(0.05)
        else:
            fin = ev
    assert fin.reason == "cancelled" and 5 <= len(fin.token_ids) < 200


def test_multibyte_characters_stream_whole(loaded):
    tok = loaded.tokenizer
    text = "Café 東京 🙂 naïve"
    ids = tok.encode(text, add_special_tokens=False)
    # the byte-level tokenizer splits at least one character across tokens
    assert any("\ufffd" in tok.decode([i]) for i in ids)
    s = TextStream(tok)
    pieces = [s.push(i) for i in ids]
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)


def test_prompt_longer_than_context(loaded):
    with pytest.raises(ContextOverflow, match="256"):
        list(loaded.generator.stream(list(range(10, 300)), SamplingParams()))


def test_generation_stops_at_context_end(loaded):
    fin = run(loaded.generator, list(range(10, 250)), max_new_tokens=50)[1]
    assert fin.reason == "context" and len(fin.token_ids) == 256 - 240 + 1


def test_second_turn_reuses_cache_and_matches_cold_run(loaded):
    """The chat's KV cache, kept between turns as the scheduler keeps it (engine/kv/cache.py),
    carries the first turn into the second; the reply is the one a cold prefill gives."""
    from engine.runtime.generate import drive
    from engine.kv.cache import KVCaches

    gen = loaded.generator
    caches = KVCaches(gen.new_cache, 1)

    def chat(prompt, n, fresh=False):
        cache = caches.claim("chat", prompt, fresh)
        events = list(drive(gen.sequence(prompt, SamplingParams(max_new_tokens=n), None, cache), gen.forward))
        assert isinstance(events[-1], Done)
        return events[-1]

    msgs = [{"role": "user", "content": "hello"}]
    fin1 = chat(loaded.prompts.chat(msgs), 10)
    msgs += [{"role": "assistant", "content": fin1.text}, {"role": "user", "content": "world"}]
    p2 = loaded.prompts.chat(msgs)
    warm = chat(p2, 12)
    assert warm.reused_tokens > 0
    cold = chat(p2, 12, fresh=True)
    assert cold.reused_tokens == 0 and cold.token_ids == warm.token_ids
    alone = run(gen, p2, max_new_tokens=12)[1]  # stream: a fresh cache of its own, every time
    assert alone.reused_tokens == 0 and alone.token_ids == warm.token_ids


MIXTRAL_STYLE = ("{{ bos_token }}{% for message in messages %}"
                 "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
                 "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
                 "{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
                 "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}")
CHATML_TOJSON = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}{% if m.meta is defined %}"
                 "{{ m.meta | tojson }}{% endif %}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
                 "{% for i in range(2) %}{% if loop.last %}{{ range(3) | length }}{% endif %}{% endfor %}")


@pytest.mark.parametrize("template", [None, MIXTRAL_STYLE, CHATML_TOJSON])
def test_sandboxed_template_gives_transformers_tokens(loaded, template):
    """The sandboxed renderer (time, loop and size limits) gives the same ids as transformers'
    apply_chat_template."""
    from engine.prompts.chat_template import ChatTemplate

    tok = loaded.tokenizer
    src = template or tok.chat_template
    ours = ChatTemplate(src, tok, loaded.ckpt.folder)
    msgs = [{"role": "user", "content": "hi <b>there</b> & \"you\""},
            {"role": "assistant", "content": "héllo ✓"},
            {"role": "user", "content": "{{ not a template }}", "meta": {"x": [1, "é"]}}]
    if template is MIXTRAL_STYLE:
        msgs = [{k: v for k, v in m.items() if k != "meta"} for m in msgs]
    want = tok.apply_chat_template(msgs, chat_template=src, add_generation_prompt=True, tokenize=True)
    want = want["input_ids"] if hasattr(want, "keys") else want
    assert ours.ids(msgs) == list(want)


def test_template_errors_are_one_line_mixdesk_errors(loaded):
    from engine.prompts.chat_template import ChatTemplate, TemplateProblem

    t = ChatTemplate(MIXTRAL_STYLE, loaded.tokenizer, loaded.ckpt.folder)
    with pytest.raises(TemplateProblem, match="roles must alternate"):
        t.ids([{"role": "assistant", "content": "x"}])


@pytest.mark.parametrize("field,value", [("temperature", float("nan")), ("top_p", 0.0), ("top_p", -1.0),
                                         ("max_new_tokens", 0), ("top_k", -1), ("repetition_penalty", 0.0),
                                         ("temperature", float("inf")), ("seed", -3)])
def test_sampling_values_are_checked(field, value):
    from engine.protocol.errors import InputError

    with pytest.raises(InputError, match=field):
        SamplingParams(**{field: value}).check()
