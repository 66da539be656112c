"""``python -m bench.dequant``: GGUF dequantisation, headscope's kernels vs llama.cpp's numpy code.

For each type, one ``SIZE × SIZE`` matrix (default 4096, one 7B attention matrix) of random
valid blocks (``random_blocks``) is dequantised by ``engine.formats.dequant.dequantize`` (into
a reused float32 buffer; with its thread pool, and with one thread) and by the ``gguf``
package's ``gguf.quants.dequantize``, in the same run; best of ``--repeat`` runs each. The
results are checked bit for bit against each other before anything is timed. Throughput is
in millions of values per second; the ratio is ours (threaded) / gguf. The single-threaded
runs are also given by the CPU time of the thread (``time.thread_time``), which a busy box
inflates much less than the wall time.

The load average (``os.getloadavg``) before and after is printed with the table: on a shared
box, trust the same-run ratios more than the absolute numbers.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from . import publish, ratio

TYPES = ("Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q4_0", "F16", "BF16")
# Byte offsets of the f16 scales in each block (ggml-common.h): d, and dmin for Q4_K / Q5_K.
F16_FIELDS = {"Q8_0": (0,), "Q4_0": (0,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def random_blocks(
    type_name: str, rows: int, cols: int, seed: int, scale: float = 1e-2, extremes: bool = False
) -> np.ndarray:
    """``[rows, row bytes]`` uint8: a valid ``type_name`` tensor of shape ``[rows, cols]``.

    Every byte pattern of the packed quants and sub-block scales is a real block (the ``gguf``
    package cannot quantise to K-types, so random blocks stand in for quantised weights);
    only the f16 block scales are drawn, as finite numbers in ``±scale`` (some 0, -0 and f16
    subnormals: block 0 has d = -0 and dmin = +0, so its values are -0). F32/F16/BF16:
    normal values of standard deviation ``scale`` (weights), or with ``extremes`` over a wide
    range of exponents, a third of them f16 subnormals (tests; subnormals make every f16
    conversion several times slower, so the benchmark leaves them out).
    """
    from headscope.engine.formats.dequant import block_layout

    gen = np.random.default_rng(seed)
    block, size = block_layout(type_name)
    n = rows * cols // block
    if type_name in ("F32", "F16", "BF16"):
        values = gen.standard_normal(n) * (np.exp2(gen.integers(-26, 12, n)) if extremes else scale)
        if type_name == "F32":
            raw = values.astype(np.float32).view(np.uint8)
        elif type_name == "F16":
            raw = values.astype(np.float16).view(np.uint8)
        else:
            raw = (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        return raw.reshape(rows, -1)
    raw = gen.integers(0, 256, size=(n, size), dtype=np.uint8)
    for at in F16_FIELDS[type_name]:
        d = gen.uniform(-scale, scale, n)
        d[gen.random(n) < 0.05] = 0.0
        d[gen.random(n) < 0.05] = -0.0
        d[gen.random(n) < 0.05] *= 1e-4  # f16 subnormals (below 6.1e-5)
        d[0] = -0.0 if at == 0 else 0.0
        raw[:, at : at + 2] = d.astype(np.float16).view(np.uint8).reshape(n, 2)
    return raw.reshape(rows, -1)


def best(fn: object, repeat: int) -> tuple[float, float]:
    """The shortest wall time and the shortest CPU time of this thread over ``repeat`` runs
    (CPU time: what a single-threaded run costs whatever else the box runs)."""
    wall, cpu = [], []
    for _ in range(repeat):
        t, c = time.perf_counter(), time.thread_time()
        fn()  # type: ignore[operator]
        cpu.append(time.thread_time() - c)
        wall.append(time.perf_counter() - t)
    return min(wall), min(cpu)


def measure(type_name: str, size: int, repeat: int) -> dict[str, object]:
    import gguf.quants
    from gguf.constants import GGMLQuantizationType

    from headscope.engine.formats.dequant import dequantize

    raw = random_blocks(type_name, size, size, seed=1)
    flat = raw.reshape(-1)
    out = np.empty(size * size, np.float32)
    qtype = GGMLQuantizationType[type_name]
    want = np.asarray(gguf.quants.dequantize(raw, qtype), dtype=np.float32).reshape(-1)
    dequantize(flat, type_name, out)
    equal = bool(np.array_equal(want.view(np.uint32), out.view(np.uint32)))
    del want
    n = size * size / 1e6
    theirs, theirs_cpu = best(lambda: gguf.quants.dequantize(raw, qtype), repeat)
    ours, _ = best(lambda: dequantize(flat, type_name, out), repeat)
    ours_1, ours_1_cpu = best(lambda: dequantize(flat, type_name, out, threads=1), repeat)
    return {"type": type_name, "equal": equal, "ours": n / ours, "ours_1": n / ours_1, "gguf": n / theirs,
            "ours_1_cpu": n / ours_1_cpu, "gguf_cpu": n / theirs_cpu}


def report(rows: list[dict[str, object]], size: int, threads: int, load: tuple[str, str]) -> str:
    lines = [
        f"### GGUF dequantisation, one {size}×{size} matrix (Mparam/s, best of the runs)",
        "",
        f"Load average (1, 5, 15 min) before: {load[0]}; after: {load[1]}.",
        "",
        f"| type | headscope, {threads} threads | headscope, 1 thread | gguf.quants.dequantize "
        "| headscope / gguf | 1 thread by CPU time: headscope, gguf, ratio | bit for bit |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cpu = f"{r['ours_1_cpu']:.0f}, {r['gguf_cpu']:.0f}, {ratio(r['ours_1_cpu'], r['gguf_cpu'], 1)}"
        lines.append(f"| {r['type']} | {r['ours']:.0f} | {r['ours_1']:.0f} | {r['gguf']:.0f} "
                     f"| {ratio(r['ours'], r['gguf'], 1)} | {cpu} | {'yes' if r['equal'] else 'NO'} |")
    return "\n".join(lines)


def _load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.dequant", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=4096, help="rows and columns of the matrix (a multiple of 256)")
    ap.add_argument("--types", default=",".join(TYPES), help="comma-separated ggml types")
    ap.add_argument("--repeat", type=int, default=5, help="runs per measurement (the best is kept)")
    ap.add_argument("--tiny", action="store_true", help="a 256×256 matrix, one run (the smoke test)")
    ap.add_argument("--out", type=Path, help="also write the markdown table to this file")
    args = ap.parse_args(argv)
    from headscope.engine.formats.dequant import default_threads

    size, repeat = (256, 1) if args.tiny else (args.size, args.repeat)
    before = _load()
    rows = [measure(t, size, repeat) for t in args.types.split(",") if t]
    text = f"Run {time.strftime('%Y-%m-%d %H:%M %Z')}.\n\n{report(rows, size, default_threads(), (before, _load()))}\n"
    return publish(text, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
