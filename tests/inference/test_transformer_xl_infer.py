"""A tiny Transformer-XL run (two steps of gin_configs/runs/txl_demo.gin) served by `ptmjax.load` and `ptmjax infer`:
its prompts are read as plain causal rows, and each greedy continuation and its score equal an uncached argmax
loop that reads the prompt and the tokens so far segment by segment with `with_memory` from an empty memory."""

import json

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ptmjax
from ptmjax import cli, gin_files, partitioning
from ptmjax.models.transformer_xl import empty_memory
from ptmjax.training import run

PROMPTS = ["def f(x):", "Return the", "a + b = c"]
LENGTH = 6
BINDINGS = (
    "BATCH_SIZE = 8", "SEGMENT_LENGTH = 16", "TransformerXLConfig.memory_length = 5",
    "TransformerXLConfig.decode_segment_length = 3", "train.num_steps = 2", "train.eval_every = 2",
    "train.eval_batches = 1", "train.checkpoint_every = 2", "train.log_every = 2", "train.show_progress = False",
    "warmup_cosine.warmup_steps = 1", "warmup_cosine.total_steps = 2",
)


@pytest.fixture(scope="module")
def txl_run(tmp_path_factory) -> str:
    model_dir = str(tmp_path_factory.mktemp("txl_run"))
    gin_files.parse_gin(["runs/txl_demo.gin"], BINDINGS)
    try:
        run.train(model_dir)
    finally:
        gin.clear_config()
    return model_dir


def segment_reading_greedy(loaded, prompt: list[int]) -> tuple[list[int], float]:
    """Argmax tokens (up to EOS) and their summed log-probability, each step rereading the prompt and the tokens
    so far in segments of decode_segment_length after an empty memory, without a cache."""
    module, params = loaded.module, jax.device_get(loaded.params)
    segment, eos = module.config.decode_segment_length, loaded.generation_ids.for_decoding().eos_token_id
    read = jax.jit(lambda tokens, memory: module.apply({"params": params}, tokens, memory, method="with_memory"))
    stream, tokens, score = list(prompt), [], 0.0
    for _ in range(LENGTH):
        memory = empty_memory(module.config, 1)
        for start in range(0, len(stream), segment):
            logits, memory = read(jnp.asarray([stream[start:start + segment]]), memory)
        last = np.asarray(logits[0, -1], np.float64)
        log_probs = last - last.max() - np.log(np.exp(last - last.max()).sum())
        token = int(log_probs.argmax())
        score += log_probs[token]
        if token == eos:
            break
        tokens.append(token)
        stream.append(token)
    return tokens, score


@pytest.mark.slow  # trains a run (two steps) and compiles its decoding on 1 and 8 devices: about a minute
def test_load_and_infer_continue_prompts_as_segment_reading_does(txl_run, tmp_path):
    loaded = ptmjax.load(txl_run, mesh=partitioning.make_mesh(partitioning.MeshConfig(data=1), jax.devices()[:1]))
    assert loaded.row_format.causal and not loaded.row_format.add_eos
    predictions = loaded.predict(PROMPTS, max_decode_length=LENGTH)
    assert sum(len(p.tokens[0]) for p in predictions) > len(PROMPTS), "the continuations are (nearly) empty"
    for text, prediction in zip(PROMPTS, predictions, strict=True):
        tokens, score = segment_reading_greedy(loaded, list(loaded.vocabulary.encode(text)))
        assert list(prediction.tokens[0]) == tokens
        np.testing.assert_allclose(prediction.scores[0], score, rtol=1e-4, atol=1e-4)
    (tmp_path / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    args = ["infer", "--model_dir", txl_run, "--input_file", str(tmp_path / "prompts.txt"),
            f"--max_decode_length={LENGTH}", "--output", str(tmp_path / "out.jsonl")]
    assert cli.main(args) == 0  # the default mesh: data parallel over all 8 devices
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["prediction"] for r in records] == [p.outputs[0] for p in predictions]
    np.testing.assert_allclose([r["score"] for r in records], [p.scores[0] for p in predictions], rtol=1e-5)
