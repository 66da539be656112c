"""``python -m bench.diff``: circuit similarity of two GPT-2-small-shaped models.

headscope's ``engine.circuits.similarity.circuit_similarity`` (token-basis OV and QK similarity of every head
pair within each layer, through six ``d_model × d_model`` Gram matrices) against the
straightforward way, measured in the same run: materialise the vocabulary-sized factors
``W_E W_V``, ``W_O W_U``, ``W_E W_Q``, ``W_E W_K`` of each layer (``[vocab, H·d_head]``) and take
their cross Gram matrices. (The circuits themselves, ``vocab × vocab``, would be 10 GB per
head at this vocabulary: nobody can build them.) The baseline runs ``BASELINE_LAYERS`` layers
and is extrapolated linearly to all of them (marked). Each side runs in its own subprocess,
so peak RSS is its own.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

BASELINE_LAYERS = 2
SHAPE = {"n_layers": 12, "n_heads": 12, "d_model": 768, "d_head": 64, "d_vocab": 50257, "n_ctx": 1024}


def random_weights(seed: int, shape: dict[str, int]):
    import torch

    from headscope.engine.core.config import ModelConfig
    from headscope.engine.model.weights import DictWeights

    g = torch.Generator().manual_seed(seed)
    L, H, D, Dh, V = (shape[k] for k in ("n_layers", "n_heads", "d_model", "d_head", "d_vocab"))
    cfg = ModelConfig(family="native", architecture="bench", n_layers=L, n_heads=H, d_model=D,
                      d_head=Dh, d_vocab=V, n_ctx=shape["n_ctx"], normalization=None)
    t = {"embed.W_E": torch.randn(V, D, generator=g), "unembed.W_U": torch.randn(D, V, generator=g)}
    for layer in range(L):
        for name in ("W_Q", "W_K", "W_V"):
            t[f"blocks.{layer}.attn.{name}"] = torch.randn(H, D, Dh, generator=g)
        t[f"blocks.{layer}.attn.W_O"] = torch.randn(H, Dh, D, generator=g)
    return DictWeights(cfg, t)  # numpy arrays: what headscope's similarity reads


def run_one(impl: str, shape: dict[str, int]) -> dict[str, float]:
    import torch

    torch.set_num_threads(2)
    wa, wb = random_weights(0, shape), random_weights(1, shape)
    start = time.perf_counter()
    with torch.inference_mode():
        if impl == "headscope":

            from headscope.engine.circuits.similarity import circuit_similarity

            circuit_similarity(wa, wb)
        else:  # the dense baseline, in torch
            from headscope.engine.forward.torch_weights import torch_weights

            wa, wb = torch_weights(wa), torch_weights(wb)
            e_a, e_b = wa.get("embed.W_E"), wb.get("embed.W_E")
            u_a, u_b = wa.get("unembed.W_U"), wb.get("unembed.W_U")
            for layer in range(min(BASELINE_LAYERS, shape["n_layers"])):
                for kind in ("ov", "qk"):
                    big = {}
                    for m, w, e, u in (("a", wa, e_a, u_a), ("b", wb, e_b, u_b)):
                        heads = [w.get(f"blocks.{layer}.attn.{n}") for n in ("W_Q", "W_K", "W_V", "W_O")]
                        q, k, v, o = (h.permute(1, 0, 2).flatten(1) if i < 3 else h.flatten(0, 1)
                                      for i, h in enumerate(heads))
                        big[m] = (e @ v, (o @ u).T) if kind == "ov" else (e @ q, e @ k)
                    for i in range(2):  # cross and self Gram matrices of the vocab-sized factors
                        _ = big["a"][i].T @ big["b"][i]
                        _ = big["a"][i].T @ big["a"][i]
                        _ = big["b"][i].T @ big["b"][i]
    elapsed = time.perf_counter() - start
    if impl != "headscope" and shape["n_layers"] > BASELINE_LAYERS:
        elapsed *= shape["n_layers"] / BASELINE_LAYERS
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": elapsed, "rss_mb": rss_mb}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="toy shapes (smoke test)")
    parser.add_argument("--one", choices=("headscope", "straightforward"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    shape = SHAPE if not args.tiny else {**SHAPE, "n_layers": 2, "n_heads": 2, "d_model": 32,
                                          "d_head": 8, "d_vocab": 100}
    if args.one:
        print(json.dumps(run_one(args.one, shape)))
        return
    results = {}
    for impl in ("headscope", "straightforward"):
        cmd = [sys.executable, "-m", "bench.diff", "--one", impl] + (["--tiny"] if args.tiny else [])
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        results[impl] = json.loads(out.strip().splitlines()[-1])
    h, d = results["headscope"], results["straightforward"]
    print("| metric | headscope (Gram matrices) | straightforward (vocab-sized factors) | ratio |")
    print("|---|---|---|---|")
    print(f"| all-pairs OV+QK similarity (s) | {h['seconds']:.2f} | {d['seconds']:.2f} "
          f"(extrapolated from {BASELINE_LAYERS} layers) | "
          f"{d['seconds'] / h['seconds']:.1f}× |")
    print(f"| peak RSS (MB, incl. both models' weights) | {h['rss_mb']:.0f} | {d['rss_mb']:.0f} | "
          f"{d['rss_mb'] / h['rss_mb']:.1f}× |")


if __name__ == "__main__":
    main()
