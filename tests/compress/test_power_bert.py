"""PoWER-BERT (ptmjax/compress/token_dropping.py): full retention against the plain classifier; the kept tokens'
states and the [CLS] logits against a float64 NumPy encoder that masks the dropped tokens out as keys from their
layer on (and picks them itself); the significance score and the choice of positions against NumPy on
hand-made attention; gradients against a masked-attention reference; (data, fsdp, tensor) against one device;
FLOPs against retention; bad values refused in one line."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compress.test_early_exit import CONFIGS, SMALL, check_sharded_steps_equal_one_device, numpy_head, tokens
from flax import linen as nn
from flax import traverse_util

from ptmjax.compress.token_dropping import kept_positions, plain_classifier, power_bert, significance
from ptmjax.families.model_api import model_api
from ptmjax.families.token_loss import LossConfig
from ptmjax.layers.attention_mask import AttentionMask
from ptmjax.models import GPT2Config
from ptmjax.models.encoder import PostLNLayer
from ptmjax.models.encoder_tasks import EncoderForSequenceClassification, EncoderForTokenClassification
from ptmjax.models.gpt2_tasks import GPT2ForSequenceClassification

LABELS, LENGTH = 3, 10
DROPPING = (7, 5, 3)  # tokens(): row 4 has 3 real tokens, row 1 six, the rest ten


def classifier(name="bert"):
    return EncoderForSequenceClassification(CONFIGS[name], num_labels=LABELS)


def init(model, seed=0):
    return nn.unbox(model_api(model).init(jax.random.key(seed)))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_full_retention_is_the_plain_classifier_exactly(name):
    base, pad = classifier(name), CONFIGS[name].pad_token_id
    for retention in ([LENGTH] * 3, [1.0] * 3):
        model = power_bert(base, retention)
        params = init(model)
        assert jax.tree.structure(params) == jax.tree.structure(init(base))
        ids = tokens(pad)
        np.testing.assert_array_equal(model.apply({"params": params}, ids), base.apply({"params": params}, ids))
        for method in ("encode", "encode_kept"):  # `encode`, every position, at any retention (probing, ptmjax.load)
            np.testing.assert_array_equal(model.apply({"params": params}, ids, method=method),
                                          base.apply({"params": params}, ids, method="encode"))
        batch = {"input_tokens": ids, "label": np.arange(8) % LABELS, "example_weight": np.ones(8, np.float32)}
        for got, want in zip(model_api(model).loss(params, batch, LossConfig()),
                             model_api(base).loss(params, batch, LossConfig()), strict=True):
            jax.tree.map(np.testing.assert_array_equal, got, want)
    assert plain_classifier(model) == base and plain_classifier(base) == base


def layer_norm(x, w, eps):
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps) * w["scale"] + w["bias"]


def activation(name, x):
    if name == "gelu_exact":
        return x * 0.5 * (1 + np.vectorize(math.erf)(x / 2**0.5))
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def numpy_encoder(config, params, x, valid, counts, soft=None):
    """float64 NumPy, full size: after layer j's attention the `counts[j]` alive positions with the most
    attention from the alive real queries stay alive ([CLS] first, padding last, ties to the earlier); a dead
    position is masked out as a key from the next layer on. With `soft` (one [s] array r_j per layer: the
    configuration search), none dies: the position ranked k is multiplied by clip(r_j[k], 0, 1) instead.
    -> (final states [b, s, d], alive [b, s])."""
    alive = np.ones_like(valid)
    for j, count in enumerate(counts):
        w = params[f"layers_{j * config.layer_groups // config.num_layers}"]
        a = w["attention"]
        q, k, v = (np.einsum("bsd,dhk->bshk", x, a[n]["kernel"]) + a[n]["bias"] for n in ("query", "key", "value"))
        logits = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(config.head_dim)
        logits = logits + np.where(alive & valid, 0.0, -1e10)[:, None, None, :]
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        h = np.einsum("bqhd,hde->bqe", np.einsum("bhqk,bkhd->bqhd", p, v), a["out"]["kernel"]) + a["out"]["bias"]
        x = layer_norm(x + h, w["attention_layer_norm"], config.layer_norm_epsilon)
        score = (p * (alive & valid)[:, None, :, None]).sum((1, 2))
        rank = np.where(alive, np.where(valid, score, -1.0), -np.inf)
        rank[:, 0] = np.inf
        order = np.argsort(-rank, axis=-1, kind="stable")
        if soft is None:
            alive = np.zeros_like(alive)
            np.put_along_axis(alive, order[:, :count], True, axis=-1)
        else:
            x = x * np.clip(soft[j], 0, 1)[np.argsort(order, axis=-1)][..., None]
        m = w["mlp"]
        h = activation(config.activation, x @ m["wi"]["kernel"] + m["wi"]["bias"]) @ m["wo"]["kernel"] + m["wo"]["bias"]
        x = layer_norm(x + h, w["mlp_layer_norm"], config.layer_norm_epsilon)
    return x, alive


@pytest.mark.parametrize("name, retention", [("bert", DROPPING), ("bert", (0.7, 0.5, 0.1)), ("albert", DROPPING),
                                             ("electra", (9, 9, 2))])
def test_dropped_tokens_equal_masked_keys_in_a_float64_numpy_encoder(name, retention):
    config, base = CONFIGS[name], classifier(name)
    model = power_bert(base, retention)
    params = init(model, seed=1)
    ids = tokens(config.pad_token_id, seed=3)
    valid = ids != config.pad_token_id
    x64 = np.asarray(model.apply({"params": params}, ids, method="embedded"), np.float64)
    weights = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    counts = model.retained_counts(LENGTH)
    assert counts == (DROPPING if retention == DROPPING else {0.1: (7, 5, 1), 2: (9, 9, 2)}[retention[-1]])
    expected, alive = numpy_encoder(config, weights, x64, valid, counts)
    np.testing.assert_array_equal(model.apply({"params": params}, ids, method="encode"),
                                  base.apply({"params": params}, ids, method="encode"))
    hidden = np.asarray(model.apply({"params": params}, ids, method="encode_kept"))
    assert hidden.shape == (8, counts[-1], config.d_model)
    for row in range(8):
        kept = np.flatnonzero(alive[row])
        real = valid[row, kept]
        np.testing.assert_allclose(hidden[row][real], expected[row, kept[real]], atol=5e-5, err_msg=f"row {row}")
    flat_weights = traverse_util.flatten_dict(weights, sep="/")
    head = {k: v for k, v in flat_weights.items() if not k.startswith(("layers_", "embedding"))}
    np.testing.assert_allclose(model.apply({"params": params}, ids), numpy_head(config, head, expected), atol=5e-5)


def test_significance_and_kept_positions_against_numpy_on_hand_made_attention():
    rng = np.random.default_rng(0)
    weights = rng.dirichlet(np.ones(5), (2, 3, 5)).astype(np.float32)  # [b=2, heads=3, q=5, k=5]
    valid = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    weights[0, :, :, 3:] = 0.0  # padding keys get no attention from real queries; padding queries do attend
    weights[0, :, 3:] = 1 / 5
    expected = np.zeros((2, 5))
    for b, h, q, k in np.ndindex(weights.shape):
        if valid[b, q] and valid[b, k]:
            expected[b, k] += weights[b, h, q, k]
    score = np.asarray(significance(jnp.asarray(weights), jnp.asarray(valid)))
    np.testing.assert_allclose(score, expected, rtol=1e-6)
    crafted = jnp.asarray([[0.1, 3.0, 2.0, 0.0, 0.0], [0.0, 1.0, 1.0, 1.0, 0.5]])
    kept = lambda count: np.asarray(kept_positions(crafted, jnp.asarray(valid), count)).tolist()  # noqa: E731
    assert kept(1) == [[0], [0]]  # [CLS] first, however little attention it gets
    assert kept(3) == [[0, 1, 2], [0, 1, 2]]  # ties go to the earlier position
    assert kept(4) == [[0, 1, 2, 3], [0, 1, 2, 3]]  # padding after every real token, then in order
    assert kept(5) == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4]]


def masked_reference(model, params, ids, alive_after):
    """The plain classifier's layers at full size, the positions dead after layer j masked out as keys from
    layer j + 1 on (alive_after[j] bool [b, s]): float32 logits [b, C]."""
    config = model.config
    x = model.apply({"params": params}, ids, method="embedded")
    keys = ids != config.pad_token_id
    for j, alive in enumerate(alive_after):
        mask = AttentionMask(jnp.where(keys, 0.0, -1e10)[:, None, None, :])
        layer = params[f"layers_{j * config.layer_groups // config.num_layers}"]
        x = PostLNLayer(config).apply({"params": layer}, x, mask)
        keys = keys & alive
    return plain_classifier(model).apply({"params": params}, x, method="classify")


@pytest.mark.parametrize("name", ["bert", "roberta"])
@pytest.mark.slow
def test_a_gradient_step_equals_the_same_step_on_the_masked_reference(name):
    config = CONFIGS[name]
    model = power_bert(classifier(name), DROPPING)
    params = init(model, seed=2)
    ids = tokens(config.pad_token_id, seed=4)
    x64 = np.asarray(model.apply({"params": params}, ids, method="embedded"), np.float64)
    alive_after, weights = [], jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    for j in range(1, 4):  # the positions alive after each layer, as the NumPy encoder picks them
        alive_after.append(numpy_encoder(config, weights, x64, ids != config.pad_token_id, DROPPING[:j])[1])
    labels = np.arange(8) % LABELS

    def loss(logits):
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], -1))

    got = jax.grad(lambda p: loss(model.apply({"params": p}, ids)))(params)
    want = jax.grad(lambda p: loss(masked_reference(model, p, ids, alive_after)))(params)
    step = lambda p, g: jax.tree.map(lambda a, b: a - 0.5 * b, p, g)  # noqa: E731
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-6), step(params, got), step(params, want))
    assert float(jnp.abs(got["layers_2"]["mlp"]["wi"]["kernel"]).max()) > 1e-4


@pytest.mark.slow
def test_sharded_training_steps_equal_one_device():
    """SGD, as in the early-exit test: Adam and Adafactor magnify the rounding of gradients that are zero."""
    check_sharded_steps_equal_one_device(power_bert(classifier("roberta"), [8, 6, 3]), None)


def test_flops_fall_with_retention():
    base = EncoderForSequenceClassification(dataclasses.replace(CONFIGS["bert"], max_length=64), num_labels=LABELS)
    params = init(base)
    ids = np.random.default_rng(0).integers(2, 60, (8, 64)).astype(np.int32)

    def flops(model):
        analysis = jax.jit(lambda p, i: model.apply({"params": p}, i)).lower(params, ids).compile().cost_analysis()
        return (analysis[0] if isinstance(analysis, list) else analysis)["flops"]

    full = flops(base)
    counts = [flops(power_bert(base, r)) for r in ([64] * 3, [48, 32, 16], [32, 16, 8], [8, 4, 1])]
    assert full < counts[0] < 1.05 * full  # full retention: the plain model and the ranking's few extra FLOPs
    assert counts == sorted(counts, reverse=True)
    assert counts[2] < 0.5 * full and counts[3] < 0.3 * full  # layer 1 attends over all 64 tokens


@pytest.mark.parametrize("make, message", [
    (lambda: power_bert(classifier(), [8, 9, 4]),
     r"retention=\[8, 9, 4\] grows at layer 2 \(8 -> 9\); .* make it non-increasing"),
    (lambda: power_bert(classifier(), [8, 4]), r"retention=\[8, 4\] must list one entry per layer \(3\)"),
    (lambda: power_bert(classifier(), [8, 0.5, 0.25]), r"token counts >= 1 or fractions of the input length"),
    (lambda: power_bert(classifier(), [1.5, 1.0, 1.0]), r"retention=\[1.5, 1.0, 1.0\] must list one entry"),
    (lambda: power_bert(classifier(), [0, 0, 0]), r"retention=\[0, 0, 0\] must list"),
    (lambda: power_bert(classifier(), [12, 8, 4]).apply({"params": init(classifier())}, tokens()),
     r"keeps 12 tokens at layer 1 but the input is 10 long; use counts <= 10, or fractions of the length"),
    (lambda: power_bert(GPT2ForSequenceClassification(GPT2Config(**SMALL)), [4] * 3),
     r"PoWER-BERT needs a sequence classifier of the encoder family .* got GPT2ForSequenceClassification"),
    (lambda: power_bert(EncoderForTokenClassification(CONFIGS["bert"]), [4] * 3),
     r"needs a sequence classifier .* got EncoderForTokenClassification"),
    (lambda: power_bert(EncoderForSequenceClassification(dataclasses.replace(CONFIGS["bert"], scan_layers=True)),
                        [4] * 3), r"set BertConfig.scan_layers = False"),
    (lambda: power_bert(EncoderForSequenceClassification(dataclasses.replace(CONFIGS["bert"], remat_policy="full")),
                        [4] * 3), r"set BertConfig.remat_policy = 'none' \(got 'full'\)"),
    (lambda: power_bert(EncoderForSequenceClassification(dataclasses.replace(CONFIGS["bert"], layerdrop=0.2)),
                        [4] * 3), r"set BertConfig.layerdrop = 0 \(got 0.2\)"),
    (lambda: power_bert(EncoderForSequenceClassification(
        dataclasses.replace(CONFIGS["bert"], attention_kernel="blockwise")), [4] * 3),
     r"set BertConfig.attention_kernel = 'einsum' \(got 'blockwise'\)"),
    (lambda: power_bert(power_bert(classifier(), [4] * 3), [4] * 3), r"already drops tokens; apply power_bert"),
])
def test_bad_values_are_refused_in_one_line(make, message):
    with pytest.raises(ValueError, match=message) as error:
        make()
    assert "\n" not in str(error.value)



def test_the_demo_run_file_binds_power_bert_on_the_fine_tuned_classifier():
    import gin

    from ptmjax import gin_files

    try:
        gin_files.parse_gin(["runs/power_bert_demo.gin"])
        bindings = gin.get_bindings("train")
        assert bindings["model"].retention == (0.5, 0.25) and bindings["model"].num_labels == 12
        assert plain_classifier(bindings["model"]) == EncoderForSequenceClassification(
            bindings["model"].config, num_labels=12)
        assert bindings["init_checkpoint"] == "runs/bert_classify_demo"
    finally:
        gin.clear_config()


@pytest.mark.slow  # a gin training run and two evaluations; the model's training is tested above
def test_a_gin_run_trains_through_the_extraction_and_its_evaluation_reports_score_tokens_and_speed(tmp_path):
    """runs/power_bert_demo.gin from a fresh BERT (no init checkpoint), 3 steps, inputs 32 long: `ptmjax eval`
    scores the folder's model as the report at its retention does; full retention keeps every token."""
    import gin

    from ptmjax import cli
    from ptmjax.compress.token_dropping_evaluation import RetentionEvaluation
    from ptmjax.decoding import DecodeConfig
    from ptmjax.tasks.classification_head import MODULE_HEAD_TASK
    from ptmjax.tools.evaluate import evaluate_model_dir

    model_dir = str(tmp_path / "run")
    bindings = ["train.init_checkpoint = None", "train.num_steps = 3", "train.batch_size = 8",
                "train.task_feature_lengths = {'inputs': 32}", "train.eval_every = 3", "train.eval_batches = 1",
                "train.inference_eval_tasks = []", "train.best_checkpoint_metric = None"]
    try:
        assert cli.main(["train", "--gin_file", "runs/power_bert_demo.gin", "--model_dir", model_dir,
                         *(f"--gin_bindings={b}" for b in bindings)]) == 0
    finally:
        gin.clear_config()
    plain = evaluate_model_dir(model_dir, MODULE_HEAD_TASK, DecodeConfig(), batch_size=8, max_examples=24,
                               output=str(tmp_path / "eval.json"), show_progress=False).results[MODULE_HEAD_TASK]
    evaluation = RetentionEvaluation(model_dir, MODULE_HEAD_TASK, batch_size=8, max_examples=24, repeats=1)
    (own,) = evaluation.report([0.5, 0.25])
    assert own.metrics == pytest.approx(plain) and own.tokens_kept == (16, 8)
    assert own.token_layers == pytest.approx(24 / 64) and own.flops_ratio < 0.75
    assert all(kept <= count for kept, count in zip(own.real_tokens_kept, own.tokens_kept, strict=True))
    (full,) = evaluation.report(None)
    assert full.tokens_kept == (32, 32) and full.token_layers == 1 and full.flops_ratio == 1
    assert full.real_tokens_kept[0] >= own.real_tokens_kept[0] >= own.real_tokens_kept[1] > 1
