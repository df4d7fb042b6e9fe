"""MPNet folders through `ptmjax.convert.hf` and `ptmjax convert`: MPNetForMaskedLM (with its WordPiece
tokenizer, which `ptmjax.load` encodes, embeds and fills masks with as transformers does) and MPNetModel
import and export bit-identically; an MPNet pre-training run exports as an
MPNetForMaskedLM that computes what the run's encoder computes. Logit parity: tests/models/test_mpnet_parity.py."""

import json

import gin
import jax
import numpy as np
import pytest
from hf_folders import saved, trained
from tokenizers import models, pre_tokenizers, trainers

import ptmjax
from ptmjax import cli, gin_files
from ptmjax.families.model_api import model_api
from ptmjax.models import MPNet, MPNetConfig
from ptmjax.storage.model_dir import ModelDir

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from test_hf_directories import assert_same_weights  # noqa: E402

from ptmjax.convert import hf, hf_mpnet  # noqa: E402

CONFIG = MPNetConfig(vocab_size=300, d_model=24, num_heads=3, num_layers=2, d_ff=40, max_length=66, pad_token_id=1,
                     positions_after_padding=True, layer_norm_epsilon=1e-5)
TEXTS = ["Return the sum of a and b.", "Open a file, read it and close it again: 3 times."]


def mpnet_tokenizer():
    """MPNetTokenizer over a WordPiece trained here, its special tokens where MPNet's are (<s> 0, <pad> 1, </s> 2)."""
    trainer = trainers.WordPieceTrainer(vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "[UNK]", "<mask>"])
    vocab = trained(models.WordPiece(unk_token="[UNK]"), trainer, pre_tokenizers.BertPreTokenizer())["vocab"]
    return transformers.MPNetTokenizer(vocab=vocab)


def saved_mpnet(directory, model_class=None):
    torch.manual_seed(0)
    model = hf_mpnet.build_hf_model(CONFIG) if model_class is None else model_class(hf_mpnet.to_hf_config(CONFIG))
    model.eval().save_pretrained(directory)
    return model


def test_load_then_save_round_trips_through_transformers(tmp_path):
    original = saved_mpnet(tmp_path / "hf")
    model, params = hf.load(str(tmp_path / "hf"))
    assert type(model) is MPNet and model.config == CONFIG
    jax.tree.map(np.testing.assert_array_equal, params, hf_mpnet.hf_to_params(original.state_dict(), CONFIG)["params"])
    hf.save(model, params, str(tmp_path / "out"))
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == ["MPNetForMaskedLM"]
    assert_same_weights(transformers.MPNetForMaskedLM.from_pretrained(tmp_path / "out"), original)


def test_a_base_model_imports_with_a_fresh_head_and_exports_the_same_backbone(tmp_path):
    original = saved_mpnet(tmp_path / "hf", transformers.MPNetModel)
    model, params = hf.load(str(tmp_path / "hf"))
    assert type(model) is MPNet
    hf.save(model, params, str(tmp_path / "out"))
    backbone = transformers.MPNetModel.from_pretrained(tmp_path / "out")
    want = {k: v for k, v in original.state_dict().items() if not k.startswith("pooler.")}  # ptmjax has no pooler
    got = backbone.state_dict()
    for key, value in want.items():
        assert torch.equal(got[key], value), key


def test_cli_convert_both_ways_with_the_tokenizer(tmp_path):
    tokenizer = mpnet_tokenizer()
    assert (tokenizer.bos_token_id, tokenizer.pad_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    original = saved_mpnet(tmp_path / "unused")
    saved(tmp_path / "hf", tokenizer, original)
    folder = ModelDir(str(tmp_path / "imported"))
    assert cli.main(["convert", "--from-hf", str(tmp_path / "hf"), "--to", folder.path]) == 0
    assert "MPNetConfig.d_model = 24" in (tmp_path / "imported" / "config.gin").read_text()
    vocab = gin_files.folder_vocabulary(folder)
    for text in TEXTS:
        assert list(vocab.encode(text)) == tokenizer(text, add_special_tokens=False)["input_ids"]
    loaded = ptmjax.load(folder.path)  # tokenizes as transformers, with <s> ... </s>
    ids = loaded.tokenize(TEXTS)
    assert ids == tokenizer(TEXTS)["input_ids"]
    with torch.no_grad():
        want = [original.mpnet(torch.tensor([row])).last_hidden_state[0].numpy() for row in ids]
    assert max(np.abs(ours - ref).max() for ours, ref in zip(loaded.hidden_states(TEXTS), want, strict=True)) < 1e-5
    masked = ["Return the <mask> of a and b.", "Open a <mask>, read it."]
    for text, answers in zip(masked, loaded.fill_mask(masked, top_k=3), strict=True):
        row = tokenizer(text, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            top = original(row).logits[0, row[0].tolist().index(tokenizer.mask_token_id)].softmax(-1).topk(3)
        assert [token for token, _ in answers[0]] == [tokenizer.decode([i]) for i in top.indices.tolist()], text
        np.testing.assert_allclose([p for _, p in answers[0]], top.values.numpy(), atol=1e-6)
    out = tmp_path / "out"
    assert cli.main(["convert", "--from", folder.path, "--to-hf", str(out)]) == 0
    assert_same_weights(transformers.MPNetForMaskedLM.from_pretrained(out), original)
    assert transformers.AutoTokenizer.from_pretrained(out)(TEXTS)["input_ids"] == tokenizer(TEXTS)["input_ids"]


@pytest.mark.slow  # a short gin training run from the CLI
def test_a_pretraining_run_exports_as_the_mpnet_it_trained(tmp_path):
    bindings = ["train.task_feature_lengths = {'inputs': 32, 'targets': 5}", "train.batch_size = 8",
                "train.num_steps = 2", "train.eval_every = 2", "train.eval_batches = 1", "train.checkpoint_every = 2",
                "train.show_progress = False", "warmup_cosine.warmup_steps = 1", "warmup_cosine.total_steps = 2"]
    try:
        assert cli.main(["train", "--gin_file=runs/mpnet_demo.gin", f"--model_dir={tmp_path / 'run'}",
                         *(f"--gin_bindings={b}" for b in bindings)]) == 0
        model, _ = gin_files.read_model_config(ModelDir(str(tmp_path / "run")))
    finally:
        gin.clear_config()
    params = ModelDir(str(tmp_path / "run")).read_params(model_api(model).abstract_params)
    assert cli.main(["convert", "--from", str(tmp_path / "run"), "--to-hf", str(tmp_path / "out")]) == 0
    exported = transformers.MPNetForMaskedLM.from_pretrained(tmp_path / "out").eval()
    tokens = np.random.default_rng(0).integers(3, 2100, (2, 20))
    with torch.no_grad():
        want = exported(torch.tensor(tokens)).logits.numpy()
    got = MPNet(model.config).apply({"params": params}, tokens).mlm_logits
    np.testing.assert_allclose(np.asarray(got), want, atol=2e-5)
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "out") is not None  # the run's vocabulary
