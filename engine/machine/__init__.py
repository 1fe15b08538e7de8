"""The machine the engine runs on: which accelerator (devices.py), how much memory is free and
used (monitor.py samples VRAM and RAM on its own thread; memory.py measures the process).

May import: protocol only.
"""
