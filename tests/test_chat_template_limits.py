"""Issue 25, must show 4: a chat template whose first line builds a huge value in one operation is
refused at load, with one message naming what exceeds the limit, in under 3 s and under 300 MB.

Each case loads a tiny model folder whose template is that line, as `mixdesk` does before it
builds anything (open the checkpoint, load its tokenizer, `ChatTemplate.of`). The load runs in a
child forked from a worker process that has imported everything already, so the child's peak RSS
(`ru_maxrss`, which starts afresh at fork) minus its RSS at the start is what the refusal cost.
Normal templates still render exactly as transformers' `apply_chat_template` does.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from two_threads import ids_from_two_threads

N = "400000000"
S = "{% set s = 'x' * 1000000 %}"  # a string at the size limit, shared by many cases

# case -> (template, words the refusal must hold)
CASES = {
    # one filter, one huge width or count
    "center_filter": ("{{ 'x'|center(" + N + ") }}", ["center filter"]),
    "format_filter": ("{{ '%" + N + "s'|format('x') }}", ["format filter"]),
    "indent_width": ("{{ 'x'|indent(width=" + N + ") }}", ["indent filter"]),
    "indent_many_lines": ("{{ ('\\n' * 100000)|indent(width=100000, blank=true) }}", ["indent filter"]),
    "tojson_indent": ("{{ [[1, 2, 3]]|tojson(indent=" + N + ") }}", ["tojson filter"]),
    "tojson_indent_string": ("{{ [[1]]|tojson(indent='x' * 900000) }}", ["tojson filter"]),
    "tojson_separators": ("{{ ([1] * 1000)|tojson(separators=(' ' * 900000, ':')) }}", ["tojson filter"]),
    "replace_growth": ("{{ ('x' * 100000)|replace('x', 'y' * 100000) }}", ["replace filter"]),
    "wordwrap_wrapstring": ("{{ ('x ' * 100000)|wordwrap(1, wrapstring='y' * 100000) }}", ["wordwrap filter"]),
    "wordwrap_slow_input": ("{{ ('x' * 1000000)|wordwrap(1) }}", ["wordwrap filter"]),
    "urlize_target": ("{{ ('a.com ' * 10000)|urlize(target='x' * 100000) }}", ["urlize filter"]),
    "batch_fill": ("{{ [1]|batch(" + N + ", 0)|list|length }}", ["batch filter"]),
    "slice_count": ("{{ [1]|slice(" + N + ")|list|length }}", ["slice filter"]),
    "join_large_list": (S + "{{ ([s] * 1000)|join }}", ["join filter"]),
    "join_separator": ("{{ range(1000000)|join('x' * 1000) }}", ["join filter"]),
    "join_of_a_string": ("{{ ('x' * 1000000)|join('y' * 1000) }}", ["join filter"]),
    "sum_of_lists": ("{% set l = [1] * 100000 %}{{ ([l] * 1000)|sum(start=[])|length }}", ["sum filter"]),
    "map_with_center": ("{{ ['x']|map('center', " + N + ")|list }}", ["center filter"]),
    "string_of_list": (S + "{{ ([s] * 1000)|string }}", ["string filter"]),
    "upper_of_list": (S + "{{ ([s] * 1000)|upper }}", ["upper filter"]),
    "pprint_of_list": (S + "{{ ([s] * 1000)|pprint }}", ["pprint filter"]),
    "xmlattr_escaping": ("{% set s = '<' * 1000000 %}{{ {'a': s, 'b': s, 'c': s}|xmlattr }}", ["xmlattr filter"]),
    "forceescape_growth": ("{% set ns = namespace(s='<' * 500000) %}{% for i in range(20) %}"
                           "{% set ns.s = ns.s|forceescape %}{% endfor %}{{ ns.s }}", ["forceescape filter"]),
    "string_times_count": ("{{ (9|string) * " + N + " }}", ["`*`"]),
    # printf `%` (the operator and the format filter), widths and precisions read before formatting
    "percent_width": ("{{ '%" + N + "s' % 'x' }}", ["`%` formatting"]),
    "percent_star_width": ("{{ '%*s' % (" + N + ", 'x') }}", ["`%` formatting"]),
    "percent_star_precision": ("{{ '%.*f' % (" + N + ", 1.0) }}", ["`%` formatting"]),
    "percent_precision": ("{{ '%." + N + "f' % 1.0 }}", ["`%` formatting"]),
    "percent_key_with_parens": ("{{ '%(a(b))" + N + "s' % {'a(b)': 'x'} }}", ["`%` formatting"]),
    "percent_many_fields": (S + "{{ '%s' * 1000 % ((s,) * 1000) }}", ["`%` formatting"]),
    "percent_of_list": (S + "{{ '%s' % ([s] * 1000,) }}", ["`%` formatting"]),
    # str methods, called through the sandbox
    "ljust": ("{{ 'x'.ljust(" + N + ") }}", ["ljust() call"]),
    "rjust": ("{{ 'x'.rjust(" + N + ") }}", ["rjust() call"]),
    "center_method": ("{{ 'x'.center(" + N + ") }}", ["center() call"]),
    "zfill": ("{{ 'x'.zfill(" + N + ") }}", ["zfill() call"]),
    "expandtabs": ("{{ ('\\t' * 1000).expandtabs(1000000) }}", ["expandtabs() call"]),
    "replace_method_empty_old": ("{{ ('x' * 100000).replace('', 'y' * 10000) }}", ["replace() call"]),
    "join_method": ("{{ ('y' * 1000).join(['x'] * 1000000) }}", ["join() call"]),
    "translate": ("{{ ('a' * 100000).translate({97: 'x' * 100000}) }}", ["translate() call"]),
    "translate_list_table": ("{{ ('a' * 100000).translate(['x' * 100000] * 128) }}", ["translate() call"]),
    "bytes_center": ("{{ 'x'.encode().center(" + N + ") }}", ["center() call"]),
    "int_to_bytes": ("{{ (1).to_bytes(" + N + ", 'big')|length }}", ["to_bytes() call"]),
    "str_format_width": ("{{ '{:" + N + "}'.format(1) }}", ["format() call"]),
    "str_format_nested_width": ("{{ '{:{}}'.format(1, " + N + ") }}", ["format() call"]),
    "str_format_precision": ("{{ '{:." + N + "f}'.format(1.0) }}", ["format() call"]),
    "str_format_many_fields": (S + "{{ ('{0}' * 1000).format(s) }}", ["format() call"]),
    "format_map_width": ("{{ '{a:" + N + "}'.format_map({'a': 1}) }}", ["format() call"]),
    "strftime_now": ("{{ strftime_now('%c' * 500000) }}", ["strftime_now() call"]),
    # operators, repeated in a loop
    "concat_doubling_namespace": ("{% set ns = namespace(s='x') %}{% for i in range(40) %}"
                                  "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}", ["`~` concatenation"]),
    "plus_doubling": ("{% set ns = namespace(s='x') %}{% for i in range(40) %}"
                      "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}", ["`+`"]),
    "list_plus_doubling": ("{% set ns = namespace(l=[1]) %}{% for i in range(40) %}"
                           "{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}", ["`+`", "items"]),
    "list_times": ("{{ ([1] * 100000) * 100000 }}", ["`*`"]),
    "concat_of_list": (S + "{{ 'a' ~ ([s] * 1000) }}", ["`~` concatenation"]),
    "power": ("{{ 10 ** 4000000 }}", ["`**`"]),
    "power_of_power": ("{% set x = 2 ** 4096 %}{{ (x ** 4096) ** 4096 }}", ["`**`"]),
    "squaring_loop": ("{% set ns = namespace(x=3) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}"
                      "{% endfor %}{{ ns.x }}", ["`*`"]),
    # many values, each below the size limit: the memory a render builds is charged as it goes
    "many_distinct_strings": ("{% set ns = namespace(l=[]) %}{% for i in range(1000) %}"
                              "{% set ns.l = ns.l + [('x' * 1000000) ~ i] %}{% endfor %}{{ ns.l|length }}",
                              ["memory limit"]),
    "string_to_lists": ("{% set ns = namespace(l=[]) %}{% for i in range(100) %}"
                        "{% set ns.l = ns.l + [('x' * 1000000 ~ i)|list] %}{% endfor %}{{ ns.l|length }}",
                        ["memory limit"]),
    "dict_building": ("{% set ns = namespace(d={}) %}{% for i in range(100) %}"
                      "{% set ns.d = dict(ns.d, **{'k' ~ i: 'x' * 1000000 ~ i}) %}{% endfor %}{{ ns.d|length }}",
                      ["memory limit"]),
    "slices_kept": (S + "{% set ns = namespace(l=[]) %}{% for i in range(1000) %}"
                    "{% set ns.l = ns.l + [s[i:]] %}{% endfor %}{{ ns.l|length }}", ["memory limit"]),
    "set_block": ("{% set x %}{% for i in range(1000) %}{{ 'x' * 1000000 }}{% endfor %}{% endset %}{{ x|length }}",
                  ["memory limit"]),
    "macro_buffer": ("{% macro m() %}{% for i in range(1000) %}{{ 'y' * 1000000 ~ i }}{% endfor %}{% endmacro %}"
                     "{{ m()|length }}", ["limit"]),
    "filter_block": ("{% filter upper %}{% for i in range(1000) %}{{ 'x' * 1000000 }}{% endfor %}{% endfilter %}",
                     ["memory limit"]),
    # the output: a list's str() is sized before it is built
    "output_of_list": (S + "{{ [s] * 1000 }}", ["output"]),
    "output_of_namespace": (S + "{% set ns = namespace(a=[s] * 1000) %}{{ ns }}", ["output"]),
    "output_of_dict_items": (S + "{{ {'a': [s] * 1000}.items() }}", ["output"]),
    # compile time: Jinja evaluates `{% autoescape %}`'s expression while compiling
    "autoescape_expression": ("{% autoescape 'x'|center(" + N + ") %}x{% endautoescape %}", ["center filter"]),
    # loops: counted, and stepped with the clock even when their body calls nothing
    "range_in_a_filter": ("{{ range(" + N + ")|list|length }}", ["loops over more than"]),
    "empty_nested_loops": ("{% set s = 'x' * 100000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}x",
                           ["ran for more than"]),
}

WORKER = textwrap.dedent("""
    import json, os, resource, sys, time
    from engine.prompts.chat_template import ChatTemplate
    from engine.protocol.errors import MixdeskError
    from engine.runtime.load import open_checkpoint

    open_checkpoint(sys.argv[1]).load_tokenizer()  # transformers imports what it needs on the first load
    for line in sys.stdin:
        folder = json.loads(line)["folder"]
        pid = os.fork()
        if pid == 0:
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            t0 = time.perf_counter()
            try:
                ckpt = open_checkpoint(folder)  # what engine.runtime.load.load does first, before it builds anything
                ChatTemplate.of(ckpt.load_tokenizer(), ckpt.folder)
                message = None
            except MixdeskError as e:
                message = str(e)
            except BaseException as e:
                message = "UNEXPECTED " + type(e).__name__ + ": " + str(e)[:500]
            seconds = time.perf_counter() - t0
            grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
            os.write(1, (json.dumps({"message": message, "seconds": seconds, "rss_mb": grew}) + "\\n").encode())
            os._exit(0)
        os.waitpid(pid, 0)
