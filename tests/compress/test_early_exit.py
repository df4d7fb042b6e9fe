"""Early exit (ptmjax/compress/early_exit*.py): each exit's logits against float64 NumPy of its head on the layer
states the probing tools read; the training loss against PABEE's and DeeBERT's weighted sums by hand; the entropy
and patience exits against a NumPy reference on crafted logits; the layer-by-layer runner against the all-layers
decisions, computing only the layers needed; DeeBERT's second stage freezing all but the exits; (data, fsdp,
tensor) against one device; an evaluation's report against `ptmjax eval`; bad values refused in one line."""

import dataclasses
import math

import jax
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax import traverse_util

from ptmjax import partitioning
from ptmjax.adapt.probing.layer_features import LayerReader
from ptmjax.compress.early_exit import EXIT_PARAMS, early_exit
from ptmjax.compress.early_exit_loss import ExitLoss
from ptmjax.compress.early_exit_policies import EntropyExit, PatienceExit, exit_decisions
from ptmjax.compress.early_exit_runner import LayerByLayer
from ptmjax.families.model_api import model_api
from ptmjax.families.token_loss import LossConfig
from ptmjax.models import AlbertConfig, BertConfig, ElectraConfig, GPT2Config
from ptmjax.models.encoder_tasks import EncoderForSequenceClassification, EncoderForTokenClassification
from ptmjax.models.gpt2_tasks import GPT2ForSequenceClassification
from ptmjax.training.optimizers import adafactor
from ptmjax.training.run_spec import RunSpec

SMALL = {"vocab_size": 64, "d_model": 16, "num_heads": 2, "num_layers": 3, "d_ff": 32, "max_length": 16,
         "dropout_rate": 0.0, "attention_dropout_rate": 0.0}
CONFIGS = {
    "bert": BertConfig(**SMALL, nsp_head=False),
    "roberta": BertConfig(**SMALL, pad_token_id=1, positions_after_padding=True, nsp_head=False),
    "albert": AlbertConfig(**SMALL, embedding_size=8),  # one set of layer parameters, applied 3 times
    "electra": ElectraConfig(**SMALL, embedding_size=8),
}
LABELS, LENGTH, BATCH = 3, 10, 8


def exit_model(name="bert"):
    return early_exit(EncoderForSequenceClassification(CONFIGS[name], num_labels=LABELS))


def tokens(pad_id=0, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(2, 60, (BATCH, LENGTH)).astype(np.int32)
    ids[1, 6:] = pad_id
    ids[4, 3:] = pad_id
    return ids


def flat(params):
    return traverse_util.flatten_dict(nn.unbox(params), sep="/")


def numpy_head(config, weights, hidden):
    """float64 NumPy of a sequence head (`weights`: its parameters by path) on hidden [b, s, d]."""
    w = {k: np.asarray(v, np.float64) for k, v in weights.items()}
    first = hidden[:, 0]
    if config.classifier_activation is None:
        pooled = np.tanh(first @ w["pair_head/pooler/kernel"] + w["pair_head/pooler/bias"])
        return pooled @ w["classifier/kernel"] + w["classifier/bias"]
    x = first @ w["classifier/dense/kernel"] + w["classifier/dense/bias"]
    x = np.tanh(x) if config.classifier_activation == "tanh" else x * 0.5 * (1 + np.vectorize(math.erf)(x / 2**0.5))
    return x @ w["classifier/out_proj/kernel"] + w["classifier/out_proj/bias"]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_each_exit_is_its_head_in_float64_on_the_layer_state_the_probing_tools_read(name):
    model = exit_model(name)
    params = flat(model_api(model).init(jax.random.key(1)))
    ids = tokens(CONFIGS[name].pad_token_id)
    logits = np.asarray(model.apply({"params": traverse_util.unflatten_dict(params, sep="/")}, ids,
                                    method="exit_logits"))
    base = EncoderForSequenceClassification(CONFIGS[name], num_labels=LABELS)
    backbone = traverse_util.unflatten_dict({k: v for k, v in params.items() if not k.startswith("exits_")}, sep="/")
    hidden = LayerReader(base, backbone)(ids).hidden.astype(np.float64)  # [L + 1, b, s, d]
    assert logits.shape == (3, BATCH, LABELS)
    for layer in range(3):
        prefix = f"exits_{layer}/" if layer < 2 else ""
        weights = {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix) and not
                   k.startswith(("layers_", "embeddings", "exits_" if layer == 2 else "-"))}
        expected = numpy_head(CONFIGS[name], weights, hidden[layer + 1])
        np.testing.assert_allclose(logits[layer], expected, atol=2e-5, err_msg=f"exit {layer}")
    np.testing.assert_array_equal(model.apply({"params": traverse_util.unflatten_dict(params, sep="/")}, ids),
                                  logits[-1])


