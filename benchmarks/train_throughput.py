"""Training throughput and MFU of T5 or GPT-2 shapes, against Hugging Face PyTorch, on CPU, GPU or TPU.

    python benchmarks/train_throughput.py [--model t5|t5-base|t5-large|gpt2|gpt2-1b] [--dtype float32|bfloat16]
        [--device cpu|gpu|tpu] [--attention einsum|xla|cudnn|pallas_tpu_flash|blockwise]
        [--remat none|full|save_dot_products]
        [--scan]
        [--steps 5] [--batch 8] [--inputs 512] [--targets 114]

Both frameworks train the same configuration with dropout off and AdamW, on
the same random token batch, on one `--device` (this machine's CPU by
default), in one run: T5 v1.0 small (60M parameters), base (223M) or large
(738M) on `--inputs` and `--targets` tokens, or GPT-2 small (124M) or a
GPT-2 of GPT-3 XL's shapes (1.3B) on `--inputs` tokens, each predicting the
next (the last position has no target, as in transformers' shifted labels).
`--dtype bfloat16` computes in bfloat16 with float32 parameters: ptmjax's
config `dtype`, PyTorch's `torch.autocast`. `--attention`, `--remat` and `--scan` are ptmjax's
`attention_kernel` (by default 'blockwise' on the CPU, where it is the fastest, and 'einsum' elsewhere),
`remat_policy` and `scan_layers` (PyTorch keeps transformers' defaults: its fused attention). Model FLOP
utilisation divides the model's FLOPs per second by the device's matmul peak
measured in the same run, in the compute dtype: on the CPU the best 2048x2048
matmul of JAX, NumPy (float32) or PyTorch; on an accelerator the best 8192x8192
matmul of JAX or PyTorch (bfloat16 on a CPU with AMX: PyTorch's AMX kernels,
about 7x its float32 peak). On an accelerator the table also gives each
framework's peak device memory. PyTorch runs on CPU and GPU only.

On the CPU each of `--steps` steps is timed alone (JAX's CPU dispatch is
synchronous); on an accelerator, three rounds of `--steps` steps are
dispatched back to back and waited for once, as a training loop does, so that
the host's dispatch overlaps the device's work (PyTorch's too), and each
round's mean is a step's time.

Each framework runs in a child process of its own (`child_runs`). `import
ptmjax` sets glibc's malloc to keep freed memory (`ptmjax/host_malloc.py`),
which speeds PyTorch up too, so on the CPU PyTorch runs twice: with glibc's
defaults, as a PyTorch user runs it, and with ptmjax's settings.
Prints a table; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from ptmjax import partitioning  # noqa: E402
from ptmjax.families.token_loss import LossConfig  # noqa: E402
from ptmjax.layers.attention import ATTENTION_KERNELS  # noqa: E402
from ptmjax.layers.layer_stack import REMAT_POLICIES  # noqa: E402
from ptmjax.models import GPT2, EncoderDecoder, GPT2Config, T5Config  # noqa: E402
from ptmjax.models.flops import gpt2_training_flops, t5_training_flops  # noqa: E402
from ptmjax.tools import results_files  # noqa: E402
from ptmjax.training.optimizers import adamw  # noqa: E402
from ptmjax.training.trainer import Trainer  # noqa: E402

T5_SMALL = T5Config(
    vocab_size=32128, d_model=512, num_heads=8, head_dim=64, d_ff=2048, num_encoder_layers=6,
    num_decoder_layers=6, ffn_activations=("relu",), tie_embeddings=True, dropout_rate=0.0,
)
GPT2_SMALL = GPT2Config(
    vocab_size=50257, d_model=768, num_heads=12, num_layers=12, d_ff=3072, max_length=1024, dropout_rate=0.0,
    attention_dropout_rate=0.0,
)
T5_BASE = dataclasses.replace(T5_SMALL, d_model=768, num_heads=12, d_ff=3072, num_encoder_layers=12,
                              num_decoder_layers=12)
T5_LARGE = dataclasses.replace(T5_SMALL, d_model=1024, num_heads=16, d_ff=4096, num_encoder_layers=24,
                               num_decoder_layers=24)
GPT2_1B = dataclasses.replace(GPT2_SMALL, d_model=2048, num_heads=16, num_layers=24, d_ff=8192, max_length=2048)
CONFIGS = {"t5": T5_SMALL, "t5-base": T5_BASE, "t5-large": T5_LARGE, "gpt2": GPT2_SMALL, "gpt2-1b": GPT2_1B}
TITLES = {"t5": "T5 v1.0 small", "t5-base": "T5 v1.0 base", "t5-large": "T5 v1.0 large", "gpt2": "GPT-2 small",
          "gpt2-1b": "GPT-2 1.3B (GPT-3 XL shapes)"}
JAX_PLATFORMS = {"cpu": "cpu", "gpu": "cuda", "tpu": "tpu"}  # --device -> JAX's platform
TORCH_DEVICES = {"cpu": "cpu", "gpu": "cuda"}  # --device -> PyTorch's device (none for TPU)
LEARNING_RATE = 1e-4
ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"  # the results files of the benchmarks whose tables docs/benchmarks.md states
PAGE = ROOT / "docs" / "benchmarks.md"
SCRIPT = "benchmarks/train_throughput.py"  # how the page's table markers name this script
ROUNDS = 3  # an accelerator's steps are timed in rounds of `--steps` steps dispatched back to back


def use_device(device: str) -> None:
    """Make JAX compute on `device` (before its first computation)."""
    jax.config.update("jax_platforms", JAX_PLATFORMS[device])


def is_decoder_only(model: str) -> bool:
    return isinstance(CONFIGS[model], GPT2Config)


def torch_synchronize(device: str) -> None:
    """Wait for PyTorch's queued work on `device` (a no-op on the CPU)."""
    if device == "gpu":
        import torch

        torch.cuda.synchronize()


