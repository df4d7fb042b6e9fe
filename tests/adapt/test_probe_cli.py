"""`ptmjax probe` on a tiny BERT model folder (stdlib SentencePiece vocabulary): the files it writes, a table row
per layer, statistics per layer and head, and the cloze set's size counted here independently."""

from __future__ import annotations

import csv
import json

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from ptmjax import cli
from ptmjax.convert.checkpoint import model_gin
from ptmjax.data import vocabularies
from ptmjax.models import Bert, BertConfig
from ptmjax.storage.model_dir import ModelDir
from ptmjax.tasks import question_answering

CONFIG = BertConfig(vocab_size=2100, d_model=32, num_heads=2, num_layers=2, d_ff=64, max_length=40, nsp_head=False,
                    dropout_rate=0.0, attention_dropout_rate=0.0)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_bert_folder(path):
    model = Bert(CONFIG)
    params = nn.unbox(jax.jit(model.init)(jax.random.key(0), jnp.ones((1, 4), jnp.int32))["params"])
    folder = ModelDir(str(path))
    path.mkdir()
    (path / "config.gin").write_text(model_gin(model) + "train.mixture_or_task_name = 'ptmjax_stdlib_mlm'\n")
    checkpointer = folder.checkpointer(asynchronous=False)
    checkpointer.save_params(0, jax.tree.map(np.asarray, params))
    checkpointer.close()


def single_token_clozes(max_length):
    """Validation questions whose answer is one SentencePiece id and whose row ([MASK] for the blank, EOS) fits."""
    vocabulary = vocabularies.stdlib_sentencepiece_vocabulary()
    count = 0
    for question in question_answering.cloze_questions("validation"):
        blank_first = question.question[0] == question_answering.BLANK
        answer = vocabulary.encode(question.answer if blank_first else " " + question.answer)
        words = [w for w in question.question if w != question_answering.BLANK]
        length = sum(len(vocabulary.encode(w if i == 0 and not blank_first else " " + w)) for i, w in enumerate(words))
        count += len(answer) == 1 and length + 2 <= max_length  # + the blank and EOS
    return count


def test_probe_writes_tables_arrays_and_plots(tmp_path, capsys):
    write_bert_folder(tmp_path / "bert")
    out = tmp_path / "probe"
    args = ["probe", "--model_dir", str(tmp_path / "bert"), "--out", str(out), "--max_length", "32",
            "--attention_examples", "20", "--attention_maps", "3"]
    assert cli.main(args) == 0
    printed = capsys.readouterr().out
    print(printed)
    table = json.loads((out / "layer_probe.json").read_text())
    assert [row["layer"] for row in table["layers"]] == [0, 1, 2]
    assert table["task"] == "ptmjax_stdlib_module_classification_head"
    assert abs(table["majority_class_accuracy"] - 100 / 12) < 1e-9  # balanced classes: the first one is the majority
    with open(out / "layer_probe.csv") as f:
        assert [int(row["layer"]) for row in csv.DictReader(f)] == [0, 1, 2]
    statistics = np.load(out / "attention_statistics.npz")
    assert sorted(statistics) == ["entropy", "max_weight", "to_first_token", "to_special_tokens"]
    assert all(statistics[name].shape == (2, 2) for name in statistics)
    assert np.all(statistics["max_weight"] <= 1) and np.all(statistics["entropy"] >= 0)
    maps = np.load(out / "attention_maps.npz")
    assert maps["attention"].shape == (3, 2, 2, 32, 32) and maps["tokens"].shape == (3, 32)
    np.testing.assert_allclose(maps["attention"].sum(-1), 1.0, atol=1e-5)
    cloze = json.loads((out / "cloze.json").read_text())
    assert cloze["questions"] == 221 and cloze["kept"] == single_token_clozes(32) == len(cloze["clozes"])
    assert 0 <= cloze["precision_at_1"] <= cloze["precision_at_10"] <= 1
    for name in ("layer_probe.png", "attention_statistics.png", "attention_example.png"):
        assert (out / name).read_bytes()[:8] == PNG_SIGNATURE
    assert "validation acc" in printed and f"{cloze['kept']} of 221 validation questions" in printed
