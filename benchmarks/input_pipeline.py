"""Input pipeline throughput against the train step's consumption, per objective; start-up to the first step.

    python benchmarks/input_pipeline.py [--batches 40] [--steps 5] [--only T5,BERT] [--t5_base] [--save]
    python benchmarks/input_pipeline.py --startup [--startup_runs 1] [--cold_cache] [--startup_binding B] [--save]

Each row is one run configuration (a `gin_configs/runs/` demo, or the demo
with another objective's task): its training dataset built as `ptmjax train`
builds it (`prepared_run.run_dataset`: the seqio task, the family's feature
converter, packing, batching, shuffling with the run's seed), read as numpy
batches for `--batches` batches after the first (its time is shown apart),
against the same run's jitted train step on its first batch, timed for
`--steps` steps after the compile. Tokens count the model's input fields per
batch, as the loop's tokens/s does. ratio = pipeline batches/s over step
batches/s: above 1 the host keeps up.
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

`--save` keeps the results in benchmarks/results/ (input_pipeline.json, input_pipeline_startup.json) and
rewrites docs/benchmarks.md's tables from them. Prints Markdown tables; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import os
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
from train_throughput import PAGE, RESULTS  # noqa: E402

from ptmjax import partitioning  # noqa: E402
from ptmjax.gin_files import parse_gin  # noqa: E402
from ptmjax.tools import results_files  # noqa: E402
from ptmjax.training import prepared_run, run  # noqa: E402

SCRIPT = "benchmarks/input_pipeline.py"  # how docs/benchmarks.md's table markers name this script

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


def throughput_table(results: dict[str, dict]) -> str:
    """A Markdown table of pipeline against step rates, one row per run configuration."""
    lines = ["| run | task | batch x lengths | first batch s | pipeline tok/s | step tok/s | ratio |",
             "|---|---|---|---:|---:|---:|---:|"]
    for label, r in results.items():
        shape = f"{r['batch']} x " + "/".join(str(v) for v in r["lengths"].values())
        note = "" if r["step_rows"] == r["batch"] else f" (step at {r['step_rows']} rows)"
        lines.append(f"| {label} | `{r['task']}` | {shape} | {r['first_s']:.2f} | {r['tokens'] / r['pipeline_s']:,.0f} "
                     f"| {r['tokens'] / r['step_s']:,.0f}{note} | {r['step_s'] / r['pipeline_s']:.1f} |")
    return "\n".join(lines) + "\n"


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


def startup_runs(runs: int, cold_cache: bool, bindings: list[str]) -> list[dict]:
    """`runs` rounds of a fresh run, the same run resumed and a fresh run beside it: each one's seconds to its
    first step and its Start-up line."""
    env = dict(os.environ)
    if cold_cache:
        env["PTMJAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="ptmjax-jax-cache-")
    rows = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as folder:
            model_dir = os.path.join(folder, "demo")
            for label, where, steps in (("fresh (2 steps)", model_dir, 2), ("resumed (to step 4)", model_dir, 4),
                                        ("fresh again (2 steps)", os.path.join(folder, "again"), 2)):
                seconds, line = run_demo(where, steps, env, bindings)
                rows.append({"run": label, "s": seconds, "line": line})
    return rows


def startup_table(entries: dict[str, dict]) -> str:
    """A Markdown table of start-up seconds: for each compilation cache the runs started with it, every round's."""
    lines = ["| compilation cache | run | seconds to the first step |", "|---|---|---|"]
    for cache, entry in entries.items():
        seconds: dict[str, list[float]] = {}
        for row in entry["rows"]:
            seconds.setdefault(row["run"], []).append(row["s"])
        for label, values in seconds.items():
            lines.append(f"| {cache} | {label} | {', '.join(f'{v:.1f}' for v in values)} |")
    return "\n".join(lines) + "\n"


def tables() -> dict[str, str]:
    """docs/benchmarks.md's tables, from benchmarks/results/input_pipeline.json and input_pipeline_startup.json."""
    files = (("pipeline", "input_pipeline", throughput_table), ("startup", "input_pipeline_startup", startup_table))
    return {name: render(json.loads((RESULTS / f"{stem}.json").read_text()))
            for name, stem, render in files if (RESULTS / f"{stem}.json").exists()}


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
    parser.add_argument("--save", action="store_true", help="keep the results in benchmarks/results/ and rewrite "
                        "docs/benchmarks.md's tables from them (--startup: without --startup_binding)")
    parser.add_argument("--startup_binding", action="append", default=[],
                        help="--startup: a gin binding for the runs, e.g. 'train.prefetch_batches = 0' (repeatable)")
    args = parser.parse_args()

    if args.startup:
        rows = startup_runs(args.startup_runs, args.cold_cache, args.startup_binding)
        cache = "empty at the start" if args.cold_cache else "as found"
        flags = "".join(f" --gin_bindings='{binding}'" for binding in args.startup_binding)
        print(f"`ptmjax train` on runs/demo.gin{flags}; the compilation cache {cache}")
        print(startup_table({cache: {"rows": rows}}))
        for row in rows:
            print(f"{row['run']}: {row['line']}")
        if args.save and not args.startup_binding:
            save("input_pipeline_startup", {cache: {"measured": results_files.run_record(), "rows": rows}})
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
    print(throughput_table(results))
    if args.save:
        record = results_files.run_record()
        save("input_pipeline", {label: {"measured": record, **r} for label, r in results.items()})


def save(stem: str, entries: dict[str, dict]) -> None:
    """Keeps `entries` in benchmarks/results/STEM.json (beside the entries of other rows) and rewrites
    docs/benchmarks.md's tables."""
    for key, entry in entries.items():
        results_files.saved_entry(RESULTS / f"{stem}.json", key, entry)
    results_files.rewrite_tables(PAGE, SCRIPT, tables())
    print(f"kept in benchmarks/results/{stem}.json; docs/benchmarks.md's tables rewritten")


if __name__ == "__main__":
    main()
