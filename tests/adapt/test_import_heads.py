"""An imported encoder fine-tunes each head from gin alone (runs/import_classify.gin, import_tagging.gin,
import_qa.gin): the backbone starts as the import's parameters, the head fresh, and the task reads its text as
the import's tokenizer encodes it (one text [CLS] ... [SEP]; a question and its context as a pair)."""

import gin
import numpy as np
import pytest
import seqio

from ptmjax import cli, gin_files
from ptmjax.families.model_api import model_api
from ptmjax.storage.model_dir import ModelDir
from ptmjax.tasks import classification_head, question_answering, tagging
from ptmjax.tree_paths import leaves_by_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow  # an import and a 2-step fine-tuning run with its evaluation: about a minute each
LENGTH = 128


def folder_params(path) -> dict[str, np.ndarray]:
    folder = ModelDir(str(path))
    model, _ = gin_files.read_model_config(folder)
    return dict(leaves_by_path(folder.read_params(model_api(model).abstract_params)))


def saved_import(hf_dir, family: str):
    """A random BERT or RoBERTa masked LM with its tokenizer in `hf_dir`; returns the (slow) tokenizer."""
    from hf_folders import SMALL_BERT, byte_level_bpe, saved, wordpiece_tokenizer

    torch.manual_seed(0)
    if family == "roberta":
        tokenizer = byte_level_bpe(transformers.RobertaTokenizer, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
        saved(hf_dir, tokenizer, transformers.RobertaForMaskedLM(transformers.RobertaConfig(
            vocab_size=len(tokenizer), max_position_embeddings=LENGTH + 2, **SMALL_BERT)))
    else:
        tokenizer = wordpiece_tokenizer(transformers.BertTokenizer)
        saved(hf_dir, tokenizer, transformers.BertForMaskedLM(transformers.BertConfig(
            vocab_size=len(tokenizer), max_position_embeddings=LENGTH, **SMALL_BERT)))
    return tokenizer


def classify_reference(tokenizer, example):
    return tokenizer(example["inputs_pretokenized"].decode(), truncation=True, max_length=LENGTH)["input_ids"]


def tagging_reference(tokenizer, example):
    words, _ = tagging.word_tags("validation")[0]  # the first example: tagging drops none
    return tokenizer(" ".join(words), truncation=True, max_length=LENGTH)["input_ids"]


def qa_reference(tokenizer, example):
    return tokenizer(example["question"].decode(), example["context"].decode(), truncation="only_second",
                     max_length=LENGTH)["input_ids"]


RUNS = {  # gin file: (the import's family, the task, its metric, the register function, the first example's ids)
    "import_classify": ("bert", classification_head.MODULE_HEAD_TASK, "accuracy",
                        classification_head.register_module_head_task, classify_reference),
    "import_tagging": ("bert", tagging.TAGGING_TASK, "span_f1", tagging.register_tagging_task, tagging_reference),
    "import_qa": ("roberta", question_answering.QA_TASK, "f1", question_answering.register_qa_task, qa_reference),
}


@pytest.mark.parametrize("run_file", sorted(RUNS))
def test_an_import_fine_tunes_a_head_on_its_own_tokenizer_from_the_gin_file(tmp_path, run_file):
    family, task_name, metric, register, reference = RUNS[run_file]
    tokenizer = saved_import(tmp_path / "hf", family)
    imported, run = tmp_path / "imported", tmp_path / "run"
    assert cli.main(["convert", "--from-hf", str(tmp_path / "hf"), "--to", str(imported)]) == 0
    bindings = [f"IMPORT = '{imported}'", "train.num_steps = 2", "train.eval_every = 2", "train.eval_batches = 1",
                "train.show_progress = False", "slanted_triangular.peak_learning_rate = 0.0",
                f"train.task_feature_lengths = {{'inputs': {LENGTH}}}"]
    try:
        assert cli.main(["train", f"--gin_file={imported / 'config.gin'}", f"--gin_file=runs/{run_file}.gin",
                         f"--model_dir={run}", *(f"--gin_bindings={b}" for b in bindings)]) == 0
        task = seqio.get_mixture_or_task(task_name)
        first = next(task.get_dataset({"inputs": LENGTH}, split="validation", shuffle=False).as_numpy_iterator())
    finally:
        gin.clear_config()
        register()
    assert list(first["inputs"]) == reference(tokenizer, first)
    backbone, tuned = folder_params(imported), folder_params(run)
    heads = sorted(path for path in tuned if path not in backbone)
    assert heads and all(path in tuned for path in backbone if not path.startswith(("mlm_head", "pair_head")))
    for path, value in backbone.items():
        if path in tuned:  # with a learning rate of 0 the backbone stays the import's
            np.testing.assert_array_equal(tuned[path], value, err_msg=path)
    assert f"{task_name}/{metric}" in (run / "metrics.jsonl").read_text()
