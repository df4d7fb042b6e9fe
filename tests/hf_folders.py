"""Tiny Hugging Face folders for tests: tokenizers trained here on the embedded corpus, saved with a model."""

import json

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from ptmjax.data import corpus

SMALL_BERT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
SMALL_T5 = dict(d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2, decoder_start_token_id=0)
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


def paragraph_lines() -> list[str]:
    """The corpus's docstring paragraphs, each on one line."""
    return [p.replace("\n", " ") for d in corpus.stdlib_docstrings("train") for p in d.split("\n\n") if p.strip()]


def save_sentencepiece_tokenizer(hf_dir):
    """A 300-piece SentencePiece model trained on 400 paragraphs of the corpus beside the folder, and in it the T5
    tokenizer files transformers reads (400 ids with T5's 100 sentinels); returns its seqio vocabulary."""
    import sentencepiece as spm
    import seqio

    from ptmjax.convert import hf_tokenizer

    prefix = hf_dir.parent / f"{hf_dir.name}_spiece"
    spm.SentencePieceTrainer.train(sentence_iterator=iter(paragraph_lines()[:400]), model_prefix=str(prefix),
                                   vocab_size=300, pad_id=0, eos_id=1, unk_id=2, bos_id=-1, minloglevel=2)
    vocabulary = seqio.SentencePieceVocabulary(f"{prefix}.model", extra_ids=100)
    hf_tokenizer.write_tokenizer(vocabulary, str(hf_dir))
    return vocabulary


def xlm_roberta_tokenizer(directory):
    """transformers' XLMRobertaTokenizer over a 300-piece SentencePiece model (unk 0, <s> 1, </s> 2, as fairseq's
    XLM-R model) trained on 400 paragraphs of the corpus and saved in `directory` as sentencepiece.bpe.model:
    fairseq's <s> <pad> </s> <unk> first, every other piece one id higher than in the model, <mask> last."""
    import sentencepiece as spm
    import transformers

    directory.mkdir(parents=True)
    spm.SentencePieceTrainer.train(sentence_iterator=iter(paragraph_lines()[:400]), vocab_size=300, minloglevel=2,
                                   model_prefix=str(directory / "sentencepiece.bpe"))
    return transformers.XLMRobertaTokenizer.from_pretrained(directory)


def save_sentencepiece_t5(hf_dir) -> None:
    """A random T5 v1.0 (SMALL_T5) with the tokenizer of `save_sentencepiece_tokenizer`."""
    import transformers

    vocabulary = save_sentencepiece_tokenizer(hf_dir)
    config = transformers.T5Config(vocab_size=vocabulary.vocab_size, **SMALL_T5)
    transformers.T5ForConditionalGeneration(config).save_pretrained(hf_dir)


def saved(hf_dir, tokenizer, model) -> None:
    tokenizer.save_pretrained(hf_dir)
    model.save_pretrained(hf_dir)


def write_sentence_transformers_files(path, pooling: str, max_seq_length: int, width: int = 32) -> None:
    """Beside a saved model, the files sentence-transformers adds: modules.json, 1_Pooling/config.json
    (`pooling`: 'mean', 'cls' or 'max'), 2_Normalize/ and sentence_bert_config.json."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "1_Pooling").mkdir()
    keys = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens", "max": "pooling_mode_max_tokens",
            "mean_sqrt_len": "pooling_mode_mean_sqrt_len_tokens"}
    modes = {key: mode == pooling for mode, key in keys.items()}
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": width, **modes}))
    (path / "2_Normalize").mkdir()
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length,
                                                                 "do_lower_case": False}))
