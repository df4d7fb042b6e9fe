"""HfTokenizerVocabulary and tokenizer folders: ids and text as transformers' tokenizer on the same files.

Tokenizers are trained here on a few hundred paragraphs of the stdlib corpus
and saved by transformers; each folder is also read without its
tokenizer.json (vocab.json + merges.txt, vocab.txt), which transformers
builds from the same files.
"""

import copy
import json
import os

import pytest
import seqio
import tensorflow as tf
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from ptmjax.data import corpus, tokenizer_dir
from ptmjax.data.hf_tokenizer_vocabulary import HfTokenizerVocabulary

transformers = pytest.importorskip("transformers")

TEXTS = [
    "Return the sum of a and b.",
    "  Leading,   repeated   and trailing spaces  ",
    "Naïve café: 123 ÷ 4 = 30.75 ; 東京 and émigré",
    "tabs\tand\nnewlines, then <|endoftext|> and [SEP] and <mask> inside the text",
    "CamelCaseIdentifiers and snake_case_names()",
]


def paragraphs(count: int = 300) -> list[str]:
    found = [p for d in corpus.stdlib_docstrings("train") for p in d.split("\n\n") if p.strip()]
    return found[:count]


def byte_level_bpe(special_tokens: list[str]) -> dict:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=special_tokens, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(paragraphs(), trainer)
    return json.loads(tokenizer.to_str())["model"]


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """name -> (folder saved by transformers, the transformers tokenizer)."""
    root = tmp_path_factory.mktemp("tokenizers")
    gpt2 = byte_level_bpe(["<|endoftext|>"])
    bart = byte_level_bpe(["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    wordpiece = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wordpiece.train_from_iterator(
        [p.lower() for p in paragraphs()],
        trainers.WordPieceTrainer(vocab_size=400, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]),
    )
    tokenizers = {
        "gpt2": transformers.GPT2Tokenizer(vocab=gpt2["vocab"], merges=[tuple(m) for m in gpt2["merges"]]),
        "bart": transformers.BartTokenizer(vocab=bart["vocab"], merges=[tuple(m) for m in bart["merges"]]),
        "bert": transformers.BertTokenizer(vocab=wordpiece.get_vocab()),
    }
    dirs = {}
    for name, tokenizer in tokenizers.items():
        tokenizer.save_pretrained(root / name)
        dirs[name] = (str(root / name), tokenizer)
    for name, model in (("gpt2", gpt2), ("bart", bart)):  # the same tokenizers as GPT-2 / BART's original files
        files = root / f"{name}_files"
        files.mkdir()
        (files / "vocab.json").write_text(json.dumps(model["vocab"]))
        (files / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in model["merges"]))
        (files / "tokenizer_config.json").write_text((root / name / "tokenizer_config.json").read_text())
        dirs[f"{name}_files"] = (str(files), transformers.AutoTokenizer.from_pretrained(files))
    files = root / "bert_files"
    files.mkdir()
    vocab = sorted(wordpiece.get_vocab().items(), key=lambda item: item[1])
    (files / "vocab.txt").write_text("".join(f"{token}\n" for token, _ in vocab))
    (files / "tokenizer_config.json").write_text((root / "bert" / "tokenizer_config.json").read_text())
    dirs["bert_files"] = (str(files), transformers.AutoTokenizer.from_pretrained(files))
    return dirs


@pytest.mark.parametrize("name", ["gpt2", "gpt2_files", "bart", "bart_files", "bert", "bert_files"])
def test_encodes_and_decodes_like_transformers(hf_dirs, name):
    path, hf_tokenizer = hf_dirs[name]
    assert os.path.exists(os.path.join(path, "tokenizer.json")) == (not name.endswith("_files"))
    vocab = tokenizer_dir.read_vocabulary(path)
    assert isinstance(vocab, HfTokenizerVocabulary)
    assert vocab.vocab_size == len(hf_tokenizer)
    for text in TEXTS:
        want = hf_tokenizer(text, add_special_tokens=False)["input_ids"]
        assert list(vocab.encode(text)) == want, text
        assert vocab.encode_tf(tf.constant(text)).numpy().tolist() == want
        through_eos = want[: want.index(vocab.eos_id) + 1] if vocab.eos_id in want else want  # seqio's decode
        assert vocab.decode(want) == hf_tokenizer.decode(through_eos, skip_special_tokens=True)
    assert (vocab.eos_id, vocab.unk_id, vocab.bos_id) == (
        hf_tokenizer.eos_token_id if name.startswith(("gpt2", "bart")) else hf_tokenizer.sep_token_id,
        hf_tokenizer.unk_token_id,
        hf_tokenizer.bos_token_id,
    )
    assert vocab.pad_id == (hf_tokenizer.eos_token_id if name.startswith("gpt2") else hf_tokenizer.pad_token_id)


def test_a_tokenizer_json_with_padding_and_truncation_encodes_each_text_as_it_is(hf_dirs, tmp_path):
    """Sentence-transformers folders save their tokenizer.json with "padding" and "truncation" set; transformers'
    tokenizer of one text neither pads nor cuts it, and neither does the vocabulary. Saved back, the file keeps
    its settings."""
    path, _ = hf_dirs["bert"]
    tokenizer = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]", length=128)
    tokenizer.enable_truncation(max_length=128)
    folder = tmp_path / "sentence_transformer"
    folder.mkdir()
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(open(os.path.join(path, "tokenizer_config.json")).read())
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    vocab = tokenizer_dir.read_vocabulary(str(folder))
    words = " ".join(paragraphs(40)).split()
    texts = [" ".join(words[:count]) for count in (1, 5, 60, 127, 128, 129, 300, 500)]
    for text in texts:
        want = hf_tokenizer(text, add_special_tokens=False)["input_ids"]
        assert list(vocab.encode(text)) == want and vocab.encode_tf(tf.constant(text)).numpy().tolist() == want
    assert len(vocab.encode(texts[0])) < 5 and len(vocab.encode(texts[-1])) > 500  # neither padded nor cut
    saved = json.loads(vocab.tokenizer.to_str())
    assert saved["padding"]["strategy"] == {"Fixed": 128} and saved["truncation"]["max_length"] == 128


