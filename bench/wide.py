"""``python -m bench.wide --dir DIR``: a Llama-2-70B-wide slice, its peak memory and its
per-layer cost against the 70B cost model of bench/README.md, in one run.

Writes (once, into ``DIR``, reused afterwards) the ``llama-70b-slice`` shape of
``bench/checkpoints.py``: Llama-2-70B's widths (d_model 8192, 64 heads, 8 KV heads, d_mlp
28672, vocab 32000, bf16) cut to 4 layers, ~7.9 GB in per-layer shards. One layer's MLP is
2.8 GB in float32: the forward pass applies it in column blocks
(``engine.forward.blocked_mlp``), which is what keeps these runs within 3 GB. Scenarios, each
in its own process (``python -m bench.wide --one SCENARIO PATH``), so peak RSS is per scenario:

- ``heads``: ``headscope heads PATH --json --no-cache`` (the CLI's ``main``, output
  discarded), timed inside: the spectral middles (``W_U W_E``, ``W_Eᵀ W_E``, once per model),
  each layer's spectral piece (``spectral.layer_spectral_scores``, which reads the layer's
  attention weights: ``heads`` runs it as the forward pass reaches the layer, and where the
  weight sweep runs alone, ``spectral._read_layer`` before it when not read ahead on a thread)
  and each layer of the forward pass (``transformer.blocks_together``, between its
  ``after_layer`` calls, less the spectral piece run inside it; the tokens of all its batches
  counted).
- ``attribution``: ``headscope patch PATH --method attribution`` on a fixed prompt of
  ``--tokens`` ids (``bench.patching.prompts``), timed inside: the two runs (clean and
  corrupt, one batch) and each layer of the backward pass (between ``report`` calls).

Each scenario's process first measures the box's rates at this shape (``run_calibrate``: the
reader's s/GB, numpy's and torch's s/TFLOP at the products' shapes, the eigenvalues, the null's
projections), and the cost model (``predicted``) prices what each piece computes at those
rates, next to the measured time per layer; ``heads`` also records the largest current RSS
during each piece (``PhaseRSS``: which one sets the peak). Then the full 70B (80 layers)
extrapolated from the measured per-layer times and from the model.

``--lock FILE`` runs each scenario's process under ``flock FILE`` (one scenario per hold: the
box's big-checkpoint lock). ``--path DIR``: a checkpoint of the slice's widths cut to fewer
layers (its layer count from its ``config.json``), for iterating. ``--tiny``: the ``tiny-llama`` shape with a block budget of a few
columns, so the blocked MLP runs (the smoke test).
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from . import ROOT, disk_read_gb, publish, rss_mb, run_json, since  # noqa: E402
from .checkpoints import SHAPES, Shape, write_checkpoint  # noqa: E402

SCENARIOS = ("heads", "attribution")  # each measures the box's rates first (``run_calibrate``)
HEADS_TOKENS = 326  # heads' pass on this shape (four 64-token sequences and the natural sentences)
SLICE, TINY = "llama-70b-slice", "tiny-llama"
A_READ, B_GEMM = 2.35, 3.45  # s/GB of stored bf16 through the reader, s/TFLOP (bench/README.md)
# the rates of the 1B/7B/13B fit, used where no ``calibrate`` ran (no eigvals or null term)
# (no peaks term; the per-head products at the product rate)
FITTED = {"read_attn": A_READ, "read_mlp": A_READ, "peaks": 0.0, "gemm_np": B_GEMM, "small_np": B_GEMM,
          "gemm_torch": B_GEMM, "gemm_torch_base": B_GEMM, "eigvals": 0.0, "null": 0.0, "first_touch": 0.0}
RATE_UNITS = {"read_attn": "s/GB", "read_mlp": "s/GB", "peaks": "s", "gemm_np": "s/TFLOP",
              "small_np": "s/TFLOP", "gemm_torch": "s/TFLOP", "gemm_torch_base": "s/TFLOP", "eigvals": "s",
              "null": "s", "first_touch": "s/GB"}
FIRST_TOUCH_BYTES = 256 << 20
FULL_LAYERS = 80  # Llama-2-70B
ANSWER, WRONG = 1, 2


# -- scenarios (each in its own process) -------------------------------------------------------


def _cli(argv: list[str]) -> None:
    import contextlib
    import io

    from headscope.tui.cli.main import main

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = main(argv)
    if code:
        raise SystemExit(f"headscope {' '.join(argv)} exited with {code}")


class PhaseRSS:
    """The process's current RSS sampled every ``dt`` s on a thread, its maximum kept per phase
    (``phase`` is set by the timed wrappers: which piece held the memory at the peak)."""

    def __init__(self, dt: float = 0.02) -> None:
        import threading

        self.phase, self.peaks, self.dt = "start", {}, dt
        self._stop = threading.Event()
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._thread = threading.Thread(target=self._run, name="bench-rss", daemon=True)
        self._thread.start()

    def _now_mb(self) -> float:
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * self._page / 2**20
        except (OSError, ValueError, IndexError):
            return 0.0

    def _run(self) -> None:
        while not self._stop.wait(self.dt):
            self.sample()

    def sample(self) -> None:
        mb, phase = self._now_mb(), self.phase
        if mb > self.peaks.get(phase, 0.0):
            self.peaks[phase] = mb

    def set(self, phase: str) -> None:
        self.sample()  # the last phase's state up to now
        self.phase = phase

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        self.sample()
        return {k: round(v) for k, v in self.peaks.items()}


def run_heads(path: Path) -> dict[str, Any]:
    """``heads --json --no-cache`` with its per-layer pieces timed (wrapping the module
    functions the sweep and the pass call through)."""
    from headscope.engine.circuits import directions, spectral
    from headscope.engine.forward import transformer

    spectral_s: dict[int, float] = {}
    forward_s: dict[int, float] = {}
    found: dict[str, Any] = {"middles": 0.0, "tokens": 0, "intervals": []}
    rss = PhaseRSS()  # the largest current RSS during each piece (which one set the peak)
    middles, layer_scores, together = (spectral.spectral_middles, spectral.layer_spectral_scores,
                                       transformer.blocks_together)
    null_spectral, read_layer = directions.null_spectral_scores, spectral._read_layer

    def timed_middles(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        rss.set("middles")
        try:
            return middles(*a, **k)
        finally:
            found["middles"] += since(t)
            found["intervals"].append(("middles", t - T0, time.perf_counter() - T0))
            rss.set("other")

    def timed_layer(w: Any, layer: int, *a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        rss.set(f"spectral {layer}")
        try:
            return layer_scores(w, layer, *a, **k)
        finally:
            spectral_s[layer] = spectral_s.get(layer, 0.0) + since(t)
            found["intervals"].append((f"spectral {layer}", t - T0, time.perf_counter() - T0))
            rss.set("other")

    def timed_together(w: Any, streams: Any, *, on_block: Any = None, after_layer: Any = None,
                       before_layer: Any = None) -> Any:
        found["tokens"] += sum(int(s.shape[0] * s.shape[1]) for s in streams)
        last = [time.perf_counter()]
        rss.set("forward 0")

        def forward_until_now(layer: int) -> None:  # the pass's own time since ``last``
            now = time.perf_counter()
            forward_s[layer] = forward_s.get(layer, 0.0) + now - last[0]
            found["intervals"].append((f"forward {layer}", last[0] - T0, now - T0))
            last[0] = now

        def before(layer: int) -> None:  # the spectral piece run here is timed as its own
            forward_until_now(layer)
            if before_layer is not None:
                before_layer(layer)
            rss.set(f"forward {layer}")
            last[0] = time.perf_counter()

        def after(layer: int) -> None:
            if after_layer is not None:
                after_layer(layer)
            forward_until_now(layer)
            rss.set(f"forward {layer + 1}")

        try:
            return together(w, streams, on_block=on_block, after_layer=after, before_layer=before)
        finally:
            rss.set("other")

    def timed_read(w: Any, layer: int) -> None:  # the sweep's read of a layer not read ahead
        if threading.current_thread().name == "headscope-read-ahead":  # overlaps: not timed
            return read_layer(w, layer)
        t = time.perf_counter()
        rss.set(f"spectral {layer}")
        try:
            read_layer(w, layer)
        finally:
            spectral_s[layer] = spectral_s.get(layer, 0.0) + since(t)
            found["intervals"].append((f"read {layer}", t - T0, time.perf_counter() - T0))
            rss.set("other")

    def phased_null(*a: Any, **k: Any) -> Any:  # once per model: its peak apart from "other"
        rss.set("null spectral")
        try:
            return null_spectral(*a, **k)
        finally:
            rss.set("other")

    directions.null_spectral_scores = phased_null
    spectral._read_layer = timed_read
    spectral.spectral_middles = timed_middles
    spectral.layer_spectral_scores = timed_layer
    transformer.blocks_together = timed_together
    try:
        _cli(["heads", str(path), "--json", "--no-cache"])
    finally:  # --inline: the process goes on
        spectral.spectral_middles, spectral.layer_spectral_scores = middles, layer_scores
        directions.null_spectral_scores, spectral._read_layer = null_spectral, read_layer
        transformer.blocks_together = together
    n = max(len(spectral_s), len(forward_s))
    return {"seconds": since(T0), "middles": found["middles"], "tokens": found["tokens"],
            "spectral_layers": [spectral_s.get(i) for i in range(n)],
            "forward_layers": [forward_s.get(i) for i in range(n)],
            "overlap": _overlap(found["intervals"]), "phase_rss_mb": rss.stop()}


def _overlap(intervals: list[tuple[str, float, float]]) -> float:
    """Seconds during which two of the timed pieces ran at once (0: one after the other, so
    the per-layer times are each piece's own)."""
    spans = sorted((a, b) for _, a, b in intervals)
    total, end = 0.0, float("-inf")
    for a, b in spans:
        if a < end:
            total += min(b, end) - a
        end = max(end, b)
    return total


def run_attribution(path: Path, n_tokens: int) -> dict[str, Any]:
    """``patch --method attribution`` with the two runs and each backward layer timed (between
    the ``report`` calls of ``forward.patching.attribute_heads``)."""
    from headscope.engine.forward import patching
    from headscope.engine.model.loading import inspect_checkpoint

    from .patching import prompts

    clean, corrupt = prompts(inspect_checkpoint(path).cfg.d_vocab, n_tokens)
    marks: list[float] = []
    resident: list[float] = []  # current RSS (MB) at the start and after the two runs
    attribute, report = patching.attribute_heads, patching.report

    def timed_attribute(*a: Any, **k: Any) -> Any:
        resident.append(current_rss_mb())
        marks.append(time.perf_counter())
        return attribute(*a, **k)

    def timed_report(progress: Any, fraction: float) -> None:
        marks.append(time.perf_counter())
        if len(resident) == 1:
            resident.append(current_rss_mb())
        report(progress, fraction)

    patching.attribute_heads = timed_attribute
    patching.report = timed_report
    # `patch` has no --no-cache: an empty results store of its own, or a second run reads back
    store, os.environ["HEADSCOPE_CACHE_DIR"] = (os.environ.get("HEADSCOPE_CACHE_DIR"),
                                                tempfile.mkdtemp(prefix="headscope-wide-store-"))
    try:
        _cli(["patch", str(path), "--method", "attribution", "--json",
              "--clean-tokens", ",".join(map(str, clean)), "--corrupt-tokens", ",".join(map(str, corrupt)),
              "--answer", str(ANSWER), "--wrong", str(WRONG)])
    finally:
        patching.attribute_heads, patching.report = attribute, report
        if store is None:
            os.environ.pop("HEADSCOPE_CACHE_DIR", None)
        else:
            os.environ["HEADSCOPE_CACHE_DIR"] = store
    steps = [b - a for a, b in itertools.pairwise(marks)]
    # marks: the start, after the two runs, then once per layer from the top (the last: done)
    # the memory the two runs made resident: touched for the first time (the process's heap
    # was trimmed after the calibration), priced at ``first_touch`` by the cost model
    touched = (resident[1] - resident[0]) / 1e3 if len(resident) == 2 else None
    return {"seconds": since(T0), "tokens": 2 * n_tokens, "two_runs": steps[0] if steps else None,
            "two_runs_touched_gb": touched,
            "backward_layers": list(reversed(steps[1:-1])) if len(steps) > 2 else []}


def current_rss_mb() -> float:
    """This process's current resident memory (MB; 0 where ``/proc`` has no ``statm``)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


def _best(fn: Any, repeat: int = 3) -> float:
    """The median of ``repeat`` timed calls of ``fn()`` (s): on a shared box the fastest call
    catches a quiet moment the scenario's minutes of work do not get (with the fastest, a run
    at load 2-4 took 1.5-1.8x its model in every piece alike)."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(since(t))
    return statistics.median(times)


