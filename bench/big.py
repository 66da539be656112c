"""``python -m bench.big --dir DIR``: a 7B-shaped checkpoint against its dense floor, one run.

Writes (once, into ``DIR``, reused afterwards) the ``llama-7b`` shape of ``bench/checkpoints.py``
(32 layers × 32 heads, d_model 4096, vocab 32000, MLP 11008, bf16, ~13 GB in per-layer shards)
and runs each scenario in its own process (``python -m bench.big --one SCENARIO PATH``), so
peak RSS and import costs are per scenario:

- ``plain-floor``: the independent floor (``bench/plain_floor.py``, no headscope import): plain
  ``safetensors`` reads upcast to float32, ``W_U W_E`` and ``W_Eᵀ W_E`` once, the two
  ``[H·d_head, d] @ [d, d]`` spectral products per layer, and a hand-written Llama forward pass
  on the sequences of ``heads``' behaviour batch (``--floor-batch``; ``64``: one sequence of 64).
- ``gguf-read`` (GGUF files): every tensor through ``gguf``'s reader and
  ``gguf.quants.dequantize``, the GGUF rows' read cost, reported apart.
- ``floor``: the headscope-reader floor (kept for comparison with earlier tables): the same
  work read through headscope's own loaders (``open_model(path, raw=True)`` +
  ``torch_weights``) and run by its own forward pass (``engine.forward.transformer.run``) on 64
  tokens, so a slow reader there is in the floor too.
- ``heads``: ``headscope heads PATH --json --no-cache`` (the CLI's ``main``), output discarded.
- ``info``: ``headscope info PATH --json``.
- ``first_view``: open the model, then the first head's 64×64 token QK block (``Engine``).
- ``composition-floor-{q,k,v}`` / ``composition-numpy-{q,k,v}`` / ``composition-{q,k,v}``
  (``--composition``): every layer pair's ``[H·d_head, d_model] @ [d_model, H·d_head]``
  product (the GEMM floor of one mode) vs the streamed sweep, tile by tile, with its ETA
  (``engine.circuits.composition``, the one sweep; ``composition-numpy-*`` is kept as a name
  for the same run).

Ratios are headscope / floor (≤ 1.5 × the warm independent floor is the goal for ``heads``).
``--cache warm,cold``: before each scenario the files it reads are read once (warm) or dropped
from the page cache with ``posix_fadvise(DONTNEED)`` (cold; no root needed); ``--repeat N``
runs every scenario N times in turn and keeps the fastest; ``--lock FILE`` holds a flock(2)
lock for each scenario (page cache set-up and run), so others can interleave on a shared box.
``--tiny`` runs the same on the toy ``tiny-llama-mha`` shape (what the smoke test does).

``--gguf``: the same shape also as llama.cpp GGUF files in Q8_0 and Q4_K (``Q4_K_M``-like:
the output matrix in Q6_K), random valid blocks and a 32k-piece SentencePiece vocabulary
(``bench/gguf_checkpoints.py``), written once into ``DIR`` next to the bf16 checkpoint;
``info``, ``first_view`` and ``heads`` run on each file (``heads-q8_0``, ...) against the
``floor`` of the bf16 checkpoint, in the same run. With ``--tiny``: the ``tiny-llama-256``
shape (K-quant rows need 256 values).

``--13b``: the ``llama-13b`` shape (40 layers × 40 heads, d_model 5120, d_mlp 13824, vocab
32000, bf16, ~26 GB in per-layer shards, written once into ``DIR``): larger than the page
cache of a 24 GB box, so every pass reads the disk and the read plan (``engine.model.readplan``)
decides what stays cached. Scenarios ``first_view``, ``plain-floor``, ``floor``, ``heads``,
``composition-floor-k`` and ``composition-k``, run as the 7B's (``--cache``, ``--repeat``,
``--lock``; the page cache **cold** by default: reading 26 GB to warm it would only evict
itself), each with the bytes it read from the disk (``/proc/self/io``). ``--drop-caches``
(root only; it empties the page cache of the whole box) adds that to the cold state. With
``--tiny``: the ``tiny-llama-mha`` shape with a page-cache budget smaller than it
(``--page-cache-mb``, default 0.2 MB), so the streamed path runs.

``--n-layers N`` (any path): the shape cut to its first N layers, written as its own checkpoint
(``llama-13b-2l``, ...): the per-layer work of the full shape in a smaller file.
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from . import disk_read_gb, publish, ratio, rss_mb, since  # noqa: E402

SCENARIOS = ("info", "first_view", "plain-floor", "heads")
SCENARIOS_13B = ("first_view", "plain-floor", "floor", "heads", "composition-floor-k", "composition-k")
KINDS = ("q", "k", "v")
GGUF_TYPES = ("Q8_0", "Q4_K")
GGUF_SCENARIOS = ("info", "first_view", "gguf-read", "heads")  # each as f"{name}-{type.lower()}"


# -- scenarios (each in its own process) -------------------------------------------------------


def _cli(argv: list[str]) -> None:
    import contextlib
    import io

    from headscope.tui.cli.main import main

    with contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    if code:
        raise SystemExit(f"headscope {' '.join(argv)} exited with {code}")


def run_info(path: Path) -> dict[str, Any]:
    _cli(["info", str(path), "--json"])
    return {"seconds": since(T0)}


def run_heads(path: Path) -> dict[str, Any]:
    _cli(["heads", str(path), "--json", "--no-cache"])
    return {"seconds": since(T0)}


def run_first_view(path: Path) -> dict[str, Any]:
    import asyncio

    from headscope.engine.core.requests import CircuitRequest
    from headscope.engine.service.engine import Engine

    eng = Engine(path)

    async def main() -> dict[str, Any]:
        t = time.perf_counter()
        await eng.ready()
        opened = since(t)
        t = time.perf_counter()
        await eng.get(CircuitRequest.of(eng.structure, 0, 0, "qk", "token", list(range(64)), list(range(64)), limit=eng.max_block_bytes))
        view = since(t)
        await eng.aclose()
        return {"open": opened, "first_view": view}

    return {**asyncio.run(main()), "seconds": since(T0)}


def run_floor(path: Path) -> dict[str, Any]:
    """The dense floor of ``heads`` (module docstring), on the raw weights."""
    import torch

    from headscope.engine.forward import transformer as forward
    from headscope.engine.forward.torch_weights import torch_weights
    from headscope.engine.model.loading import load_model

    w = torch_weights(load_model(path, raw=True).weights)  # the torch floor, as before
    cfg = w.cfg
    t = time.perf_counter()
    w_e, w_u = w.get("embed.W_E"), w.get("unembed.W_U")
    middles = (w_u @ w_e, w_e.T @ w_e)
    del w_e, w_u
    for layer in range(cfg.n_layers):
        a = {n: w.get(f"blocks.{layer}.attn.{n}") for n in ("W_Q", "W_K", "W_V", "W_O")}
        n, d = cfg.n_heads * cfg.d_head, cfg.d_model
        a["W_O"].reshape(n, d) @ middles[0]  # copying: [H·d_head, d] @ [d, d]
        a["W_Q"].permute(0, 2, 1).reshape(n, d) @ middles[1]  # QK positivity
    spectral = since(t)
    t = time.perf_counter()
    with torch.inference_mode():
        forward.run(w, torch.arange(64) % cfg.d_vocab)
    return {"spectral": spectral, "forward": since(t), "seconds": since(T0)}


class _FirstLayers:
    """A weight source cut to its first ``n`` layers (``BENCH_LAYERS``: a shorter composition run)."""

    def __init__(self, w: Any, n: int) -> None:
        self._w, self.path = w, getattr(w, "path", None)
        self.cfg = w.cfg.replace(n_layers=min(n, w.cfg.n_layers)) if n else w.cfg

    def has(self, name: str) -> bool:
        return self._w.has(name)

    def get(self, name: str) -> Any:
        return self._w.get(name)

    def get_head(self, name: str, head: int) -> Any:
        return self._w.get_head(name, head)

    def __getattr__(self, name: str) -> Any:  # the rest of the source (numpy's plan, path, ...)
        return getattr(self._w, name)


def _layers() -> int:
    import os

    return int(os.environ.get("BENCH_LAYERS", "0"))


def run_composition_floor(path: Path, kind: str) -> dict[str, Any]:
    """Every layer pair's ``[H·k, d] @ [d, H·k]`` product: the GEMM floor of one mode (only
    the products are timed, not the reads)."""
    from headscope.engine.forward.torch_weights import torch_weights
    from headscope.engine.model.loading import load_model

    w = _FirstLayers(torch_weights(load_model(path, raw=True).weights), _layers())
    cfg = w.cfg
    n, d = cfg.n_heads * cfg.d_head, cfg.d_model
    target = {"q": "W_Q", "k": "W_K", "v": "W_V"}[kind]
    x = w.get("blocks.0.attn.W_O").reshape(n, d)  # any [H·k, d] source: only the products are timed
    spent = 0.0
    for tgt in range(1, cfg.n_layers):
        y = w.get(f"blocks.{tgt}.attn.{target}").permute(1, 0, 2).reshape(d, n).contiguous()
        t = time.perf_counter()
        for _src in range(tgt):
            x @ y
        spent += since(t)
    return {"compute": spent, "seconds": since(T0)}


def run_composition(path: Path, kind: str) -> dict[str, Any]:
    """``composition.composition_scores`` streamed tile by tile (the one sweep the CLI, the
    explorer and the cluster workers run), with the ETA its progress gives."""
    from headscope.engine.circuits.composition import composition_scores
    from headscope.engine.core.eta import Eta
    from headscope.engine.model.loading import load_model

    model = load_model(path)
    w = _FirstLayers(model.weights, _layers())
    eta = Eta()
    etas: list[float] = []
    edges = 0

    def on_tile(tile: Any) -> None:
        nonlocal edges
        edges += int(tile.scores.size)

    def progress(fraction: float) -> None:
        eta.update(fraction)
        left = eta.seconds_left()
        if left is not None:
            etas.append(left)
            print(f"# composition {kind}: {fraction:.0%}, ETA {left:.0f} s", file=sys.stderr)

    t = time.perf_counter()
    composition_scores(w, kind, progress=progress, on_tile=on_tile)
    return {"compute": since(t), "edges": edges, "first_eta": etas[0] if etas else None,
            "seconds": since(T0)}


def run_plain_floor(path: Path) -> dict[str, Any]:
    """The independent floor (``bench/plain_floor.py``: no headscope import)."""
    import os

    from . import plain_floor

    out = plain_floor.floor(path, os.environ.get("BENCH_FLOOR_BATCH", "heads"))
    return {**out, "seconds": since(T0)}


def run_gguf_read(path: Path) -> dict[str, Any]:
    """Every tensor of a GGUF file through ``gguf``'s reader and dequantisation."""
    from . import plain_floor

    return {**plain_floor.gguf_read(path), "seconds": since(T0)}


