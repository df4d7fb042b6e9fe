"""`ptmjax train` as a user runs it: SIGTERM saves a checkpoint, a rerun resumes."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ptmjax import cli, gin_files


def start_training(model_dir, *bindings):
    command = [
        sys.executable, "-m", "ptmjax.train", "--gin_file=runs/demo.gin", f"--model_dir={model_dir}",
        "--gin_bindings=train.log_every = 2", "--gin_bindings=train.checkpoint_every = 1000",
        "--gin_bindings=train.eval_batches = 1",
        *(f"--gin_bindings={b}" for b in bindings),
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def train_in_process(*args: str) -> int:
    """`ptmjax train ARGS` in this process; gin's config is cleared afterwards."""
    import gin

    try:
        return cli.main(["train", *args])
    finally:
        gin.clear_config()


def logged_steps(model_dir):
    path = os.path.join(model_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line)["step"] for line in f if line.strip()]


@pytest.mark.slow
def test_sigterm_saves_and_a_rerun_resumes(tmp_path):
    model_dir = str(tmp_path / "run")
    process = start_training(model_dir, "train.num_steps = 100000")
    deadline = time.time() + 240
    while not logged_steps(model_dir):
        assert process.poll() is None, process.communicate()[0]
        assert time.time() < deadline, "no metrics after 240 s"
        time.sleep(0.5)
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output
    assert "SIGTERM: saved step" in output
    saved = [int(d) for d in os.listdir(os.path.join(model_dir, "checkpoints")) if d.isdigit()]
    assert len(saved) == 1 and 2 <= saved[0] < 100000
    with open(os.path.join(model_dir, "config.gin")) as f:
        config = f.read()
    assert "T5Config.d_model = 64" in config and "train.num_steps = 100000" in config
    assert os.path.exists(os.path.join(model_dir, "loss_curve.png"))

    process = start_training(model_dir, f"train.num_steps = {saved[0] + 2}")
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    assert f"Resumed from step {saved[0]}" in output
    assert f"Training finished at step {saved[0] + 2}" in output
    assert "eval_loss" in output


def test_unknown_gin_file_lists_the_known_ones():
    with pytest.raises(FileNotFoundError, match=r"runs/demo.gin"):
        gin_files.resolve_gin_file("runs/dmeo.gin")


def test_includes_resolve_beside_folders_named_like_gin_subfolders(tmp_path, monkeypatch):
    """A `runs/` output folder on sys.path must not break `include 'runs/...'`."""
    import gin

    for name in ("runs", "models", "mesh"):
        (tmp_path / name).mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        gin_files.parse_gin(["runs/demo.gin"])
        assert gin.query_parameter("T5Config.d_model") == 64
    finally:
        gin.clear_config()


@pytest.mark.parametrize("binding,name", [("train.num_stepz = 3", "num_stepz"), ("T5Config.d_modle = 3", "d_modle")])
def test_misspelt_binding_fails_before_any_work_naming_it(binding, name):
    import gin

    try:
        with pytest.raises(ValueError, match=f"doesn't have a parameter named '{name}'"):
            gin_files.parse_gin(["runs/demo.gin"], [binding])
    finally:
        gin.clear_config()


@pytest.mark.parametrize("binding,suggestion", [
    ("train.num_step = 5", "did you mean 'train.num_steps'?"),
    ("MeshConfig.dat = 2", "did you mean 'MeshConfig.data'?"),
    ("trian.num_steps = 5", "did you mean 'train'?"),
    ("train.model = @T5Confg()", "did you mean 'T5Config'?"),
])
def test_misspelt_gin_names_get_a_suggestion(binding, suggestion):
    import gin

    try:
        with pytest.raises(gin_files.GinConfigError) as raised:
            gin_files.parse_gin(["runs/demo.gin"], [binding])
    finally:
        gin.clear_config()
    assert str(raised.value).endswith(suggestion) and "\n" not in str(raised.value)


def test_gin_syntax_errors_are_gin_config_errors():
    import gin

    try:
        with pytest.raises(gin_files.GinConfigError, match="unclosed bracket"):
            gin_files.parse_gin(["runs/demo.gin"], ["train.num_steps = ("])
        with pytest.raises(gin_files.GinConfigError, match=r"expected ':' or '='.*train.num_steps 5"):
            gin_files.parse_gin(["runs/demo.gin"], ["train.num_steps 5"])
    finally:
        gin.clear_config()


