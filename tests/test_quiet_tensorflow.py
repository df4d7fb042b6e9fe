"""TensorFlow's native start-up lines stay off stderr unless the user asks for them."""

import os
import subprocess
import sys

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


def test_importing_ptmjax_prints_no_tensorflow_start_up_lines():
    stderr = stderr_of_import()
    assert not [line for line in START_UP_LINES if line in stderr], stderr
    assert "after import" in stderr  # stderr itself still works


def test_a_users_log_level_zero_shows_them():
    assert "absl::InitializeLog()" in stderr_of_import(TF_CPP_MIN_LOG_LEVEL="0")


def test_other_lines_written_during_the_import_come_through(capfd):
    from ptmjax import quiet_tensorflow

    with quiet_tensorflow.filtered_stderr():
        os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n")
        os.write(2, b"I0000 00:00:1795559220.964660    5239 port.cc:153] oneDNN custom operations are on.\n")
        os.write(2, b"a real error\n")
    assert capfd.readouterr().err == "a real error\n"