def matmul_peak_flops(device: str = "cpu", dtype: str = "float32", repeats: int = 10) -> dict[str, float]:
    """The best `dtype` matmul FLOP/s each library reaches on `device`: 2048x2048 on the CPU (NumPy's too in
    float32), 8192x8192 on an accelerator. Below float32, JAX's also with float32 accumulation and output, as
    ptmjax's layers compute (XLA:CPU reaches AMX only that way)."""
    size = 2048 if device == "cpu" else 8192
    a = np.random.default_rng(0).standard_normal((size, size), dtype=np.float32)
    jax_a = jnp.asarray(a, dtype)
    jax_matmuls = {"jax": jax.jit(lambda x: x @ x)}
    if dtype != "float32":
        jax_matmuls["jax, f32 accumulation"] = jax.jit(lambda x: jnp.dot(x, x, preferred_element_type=jnp.float32))
    candidates = {name: lambda f=f: f(jax_a).block_until_ready() for name, f in jax_matmuls.items()}
    if device == "cpu" and dtype == "float32":
        candidates["numpy"] = lambda: a @ a
    try:
        import torch

        if device in TORCH_DEVICES:
            torch_a = torch.from_numpy(a).to(TORCH_DEVICES[device], getattr(torch, dtype))
            candidates["torch"] = lambda: (torch_a @ torch_a, torch_synchronize(device))
    except ImportError:
        pass
    peaks = {}
    for name, matmul in candidates.items():
        matmul()
        peaks[name] = 2 * size**3 / min(_timed(matmul) for _ in range(repeats))
    return peaks


