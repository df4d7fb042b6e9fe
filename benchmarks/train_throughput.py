"""Training throughput and MFU of T5-small or GPT-2 small, against Hugging Face PyTorch.

    python benchmarks/train_throughput.py [--model t5|gpt2] [--dtype float32|bfloat16] [--steps 5] [--batch 8]
        [--inputs 512] [--targets 114]

Both frameworks train the same configuration with dropout off and AdamW, on
the same random token batch, on this machine's CPU, in one run: T5 v1.0 small
(60M parameters) on `--inputs` and `--targets` tokens, or GPT-2 small (124M)
on `--inputs` tokens, each predicting the next (the last position has no
target, as in transformers' shifted labels). `--dtype bfloat16` computes in
bfloat16 with float32 parameters: ptmjax's config `dtype`, PyTorch's
`torch.autocast`. Model FLOP utilisation divides the model's FLOPs per second
by this machine's matmul peak: the best float32 2048x2048 matmul that JAX,
NumPy or PyTorch reaches here, measured in the same run.

Each framework runs in a child process of its own. `import ptmjax` sets
glibc's malloc to keep freed memory (`ptmjax/host_malloc.py`), which speeds
PyTorch up too, so PyTorch runs twice: with glibc's defaults, as a PyTorch
user runs it, and with ptmjax's settings.
Prints a table; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
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
from ptmjax.models import GPT2, EncoderDecoder, GPT2Config, T5Config  # noqa: E402
from ptmjax.models.flops import gpt2_training_flops, t5_training_flops  # noqa: E402
from ptmjax.training.losses import LossConfig  # noqa: E402
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
TITLES = {"t5": "T5 v1.0 small", "gpt2": "GPT-2 small"}
LEARNING_RATE = 1e-4


def matmul_peak_flops(size: int = 2048, repeats: int = 10) -> dict[str, float]:
    """The best float32 matmul FLOP/s each library reaches on this machine."""
    a = np.random.default_rng(0).standard_normal((size, size), dtype=np.float32)
    jax_a, jax_matmul = jnp.asarray(a), jax.jit(lambda x: x @ x)
    candidates = {"jax": lambda: jax_matmul(jax_a).block_until_ready(), "numpy": lambda: a @ a}
    try:
        import torch

        torch_a = torch.from_numpy(a)
        candidates["torch"] = lambda: torch_a @ torch_a
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
    vocab = T5_SMALL.vocab_size if model == "t5" else GPT2_SMALL.vocab_size
    tokens = lambda length: rng.integers(2, vocab, (batch, length)).astype(np.int32)  # noqa: E731
    if model == "gpt2":
        decoder_inputs = tokens(inputs)
        weights = np.ones_like(decoder_inputs)
        weights[:, -1] = 0  # the last position has no next token
        return {"decoder_input_tokens": decoder_inputs, "decoder_target_tokens": np.roll(decoder_inputs, -1, axis=1),
                "decoder_loss_weights": weights}  # fmt: skip
    target_tokens = tokens(targets)
    decoder_inputs = np.concatenate([np.zeros((batch, 1), np.int32), target_tokens[:, :-1]], axis=1)
    return {
        "encoder_input_tokens": tokens(inputs), "decoder_input_tokens": decoder_inputs,
        "decoder_target_tokens": target_tokens, "decoder_loss_weights": np.ones_like(target_tokens),
    }  # fmt: skip


def training_flops(model: str, batch: int, inputs: int, targets: int) -> float:
    if model == "gpt2":
        return gpt2_training_flops(GPT2_SMALL, batch, inputs)
    return t5_training_flops(T5_SMALL, batch, inputs, targets)


def make_trainer(model: str = "t5", dtype: str = "float32") -> Trainer:
    """The ptmjax trainer of `model` computing in `dtype` on this host's devices: AdamW at a constant learning rate,
    no z-loss."""
    mesh_config = partitioning.MeshConfig()
    schedule = lambda step: LEARNING_RATE  # noqa: E731
    config = dataclasses.replace(GPT2_SMALL if model == "gpt2" else T5_SMALL, dtype=dtype)
    module = GPT2(config) if model == "gpt2" else EncoderDecoder(config)
    return Trainer(
        module, adamw(schedule, weight_decay=0.0, max_grad_norm=None), schedule, partitioning.make_mesh(mesh_config),
        mesh_config.rules, LossConfig(z_loss=0.0),
    )  # fmt: skip


def time_ptmjax(
    batch: dict[str, np.ndarray], steps: int, model: str = "t5", dtype: str = "float32"
) -> tuple[list[float], float]:
    """Each step's seconds, and the loss of the last step."""
    trainer = make_trainer(model, dtype)
    state = trainer.init_state(jax.random.key(0))
    _, times, metrics = timed_steps(trainer, state, partitioning.global_batch(batch, trainer.mesh), steps)
    return times, float(metrics["loss"])


def timed_steps(trainer: Trainer, state: Any, batch: dict[str, Any], steps: int) -> tuple[float, list[float], Any]:
    """The seconds of a first (compiling) step on `batch`, of each of `steps` steps after it, and the last step's
    metrics."""
    rng = jax.random.key(1)
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        state, metrics = trainer.train_step(state, batch, rng)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    return times[0], times[1:], metrics


