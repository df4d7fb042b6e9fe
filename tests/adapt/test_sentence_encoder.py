"""Contrastive fine-tuning of a sentence encoder (models/sentence_encoder.py, adapt/sentence_embedding.py): the
MultipleNegativesRanking loss and its gradient against float64 NumPy written from sentence-transformers'
definition, the pooling against NumPy, sharded steps against one device, retrieval@1 by hand, the pair task's
rows, and (slow) a gin fine-tune from a local sentence-transformers folder that raises retrieval@1 and still
embeds as transformers computes it on the exported folder."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn

from ptmjax import metrics, partitioning
from ptmjax.families import losses
from ptmjax.families.model_api import model_api
from ptmjax.families.token_loss import LossConfig
from ptmjax.models import BertConfig
from ptmjax.models.bert import Bert
from ptmjax.models.sentence_encoder import PairEmbeddings, encoder_of, pooled, sentence_encoder
from ptmjax.training.run_spec import RunSpec

BATCH, WIDTH = 8, 16
CONFIG = BertConfig(vocab_size=64, d_model=32, num_heads=2, num_layers=2, d_ff=64, max_length=32, dropout_rate=0.0,
                    attention_dropout_rate=0.0)


def reference_loss(anchors, positives, scale=20.0):
    """float64 sentence-transformers MultipleNegativesRankingLoss: cos_sim (each row over max(norm, 1e-12)) times
    scale, cross-entropy of anchor i against every positive with label i, mean over anchors."""
    a, p = (np.asarray(x, np.float64) for x in (anchors, positives))
    a = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
    p = p / np.maximum(np.linalg.norm(p, axis=1, keepdims=True), 1e-12)
    scores = scale * a @ p.T
    top = scores.max(1, keepdims=True)
    log_z = top[:, 0] + np.log(np.exp(scores - top).sum(1))
    return float(np.mean(log_z - np.diag(scores)))


def mnrl(anchors, positives, weights, scale=20.0):
    batch = {"example_weight": weights}
    terms = losses.multiple_negatives_ranking_loss(PairEmbeddings(anchors, positives), batch,
                                                   LossConfig(similarity_scale=scale))
    return terms.token_loss / terms.stats.counts["token_loss"], terms


def embeddings(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(BATCH, WIDTH)).astype(np.float32) for _ in range(2)]


@pytest.mark.parametrize("scale", [20.0, 1.0])
def test_the_loss_equals_sentence_transformers_definition_in_float64(scale):
    anchors, positives = embeddings()
    positives[3] = anchors[3] * 2.0  # a perfect positive, at another norm
    loss, terms = mnrl(anchors, positives, np.ones(BATCH, np.int32), scale)
    assert abs(float(loss) - reference_loss(anchors, positives, scale)) < 2e-6
    scores = anchors @ positives.T / np.outer(np.linalg.norm(anchors, axis=1), np.linalg.norm(positives, axis=1))
    assert float(terms.stats.sums["accuracy"]) == float(np.sum(scores.argmax(1) == np.arange(BATCH)))


def test_padded_rows_are_neither_anchors_nor_negatives():
    anchors, positives = embeddings(1)
    weights = np.ones(BATCH, np.int32)
    weights[[2, 6]] = 0
    loss, terms = mnrl(anchors, positives, weights)
    real = weights > 0
    assert float(terms.stats.counts["token_loss"]) == real.sum()
    assert abs(float(loss) - reference_loss(anchors[real], positives[real])) < 2e-6
    grads = jax.grad(lambda a, p: mnrl(a, p, weights)[0], argnums=(0, 1))(anchors, positives)
    assert all(np.all(np.isfinite(g)) and not np.any(g[~real]) for g in grads)


def test_the_gradient_equals_central_differences_of_the_float64_reference():
    anchors, positives = embeddings(2)
    weights = np.ones(BATCH, np.int32)
    grads = jax.grad(lambda a, p: mnrl(a, p, weights)[0], argnums=(0, 1))(anchors, positives)
    h = 1e-6
    for which, grad in enumerate(grads):
        expected = np.zeros((BATCH, WIDTH))
        for index in np.ndindex(BATCH, WIDTH):
            pair = [anchors.astype(np.float64), positives.astype(np.float64)]
            up, down = pair[which].copy(), pair[which].copy()
            up[index] += h
            down[index] -= h
            expected[index] = (reference_loss(*(up if k == which else pair[k] for k in range(2))) -
                               reference_loss(*(down if k == which else pair[k] for k in range(2)))) / (2 * h)
        np.testing.assert_allclose(grad, expected, atol=2e-5)


@pytest.mark.parametrize("pooling", ["mean", "cls", "max"])
def test_pooling_counts_real_tokens_only(pooling):
    rng = np.random.default_rng(3)
    hidden = rng.normal(size=(3, 5, 4)).astype(np.float32)
    lengths = [5, 2, 3]
    real = np.arange(5)[None, :] < np.asarray(lengths)[:, None]
    pick = {"mean": lambda h: h.mean(0), "cls": lambda h: h[0], "max": lambda h: h.max(0)}[pooling]
    want = np.stack([pick(h[:n]) for h, n in zip(hidden, lengths, strict=True)])
    np.testing.assert_allclose(pooled(jnp.asarray(hidden), jnp.asarray(real), pooling, False), want, atol=1e-6)
    normalised = pooled(jnp.asarray(hidden), jnp.asarray(real), pooling, True)
    np.testing.assert_allclose(normalised, want / np.linalg.norm(want, axis=1, keepdims=True), atol=1e-6)


def test_the_model_keeps_its_encoders_parameters_and_encode():
    model = sentence_encoder(Bert(CONFIG), "cls", True)
    tokens = jnp.asarray(np.random.default_rng(4).integers(1, 64, (2, 7)), jnp.int32)
    params = model_api(model).init(jax.random.key(0))
    base = model_api(encoder_of(model))
    assert encoder_of(model) == Bert(CONFIG)
    assert jax.tree.structure(nn.unbox(params)) == jax.tree.structure(nn.unbox(base.init(jax.random.key(0))))
    params = nn.unbox(params)
    hidden = base.module.apply({"params": params}, tokens, method="encode")
    out = model.apply({"params": params}, tokens, tokens)
    np.testing.assert_allclose(out.anchors, hidden[:, 0] / np.linalg.norm(hidden[:, 0], axis=1, keepdims=True),
                               atol=1e-6)


@pytest.mark.parametrize("make, message", [
    (lambda: sentence_encoder(sentence_encoder(Bert(CONFIG))), r"wraps an encoder of the BERT family once"),
    (lambda: sentence_encoder(Bert(CONFIG), "sum"), r"pooling='sum' is unknown; use one of mean, cls, max"),
])
def test_bad_values_are_refused_in_one_line(make, message):
    with pytest.raises(ValueError, match=message) as error:
        make()
    assert "\n" not in str(error.value)


def test_a_folder_without_sentence_transformers_files_and_a_bad_scale_are_refused(tmp_path):
    from ptmjax.adapt.sentence_embedding import sentence_encoder as from_folder

    with pytest.raises(ValueError, match="similarity_scale must be > 0, got 0.0"):
        LossConfig(similarity_scale=0.0)
    with pytest.raises(ValueError, match="has no modules.json of sentence-transformers; point sentence_encoder"):
        from_folder(Bert(CONFIG), str(tmp_path))


def test_retrieval_at_1_by_hand():
    """Anchor 0 is nearest body 0: right. Anchors 1 and 2 tie bodies 1 and 2 (one text, 'b'): the first, body
    1, is right for both. Anchor 3 is nearest body 0 (cosines 0.71, 0, 0, 0 with bodies 0-3): wrong. 3 of 4."""
    bodies = [[1, 0], [0, 1], [0, 1], [1, 1]]
    anchors = [[1, 0.1], [0.1, 1], [0.1, 1], [1, -1]]
    predictions = [[anchor, body] for anchor, body in zip(anchors, bodies, strict=True)]
    assert metrics.retrieval_at_1(["a", "b", "b", "d"], predictions) == {"retrieval_at_1": 75.0}


def trainer_of(model, mesh_config, devices):
    spec = RunSpec(model=model, batch_size=BATCH, task_feature_lengths={"inputs": 8, "targets": 12},
                   optimizer=optax.sgd, pack=False, mesh_config=mesh_config, loss_config=LossConfig(z_loss=0.0))
    return spec.trainer(partitioning.make_mesh(spec.mesh_config, devices)), spec


def pair_batch(spec, seed):
    rng = np.random.default_rng(seed)
    batch = {name: np.zeros(s.shape, s.dtype) for name, s in spec.abstract_batch(None).items()}
    for name in ("input_tokens", "positive_tokens"):
        lengths = rng.integers(2, batch[name].shape[1] + 1, BATCH)
        tokens = rng.integers(1, 64, batch[name].shape)
        batch[name] = np.where(np.arange(batch[name].shape[1]) < lengths[:, None], tokens, 0).astype(np.int32)
    batch["example_weight"] = np.ones(BATCH, np.int32)
    batch["example_weight"][5] = 0
    return batch


@pytest.mark.slow  # two meshes, two steps each: about a minute on 2 cores
def test_sharded_steps_equal_one_device_so_the_negatives_are_the_global_batch():
    """On (data=2, fsdp=2, tensor=2) each data shard holds 2 of the 8 rows; the loss still compares every anchor
    with all 7 real positives, as on one device (SGD, two steps): per-device negatives would differ."""
    model = sentence_encoder(Bert(CONFIG), "mean", True)
    results = []
    for mesh_config, devices in [(partitioning.MeshConfig(data=2, fsdp=2, tensor=2), None),
                                 (partitioning.MeshConfig(data=1), jax.devices()[:1])]:
        trainer, spec = trainer_of(model, mesh_config, devices)
        state = trainer.init_state(jax.random.key(0))
        for step in range(2):
            state, step_metrics = trainer.train_step(
                state, partitioning.global_batch(pair_batch(spec, step), trainer.mesh), jax.random.key(step))
        results.append((float(step_metrics["loss"]), jax.device_get(state.params)))
    (sharded_loss, sharded), (single_loss, single) = results
    np.testing.assert_allclose(sharded_loss, single_loss, rtol=2e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6), sharded, single)


def test_the_pair_task_reads_summary_and_body_as_the_tokenizer_encodes_one_text():
    import seqio

    from ptmjax.tasks import docstring_pairs

    train, validation = docstring_pairs.docstring_pairs("train"), docstring_pairs.docstring_pairs("validation")
    assert len(validation) == docstring_pairs.VALIDATION_PAIRS and len(train) > 500
    assert not {s for s, _ in train} & {s for s, _ in validation}
    assert all(len(body.split()) >= 8 for _, body in train + validation)
    task = seqio.get_mixture_or_task(docstring_pairs.PAIRS_TASK)
    first = next(task.get_dataset({"inputs": 16, "targets": 32}, split="validation", shuffle=False)
                 .as_numpy_iterator())
    vocabulary = task.output_features["inputs"].vocabulary
    summary, body = validation[0]
    assert list(first["inputs"]) == ([*vocabulary.encode(summary)[:15], vocabulary.eos_id])
    assert list(first["targets"]) == ([*vocabulary.encode(body)[:31], vocabulary.eos_id])
    assert first["targets_pretokenized"].decode() == body
    with pytest.raises(ValueError, match="unknown split 'test' of 'ptmjax_stdlib_docstring_pairs'"):
        docstring_pairs.docstring_pairs("test")


torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
LENGTH = 64  # the task's inputs and targets lengths, the folder's max_seq_length and its positions


def validation_retrieval(folder):
    """retrieval@1 (0-100) of ptmjax.load(folder).embed on the validation pairs, cut as the task cuts them."""
    import ptmjax
    from ptmjax.tasks import docstring_pairs

    pairs = docstring_pairs.docstring_pairs("validation")
    encoder = ptmjax.load(str(folder))
    vectors = [encoder.embed([text for text in texts], truncate=True) for texts in zip(*pairs, strict=True)]
    predictions = np.stack(vectors, axis=1)
    return metrics.retrieval_at_1([body for _, body in pairs], predictions)["retrieval_at_1"]


def transformers_encode(path, texts):
    """sentence-transformers' encode of the exported folder, computed in transformers: AutoModel, each text cut to
    LENGTH tokens, the mean of the last hidden states, L2-normalised."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModel.from_pretrained(path).eval()
    with torch.no_grad():
        states = [model(**tokenizer(t, return_tensors="pt", truncation=True, max_length=LENGTH)).last_hidden_state
                  for t in texts]
    return np.stack([torch.nn.functional.normalize(s[0].mean(0), dim=0).numpy() for s in states])


