"""Where a training step's time goes: the XLA operations of T5's or GPT-2's step (train_throughput.py's), on
this CPU or on a GPU, by kind and by pass.

    python benchmarks/step_profile.py [--model t5|t5-base|t5-large|gpt2|gpt2-1b] [--device cpu|gpu]
        [--dtype float32|bfloat16] [--attention blockwise] [--steps 3] [--batch 8] [--inputs 512] [--targets 114]

The step is compiled and run once, then `--steps` steps run under
`jax.profiler` (on a GPU dispatched back to back, as the training loop runs
them). On the CPU each event is an operation of the compiled step (a fusion, a
dot, a copy), named as in its HLO, traced with XLA:CPU's per-operation events
(`--xla_cpu_enable_xprof_traceme`, set here before JAX starts); on a GPU each
event is a kernel, which XLA names after its fusion ('loop_add_fusion_3' for
'loop_add_fusion.3'), and library kernels (cuBLAS, cuDNN) by their own names.
The step's HLO classifies each:

- kind: 'matmul (library fusion)' (a dot XLA hands to a library or, on a GPU,
  to its Triton matmul emitter as a fusion), 'matmul (dot)' (a dot XLA runs
  itself), 'reduction fusion', 'elementwise fusion', 'copy / transpose', or
  the operation's HLO opcode; a library's kernel is 'matmul (cuBLAS)',
  'attention (cuDNN)' or 'other library kernel';
- pass: 'forward' (JAX's `jvp`), 'backward' (`transpose(jvp)`), or 'update
  and rest' (the optimizer, the loss glue, the step's bookkeeping); a
  library's kernels cannot be told apart by pass ('library').

Times are the operations' durations per step, summed: an operation that
runs on both cores counts once, two operations that run at the same time
(XLA's concurrency-optimised scheduler, a GPU's streams) both count, so the
sum can exceed the step's wall time, which is printed beside it (on a GPU
with the time any kernel ran). Prints tables (by kind and pass, and the 15
costliest operations); asserts nothing.
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
                   for body in re.findall(r"body=%([\w.\-]+)", line)}
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


LIBRARY_KERNELS = (("matmul (cuBLAS)", re.compile(r"nvjet|gemm|xmma|cutlass", re.I)),
                   ("attention (cuDNN)", re.compile(r"cudnn|fmha|sdpa|flash", re.I)))
LIBRARY = "library"  # the pass of a library's kernels


def traced_events(directory: str, device: str = "cpu") -> tuple[collections.Counter, int]:
    """{event name: total ns} of XLA's operations (CPU threads) or kernels (GPU streams) in the newest trace under
    `directory`, and the ns during which any of them ran."""
    path = sorted(glob.glob(os.path.join(directory, "**", "*.xplane.pb"), recursive=True))[-1]
    totals: collections.Counter = collections.Counter()
    spans = []
    for plane in ProfileData.from_file(path).planes:
        on_gpu = plane.name.startswith("/device:GPU")
        for line in plane.lines:
            if (device == "gpu" and on_gpu) or (device == "cpu" and line.name.startswith("tf_XLA")):
                for event in line.events:
                    totals[event.name] += event.duration_ns
                    spans.append((event.start_ns, event.start_ns + event.duration_ns))
    return totals, covered_ns(spans)


def covered_ns(spans: list[tuple[int, int]]) -> int:
    """The ns that at least one of the (start, stop) spans covers."""
    covered, end = 0, 0
    for start, stop in sorted(spans):
        covered += max(0, stop - max(start, end))
        end = max(end, stop)
    return covered


def attributed(events: collections.Counter, operations: dict[str, tuple[str, str]], device: str) -> dict:
    """{(event name, kind, pass): total ns}: CPU events that are the step's operations, or every GPU kernel, a
    fusion's by its name and a library's by `LIBRARY_KERNELS`."""
    if device == "cpu":
        return {(name, *operations[name]): ns for name, ns in events.items() if name in operations}
    kernels = {name.replace(".", "_"): kind_and_pass for name, kind_and_pass in operations.items()}
    library = lambda name: next((kind for kind, pattern in LIBRARY_KERNELS if pattern.search(name)),  # noqa: E731
                                "other library kernel")
    return {(name, *kernels.get(name, (library(name), LIBRARY))): ns for name, ns in events.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(train_throughput.TITLES), default="t5")
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--attention", choices=ATTENTION_KERNELS, help="ptmjax's attention_kernel (default: "
                        "'blockwise' on the CPU, 'einsum' elsewhere)")
    train_throughput.add_step_arguments(parser, steps=3)
    args = parser.parse_args()
    args.attention = args.attention or ("blockwise" if args.device == "cpu" else "einsum")
    train_throughput.use_device(args.device)

    trainer = train_throughput.make_trainer(args.model, attention_kernel=args.attention, dtype=args.dtype)
    state = trainer.init_state(jax.random.key(0))
    batch = partitioning.global_batch(
        train_throughput.random_batch(args.batch, args.inputs, args.targets, args.model), trainer.mesh
    )
    operations = hlo_operations(trainer.lower_train_step(state, batch, jax.random.key(1)).compile().as_text())
    step = train_throughput.trainer_step(trainer, state, batch)
    step()
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir, profiler_options=options)
        start = time.perf_counter()
        for i in range(args.steps):
            step(wait=args.device == "cpu" or i == args.steps - 1)
        wall = (time.perf_counter() - start) / args.steps
        jax.profiler.stop_trace()
        events, busy_ns = traced_events(trace_dir, args.device)

    by_kind: collections.Counter = collections.Counter()
    by_name: collections.Counter = collections.Counter()
    for (name, kind, pass_), ns in attributed(events, operations, args.device).items():
        by_kind[(kind, pass_)] += ns / args.steps / 1e6
        by_name[(name, kind, pass_)] += ns / args.steps / 1e6
    total = sum(by_kind.values())
    passes = ("forward", "backward", "update and rest") + ((LIBRARY,) if args.device == "gpu" else ())
    where = f"on {os.cpu_count()} cores" if args.device == "cpu" else (
        f"on {jax.devices()[0].device_kind}, which ran kernels {busy_ns / args.steps / 1e6:.1f} ms per step")
    print(f"{train_throughput.TITLES[args.model]}, batch {args.batch}, {args.dtype}, attention {args.attention}: wall "
          f"{wall * 1e3:.1f} ms per step; XLA operations {total:.1f} ms per step, summed, {where}\n")
    kinds = sorted({kind for kind, _ in by_kind}, key=lambda k: -sum(by_kind[(k, p)] for p in passes))
    print(f"{'kind (ms per step)':<28}" + "".join(f"{p:>17}" for p in passes) + f"{'total':>10}{'share':>8}")
    for kind in kinds:
        row = [by_kind[(kind, p)] for p in passes]
        print(f"{kind:<28}" + "".join(f"{v:>17.1f}" for v in row) + f"{sum(row):>10.1f}{sum(row) / total:>8.1%}")
    column = [sum(by_kind[(k, p)] for k in kinds) for p in passes]
    print(f"{'all':<28}" + "".join(f"{v:>17.1f}" for v in column) + f"{total:>10.1f}{1:>8.1%}\n")
    print(f"{'costliest operations':<40}{'kind':<26}{'pass':<17}{'ms per step':>16}")
    for (name, kind, pass_), ms in by_name.most_common(15):
        print(f"{name[:39]:<40}{kind:<26}{pass_:<17}{ms:>16.2f}")


if __name__ == "__main__":
    main()
