"""The benchmarks' shared timing and attribution: `train_throughput.step_seconds` waits as a training loop does,
`step_profile` attributes a GPU trace's kernels to their fusions or libraries and counts the time any ran, each
framework's child runs in its users' environment, and a count below 1 is refused in one line before anything is
measured."""

import os
import subprocess
import sys
from collections import Counter

import pytest

BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "benchmarks")


@pytest.fixture
def benchmarks(monkeypatch):
    """The benchmarks folder on the path; step_profile's import-time XLA_FLAGS are undone after the test."""
    monkeypatch.syspath_prepend(BENCHMARKS)
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
    import step_profile
    import train_throughput

    return train_throughput, step_profile


def recording_step():
    waits = []

    def step(wait=True):
        waits.append(wait)
        return len(waits)

    return step, waits


def test_back_to_back_steps_wait_once_a_round_and_alone_each_step(benchmarks):
    train_throughput, _ = benchmarks
    step, waits = recording_step()
    times, last = train_throughput.step_seconds(step, 4, back_to_back=True)
    assert len(times) == train_throughput.ROUNDS == 3 and last == 12
    assert waits == [False, False, False, True] * 3
    step, waits = recording_step()
    times, last = train_throughput.step_seconds(step, 3, back_to_back=False)
    assert len(times) == 3 and last == 3 and waits == [True, True, True]


def test_gpu_kernels_are_attributed_to_their_fusions_or_libraries(benchmarks):
    _, step_profile = benchmarks
    operations = {"loop_add_fusion.3": ("elementwise fusion", "backward"),
                  "gemm_fusion_dot.55": ("matmul (library fusion)", "forward")}
    events = Counter({"loop_add_fusion_3": 5, "gemm_fusion_dot_55": 7, "nvjet_sm90_tst_128x128_64x6_2x1_v_bz_NNT": 11,
                      "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16": 13,
                      "void cudnn::fusion::matmul_dq<true, 64>": 17, "Memset 0": 19})
    assert step_profile.attributed(events, operations, "gpu") == {
        ("loop_add_fusion_3", "elementwise fusion", "backward"): 5,
        ("gemm_fusion_dot_55", "matmul (library fusion)", "forward"): 7,
        ("nvjet_sm90_tst_128x128_64x6_2x1_v_bz_NNT", "matmul (cuBLAS)", "library"): 11,
        ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16", "attention (cuDNN)", "library"): 13,
        ("void cudnn::fusion::matmul_dq<true, 64>", "attention (cuDNN)", "library"): 17,
        ("Memset 0", "other library kernel", "library"): 19,
    }
    # On the CPU only the step's own operations count, by their HLO names.
    cpu_events = Counter({"loop_add_fusion.3": 5, "ThreadpoolListener::StartRegion": 3})
    assert step_profile.attributed(cpu_events, operations, "cpu") == {
        ("loop_add_fusion.3", "elementwise fusion", "backward"): 5}


def test_covered_time_counts_overlaps_once(benchmarks):
    _, step_profile = benchmarks
    # [10, 20) and [15, 30) cover 20 ns; [30, 35) 5 more; [40, 50) holds [42, 45): 10 more.
    assert step_profile.covered_ns([(40, 50), (15, 30), (10, 20), (42, 45), (30, 35)]) == 35
    assert step_profile.covered_ns([]) == 0


def test_children_run_as_their_users_run_them(benchmarks):
    """On the CPU, ptmjax with its malloc settings as `import ptmjax` makes them (the environment's), PyTorch with
    glibc's defaults (as its users run it) and with ptmjax's settings; on an accelerator the environment's."""
    train_throughput, _ = benchmarks
    runs = {name: (framework, env.get("PTMJAX_KEEP_FREED_MEMORY", "auto"))
            for name, (framework, env) in train_throughput.child_runs(on_cpu=True).items()}
    assert runs == {
        "ptmjax (JAX/XLA)": ("ptmjax", os.environ.get("PTMJAX_KEEP_FREED_MEMORY", "auto")),
        "Hugging Face (PyTorch)": ("pytorch", "0"),
        "PyTorch, ptmjax's malloc": ("pytorch", "1"),
    }
    accelerator = train_throughput.child_runs(on_cpu=False)
    assert [framework for framework, _ in accelerator.values()] == ["ptmjax", "pytorch"]
    assert all("XLA_PYTHON_CLIENT_PREALLOCATE" not in env for _, env in accelerator.values())


@pytest.mark.parametrize("script, argument", [("train_throughput.py", "--steps=0"), ("step_profile.py", "--batch=-2"),
                                              ("packed_vs_unpacked.py", "--inputs=1.5"),
                                              ("cpu_time_split.py", "--frequency=0")])
def test_a_count_below_one_is_refused_in_one_line_before_anything_runs(script, argument):
    out = subprocess.run([sys.executable, os.path.join(BENCHMARKS, script), argument], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and out.stdout == ""
    name, value = argument.split("=")
    assert out.stderr.strip().splitlines()[-1] == (
        f"{script}: error: argument {name}: {value!r} is not a whole number of at least 1")
