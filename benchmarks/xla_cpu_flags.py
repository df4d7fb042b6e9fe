"""The training step of train_throughput.py (T5-small or GPT-2 small) under XLA:CPU flag sets, each in its
own process.

    python benchmarks/xla_cpu_flags.py [--model t5|gpt2] [--steps 5] [--rounds 1] [--batch 8] [--inputs 512]
        [--targets 114] [--sets 'defaults,oneDNN dot fusions']

XLA reads XLA_FLAGS once, when JAX starts, so every flag set runs in a fresh
process (this script with --child), and the rounds go through the sets in
turn so that a drift in the machine's load touches every set alike. The
table gives each set's median step time, tokens/s and speed against XLA's
defaults; the step's loss is printed too, since a flag that changes the
arithmetic (fast math) would change it. Asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

FLAG_SETS = {
    "defaults": "",
    "oneDNN matmuls": "--xla_cpu_use_onednn=true",
    "oneDNN dot fusions": "--xla_cpu_experimental_onednn_fusion_type=dot",
    "XNNPACK": "--xla_cpu_use_xnnpack=true",
    "XNNPACK dot fusions": "--xla_cpu_experimental_xnn_fusion_type=dot",
    "XNNPACK greedy graph fusion": "--xla_cpu_experimental_xnn_graph_fusion_mode=XNN_GRAPH_FUSION_MODE_GREEDY",
    "YNNPACK off": "--xla_cpu_experimental_ynn_fusion_type=",
    "YNNPACK elementwise fusions": "--xla_cpu_experimental_ynn_fusion_type=+eltwise",  # added to the defaults
    "sequential scheduler": "--xla_cpu_enable_concurrency_optimized_scheduler=false",  # ptmjax sets it true
    "512-bit vectors": "--xla_cpu_prefer_vector_width=512",
    "fast-runtime preset": "--xla_cpu_opt_preset=CPU_OPT_PRESET_FAST_RUNTIME",
    "tiling propagation": "--xla_cpu_experimental_enable_tiling_propagation=true",
}


def child(args: argparse.Namespace) -> None:
    """Times the ptmjax step under the XLA_FLAGS this process started with; prints one JSON line."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import train_throughput

    batch = train_throughput.random_batch(args.batch, args.inputs, args.targets, args.model)
    times, loss, _ = train_throughput.time_ptmjax(batch, args.steps, args.model)
    print(json.dumps({"times": times, "loss": loss}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["gpt2", "t5"], default="t5")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--inputs", type=int, default=512)
    parser.add_argument("--targets", type=int, default=114)
    parser.add_argument("--sets", default=",".join(FLAG_SETS),
                        help="comma-separated flag set names to run ('defaults' always runs)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    chosen = {"defaults", *(name.strip() for name in args.sets.split(",") if name.strip())}
    unknown = sorted(chosen - FLAG_SETS.keys())
    if unknown:
        parser.error(f"--sets: unknown flag set(s) {', '.join(map(repr, unknown))}; choose from {', '.join(FLAG_SETS)}")
    flag_sets = {name: flags for name, flags in FLAG_SETS.items() if name in chosen}

    sizes = ["--model", args.model, "--steps", str(args.steps), "--batch", str(args.batch),
             "--inputs", str(args.inputs), "--targets", str(args.targets)]
    times: dict[str, list[float]] = {name: [] for name in flag_sets}
    losses: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, flags in flag_sets.items():
            env = {**os.environ, "XLA_FLAGS": flags, "TF_CPP_MIN_LOG_LEVEL": "3"}
            out = subprocess.run([sys.executable, __file__, "--child", *sizes], env=env, capture_output=True,
                                 text=True, check=True)
            result = json.loads(out.stdout.strip().splitlines()[-1])
            times[name] += result["times"]
            losses[name] = result["loss"]

    tokens = args.batch * (args.inputs + (args.targets if args.model == "t5" else 0))
    base = statistics.median(times["defaults"])
    print(f"{args.model} training step, batch {args.batch}, inputs {args.inputs}, targets (T5) {args.targets}, "
          f"{os.cpu_count()} CPU cores; {args.rounds} round(s) of {args.steps} steps per flag set\n")
    print(f"{'XLA flags':<30}{'step s (median)':>16}{'tokens/s':>10}{'vs defaults':>13}{'loss after':>12}  XLA_FLAGS")
    for name, flags in flag_sets.items():
        median = statistics.median(times[name])
        print(f"{name:<30}{median:>16.3f}{tokens / median:>10.0f}{base / median:>12.2f}x{losses[name]:>12.5f}  {flags}")


if __name__ == "__main__":
    main()
