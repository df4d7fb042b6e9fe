"""The module-classification task (balanced, disjoint splits, batches, rank classification) and the BERT-style task."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ptmjax.data import pipeline, vocabularies
from ptmjax.evaluation import rank_classification as evaluation
from ptmjax.models import EncoderDecoder, T5Config
from ptmjax.tasks import module_classification, objective_mixture

LENGTHS = {"inputs": 64, "targets": 16}


def test_module_classification_splits_are_balanced_and_disjoint():
    labels = module_classification.module_labels()
    train = module_classification.module_classification_examples("train")
    validation = module_classification.module_classification_examples("validation")
    assert len(labels) == module_classification.NUM_MODULES == len(set(labels))
    for examples in (train, validation):
        counts = collections.Counter(module for _, module in examples)
        assert set(counts) == set(labels) and len(set(counts.values())) == 1, counts
    assert collections.Counter(m for _, m in validation)[labels[0]] == module_classification.VALIDATION_PER_MODULE
    assert not {text for text, _ in train} & {text for text, _ in validation}


def test_module_classification_yields_packed_batches_of_module_names():
    dataset = pipeline.get_dataset(module_classification.MODULE_TASK, "train", LENGTHS, 8, seed=0, shuffle=True)
    batch = next(dataset.as_numpy_iterator())
    assert set(batch) == set(pipeline.ENCDEC_FEATURES + pipeline.PACKING_FEATURES)
    assert batch["encoder_input_tokens"].shape == (8, 64) and batch["decoder_target_tokens"].shape == (8, 16)
    vocabulary = vocabularies.stdlib_sentencepiece_vocabulary()
    targets, segments = batch["decoder_target_tokens"][0], batch["decoder_segment_ids"][0]
    first = vocabulary.decode(targets[segments == 1].tolist())
    assert first in module_classification.module_labels()


def test_rank_classification_over_the_task_with_a_tiny_random_t5():
    config = T5Config(vocab_size=2100, d_model=16, num_heads=2, head_dim=8, d_ff=32, num_encoder_layers=1,
                      num_decoder_layers=1, ffn_activations=("relu",), tie_embeddings=True, dropout_rate=0.0)
    model = EncoderDecoder(config)
    tokens = jnp.ones((1, 1), jnp.int32)
    params = jax.jit(model.init)(jax.random.key(0), tokens, tokens)["params"]
    labels = module_classification.module_labels()
    result = evaluation.rank_classification(
        model, params, module_classification.MODULE_TASK, "validation", labels, LENGTHS, batch_size=40
    )  # 96 examples: the last batch is padded
    gold = [labels.index(module) for _, module in module_classification.module_classification_examples("validation")]
    np.testing.assert_array_equal(result.labels, gold)
    assert result.predictions.shape == (96,) and result.accuracy == np.mean(result.predictions == result.labels)

    batch = next(pipeline.get_dataset(module_classification.MODULE_TASK, "validation", LENGTHS, 4, seed=0,
                                      shuffle=False, pack=False).as_numpy_iterator())
    candidates = evaluation.encode_candidates(vocabularies.stdlib_sentencepiece_vocabulary(), labels, 16)
    inputs = [row[row != 0] for row in batch["encoder_input_tokens"]]
    scores = evaluation.candidate_log_likelihoods(model, params, inputs, candidates, LENGTHS)
    np.testing.assert_array_equal(result.predictions[:4], np.argmax(scores, axis=1))
    with pytest.raises(ValueError, match="not among the candidates"):
        evaluation.rank_classification(model, params, module_classification.MODULE_TASK, "validation", labels[1:],
                                       LENGTHS)


def test_bert_style_inputs_are_masked_targets_are_the_text():
    lengths = {"inputs": 64, "targets": 64}
    dataset = pipeline.get_dataset(objective_mixture.BERT_STYLE_TASK, "train", lengths, 16, seed=0, shuffle=False,
                                   pack=False)
    batch = next(dataset.as_numpy_iterator())
    inputs, targets = batch["encoder_input_tokens"], batch["decoder_target_tokens"]
    assert np.array_equal(inputs != 0, targets != 0) and (targets[:, -1] == 1).all()  # full pieces end in EOS
    changed = (inputs != targets).sum() / (targets > 1).sum()
    assert 0.10 < changed < 0.16, changed  # 15% selected, 90% of those changed
    assert ((inputs == 2099) | (inputs == targets) | (inputs < 2000)).all()  # mask: <extra_id_0>
    with pytest.raises(ValueError, match="targets length 32 must be at least the inputs length 64"):
        next(pipeline.get_dataset(objective_mixture.BERT_STYLE_TASK, "train", {"inputs": 64, "targets": 32}, 2,
                                  seed=0, shuffle=False).as_numpy_iterator())


@pytest.mark.slow
def test_every_gin_run_registers_the_downstream_tasks():
    """A fresh process that imports what gin files rely on knows the tasks by name, with no extra import."""
    import subprocess
    import sys

    code = "import ptmjax.configurables, seqio; print(seqio.TaskRegistry.names())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    for task in ("ptmjax_stdlib_module_classification", "ptmjax_stdlib_module_classification_head",
                 "ptmjax_stdlib_code_tagging", "ptmjax_stdlib_code_qa"):
        assert repr(task) in out