def test_misspelt_gin_file_gets_a_suggestion():
    with pytest.raises(FileNotFoundError, match=r"did you mean 'runs/demo.gin'"):
        gin_files.resolve_gin_file("runs/dmeo.gin")


@pytest.mark.parametrize("alias,real", [
    ("models/t5_1_1_xl.gin", "models/t5_1_1_3B.gin"), ("models/t5_1_1_xxl.gin", "models/t5_1_1_11B.gin"),
    ("models/t5_1_0_xxl.gin", "models/t5_1_0_11B.gin"), ("t5-small", "models/t5_1_0_small.gin"),
    ("t5-v1_1-xl", "models/t5_1_1_3B.gin"),
])
def test_model_aliases_fail_naming_the_real_file(alias, real):
    with pytest.raises(FileNotFoundError, match=f"that model is --gin_file={real}$"):
        gin_files.resolve_gin_file(alias)


def run_cli(*args, **env):
    command = [sys.executable, "-m", "ptmjax.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, env={**os.environ, **env}, timeout=300)


@pytest.mark.slow
def test_a_bad_binding_prints_one_line_and_no_start_up_noise():
    result = run_cli("train", "--gin_bindings=train.num_step = 5")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "ptmjax train: error: Configurable 'train' doesn't have a parameter named 'num_step' "
        "(In bindings string line 1: train.num_step = 5); did you mean 'train.num_steps'? (see docs/training.md)"
    ]


@pytest.mark.parametrize("args,env", [
    (["--traceback", "train", "--gin_file=runs/dmeo.gin"], {}),
    pytest.param(["train", "--gin_file=runs/dmeo.gin", "--traceback"], {}, marks=pytest.mark.slow),
    pytest.param(["train", "--gin_file=runs/dmeo.gin"], {"PTMJAX_TRACEBACK": "1"}, marks=pytest.mark.slow),
])
@pytest.mark.slow
def test_traceback_on_request(args, env):
    result = run_cli(*args, **env)
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert "FileNotFoundError: gin file 'runs/dmeo.gin' not found" in result.stderr


