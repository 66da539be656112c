"""The explorer's async ``Engine``: worker pool, priorities, per-head cache, prefetch.
"""
