"""Where models come from besides the user's own files: the built-in demo (demo.py), a Hugging Face repo id
(hub.py: downloaded into the HF cache), synthetic checkpoints whose weights are seeded random tensors made
on demand (synthetic.py), and the tiny models the tests and benchmarks write (tiny_model.py).

May import: files, families, protocol.
"""
