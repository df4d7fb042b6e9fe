"""The training step of train_throughput.py on one batch given unpacked and then marked as packed, in one process:
what the fused attention kernels gain from an unpacked batch.

    python benchmarks/packed_vs_unpacked.py [--model t5|t5-base|t5-large|gpt2|gpt2-1b] [--dtype float32|bfloat16]
        [--device cpu|gpu|tpu] [--attention einsum|xla|cudnn|pallas_tpu_flash] [--steps 5] [--batch 8]
        [--inputs 512] [--targets 114]

Unpacked, `attention_kernel` 'xla' and 'cudnn' take each row's padding as sequence lengths and causality as a
flag, with T5's position bias alone as a [1, heads, q, k] bias; the same rows marked packed (segment ids of one
segment per row, positions from 0) take the mask folded into a [batch, heads, q, k] bias, whose gradient cuDNN
writes for every row. The arithmetic is the same and both start from the same state, so the losses match. Both
run in one process, one after the other, because step times vary by several percent from process to process on
a GPU; step times are train_throughput.py's (`timed_steps`: on an accelerator, rounds of steps dispatched back
to back). The peak device memory is read after each, so the second is the larger of the two. Prints a table;
asserts nothing about time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_throughput as bench  # noqa: E402


def marked_packed(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`batch` with segment ids (one segment per row) and positions (0, 1, ...) for each token field."""
    packed = dict(batch)
    for side in ("encoder", "decoder"):
        tokens = batch.get(f"{side}_input_tokens")
        if tokens is not None:
            packed[f"{side}_segment_ids"] = np.ones_like(tokens)
            packed[f"{side}_positions"] = np.broadcast_to(np.arange(tokens.shape[1], dtype=tokens.dtype), tokens.shape)
    return packed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(bench.TITLES), default="t5")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--device", choices=sorted(bench.JAX_PLATFORMS), default="cpu")
    parser.add_argument("--attention", choices=bench.ATTENTION_KERNELS, default="xla")
    bench.add_step_arguments(parser)
    args = parser.parse_args()
    bench.use_device(args.device)

    trainer = bench.make_trainer(args.model, dtype=args.dtype, attention_kernel=args.attention)
    unpacked = bench.random_batch(args.batch, args.inputs, args.targets, args.model)
    flops = bench.training_flops(args.model, args.batch, args.inputs, args.targets)
    print(f"{bench.TITLES[args.model]}, batch {args.batch}, {args.dtype} compute, attention {args.attention}, on "
          f"{jax.devices()[0].device_kind}: {flops / 1e9:.1f} GFLOP per training step\n")
    print(f"{'batch given':<14}{'first step s':>14}{'step s (median)':>17}{'TFLOP/s':>10}{'loss':>10}{'peak GiB':>10}")
    for name, batch in (("unpacked", unpacked), ("packed", marked_packed(unpacked))):
        state = trainer.init_state(jax.random.key(0))  # the same start for both (a step donates its state)
        first, times, metrics = bench.timed_steps(trainer, state, bench.partitioning.global_batch(batch, trainer.mesh),
                                                  args.steps)
        peak = (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")
        median = statistics.median(times)
        memory = f"{peak / 2**30:>10.2f}" if peak else f"{'-':>10}"
        print(f"{name:<14}{first:>14.1f}{median:>17.4f}{flops / median / 1e12:>10.3f}{float(metrics['loss']):>10.4f}"
              f"{memory}")


if __name__ == "__main__":
    main()