def random_batch(batch: int, inputs: int, targets: int, model: str = "t5") -> dict[str, np.ndarray]:
    """The ptmjax batch of `model`: T5's inputs and targets, or GPT-2's tokens and their next tokens."""
    rng = np.random.default_rng(0)
    tokens = lambda length: rng.integers(2, CONFIGS[model].vocab_size, (batch, length)).astype(np.int32)  # noqa: E731
    if is_decoder_only(model):
        decoder_inputs = tokens(inputs)
        weights = np.ones_like(decoder_inputs)
        weights[:, -1] = 0  # the last position has no next token
        return {"decoder_input_tokens": decoder_inputs, "decoder_target_tokens": np.roll(decoder_inputs, -1, axis=1),
                "decoder_loss_weights": weights}
    target_tokens = tokens(targets)
    decoder_inputs = np.concatenate([np.zeros((batch, 1), np.int32), target_tokens[:, :-1]], axis=1)
    return {
        "encoder_input_tokens": tokens(inputs), "decoder_input_tokens": decoder_inputs,
        "decoder_target_tokens": target_tokens, "decoder_loss_weights": np.ones_like(target_tokens),
    }


def training_flops(model: str, batch: int, inputs: int, targets: int) -> float:
    if is_decoder_only(model):
        return gpt2_training_flops(CONFIGS[model], batch, inputs)
    return t5_training_flops(CONFIGS[model], batch, inputs, targets)


def make_trainer(model: str = "t5", **options: Any) -> Trainer:
    """The ptmjax trainer of `model` with its config's fields set as `options` say (e.g. dtype='bfloat16') on this
    host's devices: AdamW at a constant learning rate, no z-loss."""
    mesh_config = partitioning.MeshConfig()
    schedule = lambda step: LEARNING_RATE  # noqa: E731
    config = dataclasses.replace(CONFIGS[model], **options)
    module = GPT2(config) if is_decoder_only(model) else EncoderDecoder(config)
    return Trainer(
        module, adamw(schedule, weight_decay=0.0, max_grad_norm=None), schedule, partitioning.make_mesh(mesh_config),
        mesh_config.rules, LossConfig(z_loss=0.0),
    )


def time_ptmjax(
    batch: dict[str, np.ndarray], steps: int, model: str = "t5", **options: Any
) -> tuple[list[float], float, int | None]:
    """Seconds per step (`step_seconds`), the loss of the last step, and the device's peak bytes in use (None on
    the CPU), of `make_trainer(model, **options)`."""
    trainer = make_trainer(model, **options)
    state = trainer.init_state(jax.random.key(0))
    first, times, metrics = timed_steps(trainer, state, partitioning.global_batch(batch, trainer.mesh), steps)
    print(f"ptmjax: first step (compiling) {first:.1f} s", file=sys.stderr)
    stats = jax.devices()[0].memory_stats() or {}
    return times, float(metrics["loss"]), stats.get("peak_bytes_in_use")


def timed_steps(trainer: Trainer, state: Any, batch: dict[str, Any], steps: int) -> tuple[float, list[float], Any]:
    """The seconds of a first (compiling) step on `batch`, seconds per step after it (`step_seconds`), and the last
    step's metrics."""
    step = trainer_step(trainer, state, batch)
    first = _timed(step)
    times, metrics = step_seconds(step, steps, back_to_back=jax.default_backend() != "cpu")
    return first, times, metrics


def trainer_step(trainer: Trainer, state: Any, batch: dict[str, Any]):
    """A function that runs one step of `trainer` on the device batch `batch`, from `state` on, and returns its
    metrics, waiting for them unless called with wait=False."""
    rng = jax.random.key(1)

    def step(wait: bool = True):
        nonlocal state
        state, metrics = trainer.train_step(state, batch, rng)
        return jax.block_until_ready(metrics) if wait else metrics

    return step


def ptmjax_step(batch: dict[str, np.ndarray], model: str = "t5", **options: Any):
    """`trainer_step` of `make_trainer(model, **options)` on `batch`, from a fresh state."""
    trainer = make_trainer(model, **options)
    return trainer_step(trainer, trainer.init_state(jax.random.key(0)), partitioning.global_batch(batch, trainer.mesh))


