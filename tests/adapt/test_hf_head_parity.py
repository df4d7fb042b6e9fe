"""Hugging Face fine-tuning classes <-> ptmjax task models at logit parity, both directions, through the
directories `ptmjax convert` reads and writes (`hf.load`, `hf.save`).

Import: a random transformers model (every weight perturbed, so no zero bias or unit LayerNorm hides a wrong
mapping) is saved with save_pretrained and loaded by `hf.load`. Export: random ptmjax parameters are written
by `hf.save` and loaded by transformers' `from_pretrained` as the declared class. Inputs are padded batches
with two token types; every sequence logit is compared, per-token logits on the real tokens (at padding,
ptmjax's encoder masks the padded queries too, Hugging Face only the keys, so those states differ).
"""

from __future__ import annotations

import dataclasses
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ptmjax.families.model_api import model_api
from ptmjax.models import AlbertConfig, BertConfig, ElectraConfig, GPT2Config
from ptmjax.models.encoder_tasks import (
    EncoderForQuestionAnswering,
    EncoderForSequenceClassification,
    EncoderForTokenClassification,
)
from ptmjax.models.gpt2_tasks import GPT2ForSequenceClassification

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from ptmjax.convert import checkpoint, hf, hf_task_heads  # noqa: E402

NO_DROPOUT = {"dropout_rate": 0.0, "attention_dropout_rate": 0.0}
BERT = BertConfig(vocab_size=99, d_model=24, num_heads=3, num_layers=2, d_ff=40, max_length=20, nsp_head=False,
                  **NO_DROPOUT)
ENCODERS = {
    "bert": BERT,
    "roberta": dataclasses.replace(BERT, pad_token_id=1, positions_after_padding=True, max_length=22),
    "xlm_roberta": dataclasses.replace(BERT, pad_token_id=1, positions_after_padding=True, max_length=22,
                                       hf_model_type="xlm-roberta"),  # XLMRobertaFor...
    "albert": AlbertConfig(vocab_size=99, embedding_size=16, d_model=24, num_heads=3, num_layers=2, d_ff=40,
                           max_length=20, sop_head=False, **NO_DROPOUT),
    "electra": ElectraConfig(vocab_size=99, embedding_size=16, d_model=24, num_heads=3, num_layers=2, d_ff=40,
                             max_length=20, **NO_DROPOUT),
}
GPT2 = GPT2Config(vocab_size=99, d_model=24, num_heads=3, num_layers=2, d_ff=40, max_length=20, **NO_DROPOUT)
MODELS = {
    **{f"{family}_sequence": EncoderForSequenceClassification(config, num_labels=3)
       for family, config in ENCODERS.items()},
    **{f"{family}_tokens": EncoderForTokenClassification(config, num_labels=5) for family, config in ENCODERS.items()},
    **{f"{family}_span": EncoderForQuestionAnswering(config) for family, config in ENCODERS.items()},
    "bert_regression": EncoderForSequenceClassification(BERT, num_labels=1),
    "gpt2_sequence": GPT2ForSequenceClassification(GPT2, num_labels=3, pad_token_id=7),
    "gpt2_regression": GPT2ForSequenceClassification(GPT2, num_labels=1, pad_token_id=0),
}
LENGTHS = (16, 11, 4)  # real tokens per row of the padded batch


def pad_id(model: nn.Module) -> int:
    return model.pad_token_id if isinstance(model, GPT2ForSequenceClassification) else model.config.pad_token_id