def trainer_of(model, objective, mesh_config=None, devices=None, trainable=None, optimizer=adafactor):
    spec = RunSpec(model=model, batch_size=BATCH, task_feature_lengths={"inputs": LENGTH}, optimizer=optimizer,
                   pack=False, objective=objective, mesh_config=mesh_config, loss_config=LossConfig(z_loss=0.0),
                   trainable=trainable)
    return spec.trainer(partitioning.make_mesh(spec.mesh_config, devices)), spec


def classification_batch(spec, seed=0):
    rng = np.random.default_rng(seed)
    batch = {name: np.zeros(s.shape, s.dtype) for name, s in spec.abstract_batch(None).items()}
    batch["input_tokens"] = tokens(seed=seed)
    batch["label"] = rng.integers(0, LABELS, BATCH).astype(batch["label"].dtype)
    batch["example_weight"] = np.ones(BATCH, batch["example_weight"].dtype)
    batch["example_weight"][5] = 0  # an unweighted row counts for nothing
    return batch


def cross_entropies(logits, labels):
    """float64 [L, b]: each exit's cross-entropy per row."""
    z = logits - logits.max(-1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return -np.take_along_axis(log_p, labels[None, :, None], -1)[..., 0]


@pytest.mark.parametrize("weighting, weights", [("pabee", np.array([1, 2, 3]) / 6), ("deebert", np.array([1, 1, 0]))])
@pytest.mark.slow
def test_the_training_loss_is_the_weighted_sum_of_the_exits_cross_entropies(weighting, weights):
    model = exit_model()
    trainer, spec = trainer_of(model, ExitLoss(weighting))
    state = trainer.init_state(jax.random.key(0))
    batch = classification_batch(spec)
    logits = np.asarray(model.apply({"params": jax.device_get(state.params)}, batch["input_tokens"],
                                    method="exit_logits"), np.float64)
    _, metrics = trainer.train_step(state, partitioning.global_batch(batch, trainer.mesh), jax.random.key(2))
    w = batch["example_weight"].astype(np.float64)
    per_exit = (cross_entropies(logits, batch["label"]) * w).sum(-1) / w.sum()
    np.testing.assert_allclose(float(metrics["loss"]), float(weights @ per_exit), rtol=1e-5)
    hits = (logits.argmax(-1) == batch["label"]) * w
    for j in range(3):
        np.testing.assert_allclose(float(metrics[f"exit{j + 1}_accuracy"]), hits[j].sum() / w.sum(), rtol=1e-6)
    np.testing.assert_allclose(float(metrics["accuracy"]), hits[2].sum() / w.sum(), rtol=1e-6)


def reference_exits(logits, threshold=None, patience=None):
    """NumPy, written from the papers: each row's 1-based exit layer and the prediction there."""
    depth, rows = logits.shape[:2]
    layers, predictions = [], []
    for row in range(rows):
        counter, chosen = 0, depth
        for layer in range(depth):
            values = logits[layer, row].astype(np.float64)
            if threshold is not None:
                p = np.exp(values - values.max())
                p /= p.sum()
                accept = -np.sum(p * np.log(p)) < threshold
            else:
                if layer and np.argmax(values) == np.argmax(logits[layer - 1, row]):
                    counter += 1
                else:
                    counter = 0
                accept = counter >= patience
            if accept:
                chosen = layer + 1
                break
        layers.append(chosen)
        predictions.append(int(np.argmax(logits[chosen - 1, row])))
    return np.array(layers), np.array(predictions)


def crafted_logits():
    """[4 layers, 7 rows, 3 classes]: ties, confident layers, rows that never settle."""
    sure, unsure = [6.0, 0.0, 0.0], [0.1, 0.0, 0.05]
    rows = [
        [unsure, sure, sure, sure],  # confident from layer 2
        [unsure, unsure, unsure, unsure],  # never confident; argmax 0 throughout
        [[1, 1, 0], [1, 1, 0], [0, 1, 1], [0, 1, 1]],  # ties: argmax 0, 0, 1, 1
        [[0, 1, 0], [1, 0, 0], [0, 1, 0], [1, 0, 0]],  # alternates: never patient
        [sure, [0, 6, 0], [0, 6, 0], [0, 6, 0]],
        [[0, 0, 0]] * 4,  # uniform: the entropy is exactly ln 3
        [[0, 0, 5], [0, 0, 5], [0, 0, 5], [0, 0, 5]],
    ]
    return np.array(rows, np.float32).transpose(1, 0, 2)


@pytest.mark.parametrize("policy", [EntropyExit(0.2), EntropyExit(0.8), EntropyExit(1.2), PatienceExit(1),
                                    PatienceExit(2), PatienceExit(3)])
def test_entropy_and_patience_exit_where_a_numpy_reference_does(policy):
    logits = crafted_logits()
    state = jax.jit(exit_decisions, static_argnums=0)(policy, logits)
    if isinstance(policy, EntropyExit):
        layers, predictions = reference_exits(logits, threshold=policy.threshold)
    else:
        layers, predictions = reference_exits(logits, patience=policy.patience)
    np.testing.assert_array_equal(np.asarray(state.layer), layers)
    np.testing.assert_array_equal(np.asarray(state.predictions), predictions)
    np.testing.assert_array_equal(np.asarray(state.logits), logits[layers - 1, np.arange(7)])


def test_the_crafted_rows_exit_where_written_by_hand():
    logits = crafted_logits()
    assert np.asarray(exit_decisions(PatienceExit(2), logits).layer).tolist() == [3, 3, 4, 4, 4, 3, 3]
    assert np.asarray(exit_decisions(PatienceExit(1), logits).layer).tolist() == [2, 2, 2, 4, 3, 2, 2]
    assert np.asarray(exit_decisions(EntropyExit(0.2), logits).layer).tolist() == [2, 4, 4, 4, 1, 4, 1]
    assert np.asarray(exit_decisions(EntropyExit(1.2), logits).layer).tolist() == [1] * 7  # ln 3 < 1.2


@pytest.mark.parametrize("name", ["bert", "albert"])
def test_no_threshold_or_infinite_patience_gives_the_plain_classifier_and_an_infinite_threshold_layer_1(name):
    model = exit_model(name)
    params = nn.unbox(model_api(model).init(jax.random.key(3)))
    ids = tokens(seed=1)
    base = EncoderForSequenceClassification(CONFIGS[name], num_labels=LABELS)
    plain = model_api(base).head_predictions({k: v for k, v in params.items() if not k.startswith("exits_")},
                                             {"input_tokens": ids})
    logits = model.apply({"params": params}, ids, method="exit_logits")
    for policy in (EntropyExit(0.0), PatienceExit(math.inf), PatienceExit(10**6)):
        for state in (exit_decisions(policy, logits), LayerByLayer(model, params, policy)(ids).state):
            np.testing.assert_array_equal(np.asarray(state.predictions), np.asarray(plain))
            assert np.asarray(state.layer).tolist() == [3] * BATCH
    first = exit_decisions(EntropyExit(math.inf), logits)
    assert np.asarray(first.layer).tolist() == [1] * BATCH
    np.testing.assert_array_equal(np.asarray(first.predictions), np.asarray(logits[0]).argmax(-1))


@pytest.mark.parametrize("policy", [EntropyExit(math.inf), EntropyExit(1.0986), PatienceExit(1), EntropyExit(0.0)])
def test_the_layer_by_layer_runner_decides_as_all_layers_and_stops_when_every_row_has_left(policy):
    model = exit_model("roberta")
    params = nn.unbox(model_api(model).init(jax.random.key(4)))
    ids = tokens(pad_id=1, seed=2)
    state = exit_decisions(policy, model.apply({"params": params}, ids, method="exit_logits"))
    run = LayerByLayer(model, params, policy)(ids)
    np.testing.assert_array_equal(np.asarray(run.state.layer), np.asarray(state.layer))
    np.testing.assert_array_equal(np.asarray(run.state.predictions), np.asarray(state.predictions))
    np.testing.assert_allclose(np.asarray(run.state.logits), np.asarray(state.logits), atol=1e-5)
    assert run.layers_run == int(np.asarray(state.layer).max())
    if policy == EntropyExit(math.inf):
        assert run.layers_run == 1


def test_deeberts_second_stage_trains_the_exits_alone():
    model = exit_model()
    trainer, spec = trainer_of(model, ExitLoss("deebert"), trainable=[EXIT_PARAMS])
    state = trainer.init_state(jax.random.key(0))
    before = flat(jax.device_get(state.params))
    state, _ = trainer.train_step(state, partitioning.global_batch(classification_batch(spec), trainer.mesh),
                                  jax.random.key(1))
    after = flat(jax.device_get(state.params))
    moved = sorted(k for k in before if not np.array_equal(before[k], after[k]))
    assert moved and all(k.startswith("exits_") for k in moved)
    assert {k.split("/")[0] for k in moved} == {"exits_0", "exits_1"}


@pytest.mark.slow
def test_sharded_training_steps_equal_one_device():
    """SGD: Adam and Adafactor divide each gradient by its own size, which magnifies the rounding of the
    gradients that are zero in exact arithmetic (the attention key biases)."""
    check_sharded_steps_equal_one_device(exit_model("roberta"), ExitLoss())


def check_sharded_steps_equal_one_device(model, objective):
    """Two SGD steps of `model` (RoBERTa's pad id) on (data=2, fsdp=2, tensor=2) equal them on one device."""
    results = []
    for mesh_config, devices in [(partitioning.MeshConfig(data=2, fsdp=2, tensor=2), None),
                                 (partitioning.MeshConfig(data=1), jax.devices()[:1])]:
        trainer, spec = trainer_of(model, objective, mesh_config, devices, optimizer=optax.sgd)
        state = trainer.init_state(jax.random.key(0))
        for step in range(2):
            batch = classification_batch(spec, seed=step)
            batch["input_tokens"] = np.where(batch["input_tokens"] == 0, 1, batch["input_tokens"])  # RoBERTa's pad
            state, metrics = trainer.train_step(state, partitioning.global_batch(batch, trainer.mesh),
                                                jax.random.key(step))
        results.append((float(metrics["loss"]), jax.device_get(state.params)))
    (sharded_loss, sharded), (single_loss, single) = results
    np.testing.assert_allclose(sharded_loss, single_loss, rtol=2e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6), sharded, single)


