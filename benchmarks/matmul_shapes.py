"""The matrix multiplications of T5-small's training step, one at a time: XLA:CPU against PyTorch.

    python benchmarks/matmul_shapes.py [--repeats 7]

Each row is one product of `train_throughput.py`'s T5 v1.0 small step (batch 8,
512 inputs, 114 targets: 4096 encoder and 912 decoder tokens, d_model 512,
d_ff 2048, 8 heads of 64, vocabulary 32128) as an einsum of float32 operands,
forward and backward forms, jitted alone in JAX and run by `torch.einsum` on
the same arrays. GFLOP/s are 2 x output size x contracted size over the best of
`--repeats` runs. Prints a table; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import math
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

# (what it is, einsum, lhs shape, rhs shape)
PRODUCTS = [
    ("encoder q/k/v/o projection", "mk,kn->mn", (4096, 512), (512, 512)),
    ("encoder MLP in", "mk,kn->mn", (4096, 512), (512, 2048)),
    ("encoder MLP out", "mk,kn->mn", (4096, 2048), (2048, 512)),
    ("MLP out, input gradient", "mn,kn->mk", (4096, 512), (2048, 512)),
    ("MLP in, input gradient", "mn,kn->mk", (4096, 2048), (512, 2048)),
    ("projection, weight gradient", "mk,mn->kn", (4096, 512), (4096, 512)),
    ("MLP in, weight gradient", "mk,mn->kn", (4096, 512), (4096, 2048)),
    ("attention logits", "bhqd,bhkd->bhqk", (8, 8, 512, 64), (8, 8, 512, 64)),
    ("attention context", "bhqk,bhkd->bhqd", (8, 8, 512, 512), (8, 8, 512, 64)),
    ("tied output logits", "mk,nk->mn", (912, 512), (32128, 512)),
    ("logits, input gradient", "mn,nk->mk", (912, 32128), (32128, 512)),
    ("logits, embedding gradient", "mn,mk->nk", (912, 32128), (912, 512)),
    ("square 2048", "mk,kn->mn", (2048, 2048), (2048, 2048)),
]


def best_seconds(run, repeats: int) -> float:
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def rates(spec: str, lhs: np.ndarray, rhs: np.ndarray, repeats: int) -> tuple[float, float]:
    """FLOP/s of the einsum jitted alone in JAX and run by torch.einsum."""
    import torch

    lhs_spec, rest = spec.split(",")
    rhs_spec, _ = rest.split("->")
    sizes = dict(zip(lhs_spec, lhs.shape, strict=True)) | dict(zip(rhs_spec, rhs.shape, strict=True))
    flops = 2 * math.prod(sizes.values())  # every index once: output indices times contracted ones
    product = jax.jit(lambda a, b: jnp.einsum(spec, a, b))
    jax_lhs, jax_rhs = jnp.asarray(lhs), jnp.asarray(rhs)
    torch_lhs, torch_rhs = torch.from_numpy(lhs), torch.from_numpy(rhs)
    xla = flops / best_seconds(lambda: product(jax_lhs, jax_rhs).block_until_ready(), repeats)
    return xla, flops / best_seconds(lambda: torch.einsum(spec, torch_lhs, torch_rhs), repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    import torch

    rng = np.random.default_rng(0)
    print(f"float32 einsums on {os.cpu_count()} CPU cores, best of {args.repeats}; JAX {jax.__version__}, "
          f"PyTorch {torch.__version__} ({torch.get_num_threads()} threads)\n")
    print(f"{'product':<30}{'einsum':<18}{'shapes':<32}{'XLA GFLOP/s':>12}{'PyTorch':>9}{'XLA / PyTorch':>15}")
    for name, spec, lhs_shape, rhs_shape in PRODUCTS:
        lhs = rng.standard_normal(lhs_shape, dtype=np.float32)
        rhs = rng.standard_normal(rhs_shape, dtype=np.float32)
        xla, pytorch = rates(spec, lhs, rhs, args.repeats)
        shapes = f"{list(lhs_shape)} x {list(rhs_shape)}"
        print(f"{name:<30}{spec:<18}{shapes:<32}{xla / 1e9:>12.1f}{pytorch / 1e9:>9.1f}{xla / pytorch:>14.2f}x")


if __name__ == "__main__":
    main()
