"""XLM-R's sentencepiece.bpe.model as the tokenizer transformers builds from it, with fairseq's ids.

fairseq numbers its dictionary <s> 0, <pad> 1, </s> 2, <unk> 3, then the model's pieces from its fourth
(SentencePiece id 3) on, each one id higher than in the model, and XLM-R appends <mask> last. transformers'
XLMRobertaTokenizer builds this from the file: a Unigram over those pieces and their scores (unknown: 3),
the model's precompiled normalisation, words split at whitespace with '▁' before each, and
`<s> A </s>` (a pair: `<s> A </s> </s> B </s>`). This is that construction, with the tokenizers library, for
a folder whose tokenizer has no tokenizer.json beside the SentencePiece file.
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

XLMR_SENTENCEPIECE = "sentencepiece.bpe.model"
XLMR_TOKENIZER_CLASSES = ("XLMRobertaTokenizer", "XLMRobertaTokenizerFast")
FAIRSEQ_FIRST_PIECE = 3  # the SentencePiece pieces before it (<unk>, <s>, </s>) give way to fairseq's four
DEFAULT_TOKENS = {"bos": "<s>", "pad": "<pad>", "eos": "</s>", "unk": "<unk>", "mask": "<mask>"}


def _model_proto(path: str):  # -> sentencepiece_model_pb2.ModelProto
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    with open(path, "rb") as f:
        try:
            proto.ParseFromString(f.read())
        except Exception as error:  # protobuf's DecodeError
            first = (str(error).strip().splitlines() or ["unreadable"])[0]
            raise ValueError(f"{path} is not a SentencePiece model ({first}); copy the model's "
                             f"{XLMR_SENTENCEPIECE}") from None
    if len(proto.pieces) <= FAIRSEQ_FIRST_PIECE:
        raise ValueError(f"{path} holds {len(proto.pieces)} SentencePiece pieces, not a model (an empty or cut file?); "
                         f"copy the model's {XLMR_SENTENCEPIECE}")
    if proto.trainer_spec.model_type != 1:  # UNIGRAM: fairseq's XLM-R model, whatever its file is called
        raise ValueError(f"{path} is a SentencePiece model of type {proto.trainer_spec.model_type}, not unigram (1) "
                         "as XLM-R's; save the tokenizer with transformers 5 to write a tokenizer.json")
    return proto


def xlmr_tokenizer(path: str, tokens: dict[str, str] | None = None) -> Tokenizer:
    """The tokenizer of an XLM-R SentencePiece file (see the module doc); `tokens`: role -> token where they are
    not XLM-R's own (<s>, <pad>, </s>, <unk>, <mask>)."""
    tokens = {**DEFAULT_TOKENS, **(tokens or {})}
    proto = _model_proto(path)
    bos, pad, eos, unk, mask = (tokens[role] for role in ("bos", "pad", "eos", "unk", "mask"))
    vocab = [(token, 0.0) for token in (bos, pad, eos, unk)]
    vocab += [(piece.piece, piece.score) for piece in proto.pieces[FAIRSEQ_FIRST_PIECE:]]
    vocab.append((mask, 0.0))
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=3, byte_fallback=False))
    if proto.normalizer_spec.precompiled_charsmap:
        tokenizer.normalizer = normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")]
    )
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.add_special_tokens([AddedToken(token, normalized=False, special=True)
                                  for token in (bos, pad, eos, unk, mask)])
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", pair=f"{bos} $A {eos} {eos} $B {eos}", special_tokens=[(bos, 0), (eos, 2)],
    )
    return tokenizer
