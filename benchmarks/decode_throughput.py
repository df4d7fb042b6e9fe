"""Decoding throughput of T5-small and GPT-2-small, greedy and beam search, against Hugging Face PyTorch.

    python benchmarks/decode_throughput.py [--batches 1,32] [--new-tokens 32] [--models t5,gpt2]
        [--methods greedy,beam] [--beams 4] [--repeats 3] [--runs 1] [--device cpu|gpu] [--quick] [--save]

Both frameworks decode with the same weights (a randomly initialised Hugging Face model, its final
norm scaled so that logits are peaked, converted with ptmjax.convert's hf_to_params), in float32, on
one --device (this machine's CPU by default; on a GPU both multiply in full float32, JAX's matmul
precision 'highest' against PyTorch's default, no TF32), in one run: T5 v1.0 small (vocab 32128,
d_model 512, 8 heads x 64, d_ff 2048, 6+6 layers) from 64 encoder tokens per row, and GPT-2 small
(vocab 50257, d_model 768, 12 heads, 12 layers, d_ff 3072, 1024 positions) from 32-token prompts;
the prompts are the same random tokens. ptmjax runs `ModelApi.predict` (key/value cache,
lax.while_loop), HF `model.generate` (its dynamic cache) under torch.inference_mode with torch
threads = the CPU cores. Beam search: --beams beams, length penalty 0 (HF length_penalty=0.0, ptmjax
length_penalty_alpha=0.0), HF early_stopping=False, one sequence returned.

Every decode runs to --new-tokens: both get an EOS id outside the vocabulary (the vocabulary size),
which no step can emit, so greedy rows never finish early and beam search finishes its beams only at
the last step (the script checks the output lengths).

Tokens/s = batch x new tokens / seconds (beams do not multiply it); each timing is the median of
--repeats runs after one warm-up run. MFU divides the decode's model FLOPs per second by the
device's float32 matmul peak, measured in the same run as benchmarks/train_throughput.py does (the
best 2048x2048 matmul of JAX, NumPy or PyTorch on the CPU, 8192x8192 of JAX or PyTorch on a GPU);
the model FLOPs are a forward pass over the prompt and every beam's generated tokens (encoder once
per input; logits only where a token is generated), so padding slots of the fixed-size cache and
beam reordering earn no credit. ptmjax's compile time (jit lower + compile) is excluded from the
timings and given in its own column. 'same tokens' compares the two frameworks' outputs on the
benchmark batch: rows whose generated tokens are all equal. --quick is a smoke test: tiny models
(vocab 256, d_model 32, 2 layers), 8-token prompts, batch 2, 4 new tokens, 1 timed run (flags still
override). `--runs N` runs every row N times; `--save` keeps the results in
benchmarks/results/decode_throughput_<device>.json and rewrites docs/benchmarks.md's tables from them. Prints a
Markdown table; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from train_throughput import (  # noqa: E402  (run as a script: benchmarks/ is on the path)
    GPT2_SMALL,
    PAGE,
    RESULTS,
    T5_SMALL,
    TORCH_DEVICES,
    matmul_peak_flops,
    torch_synchronize,
    use_device,
)

from ptmjax.convert import hf_gpt2, hf_t5  # noqa: E402
from ptmjax.decoding import DecodeConfig, GenerationIds  # noqa: E402
from ptmjax.families.model_api import model_api  # noqa: E402
from ptmjax.models import GPT2, EncoderDecoder  # noqa: E402
from ptmjax.models.flops import t5_forward_flops  # noqa: E402
from ptmjax.tools import results_files  # noqa: E402

SCRIPT = "benchmarks/decode_throughput.py"  # how docs/benchmarks.md's table markers name this script

T5_TINY = dataclasses.replace(
    T5_SMALL, vocab_size=256, d_model=32, num_heads=4, head_dim=8, d_ff=64, num_encoder_layers=2,
    num_decoder_layers=2,
)
GPT2_TINY = dataclasses.replace(
    GPT2_SMALL, vocab_size=256, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_length=64
)


@dataclasses.dataclass(frozen=True)
class Model:
    """A benchmarked model: its config, converter, prompt length and how its logits are sharpened."""

    label: str
    config: Any
    module: type
    converter: Any
    encoder_decoder: bool
    prompt_length: int  # encoder tokens (T5) or prompt tokens (GPT-2) per row
    final_norm: str  # HF parameter scaled by `sharpen` (the logits scale with it)
    sharpen: float


def models(quick: bool) -> dict[str, Model]:
    t5, gpt2 = (T5_TINY, GPT2_TINY) if quick else (T5_SMALL, GPT2_SMALL)
    t5_name, gpt2_name = ("T5 tiny", "GPT-2 tiny") if quick else ("T5 v1.0 small", "GPT-2 small")
    t5_inputs, gpt2_prompt = (8, 8) if quick else (64, 32)
    return {
        "t5": Model(t5_name, t5, EncoderDecoder, hf_t5, True, t5_inputs, "decoder.final_layer_norm.weight", 4.0),
        "gpt2": Model(gpt2_name, gpt2, GPT2, hf_gpt2, False, gpt2_prompt, "transformer.ln_f.weight", 8.0),
    }


def build(model: Model, device: str) -> tuple[Any, Any]:
    """-> (HF model in eval mode on `device`, ptmjax params on JAX's device): the same random float32 weights."""
    import torch

    torch.manual_seed(0)
    hf = model.converter.build_hf_model(model.config).eval()
    with torch.no_grad():  # HF's init gives flat logits (near-ties make greedy tokens framework-dependent)
        hf.get_parameter(model.final_norm).mul_(model.sharpen)
    params = model.converter.hf_to_params({k: v.numpy() for k, v in hf.state_dict().items()}, model.config)
    return hf.to(TORCH_DEVICES[device]), jax.device_put(params["params"])


def decode_flops(model: Model, batch: int, beams: int, new_tokens: int) -> float:
    """Model FLOPs of decoding `batch` rows (see the module docstring)."""
    c = model.config
    if model.encoder_decoder:
        encoder = t5_forward_flops(c, batch, model.prompt_length, 0)
        return encoder + beams * (t5_forward_flops(c, batch, model.prompt_length, new_tokens) - encoder)
    per_token = c.num_layers * 2 * (4 * c.d_model**2 + 2 * c.d_model * c.d_ff)
    attention = lambda start, stop: sum(c.num_layers * 4 * c.d_model * (t + 1) for t in range(start, stop))  # noqa: E731
    prompt = model.prompt_length * per_token + attention(0, model.prompt_length) + 2 * c.d_model * c.vocab_size
    generated = (new_tokens * per_token + attention(model.prompt_length, model.prompt_length + new_tokens)
                 + (new_tokens - 1) * 2 * c.d_model * c.vocab_size)
    return batch * (prompt + beams * generated)


def prompts(model: Model, batch: int) -> np.ndarray:
    """Random tokens [batch, prompt_length], no padding (ids 2 and up: T5's pad and EOS are 0 and 1)."""
    return np.random.default_rng(batch).integers(2, model.config.vocab_size, (batch, model.prompt_length))


def decode_config(method: str, beams: int, new_tokens: int) -> DecodeConfig:
    if method == "greedy":
        return DecodeConfig(method="greedy", max_decode_length=new_tokens)
    return DecodeConfig(method="beam", max_decode_length=new_tokens, num_beams=beams, length_penalty_alpha=0.0)


def ptmjax_decoder(model: Model, params: Any, tokens: np.ndarray, config: DecodeConfig) -> tuple[float, Callable]:
    """-> (compile seconds, run() -> generated tokens [batch, new tokens] as numpy)."""
    api = model_api(model.module(model.config))
    eos = model.config.vocab_size  # outside the vocabulary: never emitted, every row runs to the end
    ids = GenerationIds(eos_token_id=eos, pad_token_id=0, decoder_start_token_id=0)
    field = "encoder_input_tokens" if model.encoder_decoder else "decoder_input_tokens"
    batch = {field: jax.device_put(tokens.astype(np.int32))}
    start = time.perf_counter()
    compiled = jax.jit(api.predict, static_argnums=(2, 3)).lower(params, batch, config, ids).compile()
    compile_seconds = time.perf_counter() - start

    def run() -> np.ndarray:
        out = jax.block_until_ready(compiled(params, batch))
        return np.asarray(out.tokens[:, 0])

    return compile_seconds, run


def hf_decoder(
    model: Model, hf: Any, tokens: np.ndarray, method: str, beams: int, new_tokens: int, device: str
) -> Callable:
    """-> run() -> generated tokens [batch, new tokens] as numpy."""
    import torch

    input_ids = torch.from_numpy(tokens).long().to(TORCH_DEVICES[device])
    kwargs = dict(
        input_ids=input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
        num_beams=1 if method == "greedy" else beams, num_return_sequences=1, max_new_tokens=new_tokens, min_length=0,
        length_penalty=0.0, early_stopping=False, eos_token_id=model.config.vocab_size, pad_token_id=0,
        use_cache=True,
    )
    if model.encoder_decoder:
        kwargs["decoder_start_token_id"] = 0
    prompt = 1 if model.encoder_decoder else tokens.shape[1]  # HF returns the decoder start / the prompt too

    def run() -> np.ndarray:
        with torch.inference_mode():
            out = hf.generate(**kwargs)
        torch_synchronize(device)
        return out.cpu().numpy()[:, prompt:]

    return run


def timed(run: Callable[[], np.ndarray], repeats: int) -> tuple[float, np.ndarray]:
    """-> (median seconds of `repeats` runs after a warm-up run, the last run's tokens)."""
    out = run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def measure_row(model: Model, hf: Any, params: Any, method: str, batch: int, args: argparse.Namespace) -> dict:
    """One row of one run: both frameworks' median seconds, ptmjax's compile seconds, the rows whose tokens agree."""
    tokens = prompts(model, batch)
    compile_seconds, ours = ptmjax_decoder(model, params, tokens, decode_config(method, args.beams, args.new_tokens))
    our_seconds, our_tokens = timed(ours, args.repeats)
    hf_seconds, hf_tokens = timed(hf_decoder(model, hf, tokens, method, args.beams, args.new_tokens, args.device),
                                  args.repeats)
    for out in (our_tokens, hf_tokens):  # both ran to the end (no EOS can occur)
        assert out.shape == (batch, args.new_tokens), out.shape
    return {"ptmjax_s": our_seconds, "hf_s": hf_seconds, "compile_s": compile_seconds,
            "same_rows": int((our_tokens == hf_tokens).all(axis=1).sum())}


def measure(args: argparse.Namespace) -> dict[str, dict]:
    """Every row of `--runs` runs: {"model method batch": {model, method, batch, flops, new_tokens, "runs": [its
    measure_row of each run with the run's float32 matmul peak]}}."""
    registry, rows = models(args.quick), {}
    for run in range(args.runs):
        peak = max(matmul_peak_flops(args.device).values())
        print(f"run {run + 1}: float32 matmul peak {peak / 1e9:.1f} GFLOP/s", file=sys.stderr)
        for name in args.models.split(","):
            model = registry[name]
            hf, params = build(model, args.device)
            for method, batch in itertools.product(args.methods.split(","), args.batches):
                row = rows.setdefault(f"{name} {method} {batch}", {
                    "model": model.label, "method": "greedy" if method == "greedy" else f"beam {args.beams}",
                    "batch": batch, "new_tokens": args.new_tokens, "runs": [],
                    "flops": decode_flops(model, batch, 1 if method == "greedy" else args.beams, args.new_tokens)})
                row["runs"].append({**measure_row(model, hf, params, method, batch, args), "peak_flops": peak})
                print(f"  {row['model']} {row['method']} batch {batch}: done", file=sys.stderr)
    return rows


def markdown(rows: list[dict]) -> str:
    """A table of decodes: each framework's tokens/s and MFU (the median run's), ptmjax's over Hugging Face's
    (median, and the range over the runs in brackets), ptmjax's compile seconds, the rows whose tokens agree."""
    header = ("model", "method", "batch", "ptmjax tok/s", "HF tok/s", "ptmjax / HF", "ptmjax MFU", "HF MFU",
              "ptmjax compile s", "same tokens")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(decode_cells(r)) + " |" for r in rows]) + "\n"


