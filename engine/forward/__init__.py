"""Everything that runs the model: the forward pass, behavioural scores, ablation, attention
sinks and the random-head null (docs/internals.md, "Layers").
"""
