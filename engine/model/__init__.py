"""The forward of every family: the dense weights, the layers, the MoE blocks.

forward.py (MoEModel: build, forward, the expert table), moe.py (route -> group by expert -> run each
in its tier -> combine), feed_forward.py (a dense layer's MLP), native_step.py (the whole decode step
in C where the native library has it), evaluate.py (perplexity and KL of the loaded model).

May import: experts, kv, files, layers, families, machine, placement, native, protocol.
"""
