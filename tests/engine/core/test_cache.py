"""The byte-bounded LRU of the engine's results (engine/core/cache.py)."""

from __future__ import annotations

from headscope.engine.core.cache import ByteLRU


def test_byte_lru_group_budget_and_entry_cap() -> None:
    cache = ByteLRU(100, sizeof=lambda v: v, max_entry=60, group=lambda k: str(k).startswith("layer"),
                    group_capacity=50)
    cache.put("big", 61)  # over the entry cap: not kept
    assert "big" not in cache and cache.bytes == 0
    cache.put("embed", 40)
    cache.put("layer0", 30)
    cache.put("layer1", 30)  # the group is over its 50: its oldest goes, not the older embed
    assert "layer0" not in cache and {"embed", "layer1"} <= set(cache._entries)
    assert (cache.bytes, cache.group_bytes, cache.evictions) == (70, 30, 1)
    cache.put("other", 40)  # over the whole budget: the least recently used goes
    assert "embed" not in cache and cache.bytes == 70
