"""Hugging Face checkpoint directories: `ptmjax.convert.hf.load/save` and `ptmjax convert`.

Random tiny transformers models are saved with save_pretrained, imported,
exported again and reloaded by transformers: every tensor must come back
bit-identical. Logit parity of each converter is tested in tests/models/.
"""

import dataclasses
import json
import os

import flax.linen as nn
import gin
import jax
import numpy as np
import pytest

from ptmjax import cli, gin_files
from ptmjax.families.model_api import model_api
from ptmjax.models import AlbertConfig, BartConfig, BertConfig, ElectraConfig, GPT2Config, T5Config
from ptmjax.storage.model_dir import ModelDir

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from ptmjax.convert import hf, hf_albert, hf_bart, hf_bert, hf_electra, hf_gpt2, hf_t5  # noqa: E402

BERT = BertConfig(vocab_size=99, d_model=24, num_heads=3, num_layers=2, d_ff=40, max_length=32)
GPT2 = GPT2Config(vocab_size=2176, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_length=64)
T5 = T5Config(
    vocab_size=120, d_model=24, num_heads=3, head_dim=10, d_ff=40, num_encoder_layers=2, num_decoder_layers=1,
    ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.1,
)
BART = BartConfig(
    vocab_size=101, d_model=24, num_heads=3, num_encoder_layers=2, num_decoder_layers=1, d_ff=40, max_length=24,
)
ALBERT = AlbertConfig(
    vocab_size=99, embedding_size=16, d_model=24, num_heads=3, num_layers=3, d_ff=40, max_length=32,
)
ELECTRA = ElectraConfig(
    vocab_size=99, embedding_size=16, d_model=24, num_heads=3, num_layers=2, d_ff=40, max_length=32,
)
# name -> (converter, config, build_hf_model kwargs)
MODELS = {
    "t5_v1_1": (hf_t5, T5),
    "gpt2": (hf_gpt2, GPT2),
    "bart": (hf_bart, BART),
    "mbart": (hf_bart, dataclasses.replace(BART, pre_layer_norm=True, scale_embedding=True)),
    "albert_pretraining": (hf_albert, ALBERT),
    "albert_mlm": (hf_albert, dataclasses.replace(ALBERT, sop_head=False)),
    "electra_discriminator": (hf_electra, ELECTRA, {"role": "discriminator"}),
    "electra_generator": (hf_electra, ELECTRA, {"role": "generator"}),
    "bert_pretraining": (hf_bert, BERT),
    "bert_mlm": (hf_bert, dataclasses.replace(BERT, nsp_head=False)),
    "roberta": (hf_bert, dataclasses.replace(BERT, pad_token_id=1, positions_after_padding=True, nsp_head=False)),
}


def saved_hf_model(name: str, directory, **save_kwargs):
    converter, config, *role = MODELS[name]
    torch.manual_seed(0)
    model = converter.build_hf_model(config, **(role[0] if role else {})).eval()
    model.save_pretrained(directory, **save_kwargs)
    return model


def assert_same_weights(reloaded, original) -> None:
    want, got = original.state_dict(), reloaded.state_dict()
    assert set(got) == set(want)
    for key, value in want.items():
        assert torch.equal(got[key], value), key


@pytest.mark.parametrize("name", sorted(MODELS))
def test_load_then_save_round_trips_through_transformers(tmp_path, name):
    converter, config, *role = MODELS[name]
    original = saved_hf_model(name, tmp_path / "hf")
    model, params = hf.load(str(tmp_path / "hf"))
    assert model.config == config
    want = converter.hf_to_params(original.state_dict(), config, **(role[0] if role else {}))["params"]
    jax.tree.map(np.testing.assert_array_equal, params, want)
    hf.save(model, params, str(tmp_path / "out"))
    with open(tmp_path / "out" / "config.json") as f:
        assert json.load(f)["architectures"] == [type(original).__name__]
    assert_same_weights(type(original).from_pretrained(tmp_path / "out"), original)


def test_sharded_safetensors_and_pytorch_bin_and_bfloat16_read_the_same(tmp_path):
    original = saved_hf_model("bert_pretraining", tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / hf.SAFETENSORS_INDEX).exists()
    _, sharded = hf.load(str(tmp_path / "sharded"))
    os.makedirs(tmp_path / "bin")
    original.config.save_pretrained(tmp_path / "bin")
    torch.save(original.state_dict(), tmp_path / "bin" / hf.PYTORCH)
    _, from_bin = hf.load(str(tmp_path / "bin"))
    jax.tree.map(np.testing.assert_array_equal, from_bin, sharded)
    original.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    _, from_bf16 = hf.load(str(tmp_path / "bf16"))
    assert all(leaf.dtype == np.float32 for leaf in jax.tree.leaves(from_bf16))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-2, atol=1e-2), from_bf16, sharded)


def test_bad_directories_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        hf.load(str(tmp_path))
    saved_hf_model("bert_pretraining", tmp_path / "hf")
    config_path = tmp_path / "hf" / "config.json"
    config = json.loads(config_path.read_text())
    for change, message in (
        ({"architectures": ["BertForMultipleChoice"]}, "imports bert checkpoints of BertForPreTraining"),
        ({"model_type": "reformer"}, "model_type='reformer'"),
        ({"position_embedding_type": "relative_key"}, "position_embedding_type='relative_key'"),
    ):
        config_path.write_text(json.dumps({**config, **change}))
        with pytest.raises(ValueError, match=message):
            hf.load(str(tmp_path / "hf"))
    config_path.write_text(json.dumps(config))
    os.remove(tmp_path / "hf" / hf.SAFETENSORS)
    with pytest.raises(FileNotFoundError, match="has no model.safetensors"):
        hf.load(str(tmp_path / "hf"))