def one(scenario: str, path: Path) -> dict[str, Any]:
    if scenario.startswith("composition-floor-"):
        out = run_composition_floor(path, scenario[-1])
    elif scenario.startswith("composition-"):  # composition-numpy-*: the same, one path now
        out = run_composition(path, scenario[-1])
    else:
        out = {"info": run_info, "heads": run_heads, "first_view": run_first_view,
               "floor": run_floor, "plain-floor": run_plain_floor,
               "gguf-read": run_gguf_read}[scenario](path)
    out["rss_mb"] = rss_mb()
    out["disk_read_gb"] = disk_read_gb()
    return out


# -- the run -------------------------------------------------------------------------------


def drop_caches() -> bool:
    """Empty the page cache (root only; the whole box's): False if not allowed."""
    import os

    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
    except OSError:
        return False
    return True


def scenario(name: str, path: Path, timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.big", "--one", name, str(path)]
    root = Path(__file__).resolve().parent.parent
    try:
        done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f} s"}
    if done.returncode != 0:
        return {"error": ((done.stderr.strip().splitlines() or ["?"])[-1])[:160]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _fmt(x: Any) -> str:
    return f"{x:.3g}" if isinstance(x, float) else ("–" if x is None else str(x))


def _seconds(r: dict[str, Any]) -> Any:
    """A scenario's fastest whole-process seconds, with the other runs' in brackets."""
    if "seconds" not in r:
        return r.get("error")
    others = r.get("runs", [])
    return f"{r['seconds']:.3g}" + (f" ({', '.join(f'{x:.3g}' for x in others)})" if len(others) > 1 else "")


def _floor_rows(label: str, floor: dict[str, Any]) -> list[tuple[str, Any, str]]:
    tokens = f"{floor.get('tokens', '?')} tokens in {floor.get('sequences', '?')} sequences"
    return [
        (f"{label}: independent floor, whole process (s)", _seconds(floor), ""),
        (f"{label}: … of which reading + bf16 → float32 (s)", floor.get("read"), ""),
        (f"{label}: … of which spectral products (s)", floor.get("spectral"), ""),
        (f"{label}: … of which the forward pass, {tokens} (s)", floor.get("forward"), ""),
    ]


def report(shape: str, res: dict[str, dict[str, Any]], states: list[str], repeat: int) -> str:
    """The 7B table: per page-cache state the independent floor, ``heads`` and their ratio
    (the fastest of ``repeat`` runs each, measured in turn)."""
    rows: list[tuple[str, Any, str]] = []
    for state in states:
        floor, heads = res.get(f"plain-floor@{state}", {}), res.get(f"heads@{state}", {})
        reader = res.get(f"floor@{state}")
        rows += _floor_rows(state, floor)
        rows += [
            (f"{state}: `heads --json --no-cache`, whole process (s)", _seconds(heads), "≤ 1.5× floor"),
            (f"**{state}: `heads` / independent floor**", ratio(heads.get("seconds"), floor.get("seconds")), "≤ 1.5× (7B warm, 13B cold)"),
            (f"{state}: `heads` peak RSS (MB)", heads.get("rss_mb"), "≤ 3000"),
            (f"{state}: independent floor peak RSS (MB)", floor.get("rss_mb"), ""),
        ]
        if reader is not None:
            rows += [
                (f"{state}: headscope-reader floor (headscope's loaders and forward pass) (s)", _seconds(reader), ""),
                (f"{state}: `heads` / headscope-reader floor", ratio(heads.get("seconds"), reader.get("seconds")), ""),
            ]
        rows += [(f"{state}: {key}, read from disk (GB)", r.get("disk_read_gb"), "")
                 for key, r in _of_state(res, state).items() if "error" not in r]
        if f"first_view@{state}" in res:
            rows.append((f"{state}: first head QK 64×64 after open (s)", res[f"first_view@{state}"].get("first_view"), "≤ 1"))
        if f"info@{state}" in res:
            rows.append((f"{state}: `info --json`, whole process (s)", _seconds(res[f"info@{state}"]), "< 0.5"))
        composition = {k: v for k, v in _of_state(res, state).items() if k.startswith("composition")}
        for kind in KINDS:
            if any(k.endswith(f"-{kind}") for k in composition):
                rows += _composition_rows(kind, composition)
    head = f"### {shape}: page cache {', '.join(states)}; fastest of {repeat} run(s) per scenario, in turn"
    lines = [head, "", "| metric | value | goal |", "|---|---|---|"]
    lines += [f"| {label} | {_fmt(v)} | {goal} |" for label, v, goal in rows]
    return "\n".join(lines)


def _of_state(res: dict[str, dict[str, Any]], state: str) -> dict[str, dict[str, Any]]:
    """The results of one page-cache state, by scenario (``measure``'s keys without ``@state``)."""
    return {k[: -len(state) - 1]: v for k, v in res.items() if k.endswith(f"@{state}")}


def _composition_rows(kind: str, res: dict[str, dict[str, Any]]) -> list[tuple[str, Any, str]]:
    rows: list[tuple[str, Any, str]] = []
    base = res.get(f"composition-floor-{kind}") or {}
    if f"composition-floor-{kind}" in res:
        rows.append((f"composition {kind}: GEMM floor (s)", base.get("compute", base.get("error")), ""))
    for impl, label in (("numpy-", "the sweep (numpy-)"), ("", "the sweep (CLI, explorer)")):
        comp = res.get(f"composition-{impl}{kind}")
        if comp is None:
            continue
        rows += [
            (f"composition {kind}, {label}: compute (s)", comp.get("compute", comp.get("error")), ""),
            (f"composition {kind}, {label} / GEMM floor", ratio(comp.get("compute"), base.get("compute")), ""),
            (f"composition {kind}, {label}: peak RSS (MB)", comp.get("rss_mb"), "≤ 3000"),
            (f"composition {kind}, {label}: first ETA (s)", comp.get("first_eta"), ""),
        ]
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.big", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--one", nargs=2, metavar=("SCENARIO", "PATH"), help=argparse.SUPPRESS)
    ap.add_argument("--dir", type=Path, help="where the checkpoint is written (reused if present)")
    ap.add_argument("--tiny", action="store_true", help="the toy shape (smoke test)")
    ap.add_argument("--shape", help="another shape of bench/checkpoints.py (e.g. llama-1b-gqa)")
    ap.add_argument("--n-layers", type=int,
                    help="the shape cut to its first N layers (its own checkpoint, NAME-Nl: the same "
                         "per-layer work in a smaller file)")
    ap.add_argument("--composition", action="store_true",
                    help="also all Q/K/V composition scores against their GEMM floors (long)")
    ap.add_argument("--only", help="comma-separated scenarios (default: all)")
    ap.add_argument("--layers", type=int, default=0,
                    help="composition on the first N layers only (N(N-1)/2 layer pairs; default all)")
    ap.add_argument("--out", type=Path, help="also write the markdown table to this file")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per scenario")
    ap.add_argument("--gguf", action="store_true",
                    help="the same shape as Q8_0 and Q4_K GGUF files against the bf16 floor")
    ap.add_argument("--13b", dest="b13", action="store_true",
                    help="the 13B shape (26 GB, larger than RAM) against its dense floor")
    ap.add_argument("--page-cache-mb", type=float,
                    help="the page cache the read plan counts on (HEADSCOPE_PAGE_CACHE_MB)")
    ap.add_argument("--drop-caches", action="store_true",
                    help="cold state: also empty the whole box's page cache before each scenario "
                         "(root only)")
    ap.add_argument("--cache",
                    help="page-cache states, comma-separated: warm (the scenario's files read once "
                         "just before it), cold (posix_fadvise DONTNEED on them just before it); "
                         "default warm, cold with --13b (larger than the page cache)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs of each scenario, in turn; the table keeps the fastest")
    ap.add_argument("--lock", type=Path,
                    help="hold this flock(2) lock file for each scenario (page cache set up + run)")
    ap.add_argument("--floor-batch", default="heads",
                    help="the sequences of plain-floor's forward pass: heads (its behaviour batch) "
                         "or a token count (one sequence)")
    args = ap.parse_args(argv)
    if args.one:  # a scenario's own process
        if args.one[0] not in ("plain-floor", "gguf-read"):  # the console script's allocator policy
            from headscope.engine.core.memory import keep_freed_memory  # (the floors set their own)

            keep_freed_memory()
        print(json.dumps(one(args.one[0], Path(args.one[1]))))
        return 0

    import os

    from .checkpoints import write_checkpoint

    os.environ["BENCH_FLOOR_BATCH"] = args.floor_batch  # read by the scenario processes
    if args.gguf:
        return main_gguf(args)
    if args.b13:
        return main_13b(args)
    shape = _shape(args, "tiny-llama-mha" if args.tiny else "llama-7b")
    root = args.dir or Path(tempfile.mkdtemp(prefix="headscope-bench-"))
    t = time.perf_counter()
    path = write_checkpoint(shape, root)
    title = shape.name  # with the composition cut below, for the table
    print(f"# {title}: checkpoint ready in {since(t):.1f} s at {path}", file=sys.stderr)
    names = list(SCENARIOS)
    if args.composition:
        names += [f"composition{part}-{k}" for k in KINDS for part in ("-floor", "-numpy", "")]
    if args.only:
        names = [n for n in args.only.split(",") if n]
    if args.layers:
        os.environ["BENCH_LAYERS"] = str(args.layers)  # read by the scenario processes
        title += f" (composition on the first {args.layers} layers)"
    states = _states(args.cache or "warm")
    res = measure([(n, n, path) for n in names], states, args)
    text = f"Run {time.strftime('%Y-%m-%d %H:%M %Z')}.\n\n{report(title, res, states, args.repeat)}\n"
    return publish(text, args.out)


