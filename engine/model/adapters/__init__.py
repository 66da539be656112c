"""Format adapters: one small module per model family (docs/internals.md).

Each adapter turns a checkpoint's ``config.json`` (or native metadata) into a
``ModelConfig`` and describes, for every canonical weight name, where its data lives in
the checkpoint. The description is data (``Whole`` / ``Heads`` / ``Zeros``), not code, so
that

- the structure and every tensor's expected shape can be checked from the safetensors
  headers alone, without torch (``base.check_specs``);
- ``CheckpointWeights.get_head`` can read just one head's slice of a fused tensor.

``base.py`` holds the specs and the helpers every family uses, ``registry.py`` picks the
family of a ``config.json``; the families import ``base`` only. Nothing in this package
imports torch.
"""
