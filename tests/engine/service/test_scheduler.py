"""The engine's generic machinery (cache, scheduler) with fake compute functions."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from headscope.engine.core import errors
from headscope.engine.core.cache import ByteLRU
from headscope.engine.core.results import nbytes, readonly
from headscope.engine.service.scheduler import Scheduler

# -- cache ---------------------------------------------------------------------------


def test_cache_hit_returns_identical_object_and_counts():
    cache = ByteLRU(1 << 20)
    value = readonly(np.ones((4, 4), np.float32))
    assert cache.get("k") is None
    cache.put("k", value)
    assert cache.get("k") is value
    assert (cache.hits, cache.misses) == (1, 1)


def test_cache_eviction_respects_byte_budget_lru_order():
    arrays = {i: readonly(np.zeros(1000, np.float32)) for i in range(10)}
    size = nbytes(arrays[0])
    cache = ByteLRU(3 * size + 10)
    for i in range(3):
        cache.put(i, arrays[i])
    cache.get(0)  # 0 becomes most recently used: 1 is evicted next
    cache.put(3, arrays[3])
    assert 1 not in cache and 0 in cache and 2 in cache and 3 in cache
    for i in range(4, 10):
        cache.put(i, arrays[i])
        assert cache.bytes <= cache.capacity
    assert cache.evictions == 7
    assert cache.bytes == sum(nbytes(arrays[k]) for k in range(7, 10))


def test_cache_refuses_entry_bigger_than_budget():
    cache = ByteLRU(100)
    cache.put("small", 1)  # 256 bytes of overhead > 100: not kept either
    cache.put("big", readonly(np.zeros(1000)))
    assert len(cache) == 0 and cache.bytes == 0


def test_readonly_arrays_cannot_be_written():
    a = readonly([1.0, 2.0])
    with pytest.raises(ValueError):
        a[0] = 3.0


# -- scheduler -----------------------------------------------------------------------


@pytest.fixture
async def sched():
    results: dict = {}
    s = Scheduler(2, on_result=results.__setitem__)
    s.results = results
    yield s
    s.close()
    s.join(2)


async def test_two_concurrent_identical_requests_run_once(sched):
    calls = []
    gate = threading.Event()

    def compute(ctx):
        calls.append(1)
        gate.wait(60)
        return object()

    t1 = asyncio.create_task(sched.run("same", compute, label="x"))
    t2 = asyncio.create_task(sched.run("same", compute, label="x"))
    await asyncio.sleep(0.05)
    gate.set()
    r1, r2 = await asyncio.gather(t1, t2)
    assert r1 is r2
    assert len(calls) == 1
    assert sched.results["same"] is r1
    assert sched.in_flight == 0


async def test_raising_job_reaches_every_awaiter_as_typed_error(sched):
    gate = threading.Event()

    def boom(ctx):
        gate.wait(60)
        raise ZeroDivisionError("bad math")

    tasks = [asyncio.create_task(sched.run("k", boom, label="boom")) for _ in range(3)]
    await asyncio.sleep(0.02)
    gate.set()
    done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
    assert all(isinstance(e, errors.ComputeError) for e in done)
    assert "ZeroDivisionError" in str(done[0]) and "bad math" in str(done[0])
    # a typed error passes through unchanged
    with pytest.raises(errors.NonFiniteError, match="nan here"):
        await sched.run("t", lambda ctx: (_ for _ in ()).throw(errors.NonFiniteError("f", "nan here")))
    assert "k" not in sched.results


async def test_queued_request_for_left_head_is_dropped_before_start():
    s = Scheduler(1)
    started = []
    gate, running = threading.Event(), threading.Event()

    def blocker(ctx):
        running.set()
        gate.wait(60)
        return "sweep"

    def view(name):
        def fn(ctx):
            started.append(name)
            return name

        return fn

    s.focus((0, 0))
    sweep = asyncio.create_task(s.run("sweep", blocker))  # occupies the only worker
    for _ in range(500):  # on a busy box the worker may take a while to start it
        if running.is_set():
            break
        await asyncio.sleep(0.01)
    old = asyncio.create_task(s.run("old", view("old"), head=(0, 0)))
    await asyncio.sleep(0.01)
    s.focus((0, 1))
    new = asyncio.create_task(s.run("new", view("new"), head=(0, 1)))
    gate.set()
    with pytest.raises(errors.CancelledError):
        await old
    assert await new == "new"
    assert await sweep == "sweep"
    assert started == ["new"]
    s.close()


async def test_running_request_for_left_head_stops_at_next_check():
    s = Scheduler(1)
    steps = []

    def slow_view(ctx):
        for i in range(200):
            ctx.check()
            steps.append(i)
            time.sleep(0.005)
        return "finished"

    s.focus((1, 1))
    task = asyncio.create_task(s.run("v", slow_view, head=(1, 1)))
    await asyncio.sleep(0.05)
    s.focus((1, 2))
    with pytest.raises(errors.CancelledError):
        await asyncio.wait_for(task, 5)
    assert 0 < len(steps) < 200
    s.close()


async def test_focused_head_runs_before_earlier_requests():
    s = Scheduler(1)
    order = []
    gate = threading.Event()

    def block(ctx):
        gate.wait(60)

    def rec(name):
        return lambda ctx: order.append(name)

    first = asyncio.create_task(s.run("block", block))
    await asyncio.sleep(0.02)
    s.focus((2, 0))  # focus before submitting, so neither request is stale
    others = [asyncio.create_task(s.run(f"o{i}", rec(f"o{i}"), head=(3, i))) for i in range(3)]
    await asyncio.sleep(0)
    focused = asyncio.create_task(s.run("f", rec("f"), head=(2, 0)))
    await asyncio.sleep(0.01)
    gate.set()
    await asyncio.gather(first, focused, *others)
    assert order == ["f", "o0", "o1", "o2"]
    s.close()


async def test_prefetch_runs_when_idle_and_is_upgraded_by_a_request():
    cached: dict = {}
    s = Scheduler(1, on_result=cached.__setitem__)
    calls = []
    gate = threading.Event()

    def pre(ctx):
        calls.append("pre")
        gate.wait(60)
        return "pf"

    s.prefetch("p", pre, head=(0, 1), label="prefetch")
    await asyncio.sleep(0.02)
    joined = asyncio.create_task(s.run("p", pre, head=(0, 1)))  # joins the running prefetch
    await asyncio.sleep(0.01)
    gate.set()
    assert await joined == "pf"
    assert calls == ["pre"] and cached["p"] == "pf"
    s.close()


async def test_cancelled_sweep_stops_and_reports_progress():
    s = Scheduler(1)
    seen = []
    steps = []

    def sweep(ctx):
        for i in range(1000):
            ctx.check()
            steps.append(i)
            ctx.progress(i / 1000)
            time.sleep(0.002)
        return "all"

    task = asyncio.create_task(s.run("sweep", sweep, label="sweep", progress=seen.append))
    await asyncio.sleep(0.1)
    assert s.activity is not None and s.activity.startswith("sweep")
    task.cancel()  # the caller gives up: the sweep must stop, not run to the end
    with pytest.raises(asyncio.CancelledError):
        await task
    n = len(steps)
    await asyncio.sleep(0.05)
    assert len(steps) <= n + 1 < 1000
    assert seen and all(0 <= f < 1 for f in seen) and seen == sorted(seen)
    s.close()


async def test_a_sweep_its_caller_gave_up_on_leaves_no_unretrieved_exception():
    """The abandoned job still ends with "cancelled" on its future; nobody awaits it, so the
    scheduler retrieves it. Left unretrieved, asyncio logged "Future exception was never
    retrieved" whenever the future was collected, once inside pytest's ast.parse, which that
    nested log's traceback formatting broke (CPython 3.11, gh-106905: a crashed test run)."""
    import gc

    loop = asyncio.get_running_loop()
    reported: list[dict] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    s = Scheduler(1)
    started, ended = threading.Event(), threading.Event()

    def sweep(ctx):
        started.set()
        try:
            while True:
                ctx.check()
                time.sleep(0.002)
        finally:
            ended.set()

    task = asyncio.create_task(s.run("sweep", sweep, label="sweep"))
    while not started.is_set():
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    while not ended.is_set():
        await asyncio.sleep(0.01)
    for _ in range(5):  # the worker's delivery reaches the loop
        await asyncio.sleep(0.01)
    s.close()  # the worker returns: nothing of the job is left on its stack
    for thread in s._threads:
        thread.join(5)
    del task
    gc.collect()
    await asyncio.sleep(0)
    assert not [c for c in reported if "never retrieved" in str(c.get("message"))]


