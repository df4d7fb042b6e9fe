"""Input pipeline throughput against the train step's consumption, per objective; start-up to the first step.

    python benchmarks/input_pipeline.py [--batches 40] [--steps 5] [--only T5,BERT] [--t5_base]
    python benchmarks/input_pipeline.py --startup [--startup_runs 1] [--cold_cache] [--startup_binding B]

Each row is one run configuration (a `gin_configs/runs/` demo, or the demo
with another objective's task): its training dataset built as `ptmjax train`
builds it (`prepared_run.run_dataset`: the seqio task, the family's feature
converter, packing, batching, shuffling with the run's seed), read as numpy
batches for `--batches` batches after the first (its time is shown apart),
against the same run's jitted train step on its first batch, timed for
`--steps` steps after the compile. Tokens count the model's input fields per
batch, as the loop's tokens/s does. ratio = pipeline batches/s over step
batches/s: above 1 the host keeps up; issue 14's target is 3 on the demo.
`--t5_base` adds T5 v1.1 base with the pre-training run's shapes (inputs 512,
targets 114, batch 128): its pipeline at batch 128, its step at
`--t5_base_step_batch` rows (tokens/s scaled from those rows; a CPU step at
128 rows takes minutes).

`--startup` runs `ptmjax train` on the demo (runs/demo.gin) in subprocesses,
into a fresh model folder: for 2 steps (a fresh run, with the JAX compilation
cache cold or warm as found), again for 4 (a resumed run), and a fresh run in
another folder (the cache now warm), and reports the seconds from the process
start to the loop's 'Start-up' line (printed when the first step is done) with
its breakdown.
`--cold_cache` points the runs at an empty compilation cache first;
`--startup_binding` adds gin bindings to them.

Prints tables; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gin  # noqa: E402
import jax  # noqa: E402
import train_throughput  # noqa: E402

from ptmjax import partitioning  # noqa: E402
from ptmjax.gin_files import parse_gin  # noqa: E402
from ptmjax.training import prepared_run, run  # noqa: E402

DEMO = ["runs/demo.gin"]


def task(name: str, **lengths: int) -> list[str]:
    bindings = [f"train.mixture_or_task_name = '{name}'"]
    if lengths:
        bindings.append(f"train.task_feature_lengths = {lengths!r}")
    return bindings


# label: (gin files, bindings); the demos' shapes (batch 32) with each registered pre-training objective.
CONFIGS: dict[str, tuple[list[str], list[str]]] = {
    "T5 span corruption (demo)": (DEMO, []),
    "T5 prefix LM": (DEMO, task("ptmjax_stdlib_prefix_lm")),
    "T5 UL2": (DEMO, task("ptmjax_stdlib_ul2")),
    "T5 PEGASUS": (DEMO, task("ptmjax_stdlib_pegasus")),
    "T5 MASS": (DEMO, task("ptmjax_stdlib_mass", inputs=128, targets=72)),
    "T5 BERT-style": (DEMO, task("ptmjax_stdlib_bert_style", inputs=128, targets=128)),
    "T5 objective mixture": (["runs/objective_mixture.gin"], []),
    "BART denoising": (["runs/bart_demo.gin"], []),
    "BERT MLM + NSP": (["runs/bert_demo.gin"], []),
    "ALBERT MLM + SOP": (["runs/albert_demo.gin"], []),
    "ELECTRA (MLM)": (["runs/electra_demo.gin"], []),
    "GPT-2 causal LM": (["runs/gpt2_demo.gin"], []),
    "XLNet permuted LM": (["runs/xlnet_demo.gin"], []),
}
T5_BASE = ("T5 v1.1 base (pre-training)", (["models/t5_1_1_base.gin", "runs/pretrain.gin", "mesh/dp.gin"], []))


def measure(gin_files: list[str], bindings: list[str], batches: int, steps: int, step_batch: int | None) -> dict:
    """Pipeline and step rates of one run configuration."""
    gin.clear_config()
    parse_gin(gin_files, bindings)
    spec = run.run_spec_from_gin()
    bound = gin.get_bindings("train")
    name = bound.get("mixture_or_task_name", "ptmjax_pretrain")
    name = getattr(name, "name", name)
    seed, pack = bound.get("seed", 0), bound.get("pack", True)
    mesh = partitioning.make_mesh(spec.mesh_config)
    trainer = spec.trainer(mesh)
    fields = trainer.api.family.init_fields

    start = time.perf_counter()
    dataset = prepared_run.run_dataset(name, "train", spec.task_feature_lengths, spec.batch_size,
                               trainer.api.family.feature_converter, seed=seed, pack=pack, shuffle=True)
    iterator = dataset.as_numpy_iterator()
    first = next(iterator)
    first_s = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    pipeline_s = (time.perf_counter() - start) / batches
    tokens = sum(first[field].size for field in fields)

    rows = step_batch or spec.batch_size
    state = trainer.init_state(jax.random.key(0))
    batch = partitioning.global_batch({k: v[:rows] for k, v in first.items()}, mesh)
    compile_s, times, _ = train_throughput.timed_steps(trainer, state, batch, steps)
    step_s = statistics.median(times) * spec.batch_size / rows  # per full batch
    return {
        "task": name, "batch": spec.batch_size, "lengths": spec.task_feature_lengths, "tokens": tokens,
        "first_s": first_s, "pipeline_s": pipeline_s, "compile_s": compile_s, "step_s": step_s, "step_rows": rows,
    }


def print_throughput(results: dict[str, dict]) -> None:
    print(f"\n{'run':<28}{'task':<34}{'batch x lengths':<24}{'first s':>8}{'pipe ex/s':>10}{'pipe tok/s':>11}"
          f"{'step tok/s':>11}{'ratio':>9}")
    for label, r in results.items():
        shape = f"{r['batch']} x " + "/".join(str(v) for v in r["lengths"].values())
        note = "" if r["step_rows"] == r["batch"] else f" (step at {r['step_rows']} rows)"
        print(f"{label:<28}{r['task']:<34}{shape:<24}{r['first_s']:>8.2f}{r['batch'] / r['pipeline_s']:>10.0f}"
              f"{r['tokens'] / r['pipeline_s']:>11.0f}{r['tokens'] / r['step_s']:>11.0f}"
              f"{r['step_s'] / r['pipeline_s']:>9.1f}{note}")


STARTUP_LINE = re.compile(r"^Start-up: (?P<total>[\d.]+) s .*$", re.M)


def run_demo(model_dir: str, num_steps: int, env: dict[str, str], bindings: list[str]) -> tuple[float, str]:
    """Seconds from spawning `ptmjax train` to its 'Start-up' line, and that line."""
    command = [sys.executable, "-m", "ptmjax.train", f"--model_dir={model_dir}",
               f"--gin_bindings=train.num_steps = {num_steps}",
               "--gin_bindings=train.show_progress = False", *(f"--gin_bindings={b}" for b in bindings)]
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**env, "PYTHONUNBUFFERED": "1"})
    seen, line_at, output = None, None, []
    for line in process.stdout:
        output.append(line)
        if seen is None and line.startswith("Start-up:"):
            seen, line_at = line.strip(), time.perf_counter() - start
    if process.wait() != 0 or seen is None:
        raise RuntimeError(f"`{' '.join(command)}` failed or printed no Start-up line:\n{''.join(output[-30:])}")
    return line_at, seen


def print_startup(runs: int, cold_cache: bool, bindings: list[str]) -> None:
    env = dict(os.environ)
    if cold_cache:
        env["PTMJAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="ptmjax-jax-cache-")
    rows = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as folder:
            model_dir = os.path.join(folder, "demo")
            rows.append(("fresh (2 steps)", *run_demo(model_dir, 2, env, bindings)))
            rows.append(("resumed (to step 4)", *run_demo(model_dir, 4, env, bindings)))
            rows.append(("fresh again (2 steps)", *run_demo(os.path.join(folder, "again"), 2, env, bindings)))
    cache = env.get("PTMJAX_COMPILATION_CACHE_DIR", "the default compilation cache")
    flags = "".join(f" --gin_bindings='{binding}'" for binding in bindings)
    print(f"\n`ptmjax train` on runs/demo.gin{flags}; compilation cache: {cache}")
    print(f"{'run':<22}{'s to first step':>16}  the loop's breakdown")
    for label, seconds, line in rows:
        print(f"{label:<22}{seconds:>16.1f}  {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=40, help="pipeline batches timed after the first")
    parser.add_argument("--steps", type=int, default=5, help="train steps timed after the compile")
    parser.add_argument("--only", default=None, help="comma-separated label prefixes of the rows to run")
    parser.add_argument("--t5_base", action="store_true", help="add T5 v1.1 base at the pre-training shapes")
    parser.add_argument("--t5_base_step_batch", type=int, default=2, help="rows of T5-base's timed step")
    parser.add_argument("--startup", action="store_true", help="time `ptmjax train` on the demo to its first step")
    parser.add_argument("--startup_runs", type=int, default=1)
    parser.add_argument("--cold_cache", action="store_true", help="--startup with an empty compilation cache")
    parser.add_argument("--startup_binding", action="append", default=[],
                        help="--startup: a gin binding for the runs, e.g. 'train.prefetch_batches = 0' (repeatable)")
    args = parser.parse_args()

    if args.startup:
        print_startup(args.startup_runs, args.cold_cache, args.startup_binding)
        return
    configs = dict(CONFIGS)
    if args.t5_base:
        configs[T5_BASE[0]] = T5_BASE[1]
    if args.only:
        prefixes = [p.strip() for p in args.only.split(",")]
        configs = {k: v for k, v in configs.items() if any(k.startswith(p) for p in prefixes)}
    print(f"{os.cpu_count()} CPU cores, {jax.device_count()} {jax.default_backend()} device(s); "
          f"pipeline over {args.batches} batches, step over {args.steps} steps (medians)")
    results = {}
    for label, (files, bindings) in configs.items():
        step_batch = args.t5_base_step_batch if label == T5_BASE[0] else None
        results[label] = measure(files, bindings, args.batches, args.steps, step_batch)
        print(f"  {label}: done", flush=True)
    print_throughput(results)


if __name__ == "__main__":
    main()