def test_sentencepiece_folder_is_seqios_vocabulary_with_t5_sentinels(tmp_path):
    from ptmjax.data import vocabularies

    stdlib = vocabularies.stdlib_sentencepiece_vocabulary()
    (tmp_path / "spiece.model").write_bytes(open(stdlib.sentencepiece_model_file, "rb").read())
    hf_tokenizer = transformers.T5Tokenizer.from_pretrained(tmp_path)  # T5Tokenizer's default: 100 sentinels
    vocab = tokenizer_dir.read_vocabulary(str(tmp_path))
    assert isinstance(vocab, seqio.SentencePieceVocabulary) and vocab.sp_model == stdlib.sp_model
    assert vocab.vocab_size == len(hf_tokenizer) == 2100
    assert hf_tokenizer.convert_tokens_to_ids(["<extra_id_0>", "<extra_id_99>"]) == [2099, 2000]
    for text in TEXTS[:2]:
        want = hf_tokenizer(text, add_special_tokens=False)["input_ids"]
        assert list(vocab.encode(text)) == want
        assert vocab.decode(want) == hf_tokenizer.decode(want)
    sentinel = "fill <extra_id_0> here"  # (transformers decodes it without the space before the sentinel)
    assert list(vocab.encode(sentinel)) == hf_tokenizer(sentinel, add_special_tokens=False)["input_ids"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "T5Tokenizer", "extra_ids": 0}))
    assert tokenizer_dir.read_vocabulary(str(tmp_path)).vocab_size == 2000  # mT5 lists its sentinels in the model


def test_a_seqio_task_tokenizes_with_the_vocabulary(hf_dirs):
    path, hf_tokenizer = hf_dirs["gpt2"]
    vocab = tokenizer_dir.read_vocabulary(path)
    seqio.TaskRegistry.remove("test_hf_tokenizer_task")
    task = seqio.TaskRegistry.add(
        "test_hf_tokenizer_task",
        source=seqio.FunctionDataSource(
            lambda split, shuffle_files, seed=None: tf.data.Dataset.from_tensor_slices({"text": TEXTS}),
            splits=["train"],
        ),
        preprocessors=[
            lambda ds: ds.map(lambda ex: {"targets": ex["text"]}),
            seqio.preprocessors.tokenize,
            seqio.preprocessors.append_eos,
        ],
        output_features={"targets": seqio.Feature(vocab, add_eos=True)},
    )
    try:
        got = [ex["targets"].tolist() for ex in task.get_dataset(None, "train", shuffle=False).as_numpy_iterator()]
        eos = hf_tokenizer.eos_token_id
        assert got == [hf_tokenizer(text, add_special_tokens=False)["input_ids"] + [eos] for text in TEXTS]
        ids = tf.constant([got[0], got[0][:3] + [eos] + got[0][4:]])
        decoded = vocab.decode_tf(ids).numpy().tolist()
        assert decoded == [TEXTS[0].encode(), hf_tokenizer.decode(got[0][:3]).encode()]  # stops at EOS
    finally:
        seqio.TaskRegistry.remove("test_hf_tokenizer_task")


def test_equality_hash_and_copies_compare_content(hf_dirs):
    vocab = tokenizer_dir.read_vocabulary(hf_dirs["bart"][0])
    again = tokenizer_dir.read_vocabulary(hf_dirs["bart"][0])
    assert vocab == again and hash(vocab) == hash(again) and vocab is not again
    copied = copy.deepcopy(vocab)  # what gin does to configurable arguments
    assert copied == vocab and copied.encode(TEXTS[0]) == vocab.encode(TEXTS[0])
    assert vocab != HfTokenizerVocabulary(vocab.tokenizer, pad_id=vocab.pad_id, eos_id=0)
    assert vocab != tokenizer_dir.read_vocabulary(hf_dirs["gpt2"][0])
    assert "HfTokenizerVocabulary(BPE" in str(vocab)


def test_missing_or_corrupt_files_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="holds no tokenizer"):
        tokenizer_dir.read_vocabulary(str(tmp_path))
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"tokenizer\.json is not a tokenizer\.json"):
        tokenizer_dir.read_vocabulary(str(tmp_path))
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "spiece.model").write_bytes(b"\x00garbage")
    with pytest.raises(ValueError, match=r"spiece\.model is not a SentencePiece model"):
        tokenizer_dir.read_vocabulary(str(tmp_path))
    (tmp_path / "spiece.model").unlink()
    (tmp_path / "vocab.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"no tokenizer file .*merges\.txt"):
        tokenizer_dir.read_vocabulary(str(tmp_path))
    (tmp_path / "vocab.json").unlink()
    (tmp_path / "tokenizer_config.json").write_text("{")
    with pytest.raises(ValueError, match=r"tokenizer_config\.json is not valid JSON"):
        tokenizer_dir.read_vocabulary(str(tmp_path))
