"""The local OpenAI-compatible server (`mixdesk serve`, the window's Local server switch)."""
from .server import Server, is_loopback

__all__ = ["Server", "is_loopback"]