def test_a_missing_checkpoint_is_one_line(tmp_path, capsys):
    assert cli.main(["inspect", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (
        f"ptmjax inspect: error: no checkpoint under {tmp_path}/checkpoints; "
        "pass the folder of a `ptmjax train` run that saved one, or of a `ptmjax convert --from-hf` import "
        "(see docs/scale.md)\n"
    )


def test_a_mesh_that_does_not_fit_is_one_line(tmp_path, capsys):
    assert train_in_process("--gin_bindings=MeshConfig.data = 3", f"--model_dir={tmp_path}") == 1
    assert capsys.readouterr().err.splitlines() == [
        "ptmjax train: error: mesh {'data': 3, 'fsdp': 1, 'tensor': 1, 'expert': 1} has 3 devices but 8 are "
        "available; set one axis to -1 or make the product match (see docs/training.md)"
    ]


def test_bugs_keep_their_traceback(monkeypatch, tmp_path):
    def broken(args):
        raise KeyError("a bug")

    monkeypatch.setattr(cli, "run_inspect", broken)
    with pytest.raises(KeyError, match="a bug"):
        cli.main(["inspect", str(tmp_path)])


def test_an_error_names_the_page_of_its_kind_else_of_its_command(monkeypatch, tmp_path, capsys):
    from ptmjax.storage.model_dir import DamagedCheckpointError

    def damaged(args):
        raise DamagedCheckpointError("checkpoint 4 is damaged")

    monkeypatch.setattr(cli, "run_inspect", damaged)
    assert cli.main(["inspect", str(tmp_path)]) == 1
    assert capsys.readouterr().err == "ptmjax inspect: error: checkpoint 4 is damaged (see docs/reliability.md)\n"
    root = Path(__file__).resolve().parents[1]
    pages = [*cli.ERROR_PAGES.values(), *(page for _, page in cli.EXAMPLES.values())]
    assert all((root / page).is_file() for page in pages), pages


def test_a_missing_required_binding_is_one_line(tmp_path, capsys):
    assert train_in_process("--gin_file=models/t5_1_1_tiny.gin", f"--model_dir={tmp_path}") == 1
    assert capsys.readouterr().err == (
        "ptmjax train: error: Required bindings for `train` not provided in config: "
        "['model', 'task_feature_lengths', 'batch_size', 'num_steps'] (see docs/training.md)\n"
    )


def test_a_misspelt_parameter_in_a_gin_file_names_the_file_and_line(tmp_path):
    import gin

    path = tmp_path / "typo.gin"
    path.write_text("include 'runs/demo.gin'\ntrain.num_stepss = 4\n")
    try:
        with pytest.raises(gin_files.GinConfigError) as raised:
            gin_files.parse_gin([str(path)])
    finally:
        gin.clear_config()
    assert str(raised.value) == (
        f"Configurable 'train' doesn't have a parameter named 'num_stepss' (In file \"{path}\", line 2: "
        "train.num_stepss = 4); did you mean 'train.num_steps'?"
    )


def test_an_unregistered_task_lists_the_registered_ones_and_creates_nothing(tmp_path, capsys):
    task = "--gin_bindings=train.mixture_or_task_name = 'no_such_task'"
    assert train_in_process(task, f"--model_dir={tmp_path / 'run'}") == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("ptmjax train: error: unknown task or mixture 'no_such_task'; registered ptmjax ones: ")
    assert "ptmjax_pretrain" in line
    assert line.endswith("(import the module that registers yours first) (see docs/training.md)")
    assert not (tmp_path / "run").exists()


COMMAND_LINES = {
    "train": ["train"],
    "eval": ["eval", "--model_dir=m", "--task=t"],
    "infer": ["infer", "--model_dir=m"],
    "probe": ["probe", "--model_dir=m"],
    "inspect": ["inspect", "m"],
}


@pytest.mark.parametrize("command", cli.COMMANDS_READING_THE_CORPUS)
def test_reading_the_command_line_imports_no_tensorflow(command):
    """The commands that read the stdlib corpus start reading it after parsing their arguments, before
    TensorFlow's import."""
    parse = f"cli._parser().parse_args({COMMAND_LINES[command]})"
    code = f"import sys; from ptmjax import cli; {parse}; print('tensorflow' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert result.stdout.strip() == "False"


# `train` sets its compilation cache from gin (train.compilation_cache_dir); `inspect` compiles nothing.
STARTED_BEFORE_RUNNING = {"train": ["corpus"], "eval": ["corpus", "cache"], "infer": ["corpus", "cache"],
                          "probe": ["corpus", "cache"], "inspect": []}


@pytest.mark.parametrize("command", COMMAND_LINES)
def test_the_commands_read_the_corpus_early_and_use_the_compilation_cache_as_they_need(command, monkeypatch):
    from ptmjax.training import compilation_cache

    started, ran = [], []
    monkeypatch.setattr(cli.corpus, "extract_in_background", lambda: started.append("corpus"))
    monkeypatch.setattr(compilation_cache, "use_compilation_cache", lambda: started.append("cache"))
    for name in ("run_train", "run_inspect"):
        monkeypatch.setattr(cli, name, lambda args: ran.append(started[:]) or 0)
    for module, name in (("evaluate", "main"), ("infer", "run"), ("probe", "run")):
        monkeypatch.setattr(f"ptmjax.tools.{module}.{name}", lambda args: ran.append(started[:]) or 0)
    assert cli.main(COMMAND_LINES[command]) == 0
    assert ran == [STARTED_BEFORE_RUNNING[command]]


def test_every_command_s_help_ends_with_examples_that_parse_and_its_page(capsys):
    """`ptmjax <command> --help` shows examples (each parses with that command's flags) and the docs/ page."""
    import pathlib
    import shlex

    assert set(cli.EXAMPLES) == {"train", "eval", "infer", "probe", "compile", "convert", "inspect", "quantize",
                                 "prune-heads", "prune-layers"}
    for command, (examples, page) in cli.EXAMPLES.items():
        assert (pathlib.Path(__file__).resolve().parents[1] / page).is_file(), page
        for example in examples:
            words = shlex.split(example.split("|")[-1], comments=True)
            assert words[:2] == ["ptmjax", command], example
            assert cli._parser().parse_args(words[1:]).command == command
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        assert capsys.readouterr().out.endswith(f"  {examples[-1]}\n\nmore: {page}\n")