def hf_model(model: str) -> Any:
    """The transformers model of the same configuration, in train mode."""
    import transformers

    if model == "gpt2":
        c = GPT2_SMALL
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=c.vocab_size, n_embd=c.d_model, n_layer=c.num_layers, n_head=c.num_heads, n_inner=c.d_ff,
            n_positions=c.max_length, activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0,
        )).train()  # fmt: skip
    c = T5_SMALL
    return transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=c.vocab_size, d_model=c.d_model, d_kv=c.head_dim, d_ff=c.d_ff, num_layers=c.num_encoder_layers,
        num_decoder_layers=c.num_decoder_layers, num_heads=c.num_heads, feed_forward_proj="relu",
        tie_word_embeddings=True, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0,
    )).train()  # fmt: skip


def time_pytorch(
    batch: dict[str, np.ndarray], steps: int, model: str = "t5", dtype: str = "float32"
) -> list[float] | None:
    """Each step's seconds in this process, or None without torch."""
    try:
        import torch
    except ImportError:
        return None
    network = hf_model(model)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16")
    optimizer = torch.optim.AdamW(network.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    if model == "gpt2":  # transformers shifts the labels itself
        tokens = torch.from_numpy(batch["decoder_input_tokens"]).long()
        inputs = {"input_ids": tokens, "labels": tokens}
    else:
        inputs = {"input_ids": torch.from_numpy(batch["encoder_input_tokens"]).long(),
                  "labels": torch.from_numpy(batch["decoder_target_tokens"]).long()}  # fmt: skip

    def step():
        with autocast:
            loss = network(**inputs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # warm up
    return [_timed(step) for _ in range(steps)]


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


PYTORCH_MALLOC = {"Hugging Face (PyTorch)": "0", "PyTorch, ptmjax's malloc": "1"}  # PTMJAX_KEEP_FREED_MEMORY


def time_in_child(args: argparse.Namespace, framework: str, keep_freed_memory: str | None = None) -> list[float] | None:
    """`framework`'s step times from a child process, whose glibc malloc `import ptmjax` sets as
    `keep_freed_memory` says (None: as this process's environment says)."""
    sizes = ["--model", args.model, "--dtype", args.dtype, "--steps", str(args.steps), "--batch", str(args.batch),
             "--inputs", str(args.inputs), "--targets", str(args.targets)]  # fmt: skip
    env = dict(os.environ)
    if keep_freed_memory is not None:
        env["PTMJAX_KEEP_FREED_MEMORY"] = keep_freed_memory
    out = subprocess.run([sys.executable, __file__, "--child", framework, *sizes], env=env, capture_output=True,
                         text=True, check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(TITLES), default="t5")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--inputs", type=int, default=512)
    parser.add_argument("--targets", type=int, default=114, help="T5 only")
    parser.add_argument("--child", choices=["ptmjax", "pytorch"], help=argparse.SUPPRESS)
    args = parser.parse_args()

    batch = random_batch(args.batch, args.inputs, args.targets, args.model)
    if args.child == "ptmjax":
        print(json.dumps(time_ptmjax(batch, args.steps, args.model, args.dtype)[0]))
        return
    if args.child == "pytorch":
        print(json.dumps(time_pytorch(batch, args.steps, args.model, args.dtype)))
        return
    tokens = args.batch * (args.inputs + (args.targets if args.model == "t5" else 0))
    flops = training_flops(args.model, args.batch, args.inputs, args.targets)
    peaks = matmul_peak_flops()
    peak = max(peaks.values())
    lengths = f"inputs {args.inputs}, targets {args.targets}" if args.model == "t5" else f"length {args.inputs}"
    print(f"{TITLES[args.model]}, batch {args.batch}, {lengths}, {args.dtype} compute: {flops / 1e9:.1f} GFLOP per "
          f"training step")  # fmt: skip
    print(f"Measured float32 2048x2048 matmul on {os.cpu_count()} CPU cores: "
          + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in peaks.items())
          + f" GFLOP/s; peak = {peak / 1e9:.1f} GFLOP/s\n")

    rows = {"ptmjax (JAX/XLA)": time_in_child(args, "ptmjax")}
    for name, keep_freed_memory in PYTORCH_MALLOC.items():
        rows[name] = time_in_child(args, "pytorch", keep_freed_memory)
    print(f"{'framework':<26}{'step s (median)':>16}{'tokens/s':>12}{'TFLOP/s':>10}{'MFU':>8}")
    medians = {name: statistics.median(times) for name, times in rows.items() if times is not None}
    for name, median in medians.items():
        print(f"{name:<26}{median:>16.3f}{tokens / median:>12.0f}{flops / median / 1e12:>10.3f}"
              f"{flops / median / peak:>8.1%}")
    if len(medians) == 1:
        print("\n(install the 'hf' extra, torch and transformers, to compare with PyTorch)")
        return
    print()
    for name in PYTORCH_MALLOC:
        print(f"ptmjax tokens/s over {name} tokens/s: {medians[name] / medians['ptmjax (JAX/XLA)']:.2f}x")
    print("(each framework runs in a child process of its own; PyTorch twice: with glibc's malloc defaults, as its "
          "users run it, and with the settings `import ptmjax` makes, ptmjax/host_malloc.py)")


if __name__ == "__main__":
    main()
