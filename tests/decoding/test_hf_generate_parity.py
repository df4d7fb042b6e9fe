"""Greedy and beam-search decoding equal Hugging Face `generate`, tokens and scores, on converted models.

T5 v1.0 and v1.1, LongT5 (local and transient-global encoder attention), BART, mBART (plain, with a
language tag as decoder start, and with a forced first token) and GPT-2, with random weights whose final
norm is scaled so that logits are peaked (the top candidates are far apart, so float rounding cannot
reorder them) while sequences still vary. Batches
of 4 rows of different lengths: encoder inputs padded with the model's pad id (HF gets an
attention_mask); GPT-2 prompts right-padded with decoder_segment_ids for ptmjax and left-padded with
an attention_mask for HF. EOS is a token that the models emit mid-sequence in some rows, so
finishing, the padding after EOS and beam search's finished hypotheses are exercised (asserted).

HF settings matching ptmjax: do_sample=False, length_penalty=0.0 (ptmjax length_penalty_alpha=0.0;
and 1.0 and 2.0 with length_penalty_style 'hf', the default for a model from Hugging Face),
early_stopping=False (HF's default: stop when no live beam can beat the worst finished one),
min_length=0, and none of BART's generation defaults that ptmjax does not apply (forced EOS at the
last step, ...). Greedy scores are the sum of log-softmax of the chosen tokens up to and including
EOS; beam scores are HF's `sequences_scores`.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ptmjax.decoding import DecodeConfig, GenerationIds
from ptmjax.families.model_api import model_api
from ptmjax.models import GPT2, EncoderDecoder, GPT2Config, T5Config
from ptmjax.models.bart import Bart, BartConfig
from ptmjax.models.longt5 import LongT5, LongT5Config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from ptmjax.convert import hf_bart, hf_gpt2, hf_longt5, hf_t5  # noqa: E402

VOCAB, NEW_TOKENS, BEAMS = 100, 8, 3
# LLVM optimisation off: each decode compiles in about half the time; the XLA graph (and float32 math) is the same.
COMPILER_OPTIONS = {"xla_backend_optimization_level": 0}
T5_V1_0 = T5Config(
    vocab_size=VOCAB, d_model=32, num_heads=4, head_dim=8, d_ff=64, num_encoder_layers=2, num_decoder_layers=2,
    ffn_activations=("relu",), tie_embeddings=True, dropout_rate=0.0,
)
T5_V1_1 = dataclasses.replace(T5_V1_0, ffn_activations=("gelu", "linear"), tie_embeddings=False)
# LongT5 over inputs of 10 tokens: blocks of 3 (a token sees 2 on each side), one global token per 2 tokens.
LONGT5_LOCAL = LongT5Config(**{f.name: getattr(T5_V1_1, f.name) for f in dataclasses.fields(T5_V1_1)},
                            encoder_attention_type="local", local_radius=2, global_block_size=2)
LONGT5_TGLOBAL = dataclasses.replace(LONGT5_LOCAL, encoder_attention_type="transient-global")
BART = BartConfig(
    vocab_size=VOCAB, d_model=32, num_heads=4, num_encoder_layers=2, num_decoder_layers=2, d_ff=64, max_length=32,
    dropout_rate=0.0,
)
MBART = dataclasses.replace(BART, pre_layer_norm=True, scale_embedding=True)
GPT2_CONFIG = GPT2Config(
    vocab_size=VOCAB, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_length=32, dropout_rate=0.0,
    attention_dropout_rate=0.0,
)


@dataclasses.dataclass(frozen=True)
class Case:
    """A model, how its random weights are drawn, and its special ids.

    Weights: norms and biases perturbed by N(0, 0.2^2); token embeddings ~ N(0, embed_std^2), position
    embeddings (T5: the relative attention bias) ~ N(0, position_std^2), other matrices ~ N(0, 1/d_model);
    then the final norm's scale times `sharpen`, which scales the logits. Small token embeddings keep a
    tied model from repeating its input token; strong positions make sequences vary.
    eos: a token these weights emit mid-sequence in some rows.
    """

    config: object
    module: type
    converter: object
    final_norm: str
    embed_std: float
    position_std: float
    sharpen: float
    eos: int
    pad: int
    start: int | None  # decoder start (encoder-decoders)


CASES = {
    "t5_v1_0": Case(T5_V1_0, EncoderDecoder, hf_t5, "decoder.final_layer_norm.weight", 0.1, 3.0, 48.0, 51, 0, 0),
    "t5_v1_1": Case(T5_V1_1, EncoderDecoder, hf_t5, "decoder.final_layer_norm.weight", 0.3, 3.0, 8.0, 20, 0, 0),
    "longt5_local": Case(LONGT5_LOCAL, LongT5, hf_longt5, "decoder.final_layer_norm.weight", 0.3, 3.0, 8.0, 20, 0, 0),
    "longt5_tglobal": Case(
        LONGT5_TGLOBAL, LongT5, hf_longt5, "decoder.final_layer_norm.weight", 0.3, 3.0, 8.0, 48, 0, 0
    ),
    "bart": Case(BART, Bart, hf_bart, "model.decoder.layers.1.final_layer_norm.weight", 0.3, 1.0, 8.0, 20, 1, 2),
    "mbart": Case(MBART, Bart, hf_bart, "model.decoder.layer_norm.weight", 0.3, 1.0, 8.0, 11, 1, 2),
    "gpt2": Case(GPT2_CONFIG, GPT2, hf_gpt2, "transformer.ln_f.weight", 0.3, 1.0, 8.0, 42, 0, None),
}


@functools.cache
def models(name: str):
    """-> (HF model, ptmjax params) with the weights `Case` describes."""
    case = CASES[name]
    torch.manual_seed(0)
    model = case.converter.build_hf_model(case.config).eval()
    with torch.no_grad():
        for key, param in model.named_parameters():
            if param.ndim == 1:
                param.add_(0.2 * torch.randn_like(param))
            elif any(k in key for k in ("wpe", "embed_positions", "relative_attention_bias")):
                param.normal_(0.0, case.position_std)
            elif any(k in key for k in ("wte", "shared")):
                param.normal_(0.0, case.embed_std)
            else:
                param.normal_(0.0, case.config.d_model**-0.5)
        model.get_parameter(case.final_norm).mul_(case.sharpen)
    params = case.converter.hf_to_params({k: v.numpy() for k, v in model.state_dict().items()}, case.config)
    return model, params["params"]


def batch(name: str):
    """-> (ptmjax batch, HF inputs): 4 rows of lengths 10, 7, 3, 5."""
    case = CASES[name]
    rng = np.random.default_rng(1)
    lengths = np.array([10, 7, 3, 5])
    tokens = rng.integers(3, VOCAB, (4, 10))
    valid = np.arange(10)[None] < lengths[:, None]
    right = np.where(valid, tokens, case.pad)  # encoder inputs: the model's pad id (T5 0, BART 1)
    if case.start is not None:
        hf = dict(input_ids=torch.tensor(right), attention_mask=torch.tensor(valid.astype(np.int64)))
        return {"encoder_input_tokens": jnp.asarray(right, jnp.int32)}, hf
    left, left_valid = (np.stack([np.roll(r, 10 - n) for r, n in zip(x, lengths, strict=True)]) for x in (right, valid))
    ours = {"decoder_input_tokens": jnp.asarray(right, jnp.int32), "decoder_segment_ids": jnp.asarray(valid, jnp.int32)}
    return ours, dict(input_ids=torch.tensor(left), attention_mask=torch.tensor(left_valid.astype(np.int64)))


def hf_generate(name: str, num_beams: int, length_penalty: float = 0.0, **ids):
    """-> (tokens [rows, num_beams or 1, NEW_TOKENS] with pad after EOS, scores), HF's decode."""
    case = CASES[name]
    model, _ = models(name)
    _, inputs = batch(name)
    ids = dict(eos_token_id=case.eos, pad_token_id=case.pad, **ids)
    if case.start is not None:
        ids.setdefault("decoder_start_token_id", case.start)
    ids.setdefault("forced_bos_token_id", None)
    with torch.inference_mode():
        out = model.generate(
            **inputs, **ids, do_sample=False, num_beams=num_beams, num_return_sequences=num_beams,
            max_new_tokens=NEW_TOKENS, min_length=0, length_penalty=length_penalty, early_stopping=False,
            forced_eos_token_id=None, no_repeat_ngram_size=0, repetition_penalty=1.0, output_scores=True,
            return_dict_in_generate=True,
        )
    prompt = 1 if case.start is not None else inputs["input_ids"].shape[1]
    generated = out.sequences[:, prompt:].numpy()
    tokens = np.full((generated.shape[0], NEW_TOKENS), case.pad)
    # HF fills after EOS with pad_token_id, or with EOS where that is 0 (beam search: `pad or eos`);
    # ptmjax pads, so HF's fill becomes pad (and the sequence ends with HF's shortest crop).
    fill = case.pad if num_beams == 1 or case.pad else case.eos
    for row, sequence in enumerate(generated):
        ends = np.flatnonzero(sequence == case.eos)
        n = ends[0] + 1 if len(ends) else len(sequence)
        assert (sequence[n:] == fill).all(), sequence
        tokens[row, :n] = sequence[:n]
    if num_beams > 1:
        scores = out.sequences_scores.numpy()
    else:
        log_probs = torch.stack(out.scores, 1).log_softmax(-1).numpy()  # [rows, steps, vocab]
        chosen = np.take_along_axis(log_probs, generated[:, : log_probs.shape[1], None], -1)[..., 0]
        finished = np.cumsum(generated[:, : log_probs.shape[1]] == case.eos, axis=1)
        after_eos = np.concatenate([np.zeros_like(finished[:, :1]), finished[:, :-1]], axis=1) > 0
        scores = np.where(after_eos, 0.0, chosen).sum(1)
    return tokens.reshape(-1, num_beams, NEW_TOKENS), scores.reshape(-1, num_beams)


