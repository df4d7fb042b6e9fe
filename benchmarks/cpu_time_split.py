"""Where a CPU training step's processor time goes: matrix-multiplication kernels or the rest, ptmjax against
Hugging Face PyTorch, sampled by Linux `perf`.

    python benchmarks/cpu_time_split.py [--model t5|gpt2] [--steps 4] [--frequency 499]

Each framework runs `train_throughput.py`'s CPU step (float32, ptmjax with
'blockwise' attention) in a child process of its own, in the environments of
`train_throughput.child_runs`: PyTorch twice, with glibc's malloc defaults and
with the settings `import ptmjax` makes. After a
warm-up step the child records itself with `perf record` over `--steps`
steps, and times each step's wall and CPU seconds (all threads, user and
system). `perf report` then attributes the samples to symbols; those of the
libraries' matrix-multiplication kernels and their packing routines
(MATMUL_SYMBOLS: YNNPACK's `ynn::dot_*` and Eigen's `gebp`/`gemm_pack` under
XLA, MKL's `*sgemm*` under PyTorch) are the matmul share. Prints a table;
needs `perf` on the PATH and permission to record one's own process; asserts
nothing about time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import train_throughput  # noqa: E402

MATMUL_SYMBOLS = re.compile(r"sgemm|gemm_pack|gebp|ynn::dot_|xnn_f32_gemm|brgemm")


@contextlib.contextmanager
def perf_recording(path: str, frequency: int):
    """`perf record` of this process, at `frequency` samples a second, into `path` while the block runs."""
    perf = subprocess.Popen(["perf", "record", "-q", "-F", str(frequency), "-p", str(os.getpid()), "-o", path],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # perf attaches to every thread before the steps start
    try:
        yield
    finally:
        perf.send_signal(signal.SIGINT)
        perf.wait()


def matmul_share(path: str) -> float:
    """The fraction of `path`'s samples in MATMUL_SYMBOLS."""
    report = subprocess.run(["perf", "report", "-i", path, "--no-children", "--sort", "sym", "--stdio",
                             "--percent-limit", "0"], capture_output=True, text=True, check=True).stdout
    shares = [(float(m.group(1)), m.group(2)) for m in re.finditer(r"^\s*([\d.]+)%\s+\[.\]\s+(.*)$", report, re.M)]
    return sum(share for share, symbol in shares if MATMUL_SYMBOLS.search(symbol)) / 100


def run_child(framework: str, model: str, steps: int, frequency: int) -> dict:
    """The median wall and CPU seconds of `framework`'s step on train_throughput.py's batch, and its matmul share."""
    batch = train_throughput.random_batch(8, 512, 114, model)
    if framework == "pytorch":
        step = train_throughput.pytorch_step(batch, model)
    else:
        step = train_throughput.ptmjax_step(batch, model, attention_kernel="blockwise")
    step()  # compile and warm up
    walls, cpus = [], []
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "perf.data")
        with perf_recording(path, frequency):
            for _ in range(steps):
                wall, cpu = time.perf_counter(), time.process_time()
                step()
                walls.append(time.perf_counter() - wall)
                cpus.append(time.process_time() - cpu)
        if not os.path.exists(path):
            sys.exit("cpu_time_split.py: `perf record` could not record this process; allow it with "
                     "`sysctl kernel.perf_event_paranoid=1` (or run as root)")
        share = matmul_share(path)
    return {"wall": statistics.median(walls), "cpu": statistics.median(cpus), "matmul_share": share}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["t5", "gpt2"], default="t5")
    count = train_throughput.positive_int
    parser.add_argument("--steps", type=count, default=4)
    parser.add_argument("--frequency", type=count, default=499, help="perf's samples per second")
    parser.add_argument("--child", choices=["ptmjax", "pytorch"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_child(args.child, args.model, args.steps, args.frequency)))
        return
    if shutil.which("perf") is None:
        parser.error("needs Linux `perf` on the PATH (e.g. apt install linux-perf)")
    print(f"{args.model}, train_throughput.py's CPU step, float32, median of {args.steps} steps per framework; "
          f"{os.cpu_count()} CPU cores\n")
    print(f"{'framework':<26}{'step s':>8}{'CPU s':>8}{'cores busy':>12}{'matmul CPU s':>14}{'other CPU s':>13}")
    for name, (framework, env) in train_throughput.child_runs(on_cpu=True).items():
        out = subprocess.run([sys.executable, __file__, "--child", framework, "--model", args.model, "--steps",
                              str(args.steps), "--frequency", str(args.frequency)], env=env, stdout=subprocess.PIPE,
                             text=True)  # its errors go to this stderr
        if out.returncode:
            sys.exit(out.returncode)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        matmul = row["cpu"] * row["matmul_share"]
        print(f"{name:<26}{row['wall']:>8.2f}{row['cpu']:>8.2f}{row['cpu'] / row['wall']:>12.2f}{matmul:>14.2f}"
              f"{row['cpu'] - matmul:>13.2f}")


if __name__ == "__main__":
    main()
