"""`ptmjax.load` against independent references: `ModelApi.predict` / `score` on rows built by hand from
the vocabulary, float64 numpy log-likelihoods, and `transformers`' own greedy `generate` and logits."""

import jax
import numpy as np
import pytest

import ptmjax
from ptmjax.decoding import DecodeConfig
from ptmjax.families.model_api import model_api

TEXTS = ["def f(x):", "Return.", "a + b", "sort it", "x = 1", "pass", "if x:", "for i", "Ok", "yes", "no!"]
TARGETS = ["y", "b  ", "sum", "in place", "x", "z", "else", "range", "ok", "no", "yes"]
LENGTH = 6


def host_params(model):
    return jax.device_get(model.params)


def padded(rows):
    array = np.zeros((len(rows), max(map(len, rows))), np.int32)
    for i, row in enumerate(rows):
        array[i, : len(row)] = row
    return array


@pytest.mark.slow
def test_generate_equals_model_api_predict_on_hand_built_rows(t5_model):
    vocab, texts = t5_model.vocabulary, TEXTS[:3]
    config = DecodeConfig(method="beam", num_beams=3, num_decodes=2, max_decode_length=LENGTH)
    encoder_inputs = padded([[*vocab.encode(t), vocab.eos_id] for t in texts])
    api = model_api(t5_model.module)
    want = api.predict(host_params(t5_model), {"encoder_input_tokens": encoder_inputs}, config, t5_model.generation_ids)
    got = t5_model.predict(texts, config)
    for row, prediction in enumerate(got):
        tokens = [list(t) for t in np.asarray(want.tokens[row])]
        tokens = [t[: t.index(vocab.eos_id)] if vocab.eos_id in t else t for t in tokens]
        assert [list(t) for t in prediction.tokens] == tokens
        assert list(prediction.outputs) == [vocab.decode(t) for t in tokens]
        np.testing.assert_allclose(prediction.scores, want.scores[row], rtol=1e-5)
    assert t5_model.generate(texts, config) == [list(p.outputs) for p in got]


def test_score_equals_model_api_score_and_float64_numpy(t5_model):
    vocab, params = t5_model.vocabulary, host_params(t5_model)
    inputs = [[*vocab.encode(t), vocab.eos_id] for t in TEXTS]
    targets = [[*vocab.encode(t), vocab.eos_id] for t in TARGETS]
    got = t5_model.score(TEXTS, TARGETS)
    target_tokens = padded(targets)
    batch = {
        "encoder_input_tokens": padded(inputs), "decoder_target_tokens": target_tokens,
        "decoder_input_tokens": np.pad(target_tokens, ((0, 0), (1, 0)))[:, :-1],
        "decoder_loss_weights": (target_tokens > 0).astype(np.int32),
    }
    api = model_api(t5_model.module)
    np.testing.assert_allclose(got, api.score(params, batch), rtol=1e-5)
    logits = np.asarray(t5_model.module.apply({"params": params}, **api.model_inputs(batch)), np.float64)
    log_probs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
    log_probs -= logits.max(-1, keepdims=True)
    want = [sum(log_probs[i, t, y] for t, y in enumerate(row)) for i, row in enumerate(targets)]
    np.testing.assert_allclose(got, want, rtol=1e-4)


@pytest.mark.slow
def test_batches_of_any_size_equal_one_input_at_a_time(t5_model):
    """5 inputs in batches of 2 (the last padded with a copy) match one input at a time (in one padded batch)."""
    config, texts, targets = DecodeConfig(max_decode_length=LENGTH), TEXTS[:5], TARGETS[:5]
    one_by_one = [t5_model.predict([text], config, batch_size=2)[0] for text in texts]
    together = t5_model.predict(texts, config, batch_size=2)
    assert [p.tokens for p in together] == [p.tokens for p in one_by_one]
    np.testing.assert_allclose([p.scores for p in together], [p.scores for p in one_by_one], rtol=1e-5)
    want = [t5_model.score([x], [y], batch_size=2)[0] for x, y in zip(texts, targets, strict=True)]
    np.testing.assert_allclose(t5_model.score(texts, targets, batch_size=2), want, rtol=1e-5)


def test_hf_gpt2_generates_what_transformers_generates(gpt2_dir):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(gpt2_dir)
    reference = transformers.AutoModelForCausalLM.from_pretrained(gpt2_dir).eval()
    prompts = ["Return the sum of", "Open a file and", "The"]
    model = ptmjax.load(gpt2_dir)
    got = model.predict(prompts, max_decode_length=8)
    for prompt, prediction in zip(prompts, got, strict=True):
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        output = reference.generate(ids, max_new_tokens=8, do_sample=False)[0, ids.shape[1] :].tolist()
        new = output[: output.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in output else output
        assert list(prediction.tokens[0]) == new
        assert prediction.outputs[0] == tokenizer.decode(new)
    targets = [" two numbers", " read it", " end"]
    with torch.no_grad():  # log p(target + EOS | prompt) from transformers' logits, in float64
        want = []
        for prompt, target in zip(prompts, targets, strict=True):
            prompt_ids = tokenizer(prompt)["input_ids"]
            target_ids = tokenizer(target)["input_ids"] + [tokenizer.eos_token_id]
            logits = reference(torch.tensor([prompt_ids + target_ids])).logits[0].double()
            log_probs = torch.log_softmax(logits, -1)[len(prompt_ids) - 1 : -1]
            want.append(float(log_probs[torch.arange(len(target_ids)), target_ids].sum()))
    np.testing.assert_allclose(model.score(prompts, targets), want, rtol=1e-4)


def test_repr_html_summarises_the_model(t5_model, t5_run):
    html = t5_model._repr_html_()
    count = sum(x.size for x in jax.tree.leaves(model_api(t5_model.module).abstract_params))
    for part in ("EncoderDecoder", f"{count:,}", "ByteVocabulary", "359 ids", "eos_token_id=1", "1 device", t5_run):
        assert part in html, part


@pytest.mark.parametrize("inputs,error,match", [
    ([], ValueError, "inputs is empty"),
    (["fine", ""], ValueError, r"inputs\[1\] is ''"),
    (["fine", 3.5], TypeError, r"inputs\[1\] is a float"),
    ("a lone string", TypeError, "wrap it"),
])
def test_bad_inputs_get_a_clear_error(t5_model, inputs, error, match):
    with pytest.raises(error, match=match):
        t5_model.generate(inputs)


def test_bad_options_and_paths_get_a_clear_error(t5_model, tmp_path):
    with pytest.raises(ValueError, match=r"unknown decode options \['beams'\]"):
        t5_model.generate(["x"], beams=2)
    with pytest.raises(FileNotFoundError, match="neither a config.gin .* nor a config.json"):
        ptmjax.load(str(tmp_path))