# -- page cache, lock, repeats ---------------------------------------------------------------

CACHE_STATES = ("warm", "cold")


def _shape(args: argparse.Namespace, default: str) -> Any:
    """The ``bench/checkpoints.py`` shape asked for (``--shape``, else ``default``), cut to
    ``--n-layers`` if given."""
    import dataclasses

    from .checkpoints import SHAPES

    shape = SHAPES[args.shape or default]
    if args.n_layers:
        shape = dataclasses.replace(shape, name=f"{shape.name}-{args.n_layers}l", n_layers=args.n_layers)
    return shape


def _states(spec: str) -> list[str]:
    states = [s for s in spec.split(",") if s]
    bad = [s for s in states if s not in CACHE_STATES]
    if bad or not states:
        raise SystemExit(f"--cache: {','.join(bad) or spec!r} is not one of {', '.join(CACHE_STATES)}")
    return states


def checkpoint_files(path: Path) -> list[Path]:
    """The files of a checkpoint: a directory's files, or the one file."""
    return sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]


def set_page_cache(files: list[Path], state: str) -> None:
    """``warm``: read every file once (its pages are then in the page cache, unless the box
    needs the memory); ``cold``: ``posix_fadvise(DONTNEED)`` on every file, which drops its
    clean pages that no process has mapped (no root needed)."""
    import os

    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            if state == "cold":
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            else:
                while os.read(fd, 64 << 20):
                    pass
        finally:
            os.close(fd)