@pytest.mark.slow
def test_cli_convert_both_ways_and_fine_tune_from_the_import(tmp_path):
    original = saved_hf_model("gpt2", tmp_path / "hf")
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    assert cli.main(["convert", "--from-hf", str(tmp_path / "hf"), "--to", ckpt]) == 0
    assert "GPT2Config.d_model = 32" in (tmp_path / "ckpt" / "config.gin").read_text()
    assert cli.main(["convert", "--from", ckpt, "--to-hf", out]) == 0
    assert_same_weights(type(original).from_pretrained(out), original)

    # Fine-tuning starts from the imported parameters: with a zero learning rate they stay exactly.
    imported = ModelDir(ckpt).read_params(model_api(hf.load(str(tmp_path / "hf"))[0]).abstract_params)
    gin_files.parse_gin(
        ["runs/gpt2_demo.gin", os.path.join(ckpt, "config.gin")],  # the imported config wins
        [f"train.init_checkpoint = '{ckpt}'", "train.task_feature_lengths = {'targets': 32}", "train.batch_size = 8",
         "train.num_steps = 2", "train.eval_batches = 1", "train.show_progress = False",
         "warmup_cosine.peak_learning_rate = 0.0", "warmup_cosine.warmup_steps = 1"],
    )
    try:
        from ptmjax.training import run

        run.train(str(tmp_path / "finetune"))
    finally:
        gin.clear_config()
    abstract = model_api(hf.load(str(tmp_path / "hf"))[0]).abstract_params
    tuned = ModelDir(str(tmp_path / "finetune")).read_params(abstract)
    jax.tree.map(np.testing.assert_array_equal, tuned, imported)


def test_joint_electra_saves_generator_and_discriminator_sharing_embeddings(tmp_path):
    from ptmjax.models import ElectraPretraining, ElectraPretrainingConfig

    config = ElectraPretrainingConfig(
        generator=dataclasses.replace(ELECTRA, d_model=12, num_heads=3, d_ff=20), discriminator=ELECTRA
    )
    params = jax.device_get(nn.unbox(model_api(ElectraPretraining(config)).init(jax.random.key(0))))
    hf.save(ElectraPretraining(config), params, str(tmp_path))
    want = hf_electra.pretraining_to_hf(params, config)
    for role, hf_class in (("generator", "ElectraForMaskedLM"), ("discriminator", "ElectraForPreTraining")):
        reloaded = getattr(transformers, hf_class).from_pretrained(tmp_path / role).state_dict()
        assert set(reloaded) == set(want[role])
        for key, value in want[role].items():
            np.testing.assert_array_equal(reloaded[key].numpy(), value, err_msg=f"{role} {key}")
    embeddings = "electra.embeddings.word_embeddings.weight"
    np.testing.assert_array_equal(want["generator"][embeddings], want["discriminator"][embeddings])


BASE_MODELS = {  # HF base class -> (the MODELS entry of its config, what its import initialises afresh, leaves out)
    "BertModel": ("bert_pretraining", "cls.", None), "RobertaModel": ("roberta", "lm_head.", "roberta.pooler."),
    "GPT2Model": ("gpt2", None, None), "BartModel": ("bart", "final_logits_bias", None),
    "MBartModel": ("mbart", "final_logits_bias", None), "T5Model": ("t5_v1_1", "lm_head.", None),
    "AlbertModel": ("albert_pretraining", "predictions.", None),
    "ElectraModel": ("electra_discriminator", "discriminator_predictions.", None),
}


@pytest.mark.parametrize("base_class", sorted(BASE_MODELS))
def test_base_model_classes_import_with_a_fresh_head_and_export_a_backbone_transformers_reads(
        tmp_path, capsys, base_class):
    """A base-model checkpoint (keys without the head class's prefix, no head) imports as the pre-training
    class, naming what it initialises afresh and what it leaves out (RoBERTa's pooler, which RobertaForMaskedLM
    has not); exported, transformers' base class reads back every tensor it kept."""
    name, fresh, left_out = BASE_MODELS[base_class]
    converter, config, *_ = MODELS[name]
    torch.manual_seed(0)
    original = getattr(transformers, base_class)(converter.to_hf_config(config)).eval()
    original.save_pretrained(tmp_path / "hf")
    model, params = hf.load(str(tmp_path / "hf"))
    out = capsys.readouterr().out
    assert f"Imported a {base_class} as a " in out
    assert (f"newly initialised: {fresh}" in out) if fresh else ("newly initialised" not in out), out
    assert (f"left out: {left_out}" in out) if left_out else ("left out" not in out), out
    hf.save(model, params, str(tmp_path / "out"))
    got = getattr(transformers, base_class).from_pretrained(tmp_path / "out").state_dict()
    kept = {key: value for key, value in original.state_dict().items()
            if not (left_out and key.startswith(left_out.split(".", 1)[1]))}
    assert set(got) == set(original.state_dict()) and len(kept) > 10
    for key, value in kept.items():
        assert torch.equal(got[key], value), key
