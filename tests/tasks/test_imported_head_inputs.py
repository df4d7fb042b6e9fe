"""With an imported tokenizer, the tagging and QA tasks build their inputs as transformers' tokenizer does: the
template's special tokens and token types, truncation to the length, tags on each word's first token, answer
spans and the context as the tokenizer's offsets and sequence ids place them (BERT WordPiece, RoBERTa BPE)."""

import numpy as np
import pytest
import seqio

from ptmjax.data import tokenizer_dir
from ptmjax.tasks import question_answering, tagging

transformers = pytest.importorskip("transformers")

LENGTH = 48
QA_LENGTH = 128  # a question and its paragraph in 300-token vocabularies: most fit, some are cut
EXAMPLES = 60


@pytest.fixture(scope="module", params=["bert", "roberta"])
def tokenizers(request, tmp_path_factory):
    """(transformers' fast tokenizer, ptmjax's vocabulary) of one saved folder."""
    from hf_folders import byte_level_bpe, wordpiece_tokenizer

    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "bert":
        wordpiece_tokenizer(transformers.BertTokenizer).save_pretrained(folder)
    else:
        byte_level_bpe(transformers.RobertaTokenizer, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]).save_pretrained(
            folder)
    fast = transformers.AutoTokenizer.from_pretrained(folder)
    assert fast.is_fast
    return fast, tokenizer_dir.read_vocabulary(str(folder))


def examples(register, name, vocabulary, length: int = LENGTH) -> list[dict]:
    try:
        task = register(vocabulary)
        dataset = task.get_dataset({"inputs": length}, split="validation", shuffle=False)
        return list(dataset.take(EXAMPLES).as_numpy_iterator())
    finally:
        register()
        assert seqio.get_mixture_or_task(name).output_features["inputs"].vocabulary != vocabulary


def word_offsets(words) -> list[int]:
    """The character offset of each word in the words joined by single spaces."""
    return np.cumsum([0] + [len(word) + 1 for word in words[:-1]]).tolist()


def test_tagging_inputs_and_tags_follow_the_imported_tokenizer(tokenizers):
    fast, vocabulary = tokenizers
    rows = examples(tagging.register_tagging_task, tagging.TAGGING_TASK, vocabulary)
    for example, (words, tags) in zip(rows, tagging.word_tags("validation"), strict=False):
        encoding = fast(" ".join(words), truncation=True, max_length=LENGTH)
        assert example["inputs"].tolist() == encoding["input_ids"]
        # A word's first token as transformers' token-classification examples find it: the first kept token with
        # its word id (byte-level BPE's space token 'Ġ', empty in the offsets, counts as the word's).
        whole = fast(" ".join(words))
        word_ids = encoding.word_ids()
        hf_words = [whole.char_to_word(offset) for offset in word_offsets(words)]
        kept = [word_ids.index(word) for word in hf_words if word in word_ids]
        scored = np.flatnonzero(example["tags"] != tagging.UNSCORED).tolist()
        assert scored == kept and example["tags"][kept].tolist() == list(tags[: len(kept)])
        assert [word.decode() for word in example["words"]] == list(words[: len(kept)])
    assert len(rows) == EXAMPLES and any(len(example["inputs"]) == LENGTH for example in rows)  # some were cut


def test_qa_inputs_types_context_and_answer_follow_the_imported_tokenizer(tokenizers):
    fast, vocabulary = tokenizers
    rows = examples(question_answering.register_qa_task, question_answering.QA_TASK, vocabulary, QA_LENGTH)
    questions = {(" ".join(q.question), " ".join(q.context)): q
                 for q in question_answering.cloze_questions("validation")}
    for example in rows:
        question = questions[example["question"].decode(), example["context"].decode()]
        encoding = fast(" ".join(question.question), " ".join(question.context), truncation="only_second",
                        max_length=QA_LENGTH, return_token_type_ids=True)
        assert example["inputs"].tolist() == encoding["input_ids"]
        assert example["token_type_ids"].tolist() == encoding["token_type_ids"]
        assert example["context_mask"].tolist() == [int(s == 1) for s in encoding.sequence_ids()]
        first = word_offsets(question.context)[question.first]
        assert example["answer_start"] == encoding.char_to_token(first, sequence_index=1)
        assert example["answer_end"] == encoding.char_to_token(first + len(question.answer) - 1, sequence_index=1)
    assert len(rows) == EXAMPLES and any(len(example["inputs"]) == QA_LENGTH for example in rows)
