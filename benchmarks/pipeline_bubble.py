"""Train-step time of a pipelined GPT-2 against the number of micro-batches, on 8 emulated CPU devices.

    python benchmarks/pipeline_bubble.py [--steps 3] [--batch 32] [--length 64] [--layers 8] [--d_model 128]

The same model and batch run without stages (data=8) and with 4 stages (stage=4, data=2) under GPipe and the
circular schedule (2 rounds) for several micro-batch counts M. Each row gives the bubble (S-1)/(M R+S-1),
the first step (compile included) and the median of the next steps, and the loss (the same on every row: the
pipeline changes no numbers). On emulated devices the 8 "devices" share the host's cores, and a stage
computes (and discards) a micro-batch in its bubble ticks as it does on real chips, so a step costs about
S (M R + S - 1) stage-ticks of work here: the bubble shows up as extra work rather than idle time. Writes
benchmarks/results/pipeline_bubble_cpu.json; prints a table; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import jax

jax.config.update("jax_num_cpu_devices", 8)

import numpy as np  # noqa: E402
import optax  # noqa: E402

from ptmjax import partitioning  # noqa: E402
from ptmjax.families.token_loss import LossConfig  # noqa: E402
from ptmjax.layers.pipeline import bubble_fraction  # noqa: E402
from ptmjax.models import GPT2, GPT2Config  # noqa: E402
from ptmjax.partitioning import MeshConfig, pipeline_rules  # noqa: E402
from ptmjax.training.trainer import Trainer  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "pipeline_bubble_cpu.json")
STAGES = 4


def rows() -> list[tuple[str, int, int]]:
    """(schedule, micro-batches, rounds); 'none' runs without stages."""
    return [("none", 1, 1), *[("gpipe", m, 1) for m in (1, 2, 4, 8, 16)], *[("circular", m, 2) for m in (4, 8, 16)]]


def timed_run(args, schedule: str, microbatches: int, repeats: int) -> dict:
    sizes = {"data": 8} if schedule == "none" else {"stage": STAGES, "data": 2}
    axes = {"stage": 1, "data": 1, "fsdp": 1, "tensor": 1, "expert": 1, **sizes}
    mesh_config = MeshConfig(axes=tuple(axes.items()), rules=pipeline_rules())
    staged = {} if schedule == "none" else {"pipeline_microbatches": microbatches, "pipeline_schedule": schedule,
                                            "pipeline_repeats": repeats}
    config = GPT2Config(vocab_size=512, d_model=args.d_model, num_heads=4, num_layers=args.layers,
                        d_ff=4 * args.d_model, max_length=args.length, dropout_rate=0.0, attention_dropout_rate=0.0,
                        scan_layers=True, **staged)
    mesh = partitioning.make_mesh(mesh_config)
    trainer = Trainer(GPT2(config), optax.adamw(1e-3), lambda _: 1e-3, mesh, mesh_config.rules, LossConfig())
    tokens = np.random.default_rng(0).integers(2, 512, (args.batch, args.length)).astype(np.int32)
    batch = partitioning.global_batch({"decoder_input_tokens": np.roll(tokens, 1, 1), "decoder_target_tokens": tokens,
                                       "decoder_loss_weights": np.ones_like(tokens)}, mesh)
    state = trainer.init_state(jax.random.key(0))
    times = []
    for _ in range(args.steps + 1):
        start = time.perf_counter()
        state, metrics = trainer.train_step(state, batch, jax.random.key(1))
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    bubble = 0.0 if schedule == "none" else bubble_fraction(STAGES, microbatches, repeats)
    return {"schedule": schedule, "microbatches": microbatches, "repeats": repeats, "bubble": bubble,
            "first_step_s": times[0], "step_s": statistics.median(times[1:]), "loss": float(metrics["loss"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--d_model", type=int, default=128)
    args = parser.parse_args()
    print(f"GPT-2 {args.layers} layers, d_model {args.d_model}, batch {args.batch} x {args.length}, "
          f"{STAGES} stages x data 2 (none: data 8), 8 emulated CPU devices\n")
    print(f"{'schedule':<10}{'M':>4}{'R':>3}{'bubble':>9}{'first step s':>14}{'step s (median)':>17}{'loss':>9}")
    results = []
    for schedule, microbatches, repeats in rows():
        row = timed_run(args, schedule, microbatches, repeats)
        results.append(row)
        print(f"{schedule:<10}{microbatches:>4}{repeats:>3}{row['bubble']:>9.1%}{row['first_step_s']:>14.1f}"
              f"{row['step_s']:>17.3f}{row['loss']:>9.4f}", flush=True)
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump({"settings": vars(args), "stages": STAGES, "rows": results}, f, indent=1)


if __name__ == "__main__":
    main()
