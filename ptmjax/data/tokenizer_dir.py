"""A folder of Hugging Face tokenizer files -> the seqio vocabulary that encodes like it.

The first that applies, as transformers would read the folder:

* spiece.model of a T5 / mT5 tokenizer (or with no tokenizer.json beside it):
  `seqio.SentencePieceVocabulary` with T5's sentinels (`extra_ids` of
  tokenizer_config.json, else the `<extra_id_N>` tokens it lists, else
  T5Tokenizer's default 100), `<extra_id_0>` the highest id;
* a ByT5Tokenizer's tokenizer_config.json (ByT5 has no other file):
  `seqio.ByteVocabulary`, the bytes at ids 3-258 as in ByT5Tokenizer, with
  the larger of `extra_ids` and the sentinels listed (ByT5's default 125)
  above them, `<extra_id_0>` the highest as ByT5 was pre-trained (transformers
  numbers its sentinel tokens upwards from 259: text holding `<extra_id_N>`
  is read as its bytes here);
* tokenizer.json;
* sentencepiece.bpe.model of an XLMRobertaTokenizer: the tokenizer transformers
  builds from it, with fairseq's ids (data/fairseq_sentencepiece.py);
* vocab.json + merges.txt: byte-level BPE (GPT-2, BART, RoBERTa);
* vocab.txt: WordPiece (BERT), cased or not as tokenizer_config.json says.

Special tokens come from tokenizer_config.json (over special_tokens_map.json);
EOS is the eos token, else the sep token (BERT). Every file is JSON, text or
a SentencePiece protobuf: nothing is unpickled.
"""

from __future__ import annotations

import os
import re
from typing import Any

import sentencepiece as spm
import seqio

from ptmjax.data.fairseq_sentencepiece import XLMR_SENTENCEPIECE, XLMR_TOKENIZER_CLASSES, xlmr_tokenizer
from ptmjax.data.hf_tokenizer_vocabulary import HfTokenizerVocabulary, read_json

SPIECE, TOKENIZER_JSON, VOCAB_JSON, MERGES, VOCAB_TXT = (
    "spiece.model", "tokenizer.json", "vocab.json", "merges.txt", "vocab.txt",
)
TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP = "tokenizer_config.json", "special_tokens_map.json"
TOKENIZER_FILES = (SPIECE, TOKENIZER_JSON, VOCAB_JSON, MERGES, VOCAB_TXT, TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP,
                   XLMR_SENTENCEPIECE)
T5_TOKENIZER_CLASSES = ("T5Tokenizer", "T5TokenizerFast", "MT5Tokenizer", "MT5TokenizerFast")
T5_DEFAULT_EXTRA_IDS = 100
BYT5_TOKENIZER, BYT5_DEFAULT_EXTRA_IDS = "ByT5Tokenizer", 125
SPECIAL_ROLES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
SENTINEL = re.compile(r"<extra_id_\d+>")


def tokenizer_files(directory: str) -> list[str]:
    """The names of the tokenizer files `directory` holds."""
    return [name for name in TOKENIZER_FILES if os.path.isfile(os.path.join(directory, name))]


def tokenizer_config(directory: str) -> dict[str, Any]:
    """special_tokens_map.json updated with tokenizer_config.json (either may be absent)."""
    config: dict[str, Any] = {}
    for name in (SPECIAL_TOKENS_MAP, TOKENIZER_CONFIG):
        if os.path.isfile(os.path.join(directory, name)):
            config.update(read_json(os.path.join(directory, name)))
    return config


def special_tokens(config: dict[str, Any]) -> dict[str, str]:
    """role ('eos', 'pad', ...) -> token string, for the roles `config` names."""
    tokens = {role: _content(config.get(f"{role}_token")) for role in SPECIAL_ROLES}
    return {role: token for role, token in tokens.items() if token}


def _content(token: Any) -> str | None:
    """A token as tokenizer configs write it: a string, or an AddedToken dict with its 'content'."""
    return token.get("content") if isinstance(token, dict) else token


def _listed_tokens(config: dict[str, Any]) -> list[str]:
    """The tokens of additional_special_tokens / extra_special_tokens (a list, or a dict of named tokens)."""
    listed: list[Any] = []
    for key in ("additional_special_tokens", "extra_special_tokens"):
        tokens = config.get(key) or []
        listed += list(tokens.values()) if isinstance(tokens, dict) else tokens
    return [_content(token) for token in listed]


