"""A sequence's keys and values: in memory, 8-bit, reused across requests, kept on disk.

tensors.py (the preallocated per-layer tensors of one sequence), int8.py (8-bit rows), cache.py (which
cache a request uses and how much of it carries over), files.py (a conversation's caches written to
the user cache folder and read back).

May import: files, layers, native, protocol.
"""
