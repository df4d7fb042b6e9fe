"""mT5, XLM-R and mBERT folders through `ptmjax convert`, both ways, with their tokenizers.

Tiny transformers models with random weights, saved with tokenizers trained here: mT5 with a SentencePiece
model as T5Tokenizer (mT5's tokenizer class in transformers 5), XLM-R with one as XLMRobertaTokenizer
(fairseq's id offset), mBERT with a cased WordPiece. The references are transformers: its tokenizer on the
same files, its model's outputs and `generate`, and the state dict of the folder imported.
"""

import json

import numpy as np
import pytest
from hf_folders import (
    SMALL_BERT,
    save_sentencepiece_tokenizer,
    saved,
    wordpiece_tokenizer,
    xlm_roberta_tokenizer,
)
from safetensors.numpy import load_file

import ptmjax
from ptmjax import cli, gin_files
from ptmjax.convert import hf_t5
from ptmjax.models import T5Config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TEXTS = ["Return the sum of a and b.", "Open a file, read it and close it again: 3 times.",
         "Naïve café: 東京 и Москва", "x"]


def round_trip(tmp_path) -> tuple[str, str]:
    """`ptmjax convert` of tmp_path/hf into a model folder and back into a Hugging Face folder: their paths."""
    imported, out = tmp_path / "imported", tmp_path / "out"
    assert cli.main(["convert", "--from-hf", str(tmp_path / "hf"), "--to", str(imported)]) == 0
    assert cli.main(["convert", "--from", str(imported), "--to-hf", str(out)]) == 0
    return str(imported), str(out)


def assert_same_weights(out: str, model) -> None:
    """The exported folder's arrays equal `model`'s state dict (tied copies written once, as transformers does)."""
    exported, state = load_file(f"{out}/model.safetensors"), model.state_dict()
    assert set(exported) <= set(state)
    for key, value in exported.items():
        np.testing.assert_array_equal(value, state[key].numpy(), err_msg=key)
    reloaded = type(model).from_pretrained(out).state_dict()
    assert set(reloaded) == set(state)
    for key, value in state.items():
        np.testing.assert_array_equal(reloaded[key].numpy(), value.numpy(), err_msg=key)


def test_an_mt5_folder_imports_generates_and_exports_with_its_sentencepiece_tokenizer(tmp_path):
    vocabulary = save_sentencepiece_tokenizer(tmp_path / "hf")  # spiece.model as T5Tokenizer, 100 sentinels
    torch.manual_seed(0)
    config = T5Config(vocab_size=vocabulary.vocab_size, d_model=32, num_heads=2, head_dim=16, d_ff=64,
                      num_encoder_layers=2, num_decoder_layers=2, ffn_activations=("gelu", "linear"),
                      tie_embeddings=False, dropout_rate=0.0, hf_model_type="mt5")
    model = hf_t5.build_hf_model(config).eval()  # an MT5ForConditionalGeneration with its own lm_head
    model.save_pretrained(tmp_path / "hf")
    hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())  # as google/mt5-* say (transformers
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**hf_config, "tie_word_embeddings": False}))  # ties)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    imported, out = round_trip(tmp_path)
    assert "T5Config.hf_model_type = 'mt5'" in (tmp_path / "imported" / "config.gin").read_text()

    vocab = gin_files.folder_vocabulary(imported)
    for text in TEXTS:
        assert list(vocab.encode(text)) == tokenizer(text, add_special_tokens=False)["input_ids"], text
    loaded = ptmjax.load(imported)
    for text, prediction in zip(TEXTS, loaded.predict(TEXTS, max_decode_length=6), strict=True):
        want = model.generate(**tokenizer(text, return_tensors="pt"), max_new_tokens=6, do_sample=False)
        assert list(prediction.tokens[0]) == want[0, 1:].tolist() and want.shape[1] == 7, text  # no EOS in 6

    hf_config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (hf_config["model_type"], hf_config["architectures"]) == ("mt5", ["MT5ForConditionalGeneration"])
    assert_same_weights(out, model)
    assert transformers.AutoTokenizer.from_pretrained(out)(TEXTS)["input_ids"] == tokenizer(TEXTS)["input_ids"]


