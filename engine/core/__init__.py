"""The bottom layer: typed errors, the model config, request validation, result types,
the byte-bounded cache, atomic exports and the files around a checkpoint. Never torch
(docs/internals.md, "Layers").
"""
