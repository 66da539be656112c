"""Model-wide work built on the layers below: request computation, the results store,
sweeps, the Dask cluster, diffs and timelines.
"""