def ptmjax_generate(name: str, num_beams: int, length_penalty: float | None = None, **ids):
    """-> (tokens [rows, num_beams or 1, NEW_TOKENS], scores), ptmjax's decode of the same batch; with
    `length_penalty`, its generation ids carry it (a model from Hugging Face) and the decode config sets no
    length penalty (the origin's)."""
    case = CASES[name]
    _, params = models(name)
    ours, _ = batch(name)
    api = model_api(case.module(case.config))
    ids = GenerationIds(case.eos, case.pad, **{"decoder_start_token_id": case.start or 0, **ids},
                        length_penalty=length_penalty)
    if num_beams > 1:
        config = DecodeConfig(
            method="beam", max_decode_length=NEW_TOKENS, num_beams=num_beams, num_decodes=num_beams,
            length_penalty_alpha=0.0 if length_penalty is None else None,
        )
    else:
        config = DecodeConfig(method="greedy", max_decode_length=NEW_TOKENS)
    out = jax.jit(api.predict, static_argnums=(2, 3), compiler_options=COMPILER_OPTIONS)(params, ours, config, ids)
    return np.asarray(out.tokens), np.asarray(out.scores)


def assert_equal_decodes(name: str, num_beams: int, length_penalty: float | None = None, **ids) -> np.ndarray:
    """Asserts ptmjax's and HF's decodes agree (tokens exactly, scores to 1e-4); -> the tokens.

    length_penalty None: 0 on both sides; else HF's, and ptmjax's from the model's origin."""
    hf_tokens, hf_scores = hf_generate(name, num_beams, length_penalty or 0.0, **ids)
    tokens, scores = ptmjax_generate(name, num_beams, length_penalty, **ids)
    diff = float(np.abs(scores - hf_scores).max())
    print(f"{name} num_beams={num_beams} {ids or ''}: max |score diff| {diff:.1e}")
    np.testing.assert_array_equal(tokens, hf_tokens)
    np.testing.assert_allclose(scores, hf_scores, rtol=0, atol=1e-4)
    return tokens


