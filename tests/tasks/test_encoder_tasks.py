"""The encoder-only tasks through the pipeline: masked LM and sentence pairs, converted for BERT-style models."""

import numpy as np
import pytest

from ptmjax.data import feature_converters, pipeline, vocabularies
from ptmjax.tasks import pretraining

LENGTHS = {"inputs": 64, "targets": 64}


def batches(task: str, converter, **kwargs) -> list[dict[str, np.ndarray]]:
    dataset = pipeline.get_dataset(
        task, "validation", LENGTHS, 4, seed=0, shuffle=False, pack=False, num_epochs=1, feature_converter=converter,
        **kwargs,
    )
    return list(dataset.as_numpy_iterator())


def test_sentence_pair_task_gives_bert_features():
    vocab_size = vocabularies.stdlib_sentencepiece_vocabulary().vocab_size
    out = batches(pretraining.STDLIB_NSP_TASK, feature_converters.SentencePairFeatureConverter, pad_final_batch=True)
    assert len(out) > 5
    for batch in out:
        assert set(batch) == {"input_tokens", "target_tokens", "loss_mask", "token_type_ids", "sentence_label"}
        assert all(v.dtype == np.int32 for v in batch.values())
        assert batch["sentence_label"].shape == (4,) and batch["input_tokens"].shape == (4, 64)
        real = batch["target_tokens"].any(axis=1)
        assert (batch["target_tokens"][real, 0] == vocab_size - 2).all()  # [CLS]
        assert not (batch["loss_mask"] & (batch["target_tokens"] == 0)).any()
        unselected = batch["loss_mask"] == 0
        assert (batch["input_tokens"][unselected] == batch["target_tokens"][unselected]).all()
        assert set(np.unique(batch["token_type_ids"])) <= {0, 1}
    labels = np.concatenate([b["sentence_label"][b["target_tokens"].any(axis=1)] for b in out])
    assert 0.3 < labels.mean() < 0.7


def test_masked_lm_task_gives_mlm_features():
    out = batches(pretraining.STDLIB_MLM_TASK, feature_converters.MaskedLmFeatureConverter)
    batch = out[0]
    assert set(batch) == {"input_tokens", "target_tokens", "loss_mask"}
    selected = np.concatenate([b["loss_mask"][b["target_tokens"] > 1] for b in out])
    assert 0.12 < selected.mean() < 0.18


def test_converters_refuse_packing_and_tasks_without_a_loss_mask():
    with pytest.raises(ValueError, match=r"does not pack.*train.pack = False"):
        feature_converters.MaskedLmFeatureConverter(pack=True)
    with pytest.raises(ValueError, match=r"needs task features \['loss_mask'\]"):
        batches(pretraining.STDLIB_TASK, feature_converters.MaskedLmFeatureConverter)
