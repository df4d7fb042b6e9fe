"""Temperature-sampled mixtures: rates by hand for T = 1, 3.33 and infinity; sizes counted from a task."""

import math

import pytest
import seqio
import tensorflow as tf

from ptmjax.tasks import mixtures

SIZES = {"a": 100, "b": 300, "c": 600}


def test_temperature_one_is_proportional_to_size():
    assert mixtures.temperature_sampling_rates(SIZES, 1.0) == pytest.approx({"a": 0.1, "b": 0.3, "c": 0.6})


def test_large_temperatures_are_uniform():
    assert mixtures.temperature_sampling_rates(SIZES, math.inf) == pytest.approx({k: 1 / 3 for k in SIZES})
    assert mixtures.temperature_sampling_rates(SIZES, 1e6) == pytest.approx({k: 1 / 3 for k in SIZES}, abs=1e-5)


def test_mt5_temperature_by_hand():
    # (n_i / N) ** (1 / 3.33): 0.1 ** 0.3003 = exp(-2.302585 * 0.3003) = 0.500841, 0.3 -> 0.696593, 0.6 -> 0.857786;
    # their sum is 2.055220, so the rates are 0.243692, 0.338939, 0.417369.
    rates = mixtures.temperature_sampling_rates(SIZES, 3.33)
    assert rates == pytest.approx({"a": 0.243692, "b": 0.338939, "c": 0.417369}, abs=2e-6)
    assert sum(rates.values()) == pytest.approx(1.0)


def test_empty_tasks_get_nothing_and_bad_inputs_are_named():
    assert mixtures.temperature_sampling_rates({"a": 0, "b": 5}, math.inf) == {"a": 0.0, "b": 1.0}
    with pytest.raises(ValueError, match="temperature=0"):
        mixtures.temperature_sampling_rates(SIZES, 0)
    with pytest.raises(ValueError, match="non-negative and not all zero"):
        mixtures.temperature_sampling_rates({"a": -1, "b": 2}, 1.0)
    with pytest.raises(ValueError, match="at least one task size"):
        mixtures.temperature_sampling_rates({}, 1.0)


def _register(name: str, num_examples: int) -> None:
    def source(split: str, shuffle_files: bool = False, seed: int | None = None) -> tf.data.Dataset:
        del split, shuffle_files, seed
        return tf.data.Dataset.from_tensor_slices({"text": [f"document {i}" for i in range(num_examples)]})

    vocabulary = seqio.PassThroughVocabulary(size=16)
    seqio.TaskRegistry.remove(name)
    seqio.TaskRegistry.add(
        name,
        source=seqio.FunctionDataSource(source, splits=["train"]),
        preprocessors=[],
        output_features={"targets": seqio.Feature(vocabulary, dtype=tf.string, add_eos=False)},
    )


def test_register_counts_each_tasks_training_examples():
    _register("ptmjax_test_small", 30)
    _register("ptmjax_test_large", 270)
    try:
        names = ["ptmjax_test_small", "ptmjax_test_large"]
        assert [mixtures.count_examples(name) for name in names] == [30, 270]
        mixture = mixtures.register_temperature_mixture("ptmjax_test_mixture", names, temperature=1.0)
        assert mixture.get_rate(seqio.get_mixture_or_task(names[0])) == pytest.approx(0.1)
        given = mixtures.register_temperature_mixture(
            "ptmjax_test_mixture", names, temperature=math.inf, sizes={names[0]: 1, names[1]: 1000}
        )
        assert given.get_rate(seqio.get_mixture_or_task(names[1])) == pytest.approx(0.5)
        with pytest.raises(ValueError, match="unknown task 'ptmjax_test_missing'"):
            mixtures.register_temperature_mixture("ptmjax_test_mixture", ["ptmjax_test_missing"], 1.0)
        with pytest.raises(ValueError, match="no split 'validation'"):
            mixtures.count_examples(names[0], "validation")
    finally:
        for name in ("ptmjax_test_small", "ptmjax_test_large"):
            seqio.TaskRegistry.remove(name)
        seqio.MixtureRegistry.remove("ptmjax_test_mixture")


def test_a_two_task_mixture_in_gin_alone(tmp_path):
    """register_mixture from gin, with a task name and a task object, trains through the pipeline."""
    import gin

    from ptmjax import gin_files
    from ptmjax.data import pipeline

    (tmp_path / "train.txt").write_text("\n".join(f"Line {i} of a local corpus about mixtures." for i in range(200)))
    gin_files.parse_gin(["runs/demo.gin"], [
        "train.mixture_or_task_name = @register_mixture()",
        "register_mixture.name = 'ptmjax_test_two_task_mixture'",
        "register_mixture.tasks_and_rates = [('ptmjax_stdlib_span_corruption', 1.0), "
        "(@register_text_files_task(), 3.0)]",
        "register_text_files_task.name = 'ptmjax_test_local_lines'",
        f"register_text_files_task.train_pattern = '{tmp_path / 'train.txt'}'",
    ])
    try:
        mixture = gin.get_bindings("train")["mixture_or_task_name"]
    finally:
        gin.clear_config()
    assert mixture is seqio.get_mixture_or_task("ptmjax_test_two_task_mixture")
    assert {task.name: mixture.get_rate(task) for task in mixture.tasks} == {
        "ptmjax_stdlib_span_corruption": 1.0, "ptmjax_test_local_lines": 3.0,
    }
    dataset = pipeline.get_dataset(mixture.name, "train", {"inputs": 64, "targets": 16}, 4, seed=0, shuffle=True)
    batch = next(dataset.as_numpy_iterator())
    assert batch["encoder_input_tokens"].shape == (4, 64) and batch["decoder_target_tokens"].any()