async def test_event_loop_not_blocked_while_sweep_runs():
    """The sweep runs on a worker thread and the loop keeps turning meanwhile. Counts, not
    wall-clock: how long a tick may take is bench/'s business (busy machines are slow)."""
    s = Scheduler(1)
    loop_thread = threading.get_ident()
    sweep_threads: list[int] = []
    running = threading.Event()

    def sweep(ctx):
        sweep_threads.append(threading.get_ident())
        running.set()
        x = np.random.default_rng(0).standard_normal((300, 300))
        for _ in range(60):
            ctx.check()
            x = np.tanh(x @ x.T / 300)
        running.clear()
        return float(x.sum())

    ticks_while_running = 0

    async def probe():
        nonlocal ticks_while_running
        while True:
            await asyncio.sleep(0.001)
            ticks_while_running += running.is_set()

    p = asyncio.create_task(probe())
    await s.run("sweep", sweep)
    p.cancel()
    assert sweep_threads and loop_thread not in sweep_threads
    assert ticks_while_running > 0, "the event loop never ran while the sweep computed"
    s.close()


async def test_finished_job_leaves_no_activity_even_without_a_progress_callback():
    """Every engine job reports 100% at its end; a job nobody asked progress of (the
    Composition tab's path column) left "path patching k 100%" and a turning spinner in the
    status bar for good (issue 39 §3)."""
    s = Scheduler(1)

    def job(ctx):
        ctx.progress(0.5)
        ctx.progress(1.0)
        return "done"

    assert await s.run("path", job, label="path patching k") == "done"
    assert (s.activity, s.progress) == (None, None)
    s.close()


