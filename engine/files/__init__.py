"""How a file becomes weights: a model folder or GGUF file validated up front and read lazily.

checkpoint.py (a Hugging Face folder), safetensors_file.py (one .safetensors file, tensor by tensor),
model_config.py (config.json read and range-checked: Dims), model_files.py (every file read from inside
the folder; a model's key), mapped.py (read-only mappings watched for a change on disk, the SIGBUS
guard's Python side), fused_experts.py (experts fused per layer: GPT-OSS, MXFP4), gguf/ (llama.cpp's
format: header, names, metadata, block values, the writer the tests use).

May import: layers, families, native, protocol. Never: experts, model, kv or anything above them.
"""