def _held(lock: Path | None) -> Any:
    """A context that holds ``lock`` (flock, exclusive) if given."""
    import contextlib
    import fcntl

    if lock is None:
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def hold() -> Any:
        with open(lock, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    return hold()


def _best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The fastest run's fields, with every run's seconds and the highest peak RSS."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[-1]
    best = dict(min(ok, key=lambda r: r["seconds"]))
    best["runs"] = [round(r["seconds"], 1) for r in ok]
    best["rss_mb"] = max(r.get("rss_mb", 0.0) for r in ok)
    return best


def measure(jobs: list[tuple[str, str, Path]], states: list[str],
            args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Each job ``(key, scenario, path)`` in each page-cache state, ``args.repeat`` times in
    turn (a change in the box's load hits every scenario alike), each under ``args.lock``;
    ``{f"{key}@{state}": the fastest run}``. ``args.drop_caches``: the cold state also
    empties the whole box's page cache (root only)."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for _ in range(args.repeat):
        for state in states:
            for key, name, path in jobs:
                with _held(args.lock):
                    set_page_cache(checkpoint_files(path), state)
                    if state == "cold" and args.drop_caches and not drop_caches():
                        print("#   cannot empty the page cache (not root?): posix_fadvise only",
                              file=sys.stderr)
                    r = scenario(name, path, args.timeout)
                runs.setdefault(f"{key}@{state}", []).append(r)
                print(f"#   {key:22s} {state:4s} {json.dumps(r)}", file=sys.stderr, flush=True)
    return {k: _best(v) for k, v in runs.items()}


def main_13b(args: argparse.Namespace) -> int:
    """``--13b``: the larger-than-RAM shape through the same scenarios and runner as the 7B
    (``measure``: page-cache state, repeats, lock), cold by default, with the read plan each
    process ran with and the bytes each scenario read from the disk."""
    import os

    from headscope.engine.model.readplan import PAGE_CACHE_ENV, page_cache_bytes

    from .checkpoints import checkpoint_bytes, write_checkpoint

    budget = args.page_cache_mb if args.page_cache_mb is not None else (0.2 if args.tiny else None)
    if budget is not None:
        os.environ[PAGE_CACHE_ENV] = str(budget)  # read by the scenario processes
    if args.layers:
        os.environ["BENCH_LAYERS"] = str(args.layers)
    shape = _shape(args, "tiny-llama-mha" if args.tiny else "llama-13b")
    root = args.dir or Path(tempfile.mkdtemp(prefix="headscope-bench-"))
    t = time.perf_counter()
    path = write_checkpoint(shape, root)
    print(f"# {shape.name}: checkpoint ready in {since(t):.1f} s at {path}", file=sys.stderr)
    names = [n for n in (args.only or ",".join(SCENARIOS_13B)).split(",") if n]
    states = _states(args.cache or "cold")
    res = measure([(n, n, path) for n in names], states, args)
    size, cache = checkpoint_bytes(path), page_cache_bytes()
    title = shape.name + (f" (composition on the first {args.layers} layers)" if args.layers else "")
    lines = [f"Run {time.strftime('%Y-%m-%d %H:%M %Z')}.", "",
             f"Checkpoint {size / 1e9:.3g} GB; page cache counted on {cache / 1e9:.3g} GB "
             f"({'streamed' if size > cache else 'fits'}).", "",
             report(title, res, states, args.repeat), ""]
    return publish("\n".join(lines), args.out)


def main_gguf(args: argparse.Namespace) -> int:
    """``--gguf``: the bf16 independent floor, then, per GGUF file, its read cost through the
    ``gguf`` package and info / first view / heads."""
    from .checkpoints import write_checkpoint
    from .gguf_checkpoints import write_gguf_checkpoint

    shape = _shape(args, "tiny-llama-256" if args.tiny else "llama-7b")
    root = args.dir or Path(tempfile.mkdtemp(prefix="headscope-bench-"))
    t = time.perf_counter()
    path = write_checkpoint(shape, root)
    files = {q: write_gguf_checkpoint(shape, root, q) for q in GGUF_TYPES}
    print(f"# {shape.name}: bf16 and GGUF checkpoints ready in {since(t):.1f} s in {root}", file=sys.stderr)
    names = ["plain-floor", *(f"{n}-{q.lower()}" for q in GGUF_TYPES for n in GGUF_SCENARIOS)]
    if args.only:
        names = [n for n in args.only.split(",") if n]
    jobs = []
    for name in names:
        base, _, kind = name.rpartition("-")
        target = files.get(kind.upper()) if base in GGUF_SCENARIOS else None
        jobs.append((name, base, target) if target else (name, name, path))
    states = _states(args.cache or "warm")
    res = measure(jobs, states, args)
    sizes = {q: p.stat().st_size for q, p in files.items()}
    text = (f"Run {time.strftime('%Y-%m-%d %H:%M %Z')}.\n\n"
            f"{report_gguf(shape.name, res, sizes, states, args.repeat)}\n")
    return publish(text, args.out)


def report_gguf(shape: str, res: dict[str, dict[str, Any]], sizes: dict[str, int],
                states: list[str], repeat: int) -> str:
    rows: list[tuple[str, Any, str]] = []
    for state in states:
        floor = res.get(f"plain-floor@{state}", {})
        rows += _floor_rows(f"{state}, bf16", floor)
        if f"heads@{state}" in res:  # the bf16 row too, so one run gives all three against one floor
            bf16 = res[f"heads@{state}"]
            rows += [(f"{state}, bf16: `heads --json --no-cache`, whole process (s)", _seconds(bf16), "≤ 1.5× floor"),
                     (f"**{state}, bf16: `heads` / independent floor**", ratio(bf16.get("seconds"), floor.get("seconds")), "≤ 1.5× (warm)"),
                     (f"{state}, bf16: `heads` peak RSS (MB)", bf16.get("rss_mb"), "≤ 3000")]
        for q in GGUF_TYPES:
            k = q.lower()
            heads, read = res.get(f"heads-{k}@{state}", {}), res.get(f"gguf-read-{k}@{state}", {})
            view, info = res.get(f"first_view-{k}@{state}", {}), res.get(f"info-{k}@{state}", {})
            rows += [
                (f"{state}, {q}: file size (GB)", sizes[q] / 1e9 if q in sizes else None, ""),
                (f"{state}, {q}: read + dequantise with `gguf` (GGUFReader, gguf.quants.dequantize) (s)",
                 read.get("read", read.get("error")), ""),
                (f"{state}, {q}: `heads --json --no-cache`, whole process (s)", _seconds(heads), "≤ 1.5× floor"),
                (f"**{state}, {q}: `heads` / bf16 independent floor**", ratio(heads.get("seconds"), floor.get("seconds")), "≤ 1.5× (warm)"),
                (f"{state}, {q}: `heads` peak RSS (MB)", heads.get("rss_mb"), "≤ 3000"),
            ]
            if view:
                rows += [(f"{state}, {q}: open until ready (s)", view.get("open", view.get("error")), ""),
                         (f"{state}, {q}: first head QK 64×64 after open (s)", view.get("first_view"), "< 1")]
            if info:
                rows.append((f"{state}, {q}: `info --json`, whole process (s)", _seconds(info), "< 0.5"))
    head = (f"### {shape}: GGUF against the bf16 independent floor; page cache {', '.join(states)}; "
            f"fastest of {repeat} run(s) per scenario, in turn")
    lines = [head, "", "| metric | value | goal |", "|---|---|---|"]
    lines += [f"| {label} | {_fmt(v)} | {goal} |" for label, v, goal in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
