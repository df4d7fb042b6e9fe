"""A tiny T5 run trained here (byte vocabulary, two steps) and a tiny Hugging Face GPT-2 folder with a
BPE tokenizer trained here; loaded once per session."""

import json

import gin
import jax
import pytest

import ptmjax
from ptmjax import gin_files, partitioning
from ptmjax.data import corpus
from ptmjax.training import run

RUN_BINDINGS = (
    "train.mixture_or_task_name = 'ptmjax_stdlib_span_corruption_byte'",
    "T5Config.vocab_size = 384", "T5Config.d_model = 32", "T5Config.num_heads = 2", "T5Config.d_ff = 64",
    "T5Config.num_encoder_layers = 1", "T5Config.num_decoder_layers = 1",
    "train.task_feature_lengths = {'inputs': 32, 'targets': 8}", "train.batch_size = 8", "train.num_steps = 2",
    "train.pack = False", "train.log_every = 2", "train.eval_every = 2", "train.eval_batches = 1",
    "train.checkpoint_every = 2", "train.show_progress = False", "rsqrt_with_warmup.warmup_steps = 1",
)


def train_tiny_run(model_dir: str) -> str:
    gin_files.parse_gin(["models/t5_1_1_tiny.gin", "runs/pretrain.gin", "mesh/dp.gin"], RUN_BINDINGS)
    try:
        run.train(model_dir)
    finally:
        gin.clear_config()
    return model_dir


@pytest.fixture(scope="session")
def t5_run(tmp_path_factory) -> str:
    return train_tiny_run(str(tmp_path_factory.mktemp("t5_run")))


@pytest.fixture(scope="session")
def t5_model(t5_run):
    """On one device (compiles fastest); the CLI tests load it on the default mesh of all 8."""
    return ptmjax.load(t5_run, mesh=partitioning.make_mesh(partitioning.MeshConfig(data=1), jax.devices()[:1]))


def save_tiny_gpt2(hf_dir) -> None:
    """A random 2-layer GPT-2 (weights scaled up 20x) and a 300-token byte-level BPE trained on the
    embedded corpus, saved by transformers."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel()
    paragraphs = [p for d in corpus.stdlib_docstrings("train") for p in d.split("\n\n") if p.strip()][:300]
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(paragraphs, trainer)
    bpe = json.loads(tokenizer.to_str())["model"]
    hf_tokenizer = transformers.GPT2Tokenizer(
        vocab=bpe["vocab"], merges=[tuple(m) for m in bpe["merges"]], pad_token="<|endoftext|>"
    )
    eos = hf_tokenizer.eos_token_id
    transformers.set_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=len(hf_tokenizer), n_embd=32, n_layer=2, n_head=2, n_positions=64, bos_token_id=eos,
        eos_token_id=eos, pad_token_id=eos,
    ))
    with torch.no_grad():  # peaked next-token distributions: greedy choices far from float ties
        for weight in model.parameters():
            if weight.ndim > 1:
                weight.mul_(20)
    hf_tokenizer.save_pretrained(hf_dir)
    model.save_pretrained(hf_dir)


@pytest.fixture(scope="session")
def gpt2_dir(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("gpt2_hf"))
    save_tiny_gpt2(path)
    return path