@pytest.mark.slow  # an import, 80 training steps with two evaluations, an eval and an export: about a minute
def test_a_gin_fine_tune_from_a_sentence_transformers_folder_raises_retrieval_and_still_embeds(tmp_path):
    import gin
    from hf_folders import SMALL_BERT, saved, wordpiece_tokenizer, write_sentence_transformers_files

    from ptmjax import cli
    from ptmjax.tasks import docstring_pairs

    tokenizer = wordpiece_tokenizer(transformers.BertTokenizer)
    torch.manual_seed(0)
    hf = tmp_path / "hf"
    saved(hf, tokenizer, transformers.BertModel(transformers.BertConfig(
        vocab_size=len(tokenizer), max_position_embeddings=LENGTH, **SMALL_BERT)))
    write_sentence_transformers_files(hf, pooling="mean", max_seq_length=LENGTH)
    imported, run, exported = tmp_path / "imported", tmp_path / "run", tmp_path / "exported"
    assert cli.main(["convert", "--from-hf", str(hf), "--to", str(imported)]) == 0
    before = validation_retrieval(imported)
    bindings = [f"IMPORT = '{imported}'", "train.num_steps = 80", "train.eval_every = 40",
                "train.checkpoint_every = 40",
                "slanted_triangular.total_steps = 80", "slanted_triangular.peak_learning_rate = 1e-3",
                f"train.task_feature_lengths = {{'inputs': {LENGTH}, 'targets': {LENGTH}}}",
                "train.show_progress = False", "train.seed = 0"]
    try:
        assert cli.main(["train", f"--gin_file={imported / 'config.gin'}", "--gin_file=runs/import_contrastive.gin",
                         f"--model_dir={run}", *(f"--gin_bindings={b}" for b in bindings)]) == 0
        assert cli.main(["eval", "--model_dir", str(run), "--task", docstring_pairs.PAIRS_TASK]) == 0
    finally:
        gin.clear_config()
        docstring_pairs.register_pairs_task()
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    key = f"eval_{docstring_pairs.PAIRS_TASK}/retrieval_at_1"
    evaluated = [record[key] for record in logged if key in record]
    after = validation_retrieval(run)
    print(f"retrieval@1 on the 100 validation pairs: {before:.0f} before, {evaluated} in training, {after:.0f} after")
    assert after == evaluated[-1]  # the run's evaluation is embed's, through the folder's pooling
    report = json.loads(next((run / "eval").glob("*.json")).read_text())
    assert report["metrics"][docstring_pairs.PAIRS_TASK]["retrieval_at_1"] == after
    assert after >= before + 10
    assert cli.main(["convert", "--from", str(run), "--to-hf", str(exported)]) == 0
    assert (exported / "modules.json").read_text() == (hf / "modules.json").read_text()
    texts = ["Return the sum of a and b.", " ".join(["word"] * 80)]
    import ptmjax

    want = transformers_encode(str(exported), texts)
    np.testing.assert_allclose(ptmjax.load(str(run)).embed(texts, truncate=True), want, atol=2e-5)
    np.testing.assert_allclose(ptmjax.load(str(exported)).embed(texts, truncate=True), want, atol=2e-5)
