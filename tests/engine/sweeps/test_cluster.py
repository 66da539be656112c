"""Sweeps on a real Dask cluster (engine/cluster.py): a scheduler and two worker processes
on 127.0.0.1, against the local sweeps."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

pytest.importorskip("distributed")

from headscope.engine.api import report
from headscope.engine.circuits import composition, spectral
from headscope.engine.core.progress import Memo
from headscope.engine.model.loading import load_model
from headscope.engine.sweeps import scores as score_sweeps
from headscope.engine.sweeps.cluster import (
    Cluster,
    ClusterError,
    ClusterTaskError,
    KeptMemo,
    connect,
    run_parts,
    worker_tile_bytes,
)
from headscope.engine.sweeps.store import ResultStore
from tests import hf_fixtures

WAIT = 60.0  # every wait on the cluster is bounded by this (seconds)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _scratch_env(scratch: Path) -> dict[str, str]:
    """Dask's scratch space (lock files, spill) under the test's tmp dir, not /tmp."""
    return {**os.environ, "DASK_TEMPORARY_DIRECTORY": str(scratch)}


def _scheduler(port: int, scratch: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
         "--port", str(port), "--no-dashboard"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_scratch_env(scratch))


WORKER_MEMORY = "2GB"  # a limit under 4 × composition.TILE_BYTES: the workers block tiles smaller


def _worker(address: str, scratch: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1",
         "--no-dashboard", "--host", "127.0.0.1", "--memory-limit", WORKER_MEMORY],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_scratch_env(scratch))


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory: pytest.TempPathFactory,
              ) -> Iterator[tuple[str, list[subprocess.Popen[bytes]]]]:
    """A scheduler and two workers; the address and the worker processes."""
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    scratch = tmp_path_factory.mktemp("dask-scratch")
    procs = [_scheduler(port, scratch)]
    workers = [_worker(address, scratch), _worker(address, scratch)]
    procs += workers
    try:
        yield address, workers
    finally:
        for p in reversed(procs):
            _stop(p)


def _connect_when_up(address: str) -> Cluster:
    """``connect``, retried for up to ``WAIT`` seconds: the scheduler may still be starting."""
    deadline = time.monotonic() + WAIT
    while True:
        try:
            return connect(address)
        except ClusterError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _sixteen_layers(tmp_path: Path) -> Path:
    """A GPT-2 of 16 layers × 8 heads (d_model 256): enough parts to act mid-sweep."""
    with mock.patch.object(hf_fixtures, "N_LAYERS", 16), \
            mock.patch.object(hf_fixtures, "D_MODEL", 256), \
            mock.patch.object(hf_fixtures, "N_HEADS", 8):
        path, _ = hf_fixtures.build_gpt2(tmp_path / "m16", tokenizer=False)
    return path


@pytest.fixture
def cluster(scheduler: tuple[str, list[subprocess.Popen[bytes]]]) -> Iterator[Cluster]:
    address, workers = scheduler
    c = _connect_when_up(address)
    alive = sum(p.poll() is None for p in workers)
    c.client.wait_for_workers(alive, timeout=WAIT)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def deep_gpt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    with mock.patch.object(hf_fixtures, "N_LAYERS", 6):
        path, _ = hf_fixtures.build_gpt2(tmp_path_factory.mktemp("cluster-gpt2"))
    return path


def test_heads_and_composition_on_the_cluster_equal_the_local_sweeps(
        cluster: Cluster, deep_gpt2: Path, tmp_path: Path) -> None:
    model = load_model(deep_gpt2)
    local_heads = report.head_table(model)
    local_comp = report.composition_report(model, "k")
    store = ResultStore(tmp_path / "store")
    seen: list[float] = []
    heads = report.head_table(model, store=store, cluster=cluster, progress=seen.append)
    comp = report.composition_report(model, "k", store=store, cluster=cluster)
    # exactly: the workers run the local sweep functions (as JSON: NaN, the delimiter sink of a
    # vocabulary without punctuation, equals itself there)
    assert json.dumps(heads) == json.dumps(local_heads)
    np.testing.assert_array_equal(np.array(comp["scores"]), np.array(local_comp["scores"]))
    assert comp["top_edges"] == local_comp["top_edges"]
    assert seen == sorted(seen) and seen[-1] >= 0.8  # the cluster parts reported as they came
    # every part is in the store: a local sweep now computes nothing
    entry = store.for_model(model)
    with mock.patch.object(spectral, "_batched_spectral_score", side_effect=AssertionError):
        again = score_sweeps.score_table(model, store=entry)
    np.testing.assert_array_equal(again.copying_score, np.array([r["copying_score"] for r in heads],
                                                                dtype=np.float32).reshape(6, -1))


def test_workers_size_composition_blocks_to_their_memory(cluster: Cluster, deep_gpt2: Path) -> None:
    assert worker_tile_bytes(2 << 30) == 512 << 20
    assert worker_tile_bytes(64 << 30) == composition.TILE_BYTES  # never more than in-process
    assert worker_tile_bytes(1 << 20) == 16 << 20
    assert worker_tile_bytes() == composition.TILE_BYTES  # not on a worker: the in-process size
    limits = {a: w["memory_limit"] for a, w in cluster.client.scheduler_info()["workers"].items()}
    found = {a: cluster.client.submit(worker_tile_bytes, workers=[a], pure=False).result()
             for a in limits}  # in a task on each real worker: its own limit
    assert found == {a: worker_tile_bytes(limit) for a, limit in limits.items()}
    assert all(v < composition.TILE_BYTES for v in found.values())
    # smaller blocks, the same numbers: one source layer at a time against the default
    arrays = load_model(deep_gpt2).weights
    small = composition.composition_scores(arrays, "k", baseline_samples=1, tile_bytes=1).scores
    default = composition.composition_scores(arrays, "k", baseline_samples=1).scores
    np.testing.assert_array_equal(small, default)


def test_a_worker_forms_each_vocabulary_contraction_once(deep_gpt2: Path) -> None:
    """One task per layer: W_U W_E and W_Eᵀ W_E are kept for the following tasks (in this
    process, as in a worker's), and every part is the local sweep's row."""
    from headscope.engine.sweeps import cluster as cluster_mod
    from headscope.engine.sweeps.store import fingerprint

    model = load_model(deep_gpt2)
    key = fingerprint(model.checkpoint, False)
    found = score_sweeps.weight_scores(model)  # the local sweep: the same numbers, bit for bit
    local = {name: found[name] for name in ("copying_score", "qk_positivity")}
    cluster_mod._OPEN.clear()
    with mock.patch.object(spectral, "spectral_middles", wraps=spectral.spectral_middles) as middles:
        for sweep, rows in local.items():
            for layer in range(rows.shape[0]):
                part = cluster_mod.compute_part(str(deep_gpt2), key, False, sweep, layer)
                np.testing.assert_array_equal(part, rows[layer])
    assert middles.call_count == 1  # both middles at once, for every task of both sweeps
    cluster_mod._OPEN.clear()


def test_an_interrupted_local_sweep_resumes_on_the_cluster(
        cluster: Cluster, deep_gpt2: Path, tmp_path: Path) -> None:
    model = load_model(deep_gpt2)
    entry = ResultStore(tmp_path / "store").for_model(model)
    memo = entry.memo("composition-q", ())
    arrays = model.weights  # what score_sweeps.composition reads
    with pytest.raises(_Stop):  # interrupted after tiles 1 and 2
        composition.composition_scores(arrays, "q", memo=_Upto(memo, 3))
    kept = KeptMemo(entry.memo("composition-q", ()))
    computed = run_parts(cluster, model, entry.key or "", "composition-q", kept)
    assert computed == 3  # tiles 3, 4, 5
    found = score_sweeps.composition(model, "q", store=ResultStore(tmp_path / "store").for_model(model))
    np.testing.assert_array_equal(found.scores, score_sweeps.composition(model, "q").scores)


class _Upto:
    """A memo that stops the sweep (raises) once tile ``stop`` would be stored."""

    def __init__(self, inner: Memo, stop: int) -> None:
        self.inner, self.stop = inner, stop

    def get(self, index: int, shape: tuple[int, ...] | None = None) -> np.ndarray | None:
        return self.inner.get(index, shape)

    def put(self, index: int, value: object) -> None:
        if index >= self.stop:
            raise _Stop()
        self.inner.put(index, value)


class _Stop(Exception):
    pass


def test_a_fingerprint_mismatch_fails_naming_the_file(cluster: Cluster, deep_gpt2: Path) -> None:
    model = load_model(deep_gpt2)
    with pytest.raises(ClusterTaskError) as err:
        run_parts(cluster, model, "0" * 32, "copying_score", KeptMemo(None))
    line = str(err.value)
    assert str(deep_gpt2) in line and "fingerprint" in line and "\n" not in line
    assert "on worker host" in line


def test_nothing_listening_is_a_one_line_error() -> None:
    address = f"tcp://127.0.0.1:{_free_port()}"
    with mock.patch("headscope.engine.sweeps.cluster.CONNECT_TIMEOUT", "2s"), \
            pytest.raises(ClusterError) as err:
        connect(address)
    assert address in str(err.value) and "\n" not in str(err.value)


def test_a_worker_killed_mid_sweep_loses_nothing(
        cluster: Cluster, scheduler: tuple[str, list[subprocess.Popen[bytes]]],
        deep_gpt2: Path, tmp_path: Path) -> None:
    """Kills one of the module's two workers (the tests after it use the other)."""
    _, workers = scheduler
    model = load_model(_sixteen_layers(tmp_path))
    victim = workers[1]
    killed: list[float] = []

    def progress(fraction: float) -> None:
        if fraction > 0 and not killed:
            killed.append(fraction)
            victim.kill()
            victim.wait(timeout=10)

    store = ResultStore(tmp_path / "store")
    found = score_sweeps.composition(model, "v", store=store.for_model(model), cluster=cluster,
                                progress=progress)
    assert killed and killed[0] < 0.5  # the kill came with most parts still to be sent back
    np.testing.assert_array_equal(found.scores, score_sweeps.composition(model, "v").scores)
    with contextlib.suppress(Exception):
        assert cluster.client.nthreads()  # the other worker is still serving


# -- the CLI ------------------------------------------------------------------------------------


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from headscope.tui.cli.main import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_composition_on_the_cluster_prints_the_local_json(
        capsys: pytest.CaptureFixture[str], cluster: Cluster, deep_gpt2: Path,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HEADSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HEADSCOPE_CONFIG", str(tmp_path / "none.toml"))
    argv = ("composition", str(deep_gpt2), "--kind", "q", "--json", "--no-cache")
    code, local, _ = _cli(capsys, *argv)
    assert code == 0
    code, remote, err = _cli(capsys, *argv, "--scheduler", cluster.address)
    assert (code, err) == (0, "")
    assert json.loads(remote) == json.loads(local)
    # the `cluster` setting is used when no flag is given
    (tmp_path / "cfg.toml").write_text(f'cluster = "{cluster.address}"\n')
    monkeypatch.setenv("HEADSCOPE_CONFIG", str(tmp_path / "cfg.toml"))
    with mock.patch("headscope.engine.sweeps.cluster.run_parts", wraps=run_parts) as spy:
        code, from_setting, _ = _cli(capsys, *argv)
    assert code == 0 and spy.called and json.loads(from_setting) == json.loads(local)


def test_cli_diff_on_the_cluster_prints_the_local_json(
        capsys: pytest.CaptureFixture[str], cluster: Cluster, deep_gpt2: Path,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HEADSCOPE_CONFIG", str(tmp_path / "none.toml"))
    with mock.patch.object(hf_fixtures, "N_LAYERS", 6):
        other, _ = hf_fixtures.build_gpt2(tmp_path / "other", seed=1)
    argv = ("diff", str(deep_gpt2), str(other), "--json", "--no-cache")
    code, local, _ = _cli(capsys, *argv)
    assert code == 0
    with mock.patch("headscope.engine.sweeps.cluster.run_parts", wraps=run_parts) as spy:
        code, remote, err = _cli(capsys, *argv, "--scheduler", cluster.address)
    assert (code, err) == (0, "")
    # both models' copying, QK-positivity and q/k/v composition sweeps went to the cluster
    sweeps = sorted(c.args[3] for c in spy.call_args_list)
    assert sweeps == sorted(2 * ["copying_score", "qk_positivity", "composition-q",
                                 "composition-k", "composition-v"])
    # the local diff takes the weight scores from engine.circuits (numpy), the workers from the
    # torch sweep: the same numbers to float32 rounding
    _assert_close(json.loads(remote), json.loads(local))


def test_cli_errors_are_one_line(capsys: pytest.CaptureFixture[str], deep_gpt2: Path,
                                 monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HEADSCOPE_CONFIG", str(tmp_path / "none.toml"))
    address = f"tcp://127.0.0.1:{_free_port()}"
    with mock.patch("headscope.engine.sweeps.cluster.CONNECT_TIMEOUT", "2s"):
        code, out, err = _cli(capsys, "heads", str(deep_gpt2), "--scheduler", address)
    assert code == 1 and out == "" and err.count("\n") == 1 and address in err
    with mock.patch.dict(sys.modules, {"distributed": None}):
        code, _, err = _cli(capsys, "heads", str(deep_gpt2), "--workers", "2")
    assert code == 1 and "headscope[cluster]" in err and err.count("\n") == 1


def test_timeline_on_the_cluster_equals_the_local_timeline_and_is_stored_on_the_client(
        cluster: Cluster, tmp_path: Path) -> None:
    from headscope.engine.sweeps import timeline
    from headscope.sample_models import bundled_model

    series = Path(bundled_model()).parent / "attn-only-2l-training"
    local = timeline.compute_timeline([series])
    store = ResultStore(tmp_path / "store")
    remote = timeline.compute_timeline([series], cluster=cluster, store=store)
    # equal up to float32 rounding (a worker's torch runs one thread: other summation order)
    _assert_close(remote.to_dict(), local.to_dict())
    # The client wrote every step that came back into its results store, keyed by the
    # step's fingerprint: the series again, with no cluster, is read back, nothing scored.
    with mock.patch.object(timeline, "score_checkpoint", side_effect=AssertionError("scored again")):
        again = timeline.compute_timeline([series], store=store)
    assert again.to_dict() == remote.to_dict()
    assert {e.path for e in store.entries()} == {str(p.resolve()) for p in series.glob("step-*")}


def test_a_timeline_step_that_differs_on_the_worker_fails_naming_it() -> None:
    """The worker side of a timeline task, run here: a step whose fingerprint is not the
    client's is refused before it is scored."""
    from headscope.engine.sweeps.timeline import score_step_task
    from headscope.sample_models import bundled_model

    path = str(bundled_model())
    with pytest.raises(ClusterTaskError) as err:
        score_step_task(path, 0, 0, False, "0" * 32)
    line = str(err.value)
    assert path in line and "fingerprint" in line and "on worker host" in line and "\n" not in line


def _assert_close(a: object, b: object) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_close(a[k], b[k])
    elif isinstance(a, list | tuple) and isinstance(b, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_close(x, y)
    elif isinstance(a, float) and isinstance(b, float):
        assert a == pytest.approx(b, abs=1e-6, nan_ok=True)
    else:
        assert a == b


def test_cancelling_stops_the_sweep_and_keeps_the_finished_parts(
        cluster: Cluster, deep_gpt2: Path, tmp_path: Path) -> None:
    from headscope.engine.core.errors import CancelledError

    model = load_model(deep_gpt2)
    entry = ResultStore(tmp_path / "store").for_model(model)
    kept = KeptMemo(entry.memo("composition-k", ()))
    with pytest.raises(CancelledError):
        run_parts(cluster, model, entry.key or "", "composition-k", kept, cancelled=lambda: True)
    assert len(kept.parts) == 1  # cancelled as soon as the first part was in
    (index,) = kept.parts
    reread = ResultStore(tmp_path / "store").for_model(model).memo("composition-k", ())
    np.testing.assert_array_equal(reread.get(index, (index, 4, 4)), kept.parts[index])


def test_a_scheduler_that_goes_away_is_one_line_with_the_parts_kept(tmp_path: Path) -> None:
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    sched = _scheduler(port, tmp_path)
    worker = _worker(address, tmp_path)
    try:
        model = load_model(_sixteen_layers(tmp_path))
        c = _connect_when_up(address)
        with c:
            c.client.wait_for_workers(1, timeout=WAIT)

            def progress(fraction: float) -> None:
                if fraction > 0 and sched.poll() is None:
                    sched.kill()
                    sched.wait(timeout=10)

            entry = ResultStore(tmp_path / "store").for_model(model)
            kept = KeptMemo(entry.memo("composition-v", ()))
            with pytest.raises(ClusterError) as err:
                run_parts(c, model, entry.key or "", "composition-v", kept, progress)
        line = str(err.value)
        assert "\n" not in line and address in line
        assert f"{len(kept.parts)} of 15 parts finished are kept" in line and kept.parts
        # the next (local) sweep computes only the rest and gets the local numbers
        again = score_sweeps.composition(model, "v", store=ResultStore(tmp_path / "store").for_model(model))
        np.testing.assert_array_equal(again.scores, score_sweeps.composition(model, "v").scores)
    finally:
        _stop(worker)
        _stop(sched)


# -- addresses and ports that are not a scheduler; --workers bounds (issue #29) ---------------


@contextlib.contextmanager
def _server(banner: bytes | None) -> Iterator[str]:
    """A TCP service on 127.0.0.1 that is not Dask: silent until spoken to (as an HTTP
    server), or sending ``banner`` at once (as SSH)."""
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    held: list[socket.socket] = []

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                held.append(conn)
                if banner is not None:
                    conn.sendall(banner)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"tcp://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()
        for conn in held:
            conn.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("banner", [None, b"SSH-2.0-OpenSSH_9.2\r\n"])
def test_a_port_with_another_service_is_not_a_scheduler_in_bounded_time(banner) -> None:
    """An HTTP server on the port: the client waited for a handshake for 8 minutes."""
    with _server(banner) as address, \
            mock.patch("headscope.engine.sweeps.cluster.HANDSHAKE_TIMEOUT", 1.0), \
            mock.patch("headscope.engine.sweeps.cluster.CONNECT_TIMEOUT", "2s"), \
            pytest.raises(ClusterError) as err:
        connect(address)
    line = str(err.value)
    assert f"{address} is not a Dask scheduler" in line and "\n" not in line


def test_the_http_port_of_a_real_http_server_is_refused_from_the_cli(tmp_path: Path) -> None:
    """As a user meets it: `heads --scheduler` at `python -m http.server`, one line, exit 1."""
    port = _free_port()
    http = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    try:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            time.sleep(0.1)
        done = subprocess.run(
            [sys.executable, "-m", "headscope.tui.cli.main", "heads", "sample_models/attn-only-1l",
             "--no-cache", "--scheduler", f"tcp://127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "HEADSCOPE_CONFIG": str(tmp_path / "none.toml")})
    finally:
        _stop(http)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "is not a Dask scheduler" in done.stderr


def test_a_malformed_address_leaves_nothing_to_stall_at_exit(tmp_path: Path) -> None:
    """The one line came, then a 20 s stall and Client.__del__'s TimeoutError traceback."""
    done = subprocess.run(
        [sys.executable, "-m", "headscope.tui.cli.main", "heads", "sample_models/attn-only-1l",
         "--no-cache", "--scheduler", "tcp://[::1"],
        capture_output=True, text=True, timeout=15,
        env={**os.environ, "HEADSCOPE_CONFIG": str(tmp_path / "none.toml")})
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr


def test_workers_are_bounded_by_cores_and_memory_and_the_nannies_are_quiet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--workers 64 on a 0.7 MB model: 66 processes, 4 GB, unfinished after 150 s."""
    import logging

    import distributed

    from headscope.engine.sweeps import cluster as cluster_module

    started: list[dict[str, object]] = []

    class FakeLocal:
        scheduler_address = "tcp://127.0.0.1:1"

        def __init__(self, **kwargs: object) -> None:
            started.append(kwargs)

    monkeypatch.setattr(distributed, "LocalCluster", FakeLocal)
    monkeypatch.setattr(distributed, "Client", lambda *a, **k: mock.Mock())
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(cluster_module, "available_memory", lambda: 64 << 30)
    said: list[str] = []
    cluster_module.local_cluster(64, model_bytes=700_000, warn=said.append)
    assert started[-1]["n_workers"] == 2 and said == ["--workers 64: starting 2 (2 CPU cores available)"]
    assert started[-1]["silence_logs"] == logging.ERROR
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(cluster_module, "available_memory", lambda: 3 << 30)
    cluster_module.local_cluster(16, model_bytes=724 << 20, warn=said.append)  # 1 GiB a worker
    assert started[-1]["n_workers"] == 3 and "3.0 GB of memory available" in said[-1]
    cluster_module.local_cluster(2, warn=said.append)  # within the bounds: as asked, silently
    assert started[-1]["n_workers"] == 2 and len(said) == 2


def test_edges_over_prompts_on_the_cluster_equal_the_local_run_and_are_stored_on_the_client(
        cluster: Cluster, tmp_path: Path) -> None:
    """``headscope edges --prompts``: one task per prompt pair, each pair's scores stored here
    as it arrives (the same file again, with no cluster, computes nothing), progress per pair."""
    from headscope.engine.sweeps import edge_prompts
    from headscope.engine.sweeps.edge_prompts import PromptPair, edges_over_prompts, pair_requests
    from headscope.sample_models import bundled_model

    model = load_model(bundled_model())  # attn-only-2l
    pairs = [PromptPair((1, 5, 9, 2, 33, 7, 5, 9), (1, 5, 9, 2, 40, 7, 11, 9), 3, 4, line=1),
             PromptPair((3, 4, 5, 6, 7, 8), (3, 4, 50, 6, 7, 9), 10, 11, line=2)]
    requests = pair_requests(model, pairs, method="eap")
    local = edges_over_prompts(model, requests)
    entry = ResultStore(tmp_path / "store").for_model(model)
    fractions: list[float] = []
    remote = edges_over_prompts(model, requests, store=entry, cluster=cluster, progress=fractions.append)
    # float32 runs on a one-thread worker: another summation order
    np.testing.assert_allclose(remote.scores, local.scores, rtol=0, atol=1e-5 * np.abs(local.scores).max())
    assert remote.clean == pytest.approx(local.clean, abs=1e-5)
    assert fractions == [0.0, 0.5, 1.0, 1.0]
    reread = ResultStore(tmp_path / "store").for_model(model)
    with mock.patch.object(edge_prompts, "edges", side_effect=AssertionError("computed again")):
        again = edges_over_prompts(model, requests, store=reread)
    assert reread.loaded == 2
    np.testing.assert_array_equal(again.scores, remote.scores)


def test_a_local_cluster_serves_nothing_beyond_this_machine_and_says_nothing_of_port_8787() -> None:
    """A Dask scheduler always starts an HTTP server (health and metrics routes, even with
    no dashboard), on port 8787 and every interface unless told otherwise. Where 8787 was
    taken (a Jupyter user's Dask dashboard, another headscope run) Dask warned "Port 8787 is
    already in use" on the command's stderr. The local cluster's server listens on a free
    port of 127.0.0.1."""
    import warnings

    from headscope.engine.sweeps import cluster as cluster_module

    with contextlib.ExitStack() as stack:
        taken = stack.enter_context(socket.socket())
        with contextlib.suppress(OSError):  # already taken by someone else: as good
            taken.bind(("", 8787))
            taken.listen()
        caught = stack.enter_context(warnings.catch_warnings(record=True))
        warnings.simplefilter("always")
        with cluster_module.local_cluster(1) as c:
            # the scheduler runs in this process (LocalCluster); tornado's server's sockets
            served = [sock.getsockname() for sock in c.local.scheduler.http_server._sockets.values()]
    assert not [w for w in caught if "already in use" in str(w.message)]
    assert served and all(host == "127.0.0.1" and port != 8787 for host, port, *_ in served), served
