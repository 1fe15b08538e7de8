"""Shared by several test modules (moved out of tests/test_serve.py, which uses them too): KEY, api."""
import pytest


openai = pytest.importorskip("openai")


KEY = "test-key-123"


def api(server, key=KEY):
    return openai.OpenAI(base_url=server.url, api_key=key, max_retries=0, timeout=60)

