"""The evaluator against the model API run directly on hand-built rows, and the metric functions applied by hand."""

import eval_tasks
import jax
import numpy as np
import pytest

from ptmjax import partitioning
from ptmjax.data import vocabularies
from ptmjax.decoding import DecodeConfig, GenerationIds
from ptmjax.evaluation import metrics
from ptmjax.evaluation.evaluator import InferenceEvaluator
from ptmjax.models import GPT2, EncoderDecoder, T5Config
from ptmjax.models.gpt2 import GPT2Config
from ptmjax.training.model_api import model_api

VOCAB = vocabularies.stdlib_sentencepiece_vocabulary()
MODELS = {
    "t5": (EncoderDecoder(T5Config(
        vocab_size=2176, d_model=32, num_heads=4, head_dim=8, d_ff=64, num_encoder_layers=1, num_decoder_layers=1,
        ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.0,
    )), eval_tasks.encoder_decoder_rows),
    "gpt2": (GPT2(GPT2Config(
        vocab_size=2176, d_model=32, num_heads=4, num_layers=1, d_ff=64, max_length=48, dropout_rate=0.0,
        attention_dropout_rate=0.0,
    )), eval_tasks.prefix_lm_rows),
}  # fmt: skip
DECODE = DecodeConfig(method="greedy", max_decode_length=8)


@pytest.fixture(scope="module", autouse=True)
def tasks():
    eval_tasks.register()
    yield
    eval_tasks.remove()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_mixture_predictions_metrics_and_scores_equal_the_model_api_by_hand(name):
    module, hand_rows = MODELS[name]
    api = model_api(module)
    params = api.init(jax.random.key(1))
    params = jax.tree.map(lambda x: x * 4.0 if x.ndim > 1 else x, jax.device_get(params))  # peaked: varied tokens
    ids = GenerationIds.from_vocabulary(VOCAB, encoder_decoder=name == "t5")
    mesh_config = partitioning.MeshConfig()
    evaluator = InferenceEvaluator(
        api, eval_tasks.MIXTURE, partitioning.make_mesh(mesh_config), mesh_config.rules, DECODE, ids, batch_size=8,
        task_feature_lengths=eval_tasks.LENGTHS,
    )  # fmt: skip
    results = evaluator.evaluate(params, step=3)

    rows = hand_rows()
    tokens = jax.jit(api.predict, static_argnums=(2, 3))(params, rows, DECODE, ids).tokens[:, 0]
    predictions = [VOCAB.decode(row.tolist()) for row in np.asarray(tokens)]
    targets = [target for _, target in eval_tasks.EXAMPLES]
    scores = np.asarray(jax.jit(api.score)(params, rows))

    assert sorted(results) == [eval_tasks.PREDICT_TASK, eval_tasks.SCORE_TASK]
    assert evaluator.num_examples() == {eval_tasks.PREDICT_TASK: 10, eval_tasks.SCORE_TASK: 10}
    assert eval_tasks.RECORDED["predictions"] == predictions  # 10 rows: a full batch, then 2 of a padded one
    assert len(set(predictions)) > 1
    assert results[eval_tasks.PREDICT_TASK] == {**metrics.rouge(targets, predictions), "num_predictions": 10.0}
    np.testing.assert_allclose(eval_tasks.RECORDED["scores"], scores, rtol=1e-5)
    np.testing.assert_allclose(results[eval_tasks.SCORE_TASK]["mean_log_likelihood"], scores.mean(), rtol=1e-5)


def test_bad_settings_raise_one_line_errors():
    api = model_api(MODELS["t5"][0])
    mesh_config = partitioning.MeshConfig()
    mesh = partitioning.make_mesh(mesh_config)
    ids = GenerationIds.from_vocabulary(VOCAB, encoder_decoder=True)

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
