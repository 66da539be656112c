"""Engine workers an earlier test left behind.

An engine's ``aclose()`` stops its scheduler and joins the workers on a daemon
``headscope-close`` thread (engine/service/engine.py); the explorer waits 0.25 s for it, and a
test that opened an engine itself may not close it at all. So in one pytest process a worker
of an earlier test may finish its job while the next test runs. A test that counts calls through a
process-wide patch (``monkeypatch.setattr`` on a module) counts only the calls of its own
threads: ``from_this_test`` drops those of a scheduler worker that was already alive."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

# the scheduler's worker threads are named after it (engine/service/scheduler.py)
WORKER_PREFIX = "headscope-engine"


def from_this_test(record: Callable[..., Any]) -> Callable[..., None]:
    """``record`` called with the arguments of each call made by any thread but an engine
    worker that was alive when this was made."""
    earlier = {t for t in threading.enumerate() if t.name.startswith(WORKER_PREFIX)}

    def recorder(*args: Any, **kwargs: Any) -> None:
        if threading.current_thread() not in earlier:
            record(*args, **kwargs)

    return recorder
