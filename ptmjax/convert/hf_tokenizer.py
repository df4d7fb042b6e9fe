"""Tokenizer files <-> Hugging Face directories: an import's are copied, a run's vocabulary is written.

A run's vocabulary becomes what `transformers.AutoTokenizer` loads with the
same ids: a SentencePiece model as T5Tokenizer (spiece.model, its
`<extra_id_N>` sentinels highest first, as seqio numbers them), bytes as
ByT5Tokenizer (sentinels listed so that they get seqio's ids too), a
`HfTokenizerVocabulary` as its tokenizer.json. transformers then writes its
own tokenizer.json and tokenizer_config.json, so loading needs no conversion.
"""

from __future__ import annotations

import json
import os
import shutil

import seqio

from ptmjax.data.hf_tokenizer_vocabulary import HfTokenizerVocabulary
from ptmjax.data.tokenizer_dir import SPIECE, TOKENIZER_CONFIG, TOKENIZER_JSON, tokenizer_files

T5_SPECIAL_IDS = (0, 1, 2)  # pad, eos, unk: what transformers' T5Tokenizer assumes


def copy_tokenizer_files(source: str, destination: str) -> list[str]:
    """Copies the tokenizer files `source` holds into `destination` (created); returns their names."""
    names = tokenizer_files(source)
    if names:
        os.makedirs(destination, exist_ok=True)
    for name in names:
        shutil.copyfile(os.path.join(source, name), os.path.join(destination, name))
    return names


def write_tokenizer(vocabulary: seqio.Vocabulary, hf_dir: str) -> None:
    """Writes the tokenizer files transformers loads as `vocabulary` (see the module doc). Needs transformers."""
    import transformers

    os.makedirs(hf_dir, exist_ok=True)
    if isinstance(vocabulary, seqio.SentencePieceVocabulary):
        config = _sentencepiece_config(vocabulary, hf_dir)
    elif isinstance(vocabulary, seqio.ByteVocabulary):
        sentinels = [f"<extra_id_{i}>" for i in reversed(range(vocabulary.extra_ids))]  # seqio: <extra_id_0> last
        config = {"tokenizer_class": "ByT5Tokenizer", "extra_ids": 0, "additional_special_tokens": sentinels}
    elif isinstance(vocabulary, HfTokenizerVocabulary):
        vocabulary.tokenizer.save(os.path.join(hf_dir, TOKENIZER_JSON))
        token = vocabulary.tokenizer.id_to_token
        config = {"tokenizer_class": "PreTrainedTokenizerFast"}
        for role, i in (("pad", vocabulary.pad_id), ("eos", vocabulary.eos_id), ("unk", vocabulary.unk_id),
                        ("bos", vocabulary.bos_id)):
            if i is not None:
                config[f"{role}_token"] = token(i)
    else:
        raise ValueError(
            f"no Hugging Face tokenizer for the vocabulary {vocabulary}; ptmjax writes SentencePiece, byte and "
            "tokenizers-library vocabularies: train with one of them"
        )
    with open(os.path.join(hf_dir, TOKENIZER_CONFIG), "w") as f:
        json.dump(config, f, indent=2)
    transformers.AutoTokenizer.from_pretrained(hf_dir).save_pretrained(hf_dir)


def _sentencepiece_config(vocabulary: seqio.SentencePieceVocabulary, hf_dir: str) -> dict[str, object]:
    """Copies the model file to spiece.model; the T5Tokenizer config with its sentinels."""
    model_file = vocabulary.sentencepiece_model_file
    special = (vocabulary.pad_id, vocabulary.eos_id, vocabulary.unk_id)
    if special != T5_SPECIAL_IDS:
        raise ValueError(
            f"the SentencePiece model {model_file} has pad/eos/unk ids {special}; transformers' T5Tokenizer needs "
            f"{T5_SPECIAL_IDS}: train it with pad_id=0, eos_id=1, unk_id=2"
        )
    shutil.copyfile(model_file, os.path.join(hf_dir, SPIECE))
    pieces = vocabulary.tokenizer.id_to_piece(list(T5_SPECIAL_IDS))
    return {
        "tokenizer_class": "T5Tokenizer", "extra_ids": vocabulary.extra_ids,
        **dict(zip(("pad_token", "eos_token", "unk_token"), pieces, strict=True)),
    }