def padded_batch(model: nn.Module) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """tokens [3, 16] padded with the model's pad id, attention mask, token types (0 then 1; 0 on padding)."""
    rng = np.random.default_rng(0)
    pad, length = pad_id(model), max(LENGTHS)
    tokens = rng.integers(0, model.config.vocab_size, (len(LENGTHS), length))
    tokens[tokens == pad] = pad + 1
    mask = np.arange(length)[None, :] < np.array(LENGTHS)[:, None]
    types = mask & (np.arange(length)[None, :] >= np.array(LENGTHS)[:, None] // 2)
    return np.where(mask, tokens, pad), mask.astype(np.int64), types.astype(np.int64)


def ptmjax_logits(model: nn.Module, params, tokens, types) -> dict[str, np.ndarray]:
    inputs = {"input_tokens": jnp.asarray(tokens, jnp.int32)}
    if not isinstance(model, GPT2ForSequenceClassification):
        inputs["token_type_ids"] = jnp.asarray(types, jnp.int32)
    out = model.apply({"params": params}, **inputs)
    if isinstance(model, EncoderForQuestionAnswering):
        return {"start_logits": np.asarray(out.start_logits), "end_logits": np.asarray(out.end_logits)}
    return {"logits": np.asarray(out)}


def hf_logits(hf_model, model: nn.Module, tokens, mask, types) -> dict[str, np.ndarray]:
    inputs = {"input_ids": torch.tensor(tokens), "attention_mask": torch.tensor(mask)}
    if not isinstance(model, GPT2ForSequenceClassification):
        inputs["token_type_ids"] = torch.tensor(types)
    with torch.no_grad():
        out = hf_model(**inputs)
    names = ("start_logits", "end_logits") if isinstance(model, EncoderForQuestionAnswering) else ("logits",)
    return {name: getattr(out, name).numpy() for name in names}


def max_diff(model: nn.Module, params, hf_model) -> float:
    tokens, mask, types = padded_batch(model)
    ours, theirs = ptmjax_logits(model, params, tokens, types), hf_logits(hf_model, model, tokens, mask, types)
    assert set(ours) == set(theirs)
    diffs = []
    for name in ours:
        assert ours[name].shape == theirs[name].shape, name
        diff = np.abs(ours[name] - theirs[name])
        per_token = isinstance(model, (EncoderForTokenClassification, EncoderForQuestionAnswering))
        diffs.append(float(np.max(diff[mask.astype(bool)] if per_token else diff)))
    return max(diffs)


def perturbed(hf_model):
    """LayerNorms and biases moved off (1, 0) by N(0, 0.2^2), other weights scaled up from std 0.02 to 0.1."""
    with torch.no_grad():
        for name, param in hf_model.named_parameters():
            if "LayerNorm" in name or "layer_norm" in name or "ln_" in name or name.endswith("bias"):
                param.add_(0.2 * torch.randn_like(param))
            else:
                param.mul_(5.0)
    return hf_model.eval()


def random_params(model: nn.Module) -> dict:
    """N(0, 0.2^2) weights, LayerNorm scales 1 + N(0, 0.2^2), drawn in numpy."""
    rng = np.random.default_rng(1)
    shapes = nn.unbox(model_api(model).abstract_params)
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: np.float32(path[-1].key == "scale") + 0.2 * rng.standard_normal(leaf.shape, np.float32),
        shapes,
    )


@pytest.mark.parametrize("name", sorted(MODELS))
def test_import_matches_transformers(tmp_path, name):
    model = MODELS[name]
    torch.manual_seed(0)
    hf_model = perturbed(hf_task_heads.build_hf_model(model))
    hf_model.save_pretrained(tmp_path)
    loaded, params = hf.load(str(tmp_path))
    assert type(loaded) is type(model) and loaded.config == model.config
    assert {f.name: getattr(loaded, f.name) for f in dataclasses.fields(model)} == {
        f.name: getattr(model, f.name) for f in dataclasses.fields(model)
    }
    diff = max_diff(loaded, params, hf_model)
    print(f"import {name}: max |ours - HF| = {diff:.2e}")
    assert diff < 1e-5


@pytest.mark.parametrize("name", sorted(MODELS))
def test_export_loads_in_transformers_as_the_head_class(tmp_path, name):
    model = MODELS[name]
    params = random_params(model)
    hf.save(model, params, str(tmp_path))
    hf_config = json.loads((tmp_path / "config.json").read_text())
    class_name = hf_task_heads.task_class_of_model(model).name
    assert hf_config["architectures"] == [class_name]
    if not isinstance(model, EncoderForQuestionAnswering):
        assert len(hf_config["id2label"]) == model.num_labels
    hf_model, info = getattr(transformers, class_name).from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    diff = max_diff(model, params, hf_model.eval())
    print(f"export {name}: max |ours - HF| = {diff:.2e}")
    assert diff < 1e-5


def test_convert_cli_round_trip_keeps_the_head(tmp_path):
    """`ptmjax convert --from-hf` then `--to-hf`: the model folder's config.gin rebuilds num_labels and the
    classifier dropout, and the exported weights equal the imported ones."""
    model = EncoderForSequenceClassification(ENCODERS["electra"], num_labels=4, classifier_dropout_rate=0.25)
    torch.manual_seed(0)
    hf_model = perturbed(hf_task_heads.build_hf_model(model))
    hf_model.save_pretrained(tmp_path / "hf")
    checkpoint.import_hf(str(tmp_path / "hf"), str(tmp_path / "model"))
    checkpoint.export_hf(str(tmp_path / "model"), str(tmp_path / "out"))
    reloaded = transformers.ElectraForSequenceClassification.from_pretrained(tmp_path / "out")
    assert reloaded.config.num_labels == 4 and reloaded.config.classifier_dropout == 0.25
    for key, value in hf_model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[key], value), key


def test_unsupported_problem_type_is_refused():
    config = hf_task_heads.to_hf_config(MODELS["bert_sequence"]).to_dict()
    config["problem_type"] = "multi_label_classification"
    with pytest.raises(ValueError, match="problem_type='multi_label_classification'"):
        hf_task_heads.from_hf_config(config)