@pytest.mark.parametrize("make, message", [
    (lambda: EntropyExit(-0.1), r"EntropyExit threshold=-0.1 must be a number >= 0"),
    (lambda: EntropyExit(float("nan")), r"EntropyExit threshold=nan must be a number >= 0"),
    (lambda: PatienceExit(0), r"PatienceExit patience=0 must be an int >= 1"),
    (lambda: PatienceExit(1.5), r"PatienceExit patience=1.5 must be an int >= 1"),
    (lambda: ExitLoss("mean"), r"ExitLoss.weighting='mean' is unknown; use one of \['pabee', 'deebert'\]"),
    (lambda: early_exit(GPT2ForSequenceClassification(GPT2Config(**SMALL))),
     r"early exit needs a sequence classifier of the encoder family .* got GPT2ForSequenceClassification"),
    (lambda: early_exit(EncoderForTokenClassification(CONFIGS["bert"])),
     r"early exit needs a sequence classifier .* got EncoderForTokenClassification"),
    (lambda: early_exit(EncoderForSequenceClassification(CONFIGS["bert"], num_labels=1)),
     r"num_labels >= 2, got EncoderForSequenceClassification"),
    (lambda: early_exit(EncoderForSequenceClassification(dataclasses.replace(CONFIGS["bert"], scan_layers=True))),
     r"a scanned stack hides; set BertConfig.scan_layers = False"),
    (lambda: early_exit(EncoderForSequenceClassification(dataclasses.replace(CONFIGS["bert"], remat_policy="full"))),
     r"remat_policy='full' recomputes out of its reach; set BertConfig.remat_policy = 'none'"),
    (lambda: early_exit(exit_model()), r"already has exits; apply early_exit to the classifier once"),
    (lambda: ExitLoss()(model_api(EncoderForSequenceClassification(CONFIGS["bert"])), {}, {}, LossConfig(), None,
                        {}),
     r"ExitLoss needs a model with exits, got EncoderForSequenceClassification; wrap it"),
])
def test_bad_values_are_refused_in_one_line(make, message):
    with pytest.raises(ValueError, match=message) as error:
        make()
    assert "\n" not in str(error.value)


