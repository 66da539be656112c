"""Checkpoint file formats: safetensors and GGUF headers, tokenizers. Reads bytes; knows
nothing of models (docs/internals.md, "Layers").
"""
