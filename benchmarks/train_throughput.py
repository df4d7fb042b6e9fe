"""Training throughput and MFU of T5-small, against Hugging Face PyTorch.

    python benchmarks/train_throughput.py [--steps 5] [--batch 8] [--inputs 512] [--targets 114]

Both frameworks train the same T5 v1.0 small configuration (60M parameters,
dropout off, float32, AdamW) on the same random token batch, on this
machine's CPU, in one run. Model FLOP utilisation divides the model's FLOPs
per second by this machine's matmul peak: the best float32 2048x2048 matmul
that JAX, NumPy or PyTorch reaches here, measured in the same run. Prints a table; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from ptmjax import partitioning  # noqa: E402
from ptmjax.models import EncoderDecoder, T5Config  # noqa: E402
from ptmjax.models.flops import t5_training_flops  # noqa: E402
from ptmjax.training.losses import LossConfig  # noqa: E402
from ptmjax.training.optimizers import adamw  # noqa: E402
from ptmjax.training.trainer import Trainer  # noqa: E402

T5_SMALL = T5Config(
    vocab_size=32128, d_model=512, num_heads=8, head_dim=64, d_ff=2048, num_encoder_layers=6,
    num_decoder_layers=6, ffn_activations=("relu",), tie_embeddings=True, dropout_rate=0.0,
)
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


def random_batch(batch: int, inputs: int, targets: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    tokens = lambda length: rng.integers(2, T5_SMALL.vocab_size, (batch, length)).astype(np.int32)  # noqa: E731
    target_tokens = tokens(targets)
    decoder_inputs = np.concatenate([np.zeros((batch, 1), np.int32), target_tokens[:, :-1]], axis=1)
    return {
        "encoder_input_tokens": tokens(inputs), "decoder_input_tokens": decoder_inputs,
        "decoder_target_tokens": target_tokens, "decoder_loss_weights": np.ones_like(target_tokens),
    }


def time_ptmjax(batch: dict[str, np.ndarray], steps: int) -> tuple[list[float], float]:
    """Each step's seconds, and the loss of the last step."""
    mesh_config = partitioning.MeshConfig()
    mesh = partitioning.make_mesh(mesh_config)
    schedule = lambda step: LEARNING_RATE  # noqa: E731
    trainer = Trainer(
        EncoderDecoder(T5_SMALL), adamw(schedule, weight_decay=0.0, max_grad_norm=None), schedule,
        mesh, mesh_config.rules, LossConfig(z_loss=0.0),
    )
    state = trainer.init_state(jax.random.key(0))
    global_batch = partitioning.global_batch(batch, mesh)
    rng = jax.random.key(1)
    state, metrics = trainer.train_step(state, global_batch, rng)  # compile
    jax.block_until_ready(metrics)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        state, metrics = trainer.train_step(state, global_batch, rng)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    return times, float(metrics["loss"])


def time_pytorch(batch: dict[str, np.ndarray], steps: int) -> list[float] | None:
    try:
        import torch
        import transformers
    except ImportError:
        return None
    config = transformers.T5Config(
        vocab_size=T5_SMALL.vocab_size, d_model=T5_SMALL.d_model, d_kv=T5_SMALL.head_dim,
        d_ff=T5_SMALL.d_ff, num_layers=T5_SMALL.num_encoder_layers,
        num_decoder_layers=T5_SMALL.num_decoder_layers, num_heads=T5_SMALL.num_heads,
        feed_forward_proj="relu", tie_word_embeddings=True, dropout_rate=0.0,
        decoder_start_token_id=0, pad_token_id=0,
    )
    model = transformers.T5ForConditionalGeneration(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    inputs = torch.from_numpy(batch["encoder_input_tokens"]).long()
    labels = torch.from_numpy(batch["decoder_target_tokens"]).long()

    def step():
        loss = model(input_ids=inputs, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # warm up
    return [_timed(step) for _ in range(steps)]


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--inputs", type=int, default=512)
    parser.add_argument("--targets", type=int, default=114)
    args = parser.parse_args()

    batch = random_batch(args.batch, args.inputs, args.targets)
    tokens = args.batch * (args.inputs + args.targets)
    flops = t5_training_flops(T5_SMALL, args.batch, args.inputs, args.targets)
    peaks = matmul_peak_flops()
    peak = max(peaks.values())
    print(f"T5 v1.0 small, batch {args.batch}, inputs {args.inputs}, targets {args.targets}: "
          f"{flops / 1e9:.1f} GFLOP per training step")
    print(f"Measured float32 2048x2048 matmul on {os.cpu_count()} CPU cores: "
          + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in peaks.items())
          + f" GFLOP/s; peak = {peak / 1e9:.1f} GFLOP/s\n")

    rows = [("ptmjax (JAX/XLA)", time_ptmjax(batch, args.steps)[0])]
    torch_times = time_pytorch(batch, args.steps)
    if torch_times is not None:
        rows.append(("Hugging Face (PyTorch)", torch_times))

    print(f"{'framework':<24}{'step s (median)':>16}{'tokens/s':>12}{'TFLOP/s':>10}{'MFU':>8}")
    medians = {}
    for name, times in rows:
        median = statistics.median(times)
        medians[name] = median
        print(f"{name:<24}{median:>16.3f}{tokens / median:>12.0f}{flops / median / 1e12:>10.3f}"
              f"{flops / median / peak:>8.1%}")
    if torch_times is None:
        print("\n(install the 'hf' extra, torch and transformers, to compare with PyTorch)")
    else:
        ratio = medians["Hugging Face (PyTorch)"] / medians["ptmjax (JAX/XLA)"]
        print(f"\nptmjax tokens/s over PyTorch tokens/s: {ratio:.2f}x")


if __name__ == "__main__":
    main()
