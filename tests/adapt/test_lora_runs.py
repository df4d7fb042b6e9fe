"""LoRA fine-tuning from gin as a user runs it: over a pre-trained run, saving only the LoRA matrices, exported
to Hugging Face merged, with the logits of the LoRA model."""

import math

import gin
import numpy as np
import pytest
import torch
import transformers

from ptmjax import gin_files
from ptmjax.adapt.lora import LORA_PARAMS
from ptmjax.convert import checkpoint
from ptmjax.families.model_api import model_api
from ptmjax.storage.model_dir import ModelDir
from ptmjax.training import run
from ptmjax.tree_paths import shapes_by_path

SHORT = ["train.task_feature_lengths = {'inputs': 32, 'targets': 8}", "train.batch_size = 8", "train.num_steps = 2",
         "train.eval_every = 2", "train.eval_batches = 1", "train.checkpoint_every = 2", "train.show_progress = False",
         "rsqrt_with_warmup.warmup_steps = 1"]


def train(run_file: str, model_dir, *bindings: str) -> None:
    gin_files.parse_gin([run_file], [*SHORT, *bindings])
    try:
        run.train(str(model_dir))
    finally:
        gin.clear_config()


pytestmark = pytest.mark.slow  # two gin training runs (about 45 s of CPU); LoRA's parts are tested by default


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    train("runs/demo.gin", root / "demo")
    train("runs/lora_demo.gin", root / "lora", f"train.init_checkpoint = '{root / 'demo'}'",
          "train.inference_eval_examples = 8", "rsqrt_with_warmup.peak_learning_rate = 0.05")
    return root


def test_a_lora_run_saves_only_the_lora_matrices(lora_run):
    import re

    folder = ModelDir(lora_run / "lora")
    saved = shapes_by_path(folder.state_metadata()["params"])
    assert saved and all(re.fullmatch(LORA_PARAMS, path) for path in saved)
    assert len(saved) == 2 * 2 * (2 + 2 + 2)  # A and B, query and value, of 2 encoder and 2 + 2 decoder attentions
    assert folder.base() == (ModelDir(lora_run / "demo"), 2)


def test_the_merged_export_gives_the_lora_models_logits(lora_run):
    checkpoint.export_hf(str(lora_run / "lora"), str(lora_run / "hf"))
    folder = ModelDir(lora_run / "lora")
    model, _ = gin_files.read_model_config(folder)
    params = folder.read_params(model_api(model).abstract_params)
    assert np.abs(params["encoder"]["layers_0"]["attention"]["query"]["lora_b"]).max() > 0  # LoRA has moved
    inputs = np.random.default_rng(0).integers(3, 2000, (2, 12)).astype(np.int32)
    decoder_inputs = np.random.default_rng(1).integers(3, 2000, (2, 5)).astype(np.int32)
    decoder_inputs[:, 0] = 0
    want = np.asarray(model.apply({"params": params}, encoder_input_tokens=inputs, decoder_input_tokens=decoder_inputs))
    hf_model = transformers.T5ForConditionalGeneration.from_pretrained(lora_run / "hf").eval()
    with torch.no_grad():
        got = hf_model(input_ids=torch.tensor(inputs, dtype=torch.long),
                       decoder_input_ids=torch.tensor(decoder_inputs, dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=1e-4)


def test_ptmjax_load_applies_lora_over_the_base_as_the_merged_export_decodes(lora_run):
    """`ptmjax.load` of the LoRA run (its LoRA matrices over runs/demo's parameters) decodes the same tokens
    and scores as the Hugging Face export of the merged model."""
    import ptmjax

    prompts = ["Return the number of items in a container.", "Open a file and return a stream."]
    if not (lora_run / "hf").exists():
        checkpoint.export_hf(str(lora_run / "lora"), str(lora_run / "hf"))
    lora, merged = ptmjax.load(str(lora_run / "lora")), ptmjax.load(str(lora_run / "hf"))
    got = lora.predict(prompts, max_decode_length=8)
    want = merged.predict(prompts, max_decode_length=8)
    for a, b in zip(got, want, strict=True):
        assert a.tokens == b.tokens
        np.testing.assert_allclose(a.scores, b.scores, rtol=1e-4)


def test_inspect_reports_every_parameter_of_the_lora_run(lora_run, capsys):
    """The LoRA matrices from the run's checkpoint and the rest from its base (runs/demo)."""
    from ptmjax import cli

    assert cli.main(["inspect", str(lora_run / "lora")]) == 0
    model, _ = gin_files.read_model_config(ModelDir(lora_run / "lora"))
    total = sum(math.prod(shape) for shape in shapes_by_path(model_api(model).abstract_params).values())
    assert f"{total:,}" in capsys.readouterr().out
