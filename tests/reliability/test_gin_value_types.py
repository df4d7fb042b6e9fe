"""Every gin value bound is type-checked from its parameter's annotation before any work (was: only train.*;
`rsqrt_with_warmup.peak_learning_rate = 'x'` gave a 50-line JAX traceback after config.gin was rewritten)."""

from collections.abc import Mapping, Sequence

import gin
import pytest

from ptmjax.cli import main
from ptmjax.gin_files import parse_gin
from ptmjax.gin_value_types import fits


@pytest.fixture(autouse=True)
def cleared_gin():
    yield
    gin.clear_config()


def test_a_bad_schedule_value_writes_nothing_over_an_existing_run(tmp_path, capsys):
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    (model_dir / "config.gin").write_text("# the run's config\n")
    status = main(["train", "--gin_bindings=rsqrt_with_warmup.peak_learning_rate = 'x'", f"--model_dir={model_dir}"])
    assert status == 1
    assert capsys.readouterr().err.strip() == ("ptmjax train: error: gin binding rsqrt_with_warmup.peak_learning_rate "
                                               "= 'x' has type str; it must be float (see docs/training.md)")
    assert sorted(p.name for p in model_dir.iterdir()) == ["config.gin"]
    assert (model_dir / "config.gin").read_text() == "# the run's config\n"


def test_a_string_step_count_is_one_line_naming_binding_value_and_type(tmp_path, capsys):
    model_dir = tmp_path / "run"
    status = main(["train", "--gin_bindings=train.num_steps = 'abc'", f"--model_dir={model_dir}"])
    err = capsys.readouterr().err.strip()
    assert status == 1
    assert err == ("ptmjax train: error: gin binding train.num_steps = 'abc' has type str; it must be int "
                   "(see docs/training.md)")
    assert not model_dir.exists()  # nothing was written


@pytest.mark.parametrize(
    ("binding", "message"),
    [
        ("train.eval_batches = '5'", "train.eval_batches = '5' has type str; it must be int | None"),
        ("train.inference_eval_tasks = 'glue'", "it must be Sequence[str]"),
        ("train.task_feature_lengths = {'inputs': 'long'}", "it must be Mapping[str, int]"),
        ("train.pack = 1", "train.pack = 1 has type int; it must be bool"),
        ("DecodeConfig.top_p = 'high'", "DecodeConfig.top_p = 'high' has type str; it must be float"),
        ("rsqrt_with_warmup.peak_learning_rate = 'x'",
         "rsqrt_with_warmup.peak_learning_rate = 'x' has type str; it must be float"),
        ("T5Config.d_model = '32'", "T5Config.d_model = '32' has type str; it must be int"),
        ("NonFinitePolicy.max_consecutive_skips = 2.5", "has type float; it must be int"),
        ("eval/DecodeConfig.num_beams = 'four'", "eval/DecodeConfig.num_beams = 'four' has type str; it must be int"),
    ],
)
def test_bad_values_of_any_configurable_are_refused(binding, message):
    with pytest.raises(ValueError, match="^gin binding ") as error:
        parse_gin(["runs/demo.gin"], [binding])
    assert message in str(error.value)


def test_good_values_and_references_pass():
    paths = parse_gin(
        ["runs/demo.gin"],
        [
            "STEPS = 7",
            "train.num_steps = %STEPS",
            "train.eval_batches = None",
            "DecodeConfig.top_p = 1",
            "train.inference_eval_tasks = ['a', 'b']",
        ],
    )
    assert paths and gin.get_bindings("train")["num_steps"] == 7


def test_fits_follows_the_annotation():
    assert fits(3, float) and not fits(True, int) and not fits(2.0, int)
    assert fits({"inputs": 4}, Mapping[str, int]) and not fits({"inputs": 4.5}, Mapping[str, int])
    assert fits(("a",), Sequence[str]) and not fits("a", Sequence[str])
    assert fits(None, int | None) and not fits("x", int | None)
