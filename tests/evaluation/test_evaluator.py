"""The evaluator against the model API run directly on hand-built rows, and the metric functions applied by hand.

Here a decoder-only GPT-2 (prefix LM rows) with random weights, scoring 4 positions at a time against the plain
`ModelApi.score`; the encoder-decoder (a trained T5) is checked the same way in test_eval_in_training_and_cli.py.
"""

import eval_tasks
import jax
import numpy as np
import pytest

from ptmjax import metrics, partitioning
from ptmjax.data import vocabularies
from ptmjax.decoding import DecodeConfig, GenerationIds
from ptmjax.evaluation.evaluator import InferenceEvaluator
from ptmjax.families.model_api import model_api
from ptmjax.models import GPT2
from ptmjax.models.gpt2 import GPT2Config

VOCAB = vocabularies.stdlib_sentencepiece_vocabulary()
GPT = GPT2(GPT2Config(
    vocab_size=2176, d_model=32, num_heads=4, num_layers=1, d_ff=64, max_length=48, dropout_rate=0.0,
    attention_dropout_rate=0.0,
))
DECODE = DecodeConfig(method="greedy", max_decode_length=8)


@pytest.fixture(scope="module", autouse=True)
def tasks():
    eval_tasks.register()
    yield
    eval_tasks.remove()


def test_mixture_predictions_metrics_and_scores_equal_the_model_api_by_hand():
    api = model_api(GPT)
    params = jax.jit(api.init)(jax.random.key(1))
    params = jax.tree.map(lambda x: x * 4.0 if x.ndim > 1 else x, jax.device_get(params))  # peaked: varied tokens
    ids = GenerationIds.from_vocabulary(VOCAB, encoder_decoder=False)
    mesh_config = partitioning.MeshConfig()
    evaluator = InferenceEvaluator(
        api, eval_tasks.MIXTURE, partitioning.make_mesh(mesh_config), mesh_config.rules, DECODE, ids, batch_size=8,
        task_feature_lengths=eval_tasks.LENGTHS, logits_chunk_size=4,
    )
    results = evaluator.evaluate(params, step=3)

    assert evaluator.num_examples() == {eval_tasks.PREDICT_TASK: 10, eval_tasks.SCORE_TASK: 10}
    assert_matches_the_model_api(results, api, params, eval_tasks.prefix_lm_rows(), ids)
    assert len(set(eval_tasks.RECORDED["predictions"])) > 1


def assert_matches_the_model_api(results, api, params, rows, ids, decode=DECODE):
    """The evaluator's results on the mixture and the predictions and scores its metrics recorded equal
    ModelApi.predict and score on the hand-built `rows` and the metric functions applied to them."""
    tokens = jax.jit(api.predict, static_argnums=(2, 3))(params, rows, decode, ids).tokens[:, 0]
    predictions = [VOCAB.decode(row.tolist()) for row in np.asarray(tokens)]
    targets = [target for _, target in eval_tasks.EXAMPLES]
    scores = np.asarray(jax.jit(api.score)(params, rows))

    assert sorted(results) == [eval_tasks.PREDICT_TASK, eval_tasks.SCORE_TASK]
    assert eval_tasks.RECORDED["predictions"] == predictions  # 10 rows: a full batch, then 2 of a padded one
    assert results[eval_tasks.PREDICT_TASK] == {**metrics.rouge(targets, predictions), "num_predictions": 10.0}
    np.testing.assert_allclose(eval_tasks.RECORDED["scores"], scores, rtol=1e-5)
    np.testing.assert_allclose(results[eval_tasks.SCORE_TASK]["mean_log_likelihood"], scores.mean(), rtol=1e-5)


def test_bad_settings_raise_one_line_errors():
    api = model_api(GPT)
    mesh_config = partitioning.MeshConfig()
    mesh = partitioning.make_mesh(mesh_config)
    ids = GenerationIds.from_vocabulary(VOCAB, encoder_decoder=False)

    def make(task=eval_tasks.PREDICT_TASK, **kwargs):
        return InferenceEvaluator(api, task, mesh, mesh_config.rules, DECODE, ids, **{"batch_size": 8, **kwargs})

    with pytest.raises(ValueError, match=r"unknown task or mixture 'no_such_task'; registered ptmjax ones: .*"):
        make("no_such_task")
    with pytest.raises(ValueError, match=r"unknown split 'test' of 'ptmjax_test_eval_predict'; known: validation"):
        make(split="test")
    with pytest.raises(ValueError, match=r"batch_size=6 does not split over the 8 .* pick a multiple of 8"):
        make(batch_size=6)
    with pytest.raises(ValueError, match=r"max_examples=0 must be"):
        make(max_examples=0)
