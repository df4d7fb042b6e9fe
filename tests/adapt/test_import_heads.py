"""An imported BERT fine-tunes a classification head from gin alone (runs/import_classify.gin): the backbone
starts as the import's parameters, the head fresh, and the task reads each docstring as the import's tokenizer
encodes one text ([CLS] ... [SEP])."""

import gin
import numpy as np
import pytest
import seqio

from ptmjax import cli, gin_files
from ptmjax.families.model_api import model_api
from ptmjax.storage.model_dir import ModelDir
from ptmjax.tasks import classification_head
from ptmjax.tree_paths import leaves_by_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow  # an import and a 2-step fine-tuning run with its evaluation: about a minute


def folder_params(path) -> dict[str, np.ndarray]:
    folder = ModelDir(str(path))
    model, _ = gin_files.read_model_config(folder)
    return dict(leaves_by_path(folder.read_params(model_api(model).abstract_params)))


def test_an_imported_bert_fine_tunes_a_head_on_its_own_tokenizer_from_the_gin_file(tmp_path):
    from hf_folders import SMALL_BERT, saved, wordpiece_tokenizer

    tokenizer = wordpiece_tokenizer(transformers.BertTokenizer)
    torch.manual_seed(0)
    saved(tmp_path / "hf", tokenizer, transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=len(tokenizer), max_position_embeddings=128, **SMALL_BERT)))
    imported, run = tmp_path / "imported", tmp_path / "run"
    assert cli.main(["convert", "--from-hf", str(tmp_path / "hf"), "--to", str(imported)]) == 0
    bindings = [f"IMPORT = '{imported}'", "train.num_steps = 2", "train.eval_every = 2", "train.eval_batches = 1",
                "train.show_progress = False", "slanted_triangular.peak_learning_rate = 0.0"]
    try:
        assert cli.main(["train", f"--gin_file={imported / 'config.gin'}", "--gin_file=runs/import_classify.gin",
                         f"--model_dir={run}", *(f"--gin_bindings={b}" for b in bindings)]) == 0
        task = seqio.get_mixture_or_task(classification_head.MODULE_HEAD_TASK)
        first = next(task.get_dataset({"inputs": 128}, split="validation", shuffle=False).as_numpy_iterator())
    finally:
        gin.clear_config()
        classification_head.register_module_head_task()
    text = classification_head.labelled_examples("validation")[0][0]
    assert list(first["inputs"]) == tokenizer(text, truncation=True, max_length=128)["input_ids"]
    backbone, tuned = folder_params(imported), folder_params(run)
    heads = sorted(path for path in tuned if path.startswith("classifier"))
    assert heads and all(path in tuned for path in backbone if not path.startswith(("mlm_head", "pair_head")))
    for path, value in backbone.items():
        if path in tuned:  # with a learning rate of 0 the backbone stays the import's
            np.testing.assert_array_equal(tuned[path], value, err_msg=path)
    assert "ptmjax_stdlib_module_classification_head/accuracy" in (run / "metrics.jsonl").read_text()
