"""A least-recently-used cache bounded by bytes, with the counters the UI shows.

The one byte-bounded LRU of the engine: the ``Engine``'s per-head result cache, the raw
tensor cache of ``CheckpointWeights`` and the processed tensor cache of ``ProcessedWeights``.

Thread-safe (one lock): the engine's event-loop thread reads it and result delivery writes
it. An entry larger than ``max_entry`` (default: the whole budget) is not kept (it would
evict everything else). Optionally, the keys for which ``group(key)`` is true share a
smaller budget ``group_capacity`` and are evicted first, oldest first, when they exceed it
(``ProcessedWeights``: whole-layer tensors that a sweep over the layers would otherwise
cycle through the whole cache).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

from headscope.engine.core.results import nbytes as default_nbytes

_MISSING = object()


class ByteLRU:
    def __init__(
        self,
        capacity: int,
        sizeof: Callable[[Any], int] = default_nbytes,
        *,
        max_entry: int | None = None,
        group: Callable[[Hashable], bool] | None = None,
        group_capacity: int | None = None,
    ) -> None:
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity = int(capacity)
        self.max_entry = self.capacity if max_entry is None else min(int(max_entry), self.capacity)
        self._sizeof = sizeof
        self._group = group
        self.group_capacity = self.capacity if group_capacity is None else int(group_capacity)
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.group_bytes = 0  # of ``bytes``, what the keys of the group hold
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def _in_group(self, key: Hashable) -> bool:
        return self._group is not None and self._group(key)

    def get(self, key: Hashable, default: Any = None, *, count: bool = True) -> Any:
        """The cached value (and mark it recently used), or ``default``; counts hit/miss."""
        with self._lock:
            entry = self._entries.get(key, _MISSING)
            if entry is _MISSING:
                if count:
                    self.misses += 1
                return default
            self._entries.move_to_end(key)
            if count:
                self.hits += 1
            return entry[0]

    def put(self, key: Hashable, value: Any) -> None:
        size = int(self._sizeof(value))
        in_group = self._in_group(key)
        with self._lock:
            if key in self._entries:
                self._drop(key)
            if size > (min(self.max_entry, self.group_capacity) if in_group else self.max_entry):
                return
            self._entries[key] = (value, size)
            self.bytes += size
            self.group_bytes += size if in_group else 0
            if self.group_bytes > self.group_capacity:  # the group's oldest first
                for old in [k for k in self._entries if self._in_group(k)]:
                    if self.group_bytes <= self.group_capacity:
                        break
                    self._evict(old)
            while self.bytes > self.capacity:
                self._evict(next(iter(self._entries)))

    def _drop(self, key: Hashable) -> None:
        _, size = self._entries.pop(key)
        self.bytes -= size
        self.group_bytes -= size if self._in_group(key) else 0

    def _evict(self, key: Hashable) -> None:
        self._drop(key)
        self.evictions += 1

    def clear_group(self) -> None:
        """Drop the entries of the group (``ProcessedWeights.release``: a sweep's last layers)."""
        with self._lock:
            for key in [k for k in self._entries if self._in_group(k)]:
                self._drop(key)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.bytes = self.group_bytes = 0
