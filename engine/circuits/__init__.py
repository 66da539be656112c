"""The one weight algebra: factored matrices, per-head circuits, spectra and scores,
composition, reading a head's directions, circuit similarity (docs/math.md).
"""
