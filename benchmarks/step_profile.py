"""Where a training step's time goes on this CPU: the XLA operations of T5-small's or GPT-2 small's step
(train_throughput.py's, with its CPU default `--attention blockwise`), by kind and by pass.

    python benchmarks/step_profile.py [--model t5|gpt2] [--attention blockwise] [--steps 3] [--batch 8]
        [--inputs 512] [--targets 114]

The step is compiled and run once, then `--steps` steps run under
`jax.profiler` with XLA:CPU's per-operation trace events on
(`--xla_cpu_enable_xprof_traceme`, set here before JAX starts). Each event
is an operation of the compiled step (a fusion, a dot, a copy), named as in
its HLO, so the step's HLO classifies it:

- kind: 'matmul (library fusion)' (a dot XLA hands to YNNPACK/XNNPACK/oneDNN
  as a fusion), 'matmul (dot)' (a dot XLA runs itself), 'reduction fusion',
  'elementwise fusion', 'copy / transpose', or the operation's HLO opcode;
- pass: 'forward' (JAX's `jvp`), 'backward' (`transpose(jvp)`), or
  'update and rest' (the optimizer, the loss glue, the step's bookkeeping).

Times are the operations' durations per step, summed: an operation that
runs on both cores counts once, two operations that run at the same time
(XLA's concurrency-optimised scheduler) both count, so the sum can exceed
the step's wall time, which is printed beside it. Prints tables (by kind and
pass, and the 15 costliest operations); asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import sys
import tempfile
import time

os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_cpu_enable_xprof_traceme=true".strip()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import train_throughput  # noqa: E402
from jax.profiler import ProfileData  # noqa: E402

from ptmjax import partitioning  # noqa: E402
from ptmjax.layers.attention import ATTENTION_KERNELS  # noqa: E402

INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(\S+) = \S+(?: \S+)* (\w[\w-]*)\((.*)$")
COMPUTATION = re.compile(r"^(?:ENTRY )?%(\S+) ")


def hlo_operations(hlo: str) -> dict[str, tuple[str, str]]:
    """{instruction name: (kind, pass)} of every instruction of a compiled module's HLO text."""
    bodies: dict[str, list[str]] = collections.defaultdict(list)
    current = None
    for line in hlo.splitlines():
        if line and not line.startswith(" ") and line.rstrip().endswith("{"):
            match = COMPUTATION.match(line)
            current = match.group(1) if match else None
        elif current is not None:
            bodies[current].append(line)
    # A loop body's instructions may lack an op_name (XLA drops it on some fusions there): the loop's pass is theirs.
    loop_passes = {body: _pass(line) for lines in bodies.values() for line in lines
                   for body in re.findall(r"body=%([\w.\-]+)", line)}  # fmt: skip
    operations = {}
    for computation, lines in bodies.items():
        for line in lines:
            match = INSTRUCTION.match(line)
            if match:
                name, opcode, rest = match.groups()
                pass_ = _pass(rest) if 'op_name="' in rest else loop_passes.get(computation, _pass(rest))
                operations[name] = (_kind(opcode, rest, bodies), pass_)
    return operations


def _kind(opcode: str, rest: str, bodies: dict[str, list[str]]) -> str:
    if opcode == "dot":
        return "matmul (dot)"
    if opcode in ("copy", "transpose"):
        return "copy / transpose"
    if opcode != "fusion":
        return opcode
    called = re.search(r"calls=%(\S+?)[,}\s]", rest)
    body = " ".join(bodies.get(called.group(1), [])) if called else ""
    if " dot(" in body:
        return "matmul (library fusion)" if "kind=kCustom" in rest else "matmul (dot fusion)"
    if " reduce(" in body or " reduce-window(" in body:
        return "reduction fusion"
    if re.search(r" (transpose|copy)\(", body) and not re.search(r" (add|multiply|exponential|tanh|divide)\(", body):
        return "copy / transpose"
    return "elementwise fusion"


def _pass(rest: str) -> str:
    op_name = re.search(r'op_name="([^"]*)"', rest)
    name = op_name.group(1) if op_name else ""
    if "transpose(jvp" in name:
        return "backward"
    if "jvp(" in name:
        return "forward"
    return "update and rest"


def traced_events(directory: str) -> collections.Counter:
    """{event name: total ns} on XLA's threads in the newest trace under `directory`."""
    path = sorted(glob.glob(os.path.join(directory, "**", "*.xplane.pb"), recursive=True))[-1]
    totals: collections.Counter = collections.Counter()
    for plane in ProfileData.from_file(path).planes:
        for line in plane.lines:
            if line.name.startswith("tf_XLA"):
                for event in line.events:
                    totals[event.name] += event.duration_ns
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(train_throughput.TITLES), default="t5")
    parser.add_argument("--attention", choices=ATTENTION_KERNELS, default="blockwise", help="ptmjax's attention_kernel")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--inputs", type=int, default=512)
    parser.add_argument("--targets", type=int, default=114, help="T5 only")
    args = parser.parse_args()

    trainer = train_throughput.make_trainer(args.model, attention_kernel=args.attention)
    state = trainer.init_state(jax.random.key(0))
    batch = partitioning.global_batch(
        train_throughput.random_batch(args.batch, args.inputs, args.targets, args.model), trainer.mesh
    )  # fmt: skip
    rng = jax.random.key(1)
    operations = hlo_operations(trainer.lower_train_step(state, batch, rng).compile().as_text())
    state, metrics = trainer.train_step(state, batch, rng)
    jax.block_until_ready(metrics)
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir)
        start = time.perf_counter()
        for _ in range(args.steps):
            state, metrics = trainer.train_step(state, batch, rng)
            jax.block_until_ready(metrics)
        wall = (time.perf_counter() - start) / args.steps
        jax.profiler.stop_trace()
        events = traced_events(trace_dir)

    by_kind: collections.Counter = collections.Counter()
    by_name: collections.Counter = collections.Counter()
    for name, ns in events.items():
        if name in operations:
            by_kind[operations[name]] += ns / args.steps / 1e6
            by_name[name] += ns / args.steps / 1e6
    total = sum(by_kind.values())
    passes = ("forward", "backward", "update and rest")
    print(f"{train_throughput.TITLES[args.model]}, batch {args.batch}: wall {wall * 1e3:.0f} ms per step; XLA "
          f"operations {total:.0f} ms per step, summed, on {os.cpu_count()} cores\n")
    kinds = sorted({kind for kind, _ in by_kind}, key=lambda k: -sum(by_kind[(k, p)] for p in passes))
    print(f"{'kind (ms per step)':<28}" + "".join(f"{p:>17}" for p in passes) + f"{'total':>10}{'share':>8}")
    for kind in kinds:
        row = [by_kind[(kind, p)] for p in passes]
        print(f"{kind:<28}" + "".join(f"{v:>17.1f}" for v in row) + f"{sum(row):>10.1f}{sum(row) / total:>8.1%}")
    column = [sum(by_kind[(k, p)] for k in kinds) for p in passes]
    print(f"{'all':<28}" + "".join(f"{v:>17.1f}" for v in column) + f"{total:>10.1f}{1:>8.1%}\n")
    print(f"{'costliest operations':<40}{'kind':<26}{'pass':<17}{'ms per step':>16}")
    for name, ms in by_name.most_common(15):
        kind, pass_ = operations[name]
        print(f"{name[:39]:<40}{kind:<26}{pass_:<17}{ms:>16.1f}")


if __name__ == "__main__":
    main()
