"""In-training evaluation logs task metrics and keeps best/ at the best step; `ptmjax eval` on best/ reproduces
that step's logged numbers (so best/ holds that step's parameters) and equals the model API on hand-built rows."""

import json
import os

import eval_tasks
import gin
import pytest
from tensorboard_helpers import tensorboard_scalars
from test_evaluator import VOCAB, assert_matches_the_model_api

from ptmjax import cli, gin_files
from ptmjax.decoding import GenerationIds
from ptmjax.families.model_api import model_api
from ptmjax.models import EncoderDecoder, T5Config
from ptmjax.storage.model_dir import ModelDir
from ptmjax.training.run import train

BEST = f"{eval_tasks.SCORE_TASK}/mean_log_likelihood"
BINDINGS = [
    "T5Config.d_model = 32", "T5Config.head_dim = 8", "T5Config.d_ff = 64", "T5Config.num_encoder_layers = 1",
    "T5Config.num_decoder_layers = 1", "train.mixture_or_task_name = 'ptmjax_stdlib_module_classification'",
    "train.task_feature_lengths = {'inputs': 24, 'targets': 8}", "train.batch_size = 8", "train.num_steps = 3",
    "train.show_progress = False", "train.eval_every = 3", "train.eval_batches = 1", "train.checkpoint_every = 3",
    "train.log_every = 1", "rsqrt_with_warmup.warmup_steps = 1", "DecodeConfig.max_decode_length = 8",
    f"train.inference_eval_tasks = ['{eval_tasks.MIXTURE}']", "train.inference_eval_every = 1",
    f"train.best_checkpoint_metric = '{BEST}'", "train.best_checkpoint_mode = 'min'",
]


@pytest.fixture(scope="module", autouse=True)
def tasks():
    eval_tasks.register()
    yield
    eval_tasks.remove()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    model_dir = str(tmp_path_factory.mktemp("eval") / "run")
    gin_files.parse_gin(["runs/demo.gin"], BINDINGS)
    try:
        train(model_dir)
    finally:
        gin.clear_config()
    return model_dir


def logged(model_dir, key):
    with open(os.path.join(model_dir, "metrics.jsonl")) as f:
        return {r["step"]: r[key] for r in map(json.loads, f) if key in r}


def eval_cli(*args):
    try:
        return cli.main(["eval", *args])
    finally:
        gin.clear_config()


@pytest.mark.slow
def test_training_logs_task_metrics_and_keeps_the_best_step(run_dir):
    values = logged(run_dir, f"eval_{BEST}")
    assert sorted(values) == [1, 2, 3] and len(set(values.values())) == 3
    assert sorted(logged(run_dir, f"eval_{eval_tasks.PREDICT_TASK}/rouge1")) == [1, 2, 3]
    best_step = min(values, key=values.get)
    assert tensorboard_scalars(os.path.join(run_dir, "tensorboard", "eval"))[BEST] == pytest.approx(values, rel=1e-6)
    with open(os.path.join(run_dir, "best", "best.json")) as f:
        assert json.load(f) == {"metric": BEST, "mode": "min", "step": best_step, "value": values[best_step]}
    assert best_step != 3, "the test wants a best step other than the newest"
    assert ModelDir(os.path.join(run_dir, "best")).saved_steps() == [best_step]
    assert ModelDir(run_dir).saved_steps() == [3]  # the run's newest checkpoint stays


@pytest.mark.slow
def test_eval_cli_on_best_reproduces_the_logged_metrics(run_dir, capsys):
    best_dir = os.path.join(run_dir, "best")
    step = json.load(open(os.path.join(best_dir, "best.json")))["step"]
    args = ("--model_dir", best_dir, "--task", eval_tasks.MIXTURE, "--batch_size", "8", "--max_decode_length", "8")
    assert eval_cli(*args) == 0
    path = os.path.join(best_dir, "eval", f"{eval_tasks.MIXTURE}_step{step}.json")
    with open(path) as f:
        written = json.load(f)
    assert written["step"] == step and sorted(written["metrics"]) == [eval_tasks.PREDICT_TASK, eval_tasks.SCORE_TASK]
    for task, values in written["metrics"].items():
        for name, value in values.items():
            assert value == pytest.approx(logged(run_dir, f"eval_{task}/{name}")[step], rel=1e-6), (task, name)
    out = capsys.readouterr().out
    assert "mean_log_likelihood" in out and path in out
    scalars = tensorboard_scalars(os.path.join(best_dir, "tensorboard", "eval"))
    assert scalars[BEST] == pytest.approx({step: written["metrics"][eval_tasks.SCORE_TASK]["mean_log_likelihood"]})
    model, _ = gin_files.read_model_config(ModelDir(best_dir))
    api = model_api(model)
    params = ModelDir(best_dir).read_params(api.abstract_params)
    ids = GenerationIds.from_vocabulary(VOCAB, encoder_decoder=True)
    assert_matches_the_model_api(written["metrics"], api, params, eval_tasks.encoder_decoder_rows(), ids)

    assert eval_cli(*args) == 1
    assert "exists; pass --overwrite to replace it" in capsys.readouterr().err


def test_bad_flags_and_settings_give_one_line_errors(run_dir, tmp_path, capsys):
    def error(*args):
        assert eval_cli(*args) == 1
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1, lines
        return lines[0]

    assert "unknown task or mixture 'nope'; registered ptmjax ones:" in error("--model_dir", run_dir, "--task", "nope")
    assert "no checkpoint under" in error("--model_dir", str(tmp_path), "--task", eval_tasks.MIXTURE)
    assert "no checkpoint for step 7" in error("--model_dir", run_dir, "--task", eval_tasks.MIXTURE, "--step", "7")
    assert "pick a multiple of 8" in error(
        "--model_dir", run_dir, "--task", eval_tasks.MIXTURE, "--batch_size", "6", "--output", str(tmp_path / "x.json")
    )
    assert "DecodeConfig.num_beams must be a positive int, got 0" in error(
        "--model_dir", run_dir, "--task", eval_tasks.MIXTURE, "--num_beams", "0"
    )

    model = EncoderDecoder(T5Config(
        vocab_size=2176, d_model=16, num_heads=2, head_dim=8, d_ff=16, num_encoder_layers=1, num_decoder_layers=1,
        ffn_activations=("relu",), tie_embeddings=True, dropout_rate=0.0,
    ))
    with pytest.raises(ValueError, match=r"best_checkpoint_metric='rouge1' does not name '<task>/<metric>'"):
        train(str(tmp_path / "bad"), model=model, task_feature_lengths={"inputs": 24, "targets": 8}, batch_size=8,
              num_steps=1, inference_eval_tasks=[eval_tasks.PREDICT_TASK], best_checkpoint_metric="rouge1")
    with pytest.raises(ValueError, match=r"needs evaluations; set train.inference_eval_tasks"):
        train(str(tmp_path / "bad"), model=model, task_feature_lengths={"inputs": 24, "targets": 8}, batch_size=8,
              num_steps=1, best_checkpoint_metric="x/y")
