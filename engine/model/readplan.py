"""The read plan of a checkpoint larger than the page cache (docs/internals.md, "The read plan").

A sweep reads each tensor's bytes once (``pread`` into memory of our own), so once a tensor is
read its page-cache copy only serves a *later* pass. When the whole checkpoint fits in the page
cache that later pass (the forward pass after the spectral sweep, the next command) finds it
there and the kernel is told nothing. When it does not fit (a 13B bf16 checkpoint, 26 GB, on a
24 GB box), every pass would push out what the next one needs: the MLP weights a forward pass
streams through evict the attention weights that ``heads``' forward pass, ``composition`` and
the explorer read again. So:

- the *hot* tensors (every attention weight, the ones read more than once) stay in the page
  cache if they fit in it; every other tensor's range is dropped (``POSIX_FADV_DONTNEED``) as
  soon as it has been read, so it never evicts them;
- if even the attention weights do not fit (70B), every range is dropped once read: the
  checkpoint is streamed, and the page cache holds no stale half of it;
- the files are opened with ``POSIX_FADV_SEQUENTIAL`` (a larger kernel read-ahead) and the
  next layer's ranges are announced with ``POSIX_FADV_WILLNEED`` while this one computes
  (``CheckpointWeights.advise_will_need``).

``posix_fadvise`` exists on Linux and most Unixes; elsewhere every advice is a no-op. The plan
never changes what is read or the numbers: only what the kernel keeps.
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass

from headscope.engine.core.errors import InvalidRequestError

__all__ = ["CACHE_SHARE", "DONTNEED", "PAGE_CACHE_ENV", "SEQUENTIAL", "WILLNEED", "PlannedReads", "ReadPlan",
           "advise", "page_cache_bytes", "plan_reads"]

DONTNEED = getattr(os, "POSIX_FADV_DONTNEED", None)
WILLNEED = getattr(os, "POSIX_FADV_WILLNEED", None)
SEQUENTIAL = getattr(os, "POSIX_FADV_SEQUENTIAL", None)

# The share of physical memory a checkpoint may take in the page cache and still count as
# "fits": the process's own arrays, the other processes' and the kernel need the rest. A 7B
# bf16 checkpoint (13.5 GB) on the 24 GB box fits (its second pass is served from memory,
# bench/README.md); a 13B one (26 GB) does not.
CACHE_SHARE = 0.6


PAGE_CACHE_ENV = "HEADSCOPE_PAGE_CACHE_MB"


def page_cache_bytes() -> int:
    """How many bytes of a checkpoint the page cache may be expected to hold: ``CACHE_SHARE``
    of physical memory (0 where it cannot be known: then nothing is advised), or
    ``$HEADSCOPE_PAGE_CACHE_MB`` MiB if set (a box shared with other work; the benchmarks'
    small shapes): a positive finite number, else ``InvalidRequestError`` naming the variable
    (``inf``, ``nan``, ``-1``, ``lots`` would otherwise be a traceback or silently ignored)."""
    given = os.environ.get(PAGE_CACHE_ENV, "").strip()
    if given:
        return int(page_cache_mib(given) * (1 << 20))
    try:
        return int(CACHE_SHARE * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def page_cache_mib(given: str) -> float:
    """``$HEADSCOPE_PAGE_CACHE_MB``'s value as a positive finite number of MiB."""
    try:
        mib = float(given)
    except ValueError:
        mib = math.nan
    if not (math.isfinite(mib) and mib > 0):
        raise InvalidRequestError(None, f"{PAGE_CACHE_ENV}={given!r} is not a page-cache size: "
                                        "set it to a positive number of MiB (e.g. 4096), or unset it")
    return mib


def advise(fd: int, offset: int, length: int, advice: int | None) -> bool:
    """``posix_fadvise(fd, offset, length, advice)`` where it exists; False if not given."""
    if advice is None or length <= 0 or not hasattr(os, "posix_fadvise"):
        return False
    try:
        os.posix_fadvise(fd, offset, length, advice)
    except OSError:  # a file system that refuses advice reads as before
        return False
    return True


@dataclass(frozen=True)
class ReadPlan:
    """What the kernel is told about one checkpoint's bytes (module docstring).

    ``streaming``: the checkpoint does not fit in ``budget`` bytes of page cache;
    ``keep_hot``: its hot (attention) tensors do, and stay there."""

    total: int  # bytes of the checkpoint's tensors
    hot: int  # of which the hot tensors'
    budget: int  # page-cache bytes it may count on
    streaming: bool
    keep_hot: bool

    def drops(self, hot: bool) -> bool:
        """Whether a tensor's range is dropped from the page cache once read."""
        return self.streaming and not (hot and self.keep_hot)


def plan_reads(total: int, hot: int, budget: int | None = None) -> ReadPlan:
    """The plan of a checkpoint of ``total`` tensor bytes, ``hot`` of them attention
    weights, given ``budget`` bytes of page cache (``page_cache_bytes()`` if None)."""
    budget = page_cache_bytes() if budget is None else int(budget)
    streaming = budget > 0 and total > budget
    return ReadPlan(total, hot, budget, streaming, streaming and hot <= budget)


class PlannedReads:
    """A reader of one checkpoint's bytes with a read plan, decided on first use from the
    sizes ``plan_sizes()`` gives (safetensors: ``CheckpointWeights``; GGUF: ``GGUFSource``).
    The class provides ``_lock``."""

    _lock: threading.Lock | threading.RLock
    _budget: int | None = None  # see page_cache_budget
    _plan: ReadPlan | None = None

    def plan_sizes(self) -> tuple[int, int]:
        """``(total, hot)``: bytes of every stored tensor, and of the attention weights."""
        raise NotImplementedError

    @property
    def page_cache_budget(self) -> int | None:
        """Bytes of page cache the read plan counts on (None: ``page_cache_bytes()``);
        setting it decides the plan again (tests, benchmarks)."""
        return self._budget

    @page_cache_budget.setter
    def page_cache_budget(self, value: int | None) -> None:
        with self._lock:
            self._budget, self._plan = value, None

    @property
    def read_plan(self) -> ReadPlan:
        """What the kernel is told about this checkpoint's bytes: nothing when it fits in the
        page cache."""
        with self._lock:
            if self._plan is None:
                self._plan = plan_reads(*self.plan_sizes(), self._budget)
            return self._plan
