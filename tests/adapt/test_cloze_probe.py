"""Cloze probing: precision at k on hand-made logits, cloze rows on a hand-made WordPiece vocabulary, P@1 of a
BERT whose MLM bias picks the answer, and blank logits against transformers' BERT and T5 (ranked by numpy)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ptmjax.adapt.probing.cloze_probe import Cloze, ClozeRanker, ClozeSet, cloze_set, precision_at_k, qa_clozes
from ptmjax.adapt.probing.text_rows import TextRows
from ptmjax.data.hf_tokenizer_vocabulary import HfTokenizerVocabulary
from ptmjax.models import Bert, BertConfig, EncoderDecoder, T5Config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from ptmjax.convert import hf_bert, hf_t5  # noqa: E402

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "##s", "dog", "ran", "a"]
ID = {word: i for i, word in enumerate(WORDS)}
CLOZES = [
    Cloze(("the", "cat"), ("on", "the", "mat"), "sat"),
    Cloze(("the", "dog"), ("on", "a", "mat"), "ran"),
    Cloze((), ("sat", "on", "the", "mat"), "cat"),  # the blank opens the cloze
    Cloze(("the",), ("ran",), "cats"),  # two tokens: dropped
    Cloze(("a", "dog"), ("on", "the", "mat"), "sat"),
]
BERT = BertConfig(vocab_size=len(WORDS), d_model=16, num_heads=2, num_layers=2, d_ff=32, max_length=16,
                  nsp_head=False, dropout_rate=0.0, attention_dropout_rate=0.0)


@pytest.fixture
def text_rows(tmp_path):
    (tmp_path / "vocab.txt").write_text("\n".join(WORDS) + "\n")
    vocabulary = HfTokenizerVocabulary.wordpiece(str(tmp_path / "vocab.txt"), special_tokens=WORDS[:5])
    return TextRows.of(Bert(BERT), vocabulary)


def test_precision_at_k_of_hand_made_logits():
    logits = np.array([[0.0, 5.0, 1.0], [3.0, 1.0, 2.0], [0.0, 0.0, 9.0], [2.0, 2.0, 0.0]])
    answers = [1, 2, 2, 1]  # hits at 1: rows 0, 2; row 1's answer is second; row 3 ties 0 and 1, 0 ranks first
    assert precision_at_k(logits, answers, 1) == 0.5
    assert precision_at_k(logits, answers, 2) == 1.0


def test_cloze_rows_on_a_wordpiece_vocabulary(text_rows):
    clozes = cloze_set(CLOZES, text_rows)
    assert clozes.total == 5 and len(clozes.rows) == 4
    assert clozes.rows[0] == tuple(ID[w] for w in ["[CLS]", "the", "cat", "[MASK]", "on", "the", "mat", "[SEP]"])
    assert clozes.rows[2][:3] == (ID["[CLS]"], ID["[MASK]"], ID["sat"])
    assert clozes.blanks == (3, 3, 1, 3)
    assert clozes.answers == (ID["sat"], ID["ran"], ID["cat"], ID["sat"])
    assert len(cloze_set(CLOZES, text_rows, max_length=7).rows) == 1  # only the opening-blank row fits


def test_a_bert_that_always_says_sat_scores_the_share_of_sat_answers(text_rows):
    model = Bert(BERT)
    params = nn.unbox(jax.jit(model.init)(jax.random.key(0), jnp.ones((1, 4), jnp.int32))["params"])
    params["mlm_head"]["bias"] = params["mlm_head"]["bias"].at[ID["sat"]].set(1e4)
    clozes = cloze_set(CLOZES, text_rows)
    logits = ClozeRanker(model, params, text_rows.mask_id, BERT.pad_token_id).logits(clozes, batch_size=3)
    assert logits.shape == (4, len(WORDS))
    assert precision_at_k(logits, clozes.answers) == 2 / 4  # 'sat' answers 2 of the 4 kept clozes


def test_bert_blank_logits_and_ranking_match_transformers(text_rows):
    torch.manual_seed(0)
    hf = hf_bert.build_hf_model(BERT).eval()
    with torch.no_grad():
        for param in hf.parameters():
            param.mul_(8.0)  # spread the logits: rankings far from float ties
    clozes = cloze_set(CLOZES, text_rows)
    ranker = ClozeRanker(Bert(BERT), hf_bert.hf_to_params(hf.state_dict(), BERT)["params"], text_rows.mask_id, 0)
    ours = ranker.logits(clozes, batch_size=8)
    reference = []
    with torch.no_grad():
        for row, blank in zip(clozes.rows, clozes.blanks, strict=True):
            reference.append(hf(torch.tensor([row])).logits[0, blank].numpy())
    reference = np.stack(reference)
    print(f"bert cloze: max |logit diff| {np.abs(ours - reference).max():.1e}")
    np.testing.assert_allclose(ours, reference, atol=1e-4)
    np.testing.assert_array_equal(ours.argmax(-1), reference.argmax(-1))
    assert precision_at_k(ours, clozes.answers) == np.mean(reference.argmax(-1) == np.array(clozes.answers))


def test_t5_ranks_the_token_after_the_sentinel_as_transformers_does():
    config = T5Config(vocab_size=40, d_model=16, num_heads=2, head_dim=8, d_ff=32, num_encoder_layers=2,
                      num_decoder_layers=2, ffn_activations=("relu",), tie_embeddings=True, dropout_rate=0.0)
    torch.manual_seed(0)
    hf = hf_t5.build_hf_model(config).eval()
    sentinel = config.vocab_size - 1
    rows = [(5, 6, sentinel, 7, 1), (sentinel, 9, 10, 11, 1), (12, sentinel, 1)]
    clozes = ClozeSet((), tuple(rows), (2, 0, 1), (3, 4, 5), 3)
    ours = ClozeRanker(EncoderDecoder(config), hf_t5.hf_to_params(hf.state_dict(), config)["params"], sentinel,
                       0).logits(clozes, batch_size=2)
    with torch.no_grad():
        reference = np.stack([hf(input_ids=torch.tensor([row]), decoder_input_ids=torch.tensor([[0, sentinel]]))
                              .logits[0, 1].numpy() for row in rows])
    print(f"t5 cloze: max |logit diff| {np.abs(ours - reference).max():.1e}")
    np.testing.assert_allclose(ours, reference, atol=1e-4)
    np.testing.assert_array_equal(ours.argmax(-1), reference.argmax(-1))


def test_qa_clozes_keep_the_question_around_the_blank():
    clozes = qa_clozes("validation")
    assert len(clozes) == 221
    assert all(c.before or c.after for c in clozes) and all("___" not in c.before + c.after for c in clozes)
