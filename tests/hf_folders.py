"""Tiny Hugging Face folders for tests: tokenizers trained here on the embedded corpus, saved with a model."""

import json

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from ptmjax.data import corpus

SMALL_BART = dict(
    d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
    encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
)


def trained(model, trainer, pre_tokenizer) -> dict:
    """The `model` part of a tokenizer.json trained by `trainer` on 300 paragraphs of the corpus."""
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizer
    paragraphs = [p for d in corpus.stdlib_docstrings("train") for p in d.split("\n\n") if p.strip()][:300]
    tokenizer.train_from_iterator(paragraphs, trainer)
    return json.loads(tokenizer.to_str())["model"]


def byte_level_bpe(tokenizer_class, special_tokens, **kwargs):
    """A transformers `tokenizer_class` over a 300-token byte-level BPE trained here."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    bpe = trained(models.BPE(), trainers.BpeTrainer(vocab_size=300, special_tokens=special_tokens,
                                                    initial_alphabet=alphabet), pre_tokenizers.ByteLevel())
    return tokenizer_class(vocab=bpe["vocab"], merges=[tuple(m) for m in bpe["merges"]], **kwargs)


def wordpiece_tokenizer(tokenizer_class):
    """A transformers `tokenizer_class` (BertTokenizer and the like) over a 300-piece WordPiece trained here."""
    trainer = trainers.WordPieceTrainer(vocab_size=300, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    wordpiece = trained(models.WordPiece(unk_token="[UNK]"), trainer, pre_tokenizers.BertPreTokenizer())
    return tokenizer_class(vocab=wordpiece["vocab"])


def saved(hf_dir, tokenizer, model) -> None:
    tokenizer.save_pretrained(hf_dir)
    model.save_pretrained(hf_dir)
