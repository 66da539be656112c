"""The CLI's cluster options (tui/cli/cluster.py): --workers bounds and usage errors, malformed addresses refused."""

from __future__ import annotations

import os
from unittest import mock

import pytest

from headscope.engine.sweeps.cluster import (
    ClusterError,
    connect,
)

pytest.importorskip("distributed")  # as tests/engine/sweeps/test_cluster.py, where these came from


@pytest.mark.parametrize("address", ["garbage", "tcp://", "tcp://[::1", "tcp://host:99999",
                                     "http://127.0.0.1:8786"])
def test_a_malformed_address_is_refused_before_any_client_is_built(address: str) -> None:
    import distributed

    with mock.patch.object(distributed, "Client", side_effect=AssertionError("built")), \
            pytest.raises(ClusterError, match="is not a Dask scheduler address"):
        connect(address)


@pytest.mark.parametrize("value", ["0", "-1"])
def test_workers_below_one_is_a_usage_error(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    from headscope.tui.cli.main import main

    for argv in (["heads", "sample_models/attn-only-1l", f"--workers={value}"],
                 ["timeline", "sample_models/attn-only-2l-training", f"--workers={value}"]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        assert "--workers" in capsys.readouterr().err


def test_timeline_threads_are_bounded_by_the_cores(monkeypatch, capsys) -> None:
    from headscope.engine.sweeps import cluster as cluster_module
    from headscope.engine.sweeps import timeline as timeline_module
    from headscope.tui.cli.main import main

    asked: list[int] = []
    real = timeline_module.score_steps

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        asked.append(kwargs.get("workers", 1))
        return real(*args, **kwargs)

    monkeypatch.setattr(timeline_module, "score_steps", spy)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(cluster_module, "available_memory", lambda: 64 << 30)
    steps = "sample_models/attn-only-2l-training"
    assert main(["timeline", steps, "--workers", "64", "--json", "--no-cache"]) == 0
    assert asked == [2]
    assert "--workers 64: scoring 2 steps at once (2 CPU cores available)" in capsys.readouterr().err
