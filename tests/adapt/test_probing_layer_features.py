"""Layer features and attention maps of frozen models against transformers' output_hidden_states and
output_attentions (random tiny BERT and GPT-2, padded rows), and scanned / remat twins against plain models."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ptmjax.adapt.probing.layer_features import LayerReader, padded_batch
from ptmjax.layers import layer_stack
from ptmjax.models import GPT2, Albert, AlbertConfig, Bert, BertConfig, EncoderDecoder, GPT2Config, T5Config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from ptmjax.convert import hf_bert, hf_gpt2  # noqa: E402

BERT = BertConfig(
    vocab_size=101, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_length=24, nsp_head=False,
    dropout_rate=0.0, attention_dropout_rate=0.0,
)
GPT = GPT2Config(vocab_size=101, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_length=24,
                 dropout_rate=0.0, attention_dropout_rate=0.0)
ROWS = [list(range(5, 21)), list(range(30, 41)), [7, 8, 9, 10]]


def perturbed(model):
    """LayerNorms and biases off their (1, 0) init, weights scaled up: a wrong mapping would show."""
    torch.manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.ndim == 1:
                param.add_(0.2 * torch.randn_like(param))
            else:
                param.mul_(5.0)
    return model.eval()


def hf_model(converter, config):
    hf_config = converter.to_hf_config(config)
    hf_config._attn_implementation = "eager"  # the probabilities are returned only by eager attention
    torch.manual_seed(0)
    return perturbed(getattr(transformers, converter.hf_class_name(config) if converter is hf_bert
                             else "GPT2LMHeadModel")(hf_config))


def max_diff_on_valid(ours, reference, valid):
    return float(np.abs(ours - reference)[..., valid, :].max())


def test_bert_hidden_states_and_attention_match_transformers():
    model = hf_model(hf_bert, BERT)
    reader = LayerReader(Bert(BERT), hf_bert.hf_to_params(model.state_dict(), BERT)["params"])
    tokens, valid = padded_batch(ROWS, 16, BERT.pad_token_id)
    outputs = reader(tokens)
    with torch.no_grad():
        ref = model(torch.tensor(tokens, dtype=torch.long), attention_mask=torch.tensor(valid.astype(np.int64)),
                    output_hidden_states=True, output_attentions=True)
    hidden_ref = np.stack([h.numpy() for h in ref.hidden_states])  # [3, b, s, d]
    attention_ref = np.stack([a.numpy() for a in ref.attentions])  # [2, b, h, q, k]
    assert outputs.hidden.shape == hidden_ref.shape and outputs.attention.shape == attention_ref.shape
    hidden_diff = max(float(np.abs(outputs.hidden[:, b][:, valid[b]] - hidden_ref[:, b][:, valid[b]]).max())
                      for b in range(len(ROWS)))
    attention_diff = max(float(np.abs(outputs.attention[:, b][..., valid[b], :] - attention_ref[:, b][..., valid[b], :])
                               .max()) for b in range(len(ROWS)))
    print(f"bert: max |hidden diff| {hidden_diff:.1e}, max |attention diff| {attention_diff:.1e}")
    assert hidden_diff < 1e-4 and attention_diff < 1e-5
    np.testing.assert_allclose(outputs.attention.sum(-1), 1.0, atol=1e-5)
    assert np.all(outputs.attention[:, 2, :, :4, 4:] < 1e-6)  # padding keys get no attention


def test_gpt2_hidden_states_and_attention_match_transformers():
    model = hf_model(hf_gpt2, GPT)
    reader = LayerReader(GPT2(GPT), hf_gpt2.hf_to_params(model.state_dict(), GPT)["params"])
    tokens, valid = padded_batch(ROWS, 16, 0)
    outputs = reader(tokens)
    with torch.no_grad():
        ref = model(torch.tensor(tokens, dtype=torch.long), attention_mask=torch.tensor(valid.astype(np.int64)),
                    output_hidden_states=True, output_attentions=True)
    hidden_ref = np.stack([h.numpy() for h in ref.hidden_states])
    attention_ref = np.stack([a.numpy() for a in ref.attentions])
    hidden_diff = max(float(np.abs(outputs.hidden[:, b][:, valid[b]] - hidden_ref[:, b][:, valid[b]]).max())
                      for b in range(len(ROWS)))
    real = [(b, n) for b, n in enumerate(valid.sum(1))]
    attention_diff = max(float(np.abs(outputs.attention[:, b, :, :n, :n] - attention_ref[:, b, :, :n, :n]).max())
                         for b, n in real)
    print(f"gpt2: max |hidden diff| {hidden_diff:.1e}, max |attention diff| {attention_diff:.1e}")
    assert hidden_diff < 1e-4 and attention_diff < 1e-5


def random_params(module, *inputs):
    return jax.jit(module.init)(jax.random.key(0), *inputs)["params"]


@pytest.mark.parametrize("family", ["albert_shared_layers", "t5_encoder"])
def test_scanned_and_rematerialised_models_read_as_their_plain_twins(family):
    if family == "albert_shared_layers":
        config = AlbertConfig(vocab_size=64, d_model=16, num_heads=2, num_layers=4, d_ff=32, max_length=16,
                              embedding_size=8, num_layer_groups=2, dropout_rate=0.0)
        plain, inputs = Albert(config), (jnp.ones((1, 4), jnp.int32),)
    else:
        config = T5Config(vocab_size=64, d_model=16, num_heads=2, head_dim=8, d_ff=32, num_encoder_layers=2,
                          num_decoder_layers=1, ffn_activations=("relu",), tie_embeddings=True, dropout_rate=0.0)
        plain, inputs = EncoderDecoder(config), (jnp.ones((1, 4), jnp.int32),) * 2
    params = random_params(plain, *inputs)
    scanned = plain.clone(config=dataclasses.replace(config, scan_layers=True, remat_policy="full"))
    tokens, _ = padded_batch(ROWS, 16, 0)
    tokens = tokens % 64
    expected = LayerReader(plain, params)(tokens)
    got = LayerReader(scanned, layer_stack.scan(params, config))(tokens)
    layers = config.num_layers if family == "albert_shared_layers" else config.num_encoder_layers
    assert expected.hidden.shape[0] == layers + 1 and expected.attention.shape[0] == layers
    np.testing.assert_allclose(got.hidden, expected.hidden, atol=1e-5)
    np.testing.assert_allclose(got.attention, expected.attention, atol=1e-6)
    if family == "albert_shared_layers":  # layers 0 and 1 share parameters but read different inputs
        assert not np.allclose(expected.attention[0], expected.attention[1])
