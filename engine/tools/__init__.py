"""The command line (`mixdesk chat/eval/plan/bench/serve`): cli.py and its parts, serve/ (the local
OpenAI-compatible server), runtime/ (the GPU runtime: a CUDA build of torch fetched on first run
and put ahead of the bundled CPU one).

The top layer: may import anything in engine/; nothing in engine/ imports it.
"""
