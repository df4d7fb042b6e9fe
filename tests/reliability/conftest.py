"""What the reliability tests share: a tiny GPT-2 as transformers saves it."""

import pytest

from ptmjax.models import GPT2Config

TINY_GPT2 = GPT2Config(vocab_size=64, d_model=16, num_heads=2, num_layers=1, d_ff=32, max_length=16)


@pytest.fixture
def tiny_gpt2() -> GPT2Config:
    return TINY_GPT2


@pytest.fixture(scope="module")
def hf_gpt2_dir(tmp_path_factory):
    """A Hugging Face GPT-2 folder of `TINY_GPT2`, written by transformers' save_pretrained."""
    pytest.importorskip("transformers")
    from ptmjax.convert import hf_gpt2

    directory = tmp_path_factory.mktemp("hf_gpt2")
    hf_gpt2.build_hf_model(TINY_GPT2).save_pretrained(directory)
    return directory
