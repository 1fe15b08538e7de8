"""The code lexers' warm-up (app/chat/markdown_render.py warm) waits while a reply streams: its imports and
regex compiling hold the GIL, and the GUI thread's event loop stalled 60-87 ms when it ran beside a
first reply. Run in a fresh interpreter: the warm-up runs once a process."""
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import sys, time
    import app.chat.markdown_render as m

    def lexer_modules():
        return sum(1 for k in list(sys.modules) if k.startswith("pygments.lexers."))

    m.streaming(True)           # a reply streams as the window opens
    m.warm()
    time.sleep(1.0)
    during = lexer_modules()
    m.streaming(False)          # it ended
    m._warming[0].join(60)
    print(during, lexer_modules(), m._warming[0].is_alive())
""")


def test_the_lexer_warm_up_waits_while_a_reply_streams_and_finishes_after():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120,
                         env={"QT_QPA_PLATFORM": "offscreen", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    during, after, alive = out.stdout.split()
    assert int(during) == 0  # nothing imported while the reply streamed (before: every lexer module, in one go)
    assert int(after) > 100 and alive == "False"  # all of them once it ended: a later guess costs no import
