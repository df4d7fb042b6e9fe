"""Preprocessors and feature converters built without AutoGraph: the same examples and batches as with it, and a
loud error where it is needed."""

import functools
import inspect
import itertools

import numpy as np
import pytest
import seqio
import tensorflow as tf

import ptmjax.tasks.classification_head  # noqa: F401 - registers the tasks compared below
import ptmjax.tasks.objective_mixture  # noqa: F401
import ptmjax.tasks.summaries  # noqa: F401
from ptmjax.data import pipeline
from ptmjax.data.without_autograph import without_autograph, without_autograph_converter

LENGTHS = {"inputs": 64, "targets": 64}
_NOT_CONVERTED = tf.autograph.experimental.do_not_convert(lambda: None).__code__  # every such wrapper's code


def with_autograph(preprocessor):
    """The preprocessor that `without_autograph` wrapped (itself if it was not wrapped)."""
    if isinstance(preprocessor, functools.partial):
        return functools.partial(with_autograph(preprocessor.func), *preprocessor.args, **preprocessor.keywords)
    return preprocessor.__wrapped__ if getattr(preprocessor, "__code__", None) is _NOT_CONVERTED else preprocessor


def tasks_without_autograph() -> list[str]:
    """The registered ptmjax tasks over data made here (FunctionDataSource) with preprocessors that skip AutoGraph."""
    names = []
    for name in sorted(seqio.TaskRegistry.names()):
        task = seqio.TaskRegistry.get(name)
        if name.startswith("ptmjax") and isinstance(task.source, seqio.FunctionDataSource):
            if any(with_autograph(p) is not p for p in task.preprocessors):
                names.append(name)
    return names


def examples(task: seqio.Task, n: int = 4) -> list[dict[str, np.ndarray]]:
    dataset = task.get_dataset(LENGTHS, split="train", use_cached=False, shuffle=True, seed=3)
    return list(itertools.islice(dataset.as_numpy_iterator(), n))


def test_every_pretraining_objective_is_registered_without_autograph():
    names = tasks_without_autograph()
    for expected in ("ptmjax_stdlib_span_corruption", "ptmjax_stdlib_causal_lm", "ptmjax_stdlib_mlm",
                     "ptmjax_stdlib_mlm_nsp", "ptmjax_stdlib_permuted_lm", "ptmjax_stdlib_ul2",
                     "ptmjax_stdlib_bart_denoising", "ptmjax_stdlib_bert_style"):
        assert expected in names


@pytest.mark.parametrize("name", tasks_without_autograph())
@pytest.mark.slow
def test_the_examples_equal_those_built_with_autograph(name):
    task = seqio.TaskRegistry.get(name)
    reference = seqio.Task(
        f"{name}_with_autograph", source=task.source, output_features=task.output_features,
        preprocessors=[with_autograph(p) for p in task.preprocessors],
    )
    got, expected = examples(task), examples(reference)
    assert len(got) == len(expected) == 4
    for a, b in zip(got, expected, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=f"{name}: {key}")


@seqio.map_over_dataset
def _keep_if_positive(features):
    if tf.reduce_sum(features["targets"]) > 0:  # Python control flow over a tensor: needs AutoGraph
        return features
    return {"targets": -features["targets"]}


def test_a_preprocessor_that_needs_autograph_fails_loudly_without_it():
    dataset = tf.data.Dataset.from_tensors({"targets": tf.constant([-1, -2])})
    assert list(_keep_if_positive(dataset).as_numpy_iterator())[0]["targets"].tolist() == [1, 2]
    with pytest.raises(tf.errors.OperatorNotAllowedInGraphError):
        without_autograph(_keep_if_positive)(dataset)


def test_seqio_still_passes_the_arguments_a_wrapped_partial_takes():
    def truncate(dataset, sequence_length, feature):
        return dataset.map(lambda x: {feature: x[feature][: sequence_length[feature]]})

    wrapped = without_autograph(functools.partial(truncate, feature="targets"))
    assert list(inspect.signature(wrapped).parameters) == ["dataset", "sequence_length", "feature"]
    dataset = tf.data.Dataset.from_tensors({"targets": tf.range(5)})
    assert next(wrapped(dataset, sequence_length={"targets": 2}).as_numpy_iterator())["targets"].tolist() == [0, 1]


# Demos whose families between them use every kind of feature converter: packed encoder-decoder and decoder-only
# rows (seqio's), masked LM, sentence pairs and permuted LM (ptmjax's), and the task heads' rows.
CONVERTER_DEMOS = ("runs/demo.gin", "runs/gpt2_demo.gin", "runs/electra_demo.gin", "runs/bert_demo.gin",
                   "runs/xlnet_demo.gin", "runs/bert_classify_demo.gin", "runs/bert_tagging_demo.gin",
                   "runs/bert_qa_demo.gin")


@pytest.mark.parametrize("run_file", CONVERTER_DEMOS)
def test_a_familys_converter_gives_the_batches_of_the_same_converter_with_autograph(run_file):
    import gin

    from ptmjax import gin_files
    from ptmjax.families.model_api import model_api
    from ptmjax.training import run

    gin_files.parse_gin([run_file], [])
    try:
        spec = run.run_spec_from_gin()
        name = gin.query_parameter("train.mixture_or_task_name")
    finally:
        gin.clear_config()
    converter = model_api(spec.model).family.feature_converter
    (reference,) = converter.__bases__
    assert converter is without_autograph_converter(reference) and converter.__name__ == reference.__name__

    def first_batches(feature_converter):
        dataset = pipeline.get_dataset(getattr(name, "name", name), "train", spec.task_feature_lengths, 4, seed=1,
                                       shuffle=True, pack=spec.pack, feature_converter=feature_converter)
        return list(itertools.islice(dataset.as_numpy_iterator(), 2))

    got, expected = first_batches(converter), first_batches(reference)
    for a, b in zip(got, expected, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=f"{run_file}: {key}")


class _NeedsAutograph(seqio.PassThroughFeatureConverter):
    def __call__(self, ds, task_feature_lengths):
        return _keep_if_positive(ds)


def test_a_converter_that_needs_autograph_fails_loudly_without_it():
    dataset = tf.data.Dataset.from_tensors({"targets": tf.constant([-1, -2])})
    assert list(_NeedsAutograph()(dataset, {}).as_numpy_iterator())[0]["targets"].tolist() == [1, 2]
    with pytest.raises(tf.errors.OperatorNotAllowedInGraphError):
        without_autograph_converter(_NeedsAutograph)()(dataset, {})
