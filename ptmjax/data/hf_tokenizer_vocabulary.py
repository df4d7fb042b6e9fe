"""A seqio vocabulary over a Hugging Face `tokenizers.Tokenizer`.

Built from a tokenizer.json, from byte-level BPE files (GPT-2 / BART /
RoBERTa: vocab.json + merges.txt) or from a WordPiece vocab.txt (BERT), the
way transformers builds its tokenizers from the same files. Encoding adds no
special tokens (seqio appends EOS) and neither pads nor truncates, whatever a
tokenizer.json's padding and truncation settings say (transformers' tokenizer
of one text does neither; saved back, the file keeps them); decoding drops
special tokens, as SentencePiece drops its control pieces. The TensorFlow
versions run the same Python tokenizer through `tf.numpy_function`. Special ids are given, or looked up by the
conventional token names; a tokenizer without a pad token pads with EOS (as
transformers does for GPT-2). Equality and hashing compare the tokenizer's
JSON and the special ids, so seqio's mixture checks compare content, not
paths. Every file read is JSON or text: nothing is unpickled.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import seqio
import tensorflow as tf
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

# Token names tried, in order, for a special id that is not given.
CONVENTIONAL_NAMES = {
    "pad": ("<pad>", "[PAD]"),
    "eos": ("</s>", "<|endoftext|>", "[SEP]"),
    "unk": ("<unk>", "[UNK]"),
    "bos": ("<s>",),
    "mask": ("[MASK]", "<mask>"),
}


class TemplatePiece(NamedTuple):
    """One place of a tokenizer's template: a special token's id, or None where a text goes; its token type."""

    special_id: int | None
    type_id: int


class HfTokenizerVocabulary(seqio.Vocabulary):
    """`tokenizer` (an object or its JSON) as a seqio vocabulary; ids not given are looked up by name."""

    def __init__(
        self,
        tokenizer: Tokenizer | str,
        pad_id: int | None = None,
        eos_id: int | None = None,
        unk_id: int | None = None,
        bos_id: int | None = None,
    ):
        self._tokenizer = Tokenizer.from_str(tokenizer) if isinstance(tokenizer, str) else tokenizer
        self._json = self._tokenizer.to_str()
        self._encoder = Tokenizer.from_str(self._json)  # one text as transformers encodes it: neither padded nor cut
        self._encoder.no_padding()
        self._encoder.no_truncation()
        given = {"pad": pad_id, "eos": eos_id, "unk": unk_id, "bos": bos_id, "mask": None}
        self._ids = {role: given[role] if given[role] is not None else self._named_id(role) for role in given}
        super().__init__(extra_ids=0)

    def _named_id(self, role: str) -> int | None:
        ids = (self._tokenizer.token_to_id(name) for name in CONVENTIONAL_NAMES[role])
        return next((i for i in ids if i is not None), None)

    @classmethod
    def from_file(cls, path: str, **ids: int | None) -> HfTokenizerVocabulary:
        """A tokenizer.json; a missing or corrupt file raises naming it."""
        require_file(path)
        try:
            tokenizer = Tokenizer.from_file(path)
        except Exception as error:  # tokenizers raises plain Exceptions
            raise ValueError(f"{path} is not a tokenizer.json ({_first_line(error)}); re-save it with "
                             "transformers' save_pretrained") from None
        return cls(tokenizer, **ids)

    @classmethod
    def byte_level_bpe(
        cls, vocab_file: str, merges_file: str, add_prefix_space: bool = False,
        special_tokens: Sequence[str] = (), **ids: int | None,
    ) -> HfTokenizerVocabulary:
        """GPT-2 / BART / RoBERTa byte-level BPE from vocab.json and merges.txt, as transformers builds it."""
        vocab = read_json(vocab_file)
        require_file(merges_file)
        try:
            model = models.BPE.from_file(vocab_file, merges_file, continuing_subword_prefix="", end_of_word_suffix="")
        except Exception as error:
            raise ValueError(f"{merges_file} does not hold BPE merges of {vocab_file} ({_first_line(error)}); "
                             "point to the tokenizer's own vocab.json and merges.txt") from None
        tokenizer = Tokenizer(model)
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
        tokenizer.decoder = decoders.ByteLevel()
        tokenizer.add_special_tokens([token for token in special_tokens if token in vocab])
        return cls(tokenizer, **ids)

    @classmethod
    def wordpiece(
        cls, vocab_file: str, lowercase: bool = True, strip_accents: bool | None = None,
        tokenize_chinese_chars: bool = True, unk_token: str = "[UNK]", special_tokens: Sequence[str] = (),
        **ids: int | None,
    ) -> HfTokenizerVocabulary:
        """BERT WordPiece from vocab.txt (one token a line), as transformers' BertTokenizer builds it."""
        require_file(vocab_file)
        try:
            with open(vocab_file, encoding="utf-8") as f:
                tokens = [line.rstrip("\n") for line in f]
        except UnicodeDecodeError as error:
            raise ValueError(f"{vocab_file} is not UTF-8 text ({error.reason}); a WordPiece vocab.txt is") from None
        vocab = {token: i for i, token in enumerate(tokens) if token}
        if unk_token not in vocab:
            raise ValueError(f"{vocab_file} has no {unk_token!r} token; a WordPiece vocabulary needs its unk token")
        tokenizer = Tokenizer(models.WordPiece(vocab, unk_token=unk_token))
        tokenizer.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=tokenize_chinese_chars, strip_accents=strip_accents,
            lowercase=lowercase,
        )
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece(prefix="##")
        tokenizer.add_special_tokens([token for token in special_tokens if token in vocab])
        return cls(tokenizer, **ids)

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    @property
    def pad_id(self) -> int:
        """The pad token's id, else EOS's (transformers' choice for GPT-2), else seqio's 0."""
        return next(i for i in (self._ids["pad"], self._ids["eos"], seqio.vocabularies.PAD_ID) if i is not None)

    @property
    def eos_id(self) -> int | None:
        return self._ids["eos"]

    @property
    def unk_id(self) -> int | None:
        return self._ids["unk"]

    @property
    def bos_id(self) -> int | None:
        return self._ids["bos"]

    @property
    def mask_id(self) -> int | None:
        """The id of the tokenizer's mask token ([MASK], <mask>), if it has one."""
        return self._ids["mask"]

    def encode_with_template(self, s: str, max_length: int | None = None) -> list[int]:
        """`s` with the special tokens the tokenizer's post-processor puts around one text ([CLS] ... [SEP],
        <s> ... </s>), as transformers' tokenizer(s) gives it; with `max_length`, the text is cut so that the
        whole fits, special tokens kept (tokenizer(s, truncation=True, max_length=...))."""
        if max_length is None:
            return self._encoder.encode(s, add_special_tokens=True).ids
        self._encoder.enable_truncation(max_length)
        try:
            return self._encoder.encode(s, add_special_tokens=True).ids
        finally:
            self._encoder.no_truncation()

    def template(self, pair: bool = False) -> tuple[TemplatePiece, ...]:
        """Where the tokenizer's post-processor puts its special tokens around one text or a pair, with each
        place's token type: BERT's [CLS] a [SEP] (b [SEP]), types 0 (1); RoBERTa's <s> a </s> (</s> b </s>), all 0."""
        encoding = self._encoder.encode("a", "a" if pair else None, add_special_tokens=True)
        pieces: list[TemplatePiece] = []
        previous = None
        for token_id, sequence, type_id in zip(encoding.ids, encoding.sequence_ids, encoding.type_ids, strict=True):
            if sequence is None:
                pieces.append(TemplatePiece(token_id, type_id))
            elif sequence != previous:
                pieces.append(TemplatePiece(None, type_id))
            previous = sequence
        return tuple(pieces)

    @property
    def _base_vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def _encode(self, s: str) -> list[int]:
        return self._encoder.encode(s, add_special_tokens=False).ids

    def _decode(self, ids: Sequence[int]) -> str:
        size = self._base_vocab_size
        return self._tokenizer.decode([int(i) for i in ids if 0 <= i < size], skip_special_tokens=True)

    def _encode_tf(self, s: tf.Tensor) -> tf.Tensor:
        """A scalar string -> int32 ids."""
        ids = tf.numpy_function(
            lambda text: np.asarray(self._encode(np.asarray(text).item().decode("utf-8")), np.int32),
            [s],
            tf.int32,
            stateful=False,
        )
        return tf.ensure_shape(ids, [None])

    def _decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
        """int ids [length] or [batch, length] -> a string scalar or [batch] strings."""

        def decode(array: np.ndarray) -> np.ndarray:
            rows = array.reshape(-1, array.shape[-1])
            return np.asarray([self._decode(row.tolist()).encode("utf-8") for row in rows], object).reshape(
                array.shape[:-1]
            )

        strings = tf.numpy_function(decode, [ids], tf.string, stateful=False)
        return tf.ensure_shape(strings, ids.shape[:-1])

    def _spec(self) -> tuple[str, tuple[tuple[str, int | None], ...]]:
        return self._json, tuple(sorted(self._ids.items()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HfTokenizerVocabulary) and self._spec() == other._spec()

    def __hash__(self) -> int:
        return hash(self._spec())

    def __getstate__(self) -> dict[str, object]:  # gin deep-copies configurable arguments
        return {"json": self._json, "ids": self._ids}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(state["json"], **{f"{role}_id": i for role, i in state["ids"].items() if role != "mask"})

    def __str__(self) -> str:
        digest = hashlib.sha256(self._json.encode()).hexdigest()[:16]
        model = json.loads(self._json)["model"]["type"]
        return f"HfTokenizerVocabulary({model}, {self._base_vocab_size} ids, sha256={digest})"


def require_file(path: str) -> None:
    """A FileNotFoundError naming `path` unless it is a file."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no tokenizer file {path}; point to a folder holding the tokenizer's files")


def read_json(path: str) -> dict:
    """A JSON file's content; a missing or corrupt file raises naming it."""
    require_file(path)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON ({_first_line(error)}); re-save the tokenizer") from None


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