""")


@pytest.fixture(scope="module")
def loader(tiny, tmp_path_factory):
    """load(template) -> {"message", "seconds", "rss_mb"}, run in a fresh fork of a warm worker."""
    folder = tmp_path_factory.mktemp("limits") / "model"
    shutil.copytree(tiny, folder)
    log = (folder.parent / "worker.log").open("w")
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(tiny)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=log, text=True, cwd=str(Path(__file__).resolve().parents[1]))
    lock = threading.Lock()

    def load(template: str) -> dict:
        with lock:
            (folder / "chat_template.jinja").write_text(template)
            worker.stdin.write(json.dumps({"folder": str(folder)}) + "\n")
            worker.stdin.flush()
            line = worker.stdout.readline()
        assert line, (folder.parent / "worker.log").read_text()[-2000:]
        return json.loads(line)

    yield load
    worker.stdin.close()
    worker.wait(timeout=30)
    log.close()


@pytest.mark.parametrize("case", list(CASES))
def test_template_refused_at_load_fast_and_small(loader, case):
    template, words = CASES[case]
    r = loader(template)
    print(f"{case}: {r['seconds']:.2f} s, +{r['rss_mb']:.0f} MB: {r['message']}")
    msg = r["message"]
    assert msg and not msg.startswith("UNEXPECTED"), msg
    assert "chat_template.jinja: the chat template" in msg, msg
    for w in words:
        assert w in msg, msg
    if "ran for" not in msg and "loops over" not in msg:
        assert "exceeds" in msg, msg
    assert r["seconds"] < 3.0
    assert r["rss_mb"] < 300


def test_a_normal_template_loads_with_little_memory(loader):
    """The baseline the cases above are measured against: loading the tokenizer and a template."""
    from engine.sources.tiny_model import CHAT_TEMPLATE

    r = loader(CHAT_TEMPLATE)
    print(f"normal template: {r['seconds']:.2f} s, +{r['rss_mb']:.0f} MB")
    assert r["message"] is None
    assert r["seconds"] < 3.0 and r["rss_mb"] < 100


@pytest.mark.parametrize("template", [
    "{{ 10 ** 4000 }}",                                  # a 4,001-digit number is fine
    "{{ 'x'|center(100000) }}{{ 'y'.ljust(1000) }}",     # widths within the limit
    "{{ ('x' * 100000)|replace('x', 'yy') }}",           # growth within the limit
    "{{ [[1, 2]]|tojson(indent=4) }}{{ '%5.2f|%-4s|%*d' % (3.14159, 'a', 3, 7) }}",
    "{{ '{:>8}|{:.3f}|{a}'.format('r', 2.5, a=1) }}{{ range(3) }}{{ ('a', 'b')|join(', ') }}",
])
def test_templates_within_the_limits_render(loader, template):
    r = loader(template)
    assert r["message"] is None, r["message"]


# ---- normal templates render exactly as transformers renders them --------------------------------
CONVERSATIONS = [
    [{"role": "user", "content": "Hello"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi <b>&</b> {{ x }}"},
     {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello!"}, {"role": "user", "content": "again"}],
    [{"role": "user", "content": "x" * 200000}, {"role": "assistant", "content": "y" * 100000},
     {"role": "user", "content": "é🙂" * 50000}],
    [{"role": "user", "content": "call a tool"},
     {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
                                                           "function": {"name": "f", "arguments": {"a": 1}}}]},
     {"role": "tool", "content": "42"}, {"role": "user", "content": "thanks"}],
]
TEMPLATES = Path(__file__).resolve().parents[1] / "resources" / "templates"  # the published Qwen3 and gpt-oss templates
SHARED = sorted(TEMPLATES.glob("*.jinja"))
# Written for these tests in the style of Llama 3's and Mixtral's templates: the date, a system
# message sliced off, `+` and `~`, trim, tojson with an indent, a macro, a namespace, loop state.
LLAMA_STYLE = """{{- bos_token }}{%- set date_string = strftime_now("%d %b %Y") %}
{%- if messages[0]['role'] == 'system' %}{%- set system = messages[0]['content']|trim %}
{%- set messages = messages[1:] %}
{%- else %}{%- set system = "" %}{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\nToday Date: " + date_string + "\n\n" + system + "<|eot_id|>" }}
{%- macro header(role) %}{{ '<|start_header_id|>' ~ role ~ '<|end_header_id|>\n\n' }}{% endmacro %}
{%- set ns = namespace(turns=0) %}
{%- for message in messages %}{%- set ns.turns = ns.turns + 1 %}
{%- if message.tool_calls is defined %}{{- header('assistant') }}{{- message.tool_calls[0].function|tojson(indent=4) }}
{%- elif message.content is string %}{{- header(message.role) + message['content']|trim + '<|eot_id|>' }}
{%- else %}{{- header(message.role) }}{{ message.content|tojson }}{%- endif %}
{%- if loop.last %}{{- '%d turns|%s' % (ns.turns, message.role|upper) }}{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- header('assistant') }}{%- endif %}"""
MIXTRAL_STYLE = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
                 "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
                 "{{ message['content'] + eos_token }}{% else %}{{ message['content'][:10] ~ '|' }}{% endif %}"
                 "{% endfor %}{{ messages|map(attribute='role')|join(',') }}{{ messages|length }}")


@pytest.fixture(scope="module")
def tok(tiny):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny))


@pytest.mark.parametrize("name", [p.name for p in SHARED] + ["llama_style", "mixtral_style"])
def test_templates_render_as_transformers(tok, name):
    from engine.prompts.chat_template import ChatTemplate

    src = {"llama_style": LLAMA_STYLE, "mixtral_style": MIXTRAL_STYLE}.get(name) or \
        (TEMPLATES / name).read_text()
    t = ChatTemplate(src, tok, Path(name))
    for msgs in CONVERSATIONS:
        want = tok.apply_chat_template(msgs, chat_template=src, add_generation_prompt=True, tokenize=False)
        assert t.render(msgs) == want


def test_load_refuses_the_model_before_building_anything(tiny, tmp_path):
    """engine.runtime.load.load itself: the model is refused with the message, nothing built."""
    from engine.protocol.errors import ModelError
    from engine.runtime.load import load

    folder = tmp_path / "model"
    shutil.copytree(tiny, folder)
    (folder / "chat_template.jinja").write_text(CASES["tojson_indent"][0] + "{{ messages }}")
    with pytest.raises(ModelError, match="tojson filter exceeds the size limit") as e:
        load(folder, "cpu", device="cpu")
    assert e.value.path.endswith("chat_template.jinja")


# ---- two threads at once -----------------------------------------------------------------------
def test_two_threads_render_at_once_each_under_its_own_budget(tok):
    """Each render has its own budget (threading.local). The two renders are interleaved for
    certain: the long one (1.5M characters, size limit 6M) joins its text while the short one (size
    limit 1M) is paused inside its own render; with one budget shared, the long join would be
    judged by the short render's limit."""
    from engine.prompts.chat_template import ChatTemplate

    src = ("{{ hold(messages[0].role) }}{% for m in messages %}"
           "{{ '<|' ~ m.role ~ '|>\\n' ~ m.content ~ '</s>\\n' }}{% endfor %}<|assistant|>\n")
    t = ChatTemplate(src, tok, Path("x"))
    long_inside, short_inside, long_done = threading.Event(), threading.Event(), threading.Event()

    def hold(role):
        if role == "long" and not long_done.is_set():
            long_inside.set()
            assert short_inside.wait(10)
        elif role == "short" and long_inside.is_set():
            short_inside.set()
            assert long_done.wait(10)
        return ""

    t.env.globals["hold"] = hold
    long = [{"role": "long", "content": "x" * 1_500_000}]
    short = [{"role": "short", "content": "hello"}]
    results, errors = {}, []

    def run(name, msgs, done=None):
        try:
            results[name] = t.render(msgs)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"{name}: {e}")
        finally:
            if done is not None:
                done.set()

    a = threading.Thread(target=run, args=("long", long, long_done))
    a.start()
    assert long_inside.wait(10)
    b = threading.Thread(target=run, args=("short", short))
    b.start()
    a.join(30)
    b.join(30)
    assert not errors, errors
    assert short_inside.is_set()
    assert results["long"] == "<|long|>\n" + "x" * 1_500_000 + "</s>\n<|assistant|>"  # Jinja drops the last \n
    assert results["short"] == "<|short|>\nhello</s>\n<|assistant|>"


def test_two_threads_tokenise_at_once(tok):
    """ids() from two threads at once (the server's pool and the engine thread) gives each the ids
    it gives alone."""
    from engine.prompts.chat_template import ChatTemplate
    from engine.sources.tiny_model import CHAT_TEMPLATE

    t = ChatTemplate(CHAT_TEMPLATE, tok, Path("x"))
    convs = [[{"role": "user", "content": f"hello {i} " * (1 + 50 * i)}] for i in range(20)]
    want = [t.ids(m) for m in convs]
    got, errors = ids_from_two_threads(t, convs, 10)
    assert not errors, errors
    assert got[0] == [want] * 10 and got[1] == [want[::-1]] * 10
