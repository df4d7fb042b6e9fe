"""How ptmjax imports TensorFlow: its native start-up lines stay off stderr unless the user asks for them, and
the command line's process imports it without Keras's optional integrations."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

# Start-up lines, and the failed cuInit that the first dataset logs on a machine without a GPU.
START_UP_LINES = ("absl::InitializeLog()", "oneDNN custom operations", "cudart_stub.cc", "cpu_feature_guard.cc",
                  "failed call to cuInit")


def stderr_of_import(**env):
    code = ("import sys, ptmjax.configurables, tensorflow as tf; list(tf.data.Dataset.range(2)); "
            "print('after import', file=sys.stderr)")
    environ = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**environ, **env}, timeout=300, check=True)
    return result.stderr


@pytest.mark.slow
def test_importing_ptmjax_prints_no_tensorflow_start_up_lines():
    stderr = stderr_of_import()
    assert not [line for line in START_UP_LINES if line in stderr], stderr
    assert "after import" in stderr  # stderr itself still works


@pytest.mark.slow
def test_a_users_log_level_zero_shows_them():
    assert "absl::InitializeLog()" in stderr_of_import(TF_CPP_MIN_LOG_LEVEL="0")


def test_other_lines_written_during_the_import_come_through(capfd):
    from ptmjax import tensorflow_import

    with tensorflow_import.filtered_stderr():
        os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n")
        os.write(2, b"I0000 00:00:1795559220.964660    5239 port.cc:153] oneDNN custom operations are on.\n")
        os.write(2, b"a real error\n")
    assert capfd.readouterr().err == "a real error\n"


# What a fresh process imports with TensorFlow, and what works after it: with the packages held back as
# `ptmjax.cli.main` holds them, or as a notebook's `import ptmjax` leaves them (argv[1]: "cli" or "library").
IMPORTS = textwrap.dedent(
    """
    import json, sys
    import ptmjax
    from ptmjax import tensorflow_import
    if sys.argv[1] == "cli":
        tensorflow_import.hold_back(tensorflow_import.KERAS_EXTRAS)
    import tensorflow as tf
    import ptmjax.configurables, ptmjax.training.run
    with_tensorflow = sorted(name for name in tensorflow_import.KERAS_EXTRAS if name in sys.modules)
    from keras.src.wrappers import sklearn_wrapper
    from ptmjax import metrics
    scores = {**metrics.accuracy([0, 1, 1], [0, 1, 0]), **metrics.spearman_corrcoef([1.0, 2.0, 3.0], [1.0, 3.0, 2.0])}
    doubled = [int(x) for x in tf.data.Dataset.range(3).map(lambda x: x * 2)]
    keras_sklearn = sklearn_wrapper.sklearn is not None
    print("REPORT" + json.dumps({"with_tensorflow": with_tensorflow, "keras_sklearn": keras_sklearn,
                                 "scores": scores, "dataset": doubled}))
    """
)


def imports_report(scope: str) -> dict:
    result = subprocess.run([sys.executable, "-c", IMPORTS, scope], capture_output=True, text=True, timeout=300,
                            check=True)
    return json.loads(next(line for line in result.stdout.splitlines() if line.startswith("REPORT"))[6:])


@pytest.mark.slow
def test_the_command_line_imports_tensorflow_without_kerass_extras_which_import_normally_after_it():
    report = imports_report("cli")
    # Neither TensorFlow nor a training run's modules imported them (tensorflow_datasets imports PIL's tiny
    # package itself, not Keras's image utilities).
    assert set(report["with_tensorflow"]) <= {"PIL"}
    assert report["keras_sklearn"] is False  # Keras set its scikit-learn wrappers aside, as if not installed
    assert report["scores"] == pytest.approx({"accuracy": 200 / 3, "spearman_corrcoef": 50.0})  # imported when called
    assert report["dataset"] == [0, 2, 4]


@pytest.mark.slow
def test_a_library_import_leaves_kerass_integrations_as_they_are():
    report = imports_report("library")
    assert {"sklearn", "scipy"} <= set(report["with_tensorflow"]) and report["keras_sklearn"] is True
    assert report["scores"] == pytest.approx({"accuracy": 200 / 3, "spearman_corrcoef": 50.0})
