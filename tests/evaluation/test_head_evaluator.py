"""HeadEvaluator on the embedded head tasks, against predictions and metrics computed here from the model's
logits on the same examples (padded by hand, one example at a time)."""

import json

import gin
import jax
import numpy as np
import pytest
from flax import linen as nn

from ptmjax import cli, gin_files, metrics, partitioning
from ptmjax.data import pipeline
from ptmjax.evaluation.head_evaluator import HeadEvaluator
from ptmjax.families.model_api import model_api
from ptmjax.models import (
    BertConfig,
    EncoderForQuestionAnswering,
    EncoderForSequenceClassification,
    EncoderForTokenClassification,
)
from ptmjax.partitioning import MeshConfig
from ptmjax.tasks.classification_head import MODULE_HEAD_TASK
from ptmjax.tasks.question_answering import QA_TASK
from ptmjax.tasks.tagging import TAGGING_TASK, TAGS
from ptmjax.training import run

CONFIG = BertConfig(vocab_size=2176, d_model=32, num_heads=2, num_layers=2, d_ff=64, max_length=64,
                    dropout_rate=0.0, attention_dropout_rate=0.0)
LENGTH, EXAMPLES = 48, 12
MESH = MeshConfig(data=2, fsdp=2, tensor=2)


def evaluate(model, task):
    """(the evaluator's metrics and its (targets, predictions), the examples, each example's outputs from the model
    alone)."""
    api = model_api(model)
    params = nn.unbox(api.init(jax.random.key(3)))
    evaluator = HeadEvaluator(api, task, partitioning.make_mesh(MESH), MESH.rules, batch_size=8,
                              task_feature_lengths={"inputs": LENGTH}, max_examples=EXAMPLES)
    got = evaluator.evaluate(params)[task], evaluator.outputs(params)[task]
    examples = list(pipeline.get_task_or_mixture(task).get_dataset(
        {"inputs": LENGTH}, split="validation", shuffle=False, num_epochs=1, seed=0, use_cached=False,
    ).take(EXAMPLES).as_numpy_iterator())
    outputs = []
    for example in examples:
        tokens = np.zeros((1, LENGTH), np.int32)
        tokens[0, : len(example["inputs"])] = example["inputs"]
        types = np.zeros((1, LENGTH), np.int32)
        if "token_type_ids" in example:
            types[0, : len(example["token_type_ids"])] = example["token_type_ids"]
        outputs.append(jax.device_get(model.apply({"params": params}, input_tokens=tokens, token_type_ids=types)))
    return got, examples, outputs


def test_classification_accuracy():
    (got, per_example), examples, outputs = evaluate(EncoderForSequenceClassification(CONFIG, num_labels=12),
                                                     MODULE_HEAD_TASK)
    predictions = [int(np.argmax(logits[0])) for logits in outputs]
    labels = [int(e["label"]) for e in examples]
    assert got == pytest.approx(metrics.accuracy(labels, predictions))
    assert per_example == (labels, predictions)  # each example's, in order: metrics of any subset follow


def test_tagging_token_accuracy_and_span_f1():
    (got, _), examples, outputs = evaluate(EncoderForTokenClassification(CONFIG, num_labels=len(TAGS)), TAGGING_TASK)
    predictions = [np.argmax(logits[0], axis=-1) for logits in outputs]
    assert got == pytest.approx(metrics.token_tagging(TAGS)([e["tags"] for e in examples], predictions))


def test_span_qa_exact_match_and_f1_with_a_brute_force_span_search():
    (got, _), examples, outputs = evaluate(EncoderForQuestionAnswering(CONFIG), QA_TASK)
    vocabulary = pipeline.get_task_or_mixture(QA_TASK).output_features["inputs"].vocabulary
    predictions = []
    for example, spans in zip(examples, outputs, strict=True):
        context = np.flatnonzero(example["token_type_ids"] == 1)
        candidates = [(s, e) for s in context for e in context if s <= e < s + 30]
        start, end = max(candidates, key=lambda c: spans.start_logits[0, c[0]] + spans.end_logits[0, c[1]])
        predictions.append(vocabulary.decode(example["inputs"][start : end + 1].tolist()))
    want = metrics.squad([[e["answers"].decode()] for e in examples], predictions)
    assert got == pytest.approx(want)


@pytest.mark.slow  # two gin training runs; the head's training and evaluation are tested above
def test_head_fine_tuning_from_gin_over_a_pretrained_bert(tmp_path, capsys):
    """runs/bert_classify_demo.gin, shortened, over a 2-step runs/bert_demo.gin run: the backbone is restored,
    the classifier is fresh, and the evaluation in training reports the task's accuracy."""
    short = ["train.batch_size = 8", "train.num_steps = 2", "train.eval_every = 2", "train.eval_batches = 1",
             "train.checkpoint_every = 2", "train.show_progress = False"]
    runs = [("runs/bert_demo.gin", "bert", ["train.task_feature_lengths = {'inputs': 32, 'targets': 32}"]),
            ("runs/bert_classify_demo.gin", "classify",
             [f"train.init_checkpoint = '{tmp_path / 'bert'}'", "train.task_feature_lengths = {'inputs': 32}",
              "train.inference_eval_examples = 8", "slanted_triangular.total_steps = 20"])]
    for run_file, name, bindings in runs:
        gin_files.parse_gin([run_file], [*short, *bindings])
        try:
            result = run.train(str(tmp_path / name))
        finally:
            gin.clear_config()
    out = capsys.readouterr().out
    assert "newly initialised: classifier/bias, classifier/kernel" in out
    assert "in the checkpoint but not in the model, left out: mlm_head/" in out
    accuracy = result.eval_metrics[f"eval_{MODULE_HEAD_TASK}/accuracy"]
    assert 0 <= accuracy <= 100 and np.isfinite(result.eval_metrics["eval_loss"])
    # `ptmjax eval` of the run's folder scores the same 8 examples alike.
    output = tmp_path / "eval.json"
    assert cli.main(["eval", "--model_dir", str(tmp_path / "classify"), "--task", MODULE_HEAD_TASK,
                     "--max_examples", "8", "--batch_size", "8", "--output", str(output)]) == 0
    assert json.loads(output.read_text())["metrics"][MODULE_HEAD_TASK]["accuracy"] == pytest.approx(accuracy)