def decode_cells(row: dict) -> list[str]:
    """One row of `markdown`."""
    runs, tokens = row["runs"], row["batch"] * row["new_tokens"]
    rates = {key: [tokens / run[key] for run in runs] for key in ("ptmjax_s", "hf_s")}
    mfu = {key: statistics.median(row["flops"] / run[key] / run["peak_flops"] for run in runs) for key in rates}
    ratios = [a / b for a, b in zip(rates["ptmjax_s"], rates["hf_s"], strict=True)]
    spread = f" ({results_files.spread(ratios)})" if len(ratios) > 1 else ""
    medians = {key: statistics.median(values) for key, values in rates.items()}
    rate = {key: f"{value:,.{1 if value < 1000 else 0}f}" for key, value in medians.items()}
    return [row["model"], row["method"], str(row["batch"]), rate["ptmjax_s"], rate["hf_s"],
            f"{statistics.median(ratios):.2f}x{spread}",
            f"{mfu['ptmjax_s']:.1%}", f"{mfu['hf_s']:.1%}", f"{statistics.median(r['compile_s'] for r in runs):.1f}",
            f"{min(r['same_rows'] for r in runs)}/{row['batch']} rows"]


def tables() -> dict[str, str]:
    """docs/benchmarks.md's tables, one per results file `decode_throughput_<device>.json`."""
    return {path.stem.removeprefix("decode_throughput_"): markdown(list(json.loads(path.read_text()).values()))
            for path in sorted(RESULTS.glob("decode_throughput_*.json"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default=None, help="comma-separated batch sizes (default 1,32; --quick 2)")
    parser.add_argument("--new-tokens", type=int, default=None, help="tokens generated per row (default 32; --quick 4)")
    parser.add_argument("--models", default="t5,gpt2")
    parser.add_argument("--methods", default="greedy,beam")
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=None, help="timed decodes per row (default 3; --quick 1)")
    parser.add_argument("--runs", type=int, default=1, help="runs of every row, one after another")
    parser.add_argument("--device", choices=sorted(TORCH_DEVICES), default="cpu")
    parser.add_argument("--quick", action="store_true", help="tiny models and batches: a smoke test")
    parser.add_argument("--save", action="store_true", help="keep the results in benchmarks/results/ and rewrite "
                        "docs/benchmarks.md's tables from them")
    args = parser.parse_args()
    use_device(args.device)
    if args.device != "cpu":
        jax.config.update("jax_default_matmul_precision", "highest")  # full float32, as PyTorch's default
    args.batches = [int(b) for b in (args.batches or ("2" if args.quick else "1,32")).split(",")]
    args.new_tokens = args.new_tokens or (4 if args.quick else 32)
    args.repeats = args.repeats or (1 if args.quick else 3)
    unknown = set(args.methods.split(",")) - {"greedy", "beam"}
    if unknown:
        parser.error(f"unknown --methods {sorted(unknown)}; use greedy and/or beam")

    import torch

    torch.set_num_threads(os.cpu_count())
    where = f"{os.cpu_count()} CPU cores" if args.device == "cpu" else jax.devices()[0].device_kind
    print(f"{args.new_tokens} new tokens per row, median of {args.repeats} decodes, float32 on {where} (torch threads "
          f"{torch.get_num_threads()}, JAX {jax.default_backend()}); beam search: {args.beams} beams", file=sys.stderr)
    rows = measure(args)
    print(markdown(list(rows.values())))
    if args.save:
        path = RESULTS / f"decode_throughput_{args.device}.json"
        for key, row in rows.items():
            results_files.saved_entry(path, key, {"measured": results_files.run_record(), "device": where, **row})
        results_files.rewrite_tables(PAGE, SCRIPT, tables())
        print(f"kept in {path.relative_to(RESULTS.parents[1])}; docs/benchmarks.md's tables rewritten", file=sys.stderr)


if __name__ == "__main__":
    main()