def step_seconds(step, steps: int, back_to_back: bool) -> tuple[list[float], Any]:
    """Seconds per step of `step(wait)`, and the last step's result: each of `steps` steps timed alone, or (on an
    accelerator) ROUNDS rounds of `steps` steps dispatched back to back, waiting for the last only, as a training
    loop does (ptmjax's waits when it logs), each round's seconds divided by `steps`. Timed alone, an accelerator's
    step also counts the host's dispatch, which back to back overlaps the steps before it."""
    rounds, per_round = (ROUNDS, steps) if back_to_back else (steps, 1)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for i in range(per_round):
            result = step(wait=i == per_round - 1)
        times.append((time.perf_counter() - start) / per_round)
    return times, result


def hf_model(model: str) -> Any:
    """The transformers model of the same configuration, in train mode."""
    import transformers

    c = CONFIGS[model]
    if is_decoder_only(model):
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=c.vocab_size, n_embd=c.d_model, n_layer=c.num_layers, n_head=c.num_heads, n_inner=c.d_ff,
            n_positions=c.max_length, activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0,
        )).train()
    return transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=c.vocab_size, d_model=c.d_model, d_kv=c.head_dim, d_ff=c.d_ff, num_layers=c.num_encoder_layers,
        num_decoder_layers=c.num_decoder_layers, num_heads=c.num_heads, feed_forward_proj="relu",
        tie_word_embeddings=True, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0,
    )).train()


def time_pytorch(
    batch: dict[str, np.ndarray], steps: int, model: str = "t5", dtype: str = "float32", device: str = "cpu"
) -> tuple[list[float], int | None] | None:
    """Each step's seconds in this process and the GPU's peak bytes allocated (None on the CPU), or None without
    torch or on a device PyTorch does not run on here."""
    try:
        import torch
    except ImportError:
        return None
    if device not in TORCH_DEVICES:
        return None
    step = pytorch_step(batch, model, dtype, device)
    step()  # warm up
    times, _ = step_seconds(step, steps, back_to_back=device != "cpu")
    return times, torch.cuda.max_memory_allocated() if device == "gpu" else None