def test_an_xlm_r_folder_keeps_fairseqs_id_offset_and_exports_as_xlm_r(tmp_path):
    import sentencepiece as spm

    tokenizer = xlm_roberta_tokenizer(tmp_path / "spm")
    processor = spm.SentencePieceProcessor(model_file=str(tmp_path / "spm" / "sentencepiece.bpe.model"))
    for text in TEXTS:  # the offset itself, as fairseq defines it: unk -> 3, every other piece + 1
        shifted = [3 if i == processor.unk_id() else i + 1 for i in processor.encode(text)]
        assert tokenizer(text)["input_ids"] == [0, *shifted, 2], text
    torch.manual_seed(0)
    model = transformers.XLMRobertaForMaskedLM(transformers.XLMRobertaConfig(
        vocab_size=len(tokenizer), max_position_embeddings=66, type_vocab_size=1, **SMALL_BERT)).eval()
    saved(tmp_path / "hf", tokenizer, model)
    imported, out = round_trip(tmp_path)

    vocab = gin_files.folder_vocabulary(imported)
    assert (vocab.bos_id, vocab.pad_id, vocab.eos_id, vocab.unk_id, vocab.vocab_size) == (0, 1, 2, 3, len(tokenizer))
    loaded = ptmjax.load(imported)
    ids = loaded.tokenize(TEXTS)
    assert ids == tokenizer(TEXTS)["input_ids"]
    for text, row in zip(TEXTS, ids, strict=True):
        inner = row[1:-1]
        assert list(vocab.encode(text)) == inner
        assert vocab.decode(inner) == tokenizer.decode(row, skip_special_tokens=True), text
    with torch.no_grad():
        want = [model.roberta(torch.tensor([row])).last_hidden_state[0].numpy() for row in ids]
    diff = max(np.abs(ours - ref).max() for ours, ref in zip(loaded.hidden_states(TEXTS), want, strict=True))
    print(f"XLM-R hidden states: max |diff| {diff:.2e}")
    assert diff < 1e-5
    masked = ["Return the <mask> of a and b.", "Open a <mask>, read it."]
    for text, answers in zip(masked, loaded.fill_mask(masked, top_k=3), strict=True):
        row = tokenizer(text, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            top = model(row).logits[0, row[0].tolist().index(tokenizer.mask_token_id)].softmax(-1).topk(3)
        assert [token for token, _ in answers[0]] == [tokenizer.decode([i]) for i in top.indices.tolist()], text
        np.testing.assert_allclose([p for _, p in answers[0]], top.values.numpy(), atol=1e-6)

    hf_config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (hf_config["model_type"], hf_config["architectures"]) == ("xlm-roberta", ["XLMRobertaForMaskedLM"])
    assert_same_weights(out, model)
    assert transformers.AutoTokenizer.from_pretrained(out)(TEXTS)["input_ids"] == tokenizer(TEXTS)["input_ids"]


def test_an_mbert_folder_reads_its_cased_wordpiece_and_round_trips(tmp_path):
    tokenizer = wordpiece_tokenizer(transformers.BertTokenizer)
    tokenizer = transformers.BertTokenizer(vocab=tokenizer.get_vocab(), do_lower_case=False)  # mBERT is cased
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(transformers.BertConfig(
        vocab_size=len(tokenizer), max_position_embeddings=64, **SMALL_BERT)).eval()
    saved(tmp_path / "hf", tokenizer, model)
    imported, out = round_trip(tmp_path)
    assert "BertConfig.nsp_head = True" in (tmp_path / "imported" / "config.gin").read_text()

    loaded = ptmjax.load(imported)
    cased = [*TEXTS, "MIXED Case and mixed case", "Ünïcödé ACCENTS"]
    assert loaded.tokenize(cased) == tokenizer(cased)["input_ids"]
    assert loaded.tokenize(["MIXED"]) != loaded.tokenize(["mixed"])
    hf_config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (hf_config["model_type"], hf_config["architectures"]) == ("bert", ["BertForPreTraining"])
    assert_same_weights(out, model)
    assert transformers.AutoTokenizer.from_pretrained(out)(cased)["input_ids"] == tokenizer(cased)["input_ids"]


def test_an_xlm_r_sentencepiece_file_without_tokenizer_json_reads_as_transformers_builds_it(tmp_path):
    """A folder as older transformers saved XLM-R's tokenizer: sentencepiece.bpe.model and tokenizer_config.json
    only. It reads as XLMRobertaTokenizer on the same file (ids, mask, pairs, decoding), and travels with imports."""
    import shutil

    from ptmjax.data import tokenizer_dir

    tokenizer = xlm_roberta_tokenizer(tmp_path / "spm")
    (tmp_path / "old").mkdir()
    shutil.copyfile(tmp_path / "spm" / "sentencepiece.bpe.model", tmp_path / "old" / "sentencepiece.bpe.model")
    (tmp_path / "old" / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "XLMRobertaTokenizer"}))
    vocab = tokenizer_dir.read_vocabulary(str(tmp_path / "old"))
    texts = [*TEXTS, "A <mask> in the middle:<mask>", "  spaces   between\twords  ", "ＦＵＬＬ width ①"]
    assert (vocab.bos_id, vocab.pad_id, vocab.eos_id, vocab.unk_id, vocab.mask_id) == (0, 1, 2, 3, len(tokenizer) - 1)
    assert vocab.vocab_size == len(tokenizer)
    for text in texts:
        ids = tokenizer(text)["input_ids"]
        assert vocab.encode_with_template(text) == ids, text
        assert vocab.decode(ids[1:-1]) == tokenizer.decode(ids, skip_special_tokens=True), text
    pair = tokenizer(texts[0], texts[1])["input_ids"]
    assert vocab.tokenizer.encode(texts[0], texts[1]).ids == pair

    torch.manual_seed(0)
    model = transformers.XLMRobertaForMaskedLM(transformers.XLMRobertaConfig(
        vocab_size=len(tokenizer), max_position_embeddings=66, type_vocab_size=1, **SMALL_BERT))
    model.save_pretrained(tmp_path / "old")
    imported, out = tmp_path / "imported", tmp_path / "out"
    assert cli.main(["convert", "--from-hf", str(tmp_path / "old"), "--to", str(imported)]) == 0
    assert cli.main(["convert", "--from", str(imported), "--to-hf", str(out)]) == 0
    assert sorted(p.name for p in (imported / "tokenizer").iterdir()) == ["sentencepiece.bpe.model",
                                                                          "tokenizer_config.json"]
    assert transformers.AutoTokenizer.from_pretrained(out)(texts)["input_ids"] == tokenizer(texts)["input_ids"]


@pytest.mark.parametrize("content", [b"", b"\x0a\xff\xff not a protobuf"])
def test_a_damaged_xlm_r_sentencepiece_file_is_named(tmp_path, content):
    from ptmjax.data import tokenizer_dir

    (tmp_path / "sentencepiece.bpe.model").write_bytes(content)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "XLMRobertaTokenizer"}))
    with pytest.raises(ValueError, match=r"sentencepiece\.bpe\.model (is not a SentencePiece model|holds 0 Sentence)"):
        tokenizer_dir.read_vocabulary(str(tmp_path))
