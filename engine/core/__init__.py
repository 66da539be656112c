"""The bottom layer: typed errors, the model config, request validation, result types,
the byte-bounded cache, atomic writes and exports, the files around a checkpoint, and the
plumbing of every sweep (progress, cancellation, memos, BLAS thread control, numeric
guards). Never torch (docs/internals.md, "Layers").
"""
