"""benchmarks/xla_cpu_flags.py refuses an unknown --sets name in one line, before starting any child process."""

import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "xla_cpu_flags.py")


def test_an_unknown_flag_set_is_named_with_the_choices_and_nothing_runs():
    out = subprocess.run([sys.executable, SCRIPT, "--sets", "oneDNN dot fusions, bogus"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2
    assert out.stdout == ""  # no table: no flag set was timed
    last = out.stderr.strip().splitlines()[-1]
    assert last == (
        "xla_cpu_flags.py: error: --sets: unknown flag set(s) 'bogus'; choose from defaults, oneDNN matmuls, "
        "oneDNN dot fusions, XNNPACK, XNNPACK dot fusions, XNNPACK greedy graph fusion, YNNPACK off, "
        "YNNPACK elementwise fusions, sequential scheduler, 512-bit vectors, fast-runtime preset, tiling propagation"
    )