def pytorch_step(batch: dict[str, np.ndarray], model: str = "t5", dtype: str = "float32", device: str = "cpu"):
    """A function that runs one AdamW training step of `model`'s transformers twin on `batch`, waiting for it unless
    called with wait=False."""
    import torch

    torch_device = TORCH_DEVICES[device]
    network = hf_model(model).to(torch_device)
    autocast = torch.autocast(torch_device, dtype=torch.bfloat16, enabled=dtype == "bfloat16")
    optimizer = torch.optim.AdamW(network.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    as_tensor = lambda name: torch.from_numpy(batch[name]).long().to(torch_device)  # noqa: E731
    if is_decoder_only(model):  # transformers shifts the labels itself
        inputs = {"input_ids": as_tensor("decoder_input_tokens"), "labels": as_tensor("decoder_input_tokens")}
    else:
        inputs = {"input_ids": as_tensor("encoder_input_tokens"), "labels": as_tensor("decoder_target_tokens")}

    def step(wait: bool = True):
        with autocast:
            loss = network(**inputs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if wait:
            torch_synchronize(device)

    return step


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def child_runs(on_cpu: bool) -> dict[str, tuple[str, dict[str, str]]]:
    """Each row's framework and the environment of its child process (see the module docstring)."""
    base = {k: v for k, v in os.environ.items() if k != "XLA_PYTHON_CLIENT_PREALLOCATE"}  # the child may preallocate
    if not on_cpu:
        return {"ptmjax (JAX/XLA)": ("ptmjax", base), "Hugging Face (PyTorch)": ("pytorch", base)}
    return {
        "ptmjax (JAX/XLA)": ("ptmjax", base),
        "Hugging Face (PyTorch)": ("pytorch", {**base, "PTMJAX_KEEP_FREED_MEMORY": "0"}),
        "PyTorch, ptmjax's malloc": ("pytorch", {**base, "PTMJAX_KEEP_FREED_MEMORY": "1"}),
    }


def time_in_child(
    args: argparse.Namespace, framework: str, env: dict[str, str]
) -> tuple[list[float], int | None] | None:
    """`framework`'s step times and peak device bytes from a child process run in `env` (None where PyTorch is not
    installed)."""
    sizes = ["--model", args.model, "--dtype", args.dtype, "--device", args.device, "--attention", args.attention,
             "--remat", args.remat, *(["--scan"] if args.scan else []), "--steps", str(args.steps),
             "--batch", str(args.batch), "--inputs", str(args.inputs), "--targets", str(args.targets)]
    out = subprocess.run([sys.executable, __file__, "--child", framework, *sizes], env=env, stdout=subprocess.PIPE,
                         text=True, check=True)  # its errors and progress go to this stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def positive_int(text: str) -> int:
    """argparse's type for a count that must be at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return int(text)


def add_step_arguments(parser: argparse.ArgumentParser, steps: int = 5) -> None:
    """`--steps`, `--batch`, `--inputs` and `--targets`: the timed steps and the batch's shape."""
    parser.add_argument("--steps", type=positive_int, default=steps)
    parser.add_argument("--batch", type=positive_int, default=8)
    parser.add_argument("--inputs", type=positive_int, default=512)
    parser.add_argument("--targets", type=positive_int, default=114, help="T5 only")


def options_label(args: argparse.Namespace) -> str:
    """ptmjax's options of a run, in words."""
    words = [f"{args.attention} attention", f"remat {args.remat}"]
    return ", ".join(words + (["scanned layers"] if args.scan else []))


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """One run: the matmul peak, then each framework's step in a child process of its own (see the module
    docstring); -> {"peak_flops": the best matmul FLOP/s, "frameworks": {name: {"step_s": the median step's
    seconds, "peak_gib": peak device GiB or None}}}."""
    peaks = matmul_peak_flops(args.device, args.dtype)
    print("Measured " + ", ".join(f"{k} {v / 1e12:.3f}" for k, v in peaks.items()) + " TFLOP/s", file=sys.stderr)
    frameworks = {}
    for name, (framework, env) in child_runs(args.device == "cpu").items():
        row = time_in_child(args, framework, env)
        if row is not None:  # None: PyTorch is not installed
            times, peak_bytes = row
            frameworks[name] = {"step_s": statistics.median(times),
                                "peak_gib": peak_bytes / 2**30 if peak_bytes else None}
    return {"peak_flops": max(peaks.values()), "frameworks": frameworks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(TITLES), default="t5")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--device", choices=sorted(JAX_PLATFORMS), default="cpu")
    parser.add_argument("--attention", choices=ATTENTION_KERNELS, help="ptmjax's attention_kernel (default: "
                        "'blockwise' on the CPU, 'einsum' elsewhere)")
    parser.add_argument("--remat", choices=sorted(REMAT_POLICIES), default="none", help="ptmjax's remat_policy")
    parser.add_argument("--scan", action="store_true", help="ptmjax's scan_layers")
    add_step_arguments(parser)
    parser.add_argument("--runs", type=positive_int, default=1, help="runs of every framework, one after another")
    parser.add_argument("--save", action="store_true", help=f"keep the results in {RESULTS.relative_to(ROOT)}/ and "
                        f"rewrite {PAGE.relative_to(ROOT)}'s tables from them")
    parser.add_argument("--child", choices=["ptmjax", "pytorch"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.attention = args.attention or ("blockwise" if args.device == "cpu" else "einsum")
    if not args.child:  # the parent's peak matmul must leave the device's memory to the children
        os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    use_device(args.device)

    batch = random_batch(args.batch, args.inputs, args.targets, args.model)
    if args.child == "ptmjax":
        times, _, peak_bytes = time_ptmjax(batch, args.steps, args.model, dtype=args.dtype,
                                           attention_kernel=args.attention, remat_policy=args.remat,
                                           scan_layers=args.scan)
        print(json.dumps([times, peak_bytes]))
        return
    if args.child == "pytorch":
        print(json.dumps(time_pytorch(batch, args.steps, args.model, args.dtype, args.device)))
        return
    decoder_only = is_decoder_only(args.model)
    entry = {
        "measured": results_files.run_record(), "title": TITLES[args.model], "batch": args.batch,
        "lengths": f"{args.inputs}" if decoder_only else f"{args.inputs} -> {args.targets}",
        "options": options_label(args), "steps": args.steps,
        "tokens": args.batch * (args.inputs + (0 if decoder_only else args.targets)),
        "flops": training_flops(args.model, args.batch, args.inputs, args.targets),
        "device": f"{os.cpu_count()} CPU cores" if args.device == "cpu" else jax.devices()[0].device_kind,
    }
    print(f"{entry['title']}, batch {args.batch} x {entry['lengths']}, {args.dtype} compute, {entry['options']}: "
          f"{entry['flops'] / 1e9:.1f} GFLOP per training step, on {entry['device']}", file=sys.stderr)
    entry["runs"] = [measure(args) for _ in range(args.runs)]
    if len(entry["runs"][0]["frameworks"]) == 1:
        print("(install the 'hf' extra, torch and transformers, to compare with PyTorch on CPU or GPU)",
              file=sys.stderr)
    print(markdown([entry]))
    if args.save:
        name = f"{args.device}_{args.dtype}"
        key = f"{args.model} {args.batch} x {entry['lengths']}, {entry['options']}"
        results_files.saved_entry(RESULTS / f"train_throughput_{name}.json", key, entry)
        results_files.rewrite_tables(PAGE, SCRIPT, tables())
        print(f"kept in {RESULTS.relative_to(ROOT)}/train_throughput_{name}.json; {PAGE.relative_to(ROOT)}'s "
              "tables rewritten", file=sys.stderr)


def markdown(entries: list[dict[str, Any]]) -> str:
    """A table of training runs: each framework's median step in each run, ptmjax's tokens/s over each other
    framework's and the model FLOP utilisation (their ranges over the runs), and peak device memory where
    measured."""
    names = list(entries[0]["runs"][0]["frameworks"])
    memory = any(f["peak_gib"] for e in entries for r in e["runs"] for f in r["frameworks"].values())
    header = ["model", "batch x length", "ptmjax options", *(f"{n}: step s" for n in names),
              *(f"ptmjax / {n}" for n in names[1:]), *(f"MFU: {n}" for n in names),
              *(f"peak GiB: {n}" for n in names if memory)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row_cells(e, names, memory)) + " |" for e in entries]
    return "\n".join(lines) + "\n"


def row_cells(entry: dict[str, Any], names: list[str], memory: bool) -> list[str]:
    """One row of `markdown`."""
    runs = entry["runs"]
    steps = {n: [r["frameworks"][n]["step_s"] for r in runs] for n in names}
    digits = "{:.0f}" if len(runs) > 1 else "{:.1f}"
    peaks_kept = all(r["peak_flops"] for r in runs)
    mfu = {n: [entry["flops"] / s / r["peak_flops"] * 100 for s, r in zip(steps[n], runs, strict=True)]
           for n in names} if peaks_kept else {}
    ratios = {n: [b / a for a, b in zip(steps[names[0]], steps[n], strict=True)] for n in names[1:]}
    return [entry["title"], f"{entry['batch']} x {entry['lengths']}", entry["options"],
            *(", ".join(f"{s:.2f}" if s >= 1 else f"{s:.3f}" for s in steps[n]) for n in names),
            *(results_files.spread(ratios[n], unit="x") for n in names[1:]),
            *(results_files.spread(mfu[n], digits, "%") if peaks_kept else "not kept" for n in names),
            *(results_files.spread([r["frameworks"][n]["peak_gib"] for r in runs], "{:.1f}")
              for n in names if memory)]


def tables() -> dict[str, str]:
    """docs/benchmarks.md's tables, one per results file `train_throughput_<device>_<dtype>.json`."""
    return {path.stem.removeprefix("train_throughput_"): markdown(list(json.loads(path.read_text()).values()))
            for path in sorted(RESULTS.glob("train_throughput_*.json"))}


if __name__ == "__main__":
    main()
