"""Module classification with class ids: the text-to-text task's examples and splits, features, the chance level."""

import collections

import numpy as np
import pytest
import seqio

from ptmjax.data import vocabularies
from ptmjax.tasks import classification_head, module_classification


def test_examples_are_the_text_to_text_tasks_with_class_ids():
    labels = module_classification.module_labels()
    for split, size in (("train", 276), ("validation", 96)):
        examples = classification_head.labelled_examples(split)
        text_to_text = module_classification.module_classification_examples(split)
        assert [(text, labels[label]) for text, label in examples] == list(text_to_text) and len(examples) == size
        assert set(collections.Counter(label for _, label in examples).values()) == {size // 12}
    train, validation = (classification_head.labelled_examples(split) for split in ("train", "validation"))
    assert not {text for text, _ in train} & {text for text, _ in validation}


def test_seqio_dataset_has_inputs_ending_in_eos_and_a_scalar_label():
    task = seqio.get_mixture_or_task(classification_head.MODULE_HEAD_TASK)
    examples = list(task.get_dataset({"inputs": 32}, split="validation", shuffle=False).as_numpy_iterator())
    vocabulary = vocabularies.stdlib_sentencepiece_vocabulary()
    expected = classification_head.labelled_examples("validation")
    assert len(examples) == 96
    for example, (text, label) in zip(examples, expected, strict=True):
        assert example["label"].dtype == example["inputs"].dtype == np.int32 and example["label"].shape == ()
        assert example["label"] == label and example["inputs_pretokenized"].decode() == text
        ids = vocabulary.encode(text)
        np.testing.assert_array_equal(example["inputs"], [*ids[:31], 1])  # cut to 31 ids, then EOS
    assert classification_head.label_postprocessor(7, {"label": np.int32(3)}, is_target=True) == 3
    assert classification_head.label_postprocessor(np.int64(7)) == 7


def test_majority_class_chance_level_is_one_in_twelve():
    assert classification_head.majority_class_baseline() == {"accuracy": pytest.approx(100 / 12)}


def test_with_an_imported_tokenizer_the_inputs_are_what_transformers_gives_one_text(tmp_path):
    """A BERT folder's WordPiece: [CLS] text [SEP], the text cut so that the whole fits, as tokenizer(text,
    truncation=True, max_length=16); re-registered with the stdlib vocabulary afterwards."""
    transformers = pytest.importorskip("transformers")
    from hf_folders import wordpiece_tokenizer

    from ptmjax.data import tokenizer_dir

    tokenizer = wordpiece_tokenizer(transformers.BertTokenizer)
    tokenizer.save_pretrained(tmp_path)
    try:
        task = classification_head.register_module_head_task(tokenizer_dir.read_vocabulary(str(tmp_path)))
        examples = list(task.get_dataset({"inputs": 16}, split="validation", shuffle=False).as_numpy_iterator())
    finally:
        classification_head.register_module_head_task()
    texts = [text for text, _ in classification_head.labelled_examples("validation")]
    want = tokenizer(texts, truncation=True, max_length=16)["input_ids"]
    assert [list(example["inputs"]) for example in examples] == want
    assert {ids[0] for ids in want} == {tokenizer.cls_token_id}
    assert {ids[-1] for ids in want} == {tokenizer.sep_token_id}
    assert max(map(len, want)) == 16 and [e["inputs_pretokenized"].decode() for e in examples] == texts