def ends_mid_sequence(tokens: np.ndarray, eos: int) -> np.ndarray:
    """bool [...]: the sequence holds EOS before its last slot."""
    return (tokens[..., :-1] == eos).any(-1)


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_and_beam_equal_hf_generate(name):
    eos = CASES[name].eos
    greedy = assert_equal_decodes(name, 1)[:, 0]
    ended = ends_mid_sequence(greedy, eos)
    assert ended.any() and (greedy == eos).any(-1).sum() < len(greedy), greedy  # some rows end early, some not
    beams = assert_equal_decodes(name, BEAMS)
    assert ends_mid_sequence(beams, eos).any() and not ends_mid_sequence(beams, eos).all(), beams
    assert len({tuple(row) for row in beams.reshape(-1, NEW_TOKENS)}) > len(beams)  # beams differ


# LongT5's rows run with -m slow: its decoder and beam search are T5's, which the default run covers.
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if "longt5" in n else n
                                  for n in sorted(CASES)])
@pytest.mark.slow
def test_beam_search_with_hf_length_penalties_equals_hf_generate(name):
    """A model from Hugging Face (its generation ids carry `length_penalty`) ranks finished beams by
    sum(log p) / length ** length_penalty and stops by generate's heuristic: the default 1.0 (beams finish at
    different lengths), and 2.0."""
    eos = CASES[name].eos
    beams = assert_equal_decodes(name, BEAMS, 1.0)
    assert ends_mid_sequence(beams, eos).any() and not ends_mid_sequence(beams, eos).all(), beams
    assert_equal_decodes(name, BEAMS, 2.0)  # favours long beams: here none ends early in some cases


@pytest.mark.parametrize("ids", [{"decoder_start_token_id": 97}, {"forced_bos_token_id": 97}])
def test_mbart_language_tag_start_and_forced_first_token_equal_hf_generate(ids):
    """mBART-cc25 starts the decoder with the target language tag; mBART-50 starts with EOS and forces the
    tag as the first generated token (its score counts 0, as in HF)."""
    for num_beams in (1, BEAMS):
        tokens = assert_equal_decodes("mbart", num_beams, **ids)
        if "forced_bos_token_id" in ids:
            assert (tokens[..., 0] == 97).all()
