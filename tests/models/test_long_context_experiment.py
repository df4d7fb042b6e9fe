"""experiments/long_context/run.py: the attention pairs each arm allows and the training FLOPs of a step, counted by
hand; equal compute across arms; the position scoring against a per-row reference; and (slow) the smoke setting end
to end."""

import json
import math
import pathlib

import jax
import numpy as np
import pytest
from test_docs import script_module

SCRIPT = "experiments/long_context/run.py"
ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_allowed_pairs_counted_by_hand(monkeypatch):
    run = script_module(SCRIPT, monkeypatch)
    arms = run.ARMS
    assert run.allowed_pairs(arms["full_512"]) == 512 * 513 // 2  # the causal triangle
    # A causal window of w keeps min(i + 1, w) keys at query i.
    for slug, window in (("window_128", 128), ("window_256", 256)):
        assert run.allowed_pairs(arms[slug]) == window * (window + 1) // 2 + (2048 - window) * window
    # Window 128 plus global tokens every 128: a query also attends the earlier global keys outside its window, and
    # a global query every earlier key.
    globals_ = set(range(0, 2048, run.GLOBAL_EVERY))
    pairs = sum(1 for i in range(2048) for k in range(i + 1) if i - k < 128 or k in globals_ or i in globals_)
    assert run.allowed_pairs(arms["global_local"]) == pairs
    # Transformer-XL: a full memory of 512 before each query's causal part of its segment.
    assert run.allowed_pairs(arms["txl_512"]) == 512 * 512 + 512 * 513 // 2


def test_training_flops_by_hand_and_equal_compute(monkeypatch):
    run = script_module(SCRIPT, monkeypatch)
    d, heads_dim, d_ff, vocab, layers = 64, 64, 256, 2176, 2  # GPT-2 tiny
    length, rows = 512, 16
    per_layer = 4 * 2 * d * heads_dim * length + 4 * (512 * 513 // 2) * heads_dim + 2 * 2 * d * d_ff * length
    forward = rows * (layers * per_layer + 2 * d * vocab * length)
    assert run.training_flops(run.ARMS["full_512"]) == 3 * forward
    setting = run.SETTINGS["reduced"]
    budget = setting.lm_steps * run.training_flops(run.ARMS["full_512"])
    for slug in setting.arms:
        arm = run.ARMS[slug]
        steps = run.steps_of(setting, arm)
        reference = run.REFERENCE[arm.kind]
        base = budget if arm.kind == run.LM else setting.summary_steps * run.training_flops(run.ARMS[reference])
        assert abs(steps * run.training_flops(arm) / base - 1) < 0.01, slug  # equal compute, up to rounding
        assert arm.kind == run.SUMMARY or arm.batch_size * arm.length == run.BATCH_TOKENS, slug


@pytest.mark.slow  # compiles GPT-2 at 512 and 2,048 for both paths: about 2 minutes on 2 loaded cores
def test_position_nll_equals_each_row_scored_alone(monkeypatch):
    """A windowed GPT-2 scored on 2048-token rows: each position's NLL equals the log-softmax of that row's own
    forward pass from BOS, one row at a time; the 512 model's row restarts every 512 positions."""
    run = script_module(SCRIPT, monkeypatch)
    rng = np.random.default_rng(0)
    rows = rng.integers(1, 2176, size=(2, run.ROW)).astype(np.int32)
    for slug in ("full_512", "window_128"):
        arm = run.ARMS[slug]
        run.parse(arm)
        model = run.training_run.run_spec_from_gin().model
        run.gin.clear_config()
        params = model.init(jax.random.PRNGKey(0), np.zeros((1, arm.length), np.int32))["params"]
        want = np.zeros(rows.shape)
        for row, want_row in zip(rows, want, strict=True):
            for start in range(0, run.ROW, arm.length):
                piece = row[start:start + arm.length]
                inputs = np.concatenate([[0], piece[:-1]])[None]
                log_probs = np.asarray(jax.nn.log_softmax(model.apply({"params": params}, inputs)))[0]
                want_row[start:start + arm.length] = -log_probs[np.arange(arm.length), piece]
        got = run.position_nll(arm, model, params, rows, batch=1)
        np.testing.assert_allclose(got, want, rtol=2e-5)
        perplexities = run.bucket_perplexities({"position_nll_sum": got.sum(0).tolist(), "eval_rows": 2})
        assert perplexities[-1] == pytest.approx(math.exp(want[:, 1:].mean()), rel=1e-5)


@pytest.mark.slow  # 2 training runs of 3 steps and their scoring: about 5 minutes on 2 loaded cores
@pytest.mark.timeout(1800)
def test_the_smoke_setting_trains_and_scores_two_arms(tmp_path, monkeypatch):
    run = script_module(SCRIPT, monkeypatch)
    monkeypatch.setattr(run, "RUNS_DIR", tmp_path)
    setting = run.dataclasses.replace(run.SETTINGS["smoke"], arms=("full_512", "window_128"))
    results = run.compare(setting, report_only=False)
    assert not results["missing"] and list(results["rows"]) == ["full_512", "window_128"]
    for row in results["rows"].values():
        assert all(1 < f["mean"] < 2176 * 2 for f in row["perplexity"])
        assert row["tokens_per_s"]["mean"] > 0 and row["compiled"]["total_bytes"] > 0
    assert "| sliding window 128, 2048 |" in run.lm_table(results)


def test_the_committed_results_account_for_every_arm_and_seed():
    """Every run of the reduced setting is either in the results or named as missing (tests/test_docs.py checks
    that the README's tables are the ones these results give)."""
    results = json.loads((ROOT / "experiments" / "long_context" / "results_reduced.json").read_text())
    setting = results["setting"]
    for slug in setting["arms"]:
        ran = results["rows"].get(slug, {}).get("seeds", [])
        for seed in setting["seeds"]:
            assert seed in ran or any(m.startswith(f"{slug} seed {seed}") for m in results["missing"]), (slug, seed)
    for row in results["rows"].values():
        if row["kind"] == "lm":
            assert len(row["perplexity"]) == 5 and all(1 < f["mean"] < 2176 for f in row["perplexity"])