def run_calibrate(path: Path, tokens: int) -> dict[str, Any]:
    """The box's rates at this checkpoint's shapes, measured in the same run as the scenarios
    (its own process, under the same lock), for the cost model (``predicted``):

    - ``read_attn``, ``read_mlp``: s per GB of stored weights through headscope's reader of
      the processed model (layer 0's four attention weights as the passes read them: widened,
      K/V once per stored head (``stored_kv``), LN folded, centred; its three MLP matrices by ``get_columns`` in the forward
      pass's blocks), the page cache warm (read once before);
    - ``peaks``: s of the per-head peaks of layer 0's four attention weights
      (``numeric.max_abs``: the spectral piece's non-finite, overflow and taming checks, a
      pass over 0.6 GB of float32 a layer at 70B widths);
    - ``gemm_np``: s/TFLOP of numpy's ``[2048, d] @ [d, d]`` (float32; the spectral sweep's
      product, on the rows of 16 heads);
    - ``small_np``: s/TFLOP of numpy's per-head ``[d_head, d] @ [d, d_head]`` on 16 heads at
      once, on one thread (the spectral piece runs them under ``one_lapack_thread``);
    - ``gemm_torch``: s/TFLOP of torch's ``[tokens, d] @ [d, block]`` (the forward pass's token
      products at ``heads``' token count; ``block``: the MLP's first column block as the reader
      gives it, in its stored layout: a Hugging Face checkpoint's ``[d_mlp, d]`` rows make it
      a transposed view, the operand the pass multiplies, not a contiguous random matrix);
    - ``gemm_torch_base``: the same at half the tokens (attribution's backward runs on the base
      run's prompt alone; at a few dozen rows a product's time follows the weight's bytes, not
      its flops, so the rate at 32 rows does not price 16);
    - ``eigvals``: s per ``eigvals`` of ``H`` random ``d_head × d_head`` float64 matrices on one
      LAPACK thread (two per layer: copying and QK positivity);
    - ``null``: s of what the behavioural null adds to one layer of the pass: the mean norms
      of its ``W_Q`` and stored ``W_K`` heads (``null.layer_head_norms``, a pass over the
      query weights: not priced before session 15, 0.05–0.2 s a layer here) and its random
      heads' projections (``null.random_projections``, 2 × ``NULL_SAMPLES`` heads on
      ``tokens`` rows: the Gram root and the draws).
    """
    import numpy as np
    import torch

    from headscope.engine.circuits.spectral import attention_weight
    from headscope.engine.core.numeric import max_abs
    from headscope.engine.core.threads import one_lapack_thread
    from headscope.engine.forward import blocked_mlp, null
    from headscope.engine.forward.torch_weights import as_tensor
    from headscope.engine.model.loading import load_model
    from headscope.engine.model.weights import stored_kv

    model = load_model(path)
    w, cfg = model.weights, model.cfg
    d, e = cfg.d_model, cfg.d_head
    attn = [f"blocks.0.attn.W_{n}" for n in "QKVO"]
    mlp = [f"blocks.0.mlp.W_{n}" for n in ("gate", "in", "out") if w.has(f"blocks.0.mlp.W_{n}")]

    def layer_attn() -> list[Any]:  # as the passes read them (K/V once per stored head)
        return [attention_weight(w, name) for name in attn]

    def read_attn() -> None:
        w.release()
        layer_attn()
        w.release()

    def read_mlp() -> None:
        for name in mlp:
            rows, cols = (d, cfg.d_mlp) if not name.endswith("W_out") else (cfg.d_mlp, d)
            for j, k in blocked_mlp.column_blocks(rows, cols, blocked_mlp.MLP_BLOCK_BYTES):
                w.get_columns(name, j, k)

    read_attn()  # the page cache warm, the reader's staging allocated
    z = layer_sizes_of(cfg)
    out: dict[str, Any] = {"read_attn": _best(read_attn, 2) / z["attn_gb"],
                           "read_mlp": _best(read_mlp, 1) / z["mlp_gb"]}
    mats = layer_attn()
    out["peaks"] = _best(lambda: [max_abs(x) for x in mats])
    mats = None
    w.release()
    rng = np.random.default_rng(0)
    a, m = rng.standard_normal((2048, d), np.float32), rng.standard_normal((d, d), np.float32)
    out["gemm_np"] = _best(lambda: a @ m) / (2 * 2048 * d * d / 1e12)
    a = m = None  # freed before the next measurement
    heads = max(1, 2048 // e)
    a, m = rng.standard_normal((heads, e, d), np.float32), rng.standard_normal((heads, d, e), np.float32)
    with one_lapack_thread():
        out["small_np"] = _best(lambda: a @ m) / (2 * heads * e * d * e / 1e12)
    a = m = None
    block = min(cfg.d_mlp, blocked_mlp.MLP_BLOCK_BYTES // (4 * d))
    x, wt = torch.randn(tokens, d), as_tensor(w.get_columns(mlp[0], 0, block))  # [d, block]
    out["gemm_torch"] = _best(lambda: x @ wt, 5) / (2 * tokens * d * block / 1e12)
    base = x[: max(1, tokens // 2)].clone()
    out["gemm_torch_base"] = _best(lambda: base @ wt, 5) / (2 * base.shape[0] * d * block / 1e12)
    wt = base = None
    small = rng.standard_normal((cfg.n_heads, e, e))
    with one_lapack_thread():
        out["eigvals"] = _best(lambda: np.linalg.eigvals(small))
    gens = null.head_generators(0)
    w.get("blocks.0.attn.W_Q"), stored_kv(w, "blocks.0.attn.W_K")  # read before, as the pass has them

    def null_layer() -> None:  # what the null adds to a layer of the pass (NullSums.__call__)
        null.layer_head_norms(w, 0)
        null.random_projections(x, e, (1.0, 1.0), null.NULL_SAMPLES, *gens)

    out["null"] = _best(null_layer)
    w.release()  # the layer read above (the raw files close with the model)
    out["first_touch"] = _best(first_touch) / (FIRST_TOUCH_BYTES / 1e9)
    return {"seconds": since(T0), "rates": out}


def first_touch() -> None:
    """Touch ``FIRST_TOUCH_BYTES`` of memory new to the process (an anonymous map, huge pages
    advised as numpy advises its large arrays), then unmap it: what each page of a pass's
    working set costs the first time (the kernel's zeroing; on a virtual machine that returns
    freed pages to its host, the host's fault as well: 0.1 to 3 s/GB on the boxes here)."""
    import mmap

    import numpy as np

    m = mmap.mmap(-1, FIRST_TOUCH_BYTES)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        m.madvise(mmap.MADV_HUGEPAGE)
    pages = np.frombuffer(m, np.uint8)
    pages[::4096] = 1
    del pages
    m.close()


def one(scenario: str, path: Path, n_tokens: int) -> dict[str, Any]:
    """A scenario's result; ``heads`` and ``attribution`` first measure the box's rates in their
    own process (``run_calibrate``, not counted in ``seconds``): on a shared box the load moves
    between processes minutes apart, so each scenario is predicted at its own rates."""
    from headscope.engine.core.memory import release_free_heap

    if scenario == "calibrate":
        return {**run_calibrate(path, n_tokens), "rss_mb": rss_mb()}
    t, load = time.perf_counter(), os.getloadavg()[0]
    rates = run_calibrate(path, HEADS_TOKENS if scenario == "heads" else 2 * n_tokens)["rates"]
    release_free_heap()  # the calibration's freed pages: not the scenario's memory
    calibrating = since(t)
    out = run_heads(path) if scenario == "heads" else run_attribution(path, n_tokens)
    out["seconds"] -= calibrating
    out["rates"], out["calibrate_s"] = rates, calibrating
    out["load"] = [round(load, 1), round(os.getloadavg()[0], 1)]  # 1-min load average: start, end
    out["rss_mb"] = rss_mb()
    out["disk_read_gb"] = disk_read_gb()
    return out


# -- the cost model ----------------------------------------------------------------------------


def layer_sizes_of(cfg: Any) -> dict[str, float]:
    """``layer_sizes`` of a ``ModelConfig`` (``kv_heads``) or a bench ``Shape`` (``n_kv_heads``)."""
    kv = getattr(cfg, "kv_heads", None) or getattr(cfg, "n_kv_heads", None) or cfg.n_heads
    return layer_sizes(cfg.d_model, cfg.n_heads, kv, cfg.d_head, cfg.d_mlp)


def layer_sizes(d: int, h: int, kv: int, e: int, d_mlp: int) -> dict[str, float]:
    """Stored GB (bf16) and parameters of one layer (gated MLP)."""
    attn = 2 * h * e * d + 2 * kv * e * d
    mlp = 3 * d * d_mlp
    return {"attn_gb": 2 * attn / 1e9, "mlp_gb": 2 * mlp / 1e9, "layer_gb": 2 * (attn + mlp) / 1e9,
            "params": attn + mlp}


def predicted(s: Shape, rates: dict[str, float], tokens: int, attribution_tokens: int,
              touched_gb: float = 0.0) -> dict[str, float]:
    """Seconds per layer (and once per model, ``middles``) of what each piece computes, at the
    rates ``run_calibrate`` measured in the same run (s/GB read, s/TFLOP, s per call):

    - middles: ``W_E`` and ``W_U`` read in vocabulary blocks (as the MLP's rows are), ``W_U``
      once more whole for its mean column (processing centres the unembedding), and
      ``4·V·d²`` flops (numpy);
    - spectral: the layer's attention weights read and processed, and their per-head peaks;
      the products of ``layer_spectral_scores``: ``W_O``'s ``H·d_head`` rows against
      ``W_U W_E``, ``W_K``'s rows against ``W_Eᵀ W_E`` (one per KV head), each ``2·rows·d²``,
      and the per-head ``d_head``-sized products (on one thread); two ``eigvals`` batches of
      ``H`` heads;
    - forward: the layer's MLP read (its attention weights are the spectral piece's, run as
      the pass reaches the layer), the token products ``2·tokens·params`` (torch; K and V once
      per KV head) and the layer's part of the null (its heads' norms and random heads'
      projections);
    - attribution, per layer of its backward, on the base run's prompt (half the tokens): the
      layer's forward again with gradients (attention and MLP read) and the blocked MLP's
      backward (its three matrices read once more); gradients of the input only (the weights
      need none): the forward's products once, the input gradient's once more, and ``W_gate``'s
      and ``W_in``'s a third time (the blocked MLP recomputes its hidden blocks in the backward),
      at ``gemm_torch_base``; the two runs before it: one forward of both prompts,
      and the first touch of the memory they make resident (``touched_gb``, measured: the
      process's first pass builds its heap; later passes reuse it), spread over the layers.
    """
    d, v, h, e = s.d_model, s.d_vocab, s.n_heads, s.d_head
    kv = s.n_kv_heads or h
    z = layer_sizes_of(s)
    r = rates
    spectral_flops = 2 * h * e * d * d + 2 * kv * e * d * d
    attn_params, gates = 2 * h * e * d + 2 * kv * e * d, 1  # the slice's MLP is gated: W_gate, W_in
    per_head_flops = 2 * 2 * h * e * d * e
    layer_read = r["read_attn"] * z["attn_gb"] + r["read_mlp"] * z["mlp_gb"]
    return {
        "middles": r["read_mlp"] * 3 * 2 * v * d / 1e9 + r["gemm_np"] * 4 * v * d * d / 1e12,
        "spectral": r["read_attn"] * z["attn_gb"] + r["peaks"] + r["gemm_np"] * spectral_flops / 1e12
                    + r["small_np"] * per_head_flops / 1e12 + 2 * r["eigvals"],
        "forward": r["read_mlp"] * z["mlp_gb"] + r["gemm_torch"] * 2 * tokens * z["params"] / 1e12 + r["null"],
        "backward": layer_read + r["read_mlp"] * z["mlp_gb"]
                    + r.get("gemm_torch_base", r["gemm_torch"]) * 2 * (attribution_tokens // 2)
                    * (2 * attn_params + 3 * (gates + 1) * d * s.d_mlp + 2 * d * s.d_mlp) / 1e12,
        "two_runs_per_layer": layer_read + r["gemm_torch"] * 2 * attribution_tokens * z["params"] / 1e12
                              + r.get("first_touch", 0.0) * touched_gb / s.n_layers,
    }


# -- the run -----------------------------------------------------------------------------------


def scenario(name: str, path: Path, args: argparse.Namespace, heads_tokens: int | None = None) -> dict[str, Any]:
    """One scenario's result (``calibrate``: at ``heads_tokens``, the token count of the
    ``heads`` run before it)."""
    tokens = int(heads_tokens or HEADS_TOKENS) if name == "calibrate" else args.tokens
    if args.inline:  # the smoke test: no process per scenario (peak RSS is this process's)
        return one(name, path, tokens)
    cmd = ["-m", "bench.wide", "--one", name, str(path), "--tokens", str(tokens)]
    if args.lock:  # one scenario per hold of the shared lock
        cmd = ["-c", "import os, sys; os.execvp('flock', ['flock', sys.argv[1], sys.executable, *sys.argv[2:]])",
               str(args.lock), *cmd]
    return run_json(cmd, args.timeout)


def _med(runs: list[dict[str, Any]], key: str) -> Any:
    vals = [r[key] for r in runs if isinstance(r.get(key), int | float)]
    return statistics.median(vals) if vals else None


def _med_layers(runs: list[dict[str, Any]], key: str) -> list[float]:
    per = [r[key] for r in runs if r.get(key)]
    if not per:
        return []
    n = min(len(p) for p in per)
    return [statistics.median(p[i] for p in per if p[i] is not None) for i in range(n)]


def _rates(runs: list[dict[str, Any]]) -> dict[str, float] | None:
    """The median of each rate the runs measured (None if none did)."""
    found = [r["rates"] for r in runs if r.get("rates")]
    return {k: statistics.median(f[k] for f in found) for k in found[0]} if found else None


def _f(x: Any, fmt: str = ".3g") -> str:
    return "–" if x is None else format(x, fmt)


def report(shape: Shape, res: dict[str, list[dict[str, Any]]], repeat: int) -> str:
    heads, attr = res.get("heads", []), res.get("attribution", [])
    ok_h = [r for r in heads if "error" not in r]
    ok_a = [r for r in attr if "error" not in r]
    tokens = _med(ok_h, "tokens") or 0
    a_tokens = _med(ok_a, "tokens") or 0
    rates_h, rates_a = _rates(ok_h), _rates(ok_a)
    model = predicted(shape, rates_h or FITTED, int(tokens), int(a_tokens))
    model_a = predicted(shape, rates_a or FITTED, int(tokens), int(a_tokens), _med(ok_a, "two_runs_touched_gb") or 0.0)
    lines = [f"### {shape.name}: {shape.n_layers} layers, d_model {shape.d_model}, {shape.n_heads} heads "
             f"({shape.n_kv_heads or shape.n_heads} KV), d_mlp {shape.d_mlp} (median of {repeat})", ""]
    errors = [f"{name}: {r['error']}" for name, runs in res.items() for r in runs if "error" in r]
    lines += [f"- error: {e}" for e in errors]
    lines += ["| scenario | whole process (s) | peak RSS (MB) | read from disk (GB) | goal |", "|---|---|---|---|---|"]
    for name, runs in (("`heads --json --no-cache`", ok_h), ("`patch --method attribution`", ok_a)):
        lines.append(f"| {name} | {_f(_med(runs, 'seconds'))} | {_f(_med(runs, 'rss_mb'), '.0f')} | "
                     f"{_f(_med(runs, 'disk_read_gb'))} | ≤ 3000 MB |")
    rows: list[tuple[str, float | None, float]] = [("spectral middles (once per model)", _med(ok_h, "middles"), model["middles"])]
    spectral, forward = _med_layers(ok_h, "spectral_layers"), _med_layers(ok_h, "forward_layers")
    backward = _med_layers(ok_a, "backward_layers")
    rows += [(f"`heads` spectral, layer {i}", t, model["spectral"]) for i, t in enumerate(spectral)]
    rows += [(f"`heads` forward ({int(tokens)} tokens), layer {i}", t, model["forward"]) for i, t in enumerate(forward)]
    two = _med(ok_a, "two_runs")
    rows.append((f"attribution: the two runs ({int(a_tokens)} tokens), per layer",
                 None if two is None else two / shape.n_layers, model_a["two_runs_per_layer"]))
    rows += [(f"attribution backward, layer {i}", t, model_a["backward"]) for i, t in enumerate(backward)]
    lines += ["", "| per layer (s) | measured | cost model | measured / model |", "|---|---|---|---|"]
    lines += [f"| {label} | {_f(t)} | {_f(p)} | {_f(None if t is None else t / p, '.2f')} |" for label, t, p in rows]
    overlap = _med(ok_h, "overlap")
    if overlap:
        lines.append(f"\n(the timed pieces of `heads` overlapped for {overlap:.1f} s: per-layer times include another's)")
    for name, rates, runs in (("`heads`", rates_h, ok_h), ("attribution", rates_a, ok_a)):
        shown = ", ".join(f"{k} {v:.3g} {RATE_UNITS[k]}" for k, v in (rates or FITTED).items())
        loads = "; ".join(f"{r['load'][0]}–{r['load'][1]}" for r in runs if r.get("load"))
        lines.append(f"\nRates of {name}'s process " + ("(measured in it before the run): " if rates
                     else "(not measured: the 1B/7B/13B fit): ") + shown
                     + (f" (load average at its start–end: {loads})" if loads else ""))
    touched = _med(ok_a, "two_runs_touched_gb")
    if touched is not None:
        lines.append(f"\nattribution's two runs made {touched:.2f} GB resident for the first time (priced "
                     "in their row at `first_touch`)")
    phases = [r["phase_rss_mb"] for r in ok_h if r.get("phase_rss_mb")]
    if phases:
        top = sorted(phases[0].items(), key=lambda kv: -kv[1])[:6]
        lines.append("`heads`' largest current RSS per piece (MB, first run): "
                     + ", ".join(f"{k} {v:.0f}" for k, v in top))
    lines += ["", full_estimate(shape, ok_h, spectral, forward, model)]
    return "\n".join(lines)


def full_estimate(shape: Shape, heads: list[dict[str, Any]], spectral: list[float], forward: list[float],
                  model: dict[str, float]) -> str:
    """The full 70B (80 layers) from the slice: its whole ``heads`` minus its layers and its
    middles (start, open, the null's spectral scores, the store), plus the middles and 80
    layers, once at the measured medians and once at the cost model's per-layer seconds."""
    total = _med(heads, "seconds")
    middles = _med(heads, "middles")
    if total is None or middles is None or not spectral or not forward:
        return "full 70B estimate: – (no `heads` run)"
    per = statistics.median(spectral) + statistics.median(forward)
    fixed = total - sum(spectral) - sum(forward) - middles
    est = fixed + middles + FULL_LAYERS * per
    per_model = model["spectral"] + model["forward"]
    est_model = fixed + model["middles"] + FULL_LAYERS * per_model
    return (f"full 70B `heads` from the slice: {fixed:.0f} s outside the layers and the middles + "
            f"middles {middles:.0f} s + {FULL_LAYERS} × {per:.1f} s per layer (spectral "
            f"{statistics.median(spectral):.1f} + forward {statistics.median(forward):.1f}) = "
            f"{est:.0f} s ({est / 60:.0f} min); from the cost model at this run's rates: {fixed:.0f} + "
            f"{model['middles']:.0f} + {FULL_LAYERS} × {per_model:.1f} = {est_model:.0f} s "
            f"({est_model / 60:.0f} min); every layer's weights in the page cache (at 70B they stream "
            "from the disk: 138 GB at the disk's 1.1–1.5 GB/s, under the reader's rate if read ahead)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.wide", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--one", nargs=2, metavar=("SCENARIO", "PATH"), help=argparse.SUPPRESS)
    ap.add_argument("--dir", type=Path, help="where the slice is written (reused if present)")
    ap.add_argument("--path", type=Path, help="run on this checkpoint of the slice's widths instead "
                    "(e.g. a cut to 1-2 layers; its layer count from its config.json)")
    ap.add_argument("--tiny", action="store_true", help="the toy shape, blocked MLP forced (smoke test)")
    ap.add_argument("--only", help="comma-separated scenarios (default: heads,attribution)")
    ap.add_argument("--tokens", type=int, default=16, help="prompt length of the attribution run")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each scenario, in turn")
    ap.add_argument("--lock", type=Path, help="run each scenario under `flock LOCK`")
    ap.add_argument("--write-only", action="store_true", help="write the slice, run nothing")
    ap.add_argument("--inline", action="store_true", help=argparse.SUPPRESS)  # the smoke test's
    ap.add_argument("--out", type=Path, help="also write the markdown to this file")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per scenario")
    args = ap.parse_args(argv)
    if args.one:  # a scenario's own process: the console script's allocator policy, before any thread
        from headscope.engine.core.memory import keep_freed_memory

        keep_freed_memory()
        print(json.dumps(one(args.one[0], Path(args.one[1]), args.tokens)))
        return 0
    shape = SHAPES[TINY if args.tiny else SLICE]
    if args.path:
        layers = json.loads((args.path / "config.json").read_text())["num_hidden_layers"]
        shape = dataclasses.replace(shape, name=args.path.name, n_layers=layers)
    with tiny_blocks(args.tiny):
        return _run(shape, args)


@contextlib.contextmanager
def tiny_blocks(on: bool) -> Iterator[None]:
    """With ``on``: MLP blocks of 7 columns of a d_model 64 matrix, so the toy shape's MLP runs
    blocked, in this process and in the scenarios' (restored after)."""
    if not on:
        yield
        return
    from headscope.engine.forward import blocked_mlp

    budget, env = blocked_mlp.MLP_BLOCK_BYTES, os.environ.get("HEADSCOPE_MLP_BLOCK_BYTES")
    blocked_mlp.MLP_BLOCK_BYTES = 4 * 64 * 7
    os.environ["HEADSCOPE_MLP_BLOCK_BYTES"] = str(blocked_mlp.MLP_BLOCK_BYTES)
    try:
        yield
    finally:
        blocked_mlp.MLP_BLOCK_BYTES = budget
        if env is None:
            os.environ.pop("HEADSCOPE_MLP_BLOCK_BYTES", None)
        else:
            os.environ["HEADSCOPE_MLP_BLOCK_BYTES"] = env


def _run(shape: Shape, args: argparse.Namespace) -> int:
    root = args.dir or Path(tempfile.mkdtemp(prefix="headscope-wide-"))
    t = time.perf_counter()
    if args.lock and not args.write_only and not args.path:  # the writing is one hold of the lock too
        subprocess.run(["flock", str(args.lock), sys.executable, "-m", "bench.wide", "--dir", str(root),
                        "--write-only", *(["--tiny"] if args.tiny else [])], cwd=ROOT, check=True)
    path = args.path or write_checkpoint(shape, root)  # written above, or now without a lock
    print(f"# {path} ready in {since(t):.0f} s", file=sys.stderr, flush=True)
    if args.write_only:
        return 0
    names = args.only.split(",") if args.only else list(SCENARIOS)
    res: dict[str, list[dict[str, Any]]] = {}
    for _ in range(args.repeat):
        for name in names:
            r = scenario(name, path, args, _med(res.get("heads", []), "tokens"))
            res.setdefault(name, []).append(r)
            print(name, json.dumps(r), file=sys.stderr, flush=True)
    return publish(report(shape, res, args.repeat), args.out)


if __name__ == "__main__":
    raise SystemExit(main())