def test_the_demo_run_files_bind_exits_and_their_losses():
    import gin

    from ptmjax import gin_files

    for name, weighting, trainable in (("early_exit_demo", "pabee", None),
                                       ("early_exit_deebert_demo", "deebert", [EXIT_PARAMS])):
        try:
            gin_files.parse_gin([f"runs/{name}.gin"])
            bindings = gin.get_bindings("train")
            model = bindings["model"]
            assert callable(getattr(model, "exit_logits", None)) and model.num_labels == 12
            assert bindings["objective"] == ExitLoss(weighting)
            assert bindings.get("trainable") == trainable
        finally:
            gin.clear_config()


@pytest.mark.slow
def test_a_gin_run_trains_the_exits_and_its_evaluation_reports_score_and_layers(tmp_path):
    """runs/early_exit_demo.gin from a fresh BERT (no init checkpoint), 3 steps; the report at threshold 0 is
    `ptmjax eval`'s score with every layer used, at an infinite threshold every example leaves at layer 1."""
    import gin

    from ptmjax import cli
    from ptmjax.compress.early_exit_evaluation import ExitEvaluation
    from ptmjax.decoding import DecodeConfig
    from ptmjax.tasks.classification_head import MODULE_HEAD_TASK
    from ptmjax.tools.evaluate import evaluate_model_dir

    model_dir = str(tmp_path / "run")
    bindings = ["train.init_checkpoint = None", "train.num_steps = 3", "train.batch_size = 8",
                "train.task_feature_lengths = {'inputs': 32}", "train.eval_every = 3", "train.eval_batches = 1",
                "train.inference_eval_tasks = []", "train.best_checkpoint_metric = None", "BertConfig.num_layers = 3"]
    try:
        assert cli.main(["train", "--gin_file", "runs/early_exit_demo.gin", "--model_dir", model_dir,
                         *(f"--gin_bindings={b}" for b in bindings)]) == 0
    finally:
        gin.clear_config()
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        assert "exit3_accuracy" in f.read()
    evaluation = ExitEvaluation(model_dir, MODULE_HEAD_TASK, batch_size=8, max_examples=24)
    plain = evaluate_model_dir(model_dir, MODULE_HEAD_TASK, DecodeConfig(), batch_size=8, max_examples=24,
                               output=str(tmp_path / "eval.json"), show_progress=False).results[MODULE_HEAD_TASK]
    (none,) = evaluation.report(EntropyExit(0.0))
    assert none.metrics == pytest.approx(plain) and none.average_exit_layer == 3 and none.layers_saved == 0
    (first,) = evaluation.report(EntropyExit(math.inf))
    assert first.average_exit_layer == 1 and first.layers_saved == pytest.approx(2 / 3)
    (patient,) = evaluation.report(PatienceExit(1))
    assert 2 <= patient.average_exit_layer <= 3 and patient.layers_saved == pytest.approx(
        1 - patient.average_exit_layer / 3)
    assert set(patient.metrics) == set(plain) and patient.depth == 3


def test_an_exit_after_a_layer_layerdrop_skips_reads_that_layers_input():
    model = early_exit(EncoderForSequenceClassification(dataclasses.replace(CONFIGS["bert"], layerdrop=0.5),
                                                        num_labels=LABELS))
    params = nn.unbox(model_api(model).init(jax.random.key(5)))
    ids = tokens()
    for seed in range(20):
        logits, variables = model.apply({"params": params}, ids, enable_dropout=True, method="exit_logits",
                                        rngs={"dropout": jax.random.key(seed)}, mutable=["intermediates"])
        (dropped,) = variables["intermediates"]["layerdrop"]["dropped"]
        if dropped[0]:
            break
    assert dropped[0], "no draw dropped layer 1"
    embedded = model.apply({"params": params}, ids, method="embedded")
    np.testing.assert_allclose(logits[0], model.apply({"params": params}, 0, embedded, method="exit_at"), atol=1e-6)
