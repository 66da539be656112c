"""A least-recently-used cache bounded by bytes, with the counters the UI shows.

Thread-safe (one lock): the engine's event-loop thread reads it and result delivery writes
it. An entry larger than the whole budget is not kept (it would evict everything else).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

from .results import nbytes as default_nbytes

_MISSING = object()


class ByteLRU:
    def __init__(self, capacity: int, sizeof: Callable[[Any], int] = default_nbytes) -> None:
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity = int(capacity)
        self._sizeof = sizeof
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

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
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            if size > self.capacity:
                return
            self._entries[key] = (value, size)
            self.bytes += size
            while self.bytes > self.capacity:
                _, (_, evicted) = self._entries.popitem(last=False)
                self.bytes -= evicted
                self.evictions += 1

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.bytes = 0
