"""The stdlib docstring-summary task (text, split sizes, ROUGE) and the module-classification task's accuracy."""

import sys

import pytest
import seqio

from ptmjax.tasks import module_classification, summaries, text_to_text


def evaluate(task: seqio.Task, examples: list[dict], predictions: list[str]) -> dict[str, float]:
    """The task's metrics of `predictions`, as seqio's evaluator computes them."""
    targets = [task.postprocess_fn(text_to_text.as_text(ex["targets_pretokenized"]), example=ex, is_target=True)
               for ex in examples]
    predicted = [task.postprocess_fn(text, example=ex) for ex, text in zip(examples, predictions, strict=True)]
    results = {}
    for metric_fn in task.predict_metric_fns:
        results.update(metric_fn(targets, predicted))
    return results


def test_summary_and_body_keeps_only_pep257_docstrings():
    body = "The body has at least eight words in it, as required."
    assert summaries.summary_and_body(f"Return the thing.\n\n{body}") == ("Return the thing.", body)
    assert summaries.summary_and_body(f"Two line\nsummary here.\n\n{body}") is None
    assert summaries.summary_and_body(f"deque([iterable]) --> deque object\n\n{body}") is None
    assert summaries.summary_and_body(f"SelectorKey(fileobj, fd, events, data)\n\n{body}") is None
    assert summaries.summary_and_body(f"Emit.\n\n{body}") is None  # fewer than 3 words
    assert summaries.summary_and_body("Return the thing.\n\nToo short a body.") is None


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the corpus' docstrings are CPython 3.11's")
def test_docstring_summary_task_text_sizes_and_rouge():
    assert [len(summaries.docstring_summary_examples(s)) for s in ("train", "validation")] == [660, 40]
    task = seqio.get_mixture_or_task(summaries.SUMMARY_TASK)
    examples = list(task.get_dataset(None, "validation", shuffle=False, use_cached=False).take(2).as_numpy_iterator())
    first = examples[0]
    assert text_to_text.as_text(first["inputs_pretokenized"]).startswith(
        "summarize: Deprecated, use 'staticmethod' with 'abstractmethod' instead:")
    assert text_to_text.as_text(first["targets_pretokenized"]) == "A decorator indicating abstract staticmethods."
    assert first["targets"][-1] == 1  # EOS
    perfect = evaluate(task, examples, [text_to_text.as_text(ex["targets_pretokenized"]) for ex in examples])
    assert perfect == pytest.approx({"rouge1": 100.0, "rouge2": 100.0, "rougeLsum": 100.0})
    wrong = evaluate(task, examples, ["nothing in common", "at all"])
    assert set(wrong) == set(perfect) and max(wrong.values()) < 50


def test_module_classification_reports_accuracy_of_the_generated_name():
    task = seqio.get_mixture_or_task(module_classification.MODULE_TASK)
    examples = list(task.get_dataset(None, "validation", shuffle=False, use_cached=False).take(3).as_numpy_iterator())
    names = [text_to_text.as_text(ex["targets_pretokenized"]) for ex in examples]
    assert evaluate(task, examples, names) == {"accuracy": 100.0}
    assert evaluate(task, examples, [names[0], "json", "nonsense"]) == pytest.approx({"accuracy": 100 / 3})
