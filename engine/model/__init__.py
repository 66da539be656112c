"""A model's weights: one adapter per family, lazy per-head reads, weight processing, RoPE,
and opening a checkpoint (docs/internals.md, "Layers").
"""