async def test_an_earlier_job_finishing_keeps_the_running_jobs_activity():
    s = Scheduler(2)
    gate, started = threading.Event(), threading.Event()

    def quick(ctx):
        ctx.progress(1.0)
        return 1

    def slow(ctx):
        started.set()
        gate.wait(60)
        ctx.progress(0.4)
        gate2.wait(60)
        return 2

    gate2 = threading.Event()
    slow_task = asyncio.create_task(s.run("slow", slow, label="sweep"))
    assert await s.run("quick", quick, label="quick") == 1
    gate.set()
    for _ in range(200):
        if s.activity == "sweep 40%":
            break
        await asyncio.sleep(0.01)
    assert s.activity == "sweep 40%"
    gate2.set()
    assert await slow_task == 2
    assert s.activity is None
    s.close()


async def test_freed_pages_go_back_once_the_queue_is_drained(monkeypatch):
    """Between jobs the freed memory stays for the next (engine/core/memory.py); when no job
    runs or waits, the scheduler trims the heap, so an idle explorer holds only what it keeps."""
    from headscope.engine.service import scheduler

    trims: list[tuple[int, int]] = []
    s = Scheduler(1)

    def trim() -> None:
        # only this scheduler's trims count: a worker another test left behind may finish
        # its job (and trim) while this test runs, because the patch is module-wide
        if threading.current_thread() in s._threads:
            trims.append((len(s._running), len(s._queue)))

    monkeypatch.setattr(scheduler, "release_free_heap", trim)
    gate = threading.Event()

    async def until(condition) -> None:
        for _ in range(1000):
            if condition():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the scheduler never got there")

    try:
        first = asyncio.create_task(s.run("first", lambda ctx: gate.wait(60)))
        await until(lambda: len(s._running) == 1)
        queued = [asyncio.create_task(s.run(k, lambda ctx, k=k: k)) for k in ("second", "third")]
        await until(lambda: len(s._queue) == 2)
        assert trims == []  # the first job still runs, two wait
        gate.set()
        await asyncio.wait_for(asyncio.gather(first, *queued), 30)
        await until(lambda: trims)  # the worker trims after delivering the last result
        assert trims == [(0, 0)]  # once, with nothing running or queued
    finally:
        gate.set()
        s.close()
        s.join(2)
