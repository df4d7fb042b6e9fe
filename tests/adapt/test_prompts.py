"""Discrete cloze prompts for masked LMs and few-shot prompts for decoders, against hand-built references."""

import jax
import numpy as np
import optax
import pytest
from flax import linen as nn

from ptmjax import partitioning
from ptmjax.adapt.cloze_prompts import ClozePrompt, cloze_rows, cloze_scores, register_cloze_task
from ptmjax.adapt.in_context import draw_demonstrations, few_shot_accuracy, few_shot_prompt
from ptmjax.data import pipeline, vocabularies
from ptmjax.data.feature_converters import MaskedLmFeatureConverter
from ptmjax.families.model_api import model_api
from ptmjax.models import GPT2, Bert, BertConfig, GPT2Config
from ptmjax.partitioning import MeshConfig
from ptmjax.training.trainer import Trainer

VOCAB = vocabularies.stdlib_sentencepiece_vocabulary()
PROMPT = ClozePrompt("{text} It is about {mask} .", ("json", "os"))
BERT = Bert(BertConfig(vocab_size=VOCAB.vocab_size, d_model=32, num_heads=2, num_layers=2, d_ff=64, max_length=32,
                       nsp_head=False, dropout_rate=0.0, attention_dropout_rate=0.0))
EXAMPLES = [("Encode a Python object as a string of text.", 0), ("Return the current working directory.", 1),
            ("Decode a document into a Python object.", 0), ("Remove a file from the file system.", 1)]


def test_cloze_prompt_cuts_the_text_and_keeps_the_template():
    text = "Serialize obj to a JSON formatted str using this conversion table."
    ids, at = PROMPT.encode(VOCAB, text, length=16, mask_id=2175)
    template_ids = VOCAB.encode("It is about") + [2175] + VOCAB.encode(".")
    budget = 16 - len(template_ids) - 1
    assert ids == VOCAB.encode(text)[:budget] + template_ids + [VOCAB.eos_id]
    assert len(ids) == 16 and ids[at] == 2175 and at == budget + len(VOCAB.encode("It is about"))


def test_a_verbalizer_word_of_several_tokens_is_named():
    with pytest.raises(ValueError, match=r"verbalizer word 'xmlrpcserverproxy' is \d+ tokens"):
        ClozePrompt("{text} {mask}", ("json", "xmlrpcserverproxy")).class_ids(VOCAB)


def test_cloze_scores_are_the_class_logits_at_the_mask():
    params = nn.unbox(model_api(BERT).init(jax.random.key(0)))
    rows = cloze_rows(PROMPT, VOCAB, EXAMPLES, length=24)
    assert (rows["target_tokens"] != rows["input_tokens"]).sum(axis=1).tolist() == [1, 1, 1, 1]
    got = cloze_scores(BERT, params, rows["input_tokens"], rows["loss_mask"], PROMPT.class_ids(VOCAB))
    logits = np.asarray(BERT.apply({"params": params}, input_tokens=rows["input_tokens"]).mlm_logits)
    at = rows["loss_mask"].argmax(axis=1)
    want = logits[np.arange(4), at][:, PROMPT.class_ids(VOCAB)]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_pet_fine_tuning_on_the_cloze_makes_the_gold_class_win():
    mesh_config = MeshConfig(data=2, fsdp=2, tensor=2)
    trainer = Trainer(BERT, optax.adamw(3e-3), lambda _: 3e-3, partitioning.make_mesh(mesh_config), mesh_config.rules)
    rows = cloze_rows(PROMPT, VOCAB, EXAMPLES * 2, length=24)
    state = trainer.init_state(jax.random.key(0))
    class_ids, labels = PROMPT.class_ids(VOCAB), np.array([label for _, label in EXAMPLES * 2])
    losses = []
    for _ in range(30):
        state, metrics = trainer.train_step(state, partitioning.global_batch(rows, trainer.mesh), jax.random.key(1))
        losses.append(float(metrics["loss"]))
    scores = cloze_scores(BERT, jax.device_get(state.params), rows["input_tokens"], rows["loss_mask"], class_ids)
    assert losses[-1] < 0.35 * losses[0]
    assert (scores.argmax(axis=1) == labels).all()


def test_few_shot_prompt_text():
    prompt = few_shot_prompt([("a", "x"), ("b", "y")], "c", template="Q: {text} A: {label}\n")
    assert prompt == "Q: a A: x\nQ: b A: y\nQ: c A: "
    assert draw_demonstrations(EXAMPLES, 2, seed=3) == draw_demonstrations(EXAMPLES, 2, seed=3)
    with pytest.raises(ValueError, match=r"k=5 demonstrations cannot be drawn from 4"):
        draw_demonstrations(EXAMPLES, 5, seed=0)


def test_few_shot_scores_are_causal_log_likelihoods_of_the_labels():
    """Against log p(label tokens, EOS | prompt) summed from one causal forward pass over prompt + label."""
    gpt2 = GPT2(GPT2Config(vocab_size=VOCAB.vocab_size, d_model=32, num_heads=2, num_layers=2, d_ff=64,
                           max_length=128, dropout_rate=0.0, attention_dropout_rate=0.0))
    params = nn.unbox(model_api(gpt2).init(jax.random.key(0)))
    labels = ["json", "os"]
    accuracy, scores = few_shot_accuracy(gpt2, params, VOCAB, EXAMPLES[:2], EXAMPLES[2:], labels, k=2,
                                         task_feature_lengths={"inputs": 96, "targets": 4}, seed=1)
    demonstrations = [(text, labels[label]) for text, label in draw_demonstrations(EXAMPLES[:2], 2, seed=1)]
    for i, (text, _) in enumerate(EXAMPLES[2:]):
        prompt = VOCAB.encode(few_shot_prompt(demonstrations, text))
        for j, name in enumerate(labels):
            target = [*VOCAB.encode(f" {name}"), VOCAB.eos_id]
            tokens = np.asarray([prompt + target])
            inputs = np.concatenate([[[0]], tokens[:, :-1]], axis=1)  # the decoder input: shifted right, BOS 0
            logits = np.asarray(gpt2.apply({"params": params}, decoder_input_tokens=inputs), np.float64)[0]
            log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
            want = sum(log_probs[len(prompt) + t, token] for t, token in enumerate(target))
            np.testing.assert_allclose(scores[i, j], want, rtol=1e-4)
    assert accuracy == np.mean(scores.argmax(axis=1) == [label for _, label in EXAMPLES[2:]])


def test_a_registered_cloze_task_gives_the_cloze_rows_to_the_masked_lm_pipeline():
    register_cloze_task("ptmjax_test_cloze", PROMPT, VOCAB, {"train": EXAMPLES, "validation": EXAMPLES[:2]}, length=24)
    batch = next(pipeline.get_dataset("ptmjax_test_cloze", "train", {"inputs": 24, "targets": 24}, 4, seed=0,
                                      shuffle=False, pack=False, num_epochs=1,
                                      feature_converter=MaskedLmFeatureConverter).as_numpy_iterator())
    want = cloze_rows(PROMPT, VOCAB, EXAMPLES, length=24)
    assert sorted(batch) == sorted(want)
    for name, value in want.items():
        np.testing.assert_array_equal(batch[name], value, err_msg=name)