def read_vocabulary(directory: str) -> seqio.Vocabulary:
    """The seqio vocabulary of a folder of tokenizer files (see the module doc); errors name the file or the fix."""
    present = set(tokenizer_files(directory))
    config = tokenizer_config(directory)
    tokenizer_class = config.get("tokenizer_class")
    path = {name: os.path.join(directory, name) for name in TOKENIZER_FILES}
    if SPIECE in present and (tokenizer_class in T5_TOKENIZER_CLASSES or TOKENIZER_JSON not in present):
        if tokenizer_class not in (None, *T5_TOKENIZER_CLASSES):
            raise ValueError(
                f"{path[SPIECE]} belongs to a {tokenizer_class}; ptmjax reads T5 / mT5 SentencePiece models, or "
                f"a {TOKENIZER_JSON}: save the tokenizer with transformers 5 to write one"
            )
        return sentencepiece_vocabulary(path[SPIECE], _extra_ids(config))
    if tokenizer_class == BYT5_TOKENIZER and TOKENIZER_JSON not in present:
        sentinels = {token for token in _listed_tokens(config) if SENTINEL.fullmatch(token or "")}
        return seqio.ByteVocabulary(extra_ids=max(len(sentinels), int(config.get("extra_ids", 0))) or
                                    BYT5_DEFAULT_EXTRA_IDS)
    tokens = special_tokens(config)
    if TOKENIZER_JSON in present:
        vocabulary = HfTokenizerVocabulary.from_file(path[TOKENIZER_JSON])
    elif XLMR_SENTENCEPIECE in present and tokenizer_class in XLMR_TOKENIZER_CLASSES:
        vocabulary = HfTokenizerVocabulary(xlmr_tokenizer(path[XLMR_SENTENCEPIECE], tokens))
    elif VOCAB_JSON in present:
        vocabulary = HfTokenizerVocabulary.byte_level_bpe(
            path[VOCAB_JSON], path[MERGES], add_prefix_space=bool(config.get("add_prefix_space", False)),
            special_tokens=[*tokens.values(), *_listed_tokens(config)],
        )
    elif VOCAB_TXT in present:
        vocabulary = HfTokenizerVocabulary.wordpiece(
            path[VOCAB_TXT], lowercase=bool(config.get("do_lower_case", True)),
            strip_accents=config.get("strip_accents"),
            tokenize_chinese_chars=bool(config.get("tokenize_chinese_chars", True)),
            unk_token=tokens.get("unk", "[UNK]"), special_tokens=[*tokens.values(), *_listed_tokens(config)],
        )
    else:
        if tokenizer_class:
            raise ValueError(
                f"{directory} holds a {tokenizer_class} without any of {', '.join(TOKENIZER_FILES[:5])}; ptmjax "
                f"reads those files and {BYT5_TOKENIZER} folders: save the tokenizer with transformers 5 to write a "
                f"{TOKENIZER_JSON}"
            )
        raise FileNotFoundError(
            f"{directory} holds no tokenizer ({', '.join(TOKENIZER_FILES[:5])}); copy the tokenizer files of the "
            "model there"
        )
    return _with_special_ids(vocabulary, tokens)


def _with_special_ids(vocabulary: HfTokenizerVocabulary, tokens: dict[str, str]) -> HfTokenizerVocabulary:
    """`vocabulary` with the ids of the configured special tokens (EOS: eos, else sep)."""
    ids = {role: vocabulary.tokenizer.token_to_id(token) for role, token in tokens.items()}
    eos = ids.get("eos") if ids.get("eos") is not None else ids.get("sep")
    return HfTokenizerVocabulary(
        vocabulary.tokenizer, pad_id=ids.get("pad"), eos_id=eos, unk_id=ids.get("unk"), bos_id=ids.get("bos")
    )


def _extra_ids(config: dict[str, Any]) -> int:
    if "extra_ids" in config:
        return int(config["extra_ids"])
    sentinels = {token for token in _listed_tokens(config) if SENTINEL.fullmatch(token or "")}
    return len(sentinels) if sentinels else T5_DEFAULT_EXTRA_IDS


def sentencepiece_vocabulary(path: str, extra_ids: int) -> seqio.SentencePieceVocabulary:
    """A T5 SentencePiece model file with `extra_ids` sentinels; a missing or corrupt file raises naming it."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no tokenizer file {path}; point to a folder holding the tokenizer's files")
    with open(path, "rb") as f:
        proto = f.read()
    try:
        spm.SentencePieceProcessor(model_proto=proto)
    except (RuntimeError, OSError) as error:
        first = (str(error).strip().splitlines() or ["unreadable"])[0]
        raise ValueError(f"{path} is not a SentencePiece model ({first}); copy the model's spiece.model") from None
    return seqio.SentencePieceVocabulary(path, extra_ids=extra_ids)
