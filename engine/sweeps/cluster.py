"""Sweeps on a Dask cluster: one task per missing part of a sweep (docs/internals.md,
"Sweeps on a cluster").

The weight sweeps (``engine.circuits.spectral``, ``engine.circuits.composition``) keep their result in parts (a layer of the copying and
QK-positivity sweeps, a target-layer tile of a composition sweep) behind a ``Memo``. Here
each part the memo lacks becomes one task: a worker opens the checkpoint from the same
path itself (a shared filesystem; the client sends the path and the fingerprint, never
weights), checks the fingerprint, computes that one part with the local sweep function
(``_OnePart`` makes every other part look finished, so the arithmetic is the local one),
and sends it back. Results are put in the memo as they arrive, so finished parts survive
an interruption and a later sweep, local or on the cluster, computes only the rest.

Needs the optional ``dask`` and ``distributed`` packages (``pip install 'headscope[cluster]'``).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from headscope.engine.core.errors import HeadscopeError
from headscope.engine.core.files import os_reason
from headscope.engine.core.progress import Cancelled, Memo, Progress, check_cancelled, report

if TYPE_CHECKING:
    from headscope.engine.model.loading import LoadedModel

RETRIES = 2  # a task whose worker died is run again elsewhere this many times
CONNECT_TIMEOUT = "10s"
# A Dask scheduler writes its handshake as soon as a connection is accepted (distributed's
# Listener.on_connection): a service that stays silent this long, or says something else
# (an HTTP server waits for a request, SSH sends a text banner), is not one.
HANDSHAKE_TIMEOUT = 5.0
_ADDRESS = re.compile(r"(?:(tcp|tls)://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):([0-9]{1,5})")
# What one local worker process costs before it reads a model (Python, numpy, torch and
# distributed imported: ~250 MB resident, measured), and the cap on what it reads of one.
WORKER_BASE_BYTES = 300 << 20
MISSING_EXTRA = "sweeps on a cluster need the optional Dask packages: pip install 'headscope[cluster]'"

__all__ = [
    "Cluster",
    "ClusterError",
    "ClusterTaskError",
    "KeptMemo",
    "compute_part",
    "connect",
    "fingerprint_mismatch",
    "local_cluster",
    "on_worker",
    "parse_address",
    "part_shapes",
    "run_parts",
    "run_tasks",
    "worker_bound",
    "worker_model",
]


class ClusterError(HeadscopeError):
    """The cluster cannot be reached, went away, or the Dask packages are not installed."""


class ClusterTaskError(ClusterError):
    """A task failed on a worker (the reason names the worker's host and the file)."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Dask sends a task's exception back to the client: rebuild it from (path, reason).
        return (type(self), (self.path, self.reason))


def _require_distributed() -> Any:
    try:
        import distributed
    except ImportError:
        raise ClusterError(None, MISSING_EXTRA) from None
    return distributed


# -- the parts of a sweep -----------------------------------------------------------------------


def part_shapes(sweep: str, n_layers: int, n_heads: int) -> dict[int, tuple[int, ...]]:
    """Index and shape of every part of ``sweep`` (the ``Memo`` indices of the sweeps)."""
    if sweep in ("copying_score", "qk_positivity"):
        return {layer: (n_heads,) for layer in range(n_layers)}
    if sweep in ("composition-q", "composition-k", "composition-v"):
        return {t: (t, n_heads, n_heads) for t in range(1, n_layers)}
    raise ClusterError(None, f"no cluster sweep named {sweep!r}")


class _OnePart:
    """A memo in which every part but ``index`` is already finished (zeros, never read back):
    the local sweep function then computes exactly that one part."""

    def __init__(self, index: int, shapes: dict[int, tuple[int, ...]]) -> None:
        self.index, self.shapes = index, shapes
        self.value: np.ndarray | None = None

    def get(self, index: int, shape: tuple[int, ...] | None = None) -> np.ndarray | None:
        if index == self.index:
            return None
        return np.zeros(shape or self.shapes[index], dtype=np.float32)

    def put(self, index: int, value: Any) -> None:
        if index == self.index:
            self.value = np.asarray(value, dtype=np.float32)


def _run_sweep(model: LoadedModel, sweep: str, memo: _OnePart) -> None:
    """Compute ``memo``'s one part by the function the client's own sweep runs
    (``scores.weight_scores``, ``scores.composition``), so the numbers are bit-identical."""
    from headscope.engine.circuits import spectral
    from headscope.engine.circuits.composition import composition_scores
    from headscope.engine.circuits.spectral import kept_spectral_middles

    arrays = model.weights
    if sweep in ("copying_score", "qk_positivity"):
        # one layer of spectral.spectral_scores; the middles are kept on the worker's open model
        middle = {sweep: kept_spectral_middles(arrays)[sweep]}
        memo.put(memo.index, spectral.layer_spectral_scores(arrays, memo.index, middle)[sweep])
        return
    composition_scores(arrays, sweep.rsplit("-", 1)[1], memo=memo, baseline_samples=1,
                       tile_bytes=worker_tile_bytes())


def worker_tile_bytes(limit: int | None = None) -> int:
    """How many bytes of source factors a composition part stacks at once on this worker:
    a quarter of the worker's memory limit (``dask worker --memory-limit``; ``limit``
    overrides), never more than the in-process ``composition.TILE_BYTES``, never under 16 MiB. The
    blocking changes, the numbers do not (tests/engine/sweeps/test_cluster.py)."""
    from headscope.engine.circuits.composition import TILE_BYTES

    if limit is None:
        try:
            from distributed import get_worker

            limit = get_worker().memory_manager.memory_limit
        except (ImportError, ValueError, AttributeError):  # not on a worker / an older Dask
            limit = None
    if not limit:
        return TILE_BYTES
    return max(16 << 20, min(TILE_BYTES, int(limit) // 4))


# One open model per worker process: the tasks of one sweep share the opened checkpoint.
_OPEN: dict[tuple[str, str, bool], LoadedModel] = {}

def _worker_model(path: str, key: str, raw: bool) -> LoadedModel:
    from headscope.engine.model.loading import load_model
    from headscope.engine.sweeps.store import fingerprint

    cached = _OPEN.get((path, key, raw))
    if cached is not None:
        return cached
    model = load_model(path, raw=raw)
    found = fingerprint(model.checkpoint, raw)
    if found != key:
        raise fingerprint_mismatch(path)
    _OPEN.clear()
    _OPEN[(path, key, raw)] = model
    return model


def worker_model(path: str, key: str, raw: bool) -> LoadedModel:
    """The checkpoint at ``path`` opened on this worker (once for the tasks of a sweep),
    or a ``ClusterTaskError`` if its fingerprint is not the client's ``key``."""
    return _worker_model(path, key, raw)


def compute_part(path: str, key: str, raw: bool, sweep: str, index: int) -> np.ndarray:
    """One part of ``sweep`` on the checkpoint at ``path`` (run on a worker).

    Fails with ``ClusterTaskError`` (naming this host and the file) if the checkpoint's
    fingerprint is not ``key``, or if it cannot be opened here.
    """
    try:
        model = _worker_model(path, key, raw)
        cfg = model.cfg
        memo = _OnePart(index, part_shapes(sweep, cfg.n_layers, cfg.n_heads))
        _run_sweep(model, sweep, memo)
    except ClusterTaskError:
        raise
    except HeadscopeError as err:  # re-typed: it must travel back to the client intact
        raise on_worker(err) from None
    assert memo.value is not None
    return memo.value


# -- the client side ----------------------------------------------------------------------------


class KeptMemo:
    """The parts in memory, written through to ``inner`` (the results store, or None): the
    sweep that follows a cluster run reads them back even if the store cannot keep them."""

    def __init__(self, inner: Memo | None) -> None:
        self.inner = inner
        self.parts: dict[int, np.ndarray] = {}

    def get(self, index: int, shape: tuple[int, ...] | None = None) -> np.ndarray | None:
        if index in self.parts:
            return self.parts[index]
        return None if self.inner is None else self.inner.get(index, shape)

    def put(self, index: int, value: Any) -> None:
        self.parts[index] = np.asarray(value, dtype=np.float32)
        if self.inner is not None:
            self.inner.put(index, value)


@dataclass
class Cluster:
    """A connected Dask client (and the local cluster it started, if any)."""

    client: Any
    address: str
    local: Any = None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()
        if self.local is not None:
            with contextlib.suppress(Exception):
                self.local.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def parse_address(address: str) -> tuple[str, str, int]:
    """``(scheme, host, port)`` of ``tcp://HOST:PORT`` (``tls://``, or no scheme: tcp);
    a one-line ``ClusterError`` for anything else, before any client is built."""
    match = _ADDRESS.fullmatch(address.strip())
    if match is None or not 1 <= int(match.group(3)) <= 65535:
        raise ClusterError(None, f"{address!r} is not a Dask scheduler address: expected "
                           "tcp://HOST:PORT")
    return match.group(1) or "tcp", match.group(2).strip("[]"), int(match.group(3))


def probe_scheduler(address: str, host: str, port: int,
                    timeout: float = HANDSHAKE_TIMEOUT) -> None:
    """Fail in bounded time unless a Dask scheduler answers at ``host:port``: the client's
    own connect waits for a handshake without end on a port where another service listens."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as err:
        reason = "timed out" if isinstance(err, TimeoutError) else os_reason(err)
        raise ClusterError(None, f"cannot reach a Dask scheduler at {address} ({reason})") from None
    with sock:
        sock.settimeout(timeout)
        head = b""
        try:
            while len(head) < 8:
                chunk = sock.recv(8 - len(head))
                if not chunk:
                    break
                head += chunk
        except OSError:  # timed out, or reset
            pass
    # Dask's first frame starts with a little-endian 64-bit count (of frames or bytes): small.
    if len(head) < 8 or not 0 < int.from_bytes(head, "little") < 1 << 32:
        said = f"it sent {head[:8]!r}" if head else f"no Dask handshake within {timeout:g} s"
        raise ClusterError(None, f"{address} is not a Dask scheduler ({said}; another service "
                           "listens on that port?)")


def connect(address: str) -> Cluster:
    """A client of the scheduler at ``address`` (``tcp://HOST:PORT``); one-line error if none.

    The address is checked and the port probed first (``parse_address``,
    ``probe_scheduler``); a client whose construction fails is closed at once (left to its
    ``__del__``, it stalls 20 s and prints a traceback)."""
    distributed = _require_distributed()
    scheme, host, port = parse_address(address)
    if scheme == "tcp":
        probe_scheduler(address, host, port, HANDSHAKE_TIMEOUT)
    client = distributed.Client.__new__(distributed.Client)
    try:
        client.__init__(address.strip(), timeout=CONNECT_TIMEOUT, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as err:
        _close_quietly(client)
        raise ClusterError(None, f"cannot reach a Dask scheduler at {address} ({_brief(err)})") from None
    except BaseException:
        _close_quietly(client)
        raise
    return Cluster(client, address)


def _close_quietly(client: Any) -> None:
    with contextlib.suppress(Exception):
        client.close(timeout=2)


def worker_bound(model_bytes: int = 0, base: int = WORKER_BASE_BYTES) -> tuple[int, str]:
    """How many local workers this machine can run, and why: one per core (more only wait
    for one), and as many as the available memory holds at ``base`` (a process's own cost;
    0 for threads) plus ``model_bytes`` (what one worker reads of the model) each."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    available = available_memory()
    per_worker = max(1, base + max(0, int(model_bytes)))
    by_memory = max(1, available // per_worker) if available else cores
    if by_memory < cores:
        return by_memory, (f"{available / 2**30:.1f} GB of memory available, about "
                           f"{per_worker / 2**20:.0f} MB per worker")
    return cores, f"{cores} CPU core{'s' if cores != 1 else ''} available"


def available_memory() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (None where there is none)."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f.read(1 << 16).splitlines():
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def local_cluster(n_workers: int, model_bytes: int = 0,
                  warn: Callable[[str], None] | None = None) -> Cluster:
    """Up to ``n_workers`` local worker processes (one thread each) on 127.0.0.1, and a
    client; more than the machine can run (``worker_bound``) are cut, saying so."""
    import logging

    distributed = _require_distributed()
    if n_workers < 1:
        raise ClusterError(None, f"--workers must be at least 1, not {n_workers}")
    bound, why = worker_bound(model_bytes)
    if n_workers > bound:
        if warn is not None:
            warn(f"--workers {n_workers}: starting {bound} ({why})")
        n_workers = bound
    # The nannies' warnings (one per worker: memory, ports, restarts) are not ours to show.
    # The scheduler serves HTTP (health and metrics routes) even with no dashboard, on 8787
    # unless told otherwise: where that port was taken (a Jupyter user's Dask dashboard,
    # another run) Dask warned so on the command's stderr. A free port of 127.0.0.1 instead.
    local = distributed.LocalCluster(n_workers=n_workers, processes=True, threads_per_worker=1,
                                     host="127.0.0.1", dashboard_address=None,
                                     scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
                                     silence_logs=logging.ERROR)
    client = distributed.Client(local, set_as_default=False)
    return Cluster(client, local.scheduler_address, local)


def _brief(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= 160 else text[:157] + "..."


def run_parts(cluster: Cluster, model: LoadedModel, key: str, sweep: str, memo: Memo,
              progress: Progress = None, cancelled: Cancelled = None) -> int:
    """Compute on ``cluster`` every part of ``sweep`` that ``memo`` lacks and put each in it
    as it arrives; the number computed. ``progress(fraction of parts done)``; ``cancelled()``
    (or Ctrl-C) cancels the outstanding tasks. A scheduler that goes away is a
    ``ClusterError``, the parts already put kept."""

    cfg = model.cfg
    shapes = part_shapes(sweep, cfg.n_layers, cfg.n_heads)
    missing = [i for i, shape in shapes.items() if memo.get(i, shape) is None]
    total = len(shapes) or 1
    done = total - len(missing)
    report(progress, done / total)
    if not missing:
        return 0
    distributed = _require_distributed()
    path = str(model.path)
    futures = {}
    count = [done]  # parts finished so far, for the error message
    with _cluster_failures(cluster, count, total):
        for i in missing:
            fut = cluster.client.submit(compute_part, path, key, bool(model.raw), sweep, i,
                                        retries=RETRIES, pure=False)
            futures[fut.key] = (fut, i)
    try:
        with _cluster_failures(cluster, count, total):
            for fut in distributed.as_completed([f for f, _ in futures.values()],
                                                loop=cluster.client.loop):
                _, index = futures[fut.key]
                value = fut.result()
                memo.put(index, value)
                count[0] += 1
                report(progress, count[0] / total)
                check_cancelled(cancelled)
    except BaseException:
        _cancel(cluster, [f for f, _ in futures.values()])
        raise
    return len(missing)


def on_worker(err: HeadscopeError) -> ClusterTaskError:
    """``err``, raised by a task on a worker, as the error that travels back to the client
    intact (Dask pickles it): the reason names this host."""
    return ClusterTaskError(err.path, f"on worker host {socket.gethostname()}: {err.reason}")


def fingerprint_mismatch(path: str) -> ClusterTaskError:
    """The error of a task whose checkpoint is not the client's (``store.fingerprint``)."""
    return ClusterTaskError(path, f"on worker host {socket.gethostname()}: the checkpoint differs "
                            "from the client's (fingerprint mismatch: not the same file on a "
                            "shared filesystem?)")


def run_tasks(cluster: Cluster, task: Callable[..., Any], args: Sequence[tuple[Any, ...]], *,
              finished: Callable[[int, Any], None], cancelled: Cancelled = None) -> None:
    """``task(*args[i])`` for every ``i`` on ``cluster``, one Dask task each (a module-level
    function: Dask sends it by name); ``finished(i, result)`` as each arrives. Faults and
    cancellation as ``run_parts`` (the timeline's steps: ``timeline.score_step_task``)."""

    distributed = _require_distributed()
    futures: dict[str, tuple[Any, int]] = {}
    count = [0]
    with _cluster_failures(cluster, count, len(args)):
        for i, a in enumerate(args):
            fut = cluster.client.submit(task, *a, retries=RETRIES, pure=False)
            futures[fut.key] = (fut, i)
    try:
        with _cluster_failures(cluster, count, len(args)):
            for fut in distributed.as_completed([f for f, _ in futures.values()],
                                                loop=cluster.client.loop):
                finished(futures[fut.key][1], fut.result())
                count[0] += 1
                check_cancelled(cancelled)
    except BaseException:
        _cancel(cluster, [f for f, _ in futures.values()])
        raise


def _cancel(cluster: Cluster, futures: list[Any]) -> None:
    with contextlib.suppress(Exception):
        cluster.client.cancel([f for f in futures if not f.done()])


@contextlib.contextmanager
def _cluster_failures(cluster: Cluster, count: list[int], total: int) -> Iterator[None]:
    """Connection failures as one ``ClusterError`` line (task errors pass through);
    ``count[0]``: the parts finished (and kept) so far."""
    try:
        yield
    except HeadscopeError:
        raise
    except (OSError, TimeoutError) as err:
        raise _gone(cluster, count[0], total, err) from None
    except Exception as err:
        if type(err).__name__ == "KilledWorker":
            raise ClusterError(None, f"a task killed {RETRIES + 1} Dask workers in turn "
                               f"({_brief(err)}); {count[0]} of {total} parts finished are kept") from None
        if type(err).__module__.startswith(("distributed", "tornado")) or "closed" in str(err).lower():
            raise _gone(cluster, count[0], total, err) from None
        raise


def _gone(cluster: Cluster, done: int, total: int, err: BaseException) -> ClusterError:
    return ClusterError(None, f"lost the Dask scheduler at {cluster.address} ({_brief(err)}); "
                        f"{done} of {total} parts finished are kept in the results store")
