"""Tokenizers and generation ids travel with models through `ptmjax convert`, both ways.

Tiny transformers models are saved with byte-level BPE / WordPiece tokenizers
trained here; a tiny ptmjax T5 run exports the stdlib SentencePiece
vocabulary. The reference is transformers: its tokenizer on the same files,
and `generate` with no token-id argument.
"""

import dataclasses
import json

import flax.linen as nn
import jax
import pytest
import seqio
from hf_folders import (
    SMALL_BART,
    SMALL_T5,
    byte_level_bpe,
    paragraph_lines,
    save_sentencepiece_t5,
    saved,
    wordpiece_tokenizer,
)

from ptmjax import cli, gin_files
from ptmjax.convert import checkpoint
from ptmjax.data import tokenizer_dir, vocabularies
from ptmjax.data.hf_tokenizer_vocabulary import HfTokenizerVocabulary
from ptmjax.decoding.generation_ids import GenerationIds
from ptmjax.families.model_api import model_api
from ptmjax.models import EncoderDecoder, T5Config
from ptmjax.storage.checkpoints import Checkpointer
from ptmjax.storage.model_dir import ModelDir

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TEXTS = ["Return the sum of a and b.", "Open a file, read it and close it again: 3 times."]


def assert_generates(hf_dir, auto_class) -> torch.Tensor:
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    model = getattr(transformers, auto_class).from_pretrained(hf_dir).eval()
    output = model.generate(**tokenizer(TEXTS, return_tensors="pt", padding=True))
    assert output.shape[0] == len(TEXTS) and output.shape[1] > 1
    return output


def test_a_t5_run_exports_its_sentencepiece_tokenizer_and_generation_ids(tmp_path):
    config = T5Config(
        vocab_size=2100, d_model=32, num_heads=2, head_dim=16, d_ff=64, num_encoder_layers=2, num_decoder_layers=2,
        ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.0,
    )
    run = tmp_path / "run"  # a run folder as `ptmjax train` leaves it: config.gin with the task, a checkpoint
    run.mkdir()
    (run / "config.gin").write_text(
        checkpoint.model_gin(EncoderDecoder(config)) + "train.mixture_or_task_name = 'ptmjax_stdlib_span_corruption'\n"
    )
    checkpointer = Checkpointer(str(run / "checkpoints"), asynchronous=False)
    checkpointer.save_params(0, jax.device_get(nn.unbox(model_api(EncoderDecoder(config)).init(jax.random.key(0)))))
    checkpointer.close()
    vocab = gin_files.folder_vocabulary(str(run))
    assert vocab == vocabularies.stdlib_sentencepiece_vocabulary()
    assert gin_files.folder_generation_ids(ModelDir(str(run))) == GenerationIds(eos_token_id=1, pad_token_id=0,
                                                                decoder_start_token_id=0)
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "config.gin"]  # reading created nothing

    out = tmp_path / "hf"
    assert cli.main(["convert", "--from", str(run), "--to-hf", str(out)]) == 0
    assert (out / "spiece.model").read_bytes() == open(vocab.sentencepiece_model_file, "rb").read()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert len(tokenizer) == vocab.vocab_size
    for text in TEXTS:
        assert tokenizer(text)["input_ids"] == [*vocab.encode(text), vocab.eos_id]  # transformers appends EOS
    assert tokenizer.convert_tokens_to_ids("<extra_id_0>") == vocab.vocab_size - 1  # seqio's first sentinel
    hf_config = json.loads((out / "config.json").read_text())
    assert (hf_config["decoder_start_token_id"], hf_config["eos_token_id"], hf_config["pad_token_id"]) == (0, 1, 0)
    output = assert_generates(out, "AutoModelForSeq2SeqLM")
    assert output[:, 0].tolist() == [0, 0]  # the decoder starts from pad, as T5's

    imported = tmp_path / "imported"  # and back: spiece.model is seqio's SentencePiece again
    checkpoint.import_hf(str(out), str(imported))
    again = gin_files.folder_vocabulary(str(imported))
    assert again.sp_model == vocab.sp_model and again.vocab_size == vocab.vocab_size
    run_ids = gin_files.folder_generation_ids(ModelDir(str(run)))
    # the same ids; from Hugging Face files, beam search ranks as their generate does (transformers' default 1.0)
    assert gin_files.folder_generation_ids(ModelDir(str(imported))) == dataclasses.replace(run_ids, length_penalty=1.0)


@pytest.mark.parametrize("family", ["gpt2", "bart"])
def test_import_brings_the_tokenizer_and_export_writes_it_back(tmp_path, family):
    if family == "gpt2":
        tokenizer = byte_level_bpe(transformers.GPT2Tokenizer, ["<|endoftext|>"], pad_token="<|endoftext|>")
        eos = tokenizer.eos_token_id
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=2, n_positions=64, bos_token_id=eos,
            eos_token_id=eos, pad_token_id=eos,
        ))
        auto_class = "AutoModelForCausalLM"
        want = GenerationIds(eos_token_id=eos, pad_token_id=eos, bos_token_id=eos, length_penalty=1.0)
    else:
        tokenizer = byte_level_bpe(transformers.BartTokenizer, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
        config = transformers.BartConfig(vocab_size=len(tokenizer), **SMALL_BART)
        model = transformers.BartForConditionalGeneration(config)
        model.generation_config.forced_bos_token_id = 0  # where transformers 5 keeps it (mBART-50's language tag)
        auto_class = "AutoModelForSeq2SeqLM"
        want = GenerationIds(eos_token_id=2, pad_token_id=1, decoder_start_token_id=2, bos_token_id=0,
                             forced_bos_token_id=0, forced_eos_token_id=2, length_penalty=1.0)
    saved(tmp_path / "hf", tokenizer, model)
    folder = ModelDir(str(tmp_path / "imported"))
    assert cli.main(["convert", "--from-hf", str(tmp_path / "hf"), "--to", folder.path]) == 0
    copied = sorted(p.name for p in (tmp_path / "imported" / "tokenizer").iterdir())
    assert copied == ["tokenizer.json", "tokenizer_config.json"]
    vocab = gin_files.folder_vocabulary(folder)
    assert isinstance(vocab, HfTokenizerVocabulary)
    for text in TEXTS:
        assert list(vocab.encode(text)) == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert gin_files.folder_generation_ids(folder) == want

    out = tmp_path / "out"
    assert cli.main(["convert", "--from", folder.path, "--to-hf", str(out)]) == 0
    reloaded = transformers.AutoTokenizer.from_pretrained(out)
    assert reloaded(TEXTS)["input_ids"] == tokenizer(TEXTS)["input_ids"]
    assert GenerationIds.from_hf_dir(str(out)) == want
    assert_generates(out, auto_class)


def test_bert_import_gives_a_wordpiece_vocabulary(tmp_path):
    tokenizer = wordpiece_tokenizer(transformers.BertTokenizer)
    model = transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64,
    ))
    saved(tmp_path / "hf", tokenizer, model)
    folder = ModelDir(str(tmp_path / "imported"))
    checkpoint.import_hf(str(tmp_path / "hf"), folder.path)
    vocab = gin_files.folder_vocabulary(folder)
    assert json.loads(vocab.tokenizer.to_str())["model"]["type"] == "WordPiece"
    assert (vocab.pad_id, vocab.eos_id, vocab.unk_id) == (0, tokenizer.sep_token_id, tokenizer.unk_token_id)
    for text in [*TEXTS, "MIXED case Ünïcödé"]:
        assert list(vocab.encode(text)) == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert gin_files.folder_generation_ids(folder) == GenerationIds(pad_token_id=0, length_penalty=1.0)


def test_folders_without_a_vocabulary_say_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="has neither a tokenizer/ folder nor a config.gin"):
        gin_files.folder_vocabulary(str(tmp_path))
    (tmp_path / "config.gin").write_text("train.batch_size = 8\n")
    with pytest.raises(ValueError, match="binds no train.mixture_or_task_name; copy the model's Hugging Face"):
        gin_files.folder_vocabulary(str(tmp_path))
    (tmp_path / "generation.json").write_text('{"eos_token_id": [1, 2]}')
    with pytest.raises(ValueError, match=r"generation\.json has eos_token_id=\[1, 2\]"):
        gin_files.folder_generation_ids(ModelDir(str(tmp_path)))


@pytest.mark.slow
def test_an_import_fine_tunes_on_text_with_its_own_tokenizer(tmp_path):
    """A Hugging Face T5 with its own SentencePiece model, imported, trains on text files through gin
    alone: the task's vocabulary is the imported folder's (`folder_vocabulary`), not ptmjax's."""
    import gin

    save_sentencepiece_t5(tmp_path / "hf")
    lines = paragraph_lines()
    imported = tmp_path / "imported"
    checkpoint.import_hf(str(tmp_path / "hf"), str(imported))
    own = gin_files.folder_vocabulary(str(imported))
    assert own.vocab_size == 400 and own != vocabularies.stdlib_sentencepiece_vocabulary()
    (tmp_path / "train.txt").write_text("\n".join(lines[:64]) + "\n")
    (tmp_path / "valid.txt").write_text("\n".join(lines[64:72]) + "\n")
    bindings = [
        "train.mixture_or_task_name = @register_text_files_task()",
        "register_text_files_task.name = 'own_tokenizer_text'",
        f"register_text_files_task.train_pattern = '{tmp_path / 'train.txt'}'",
        f"register_text_files_task.validation_pattern = '{tmp_path / 'valid.txt'}'",
        "register_text_files_task.vocabulary = @folder_vocabulary()",
        f"folder_vocabulary.path = '{imported}'",
        f"train.init_checkpoint = '{imported}'",
        "train.task_feature_lengths = {'inputs': 32, 'targets': 8}",
        "train.batch_size = 8", "train.num_steps = 2", "train.eval_batches = 1", "train.show_progress = False",
        "train.optimizer = @adamw", "adamw.learning_rate = 1e-3",
    ]
    run = tmp_path / "run"
    try:
        assert cli.main(["train", f"--gin_file={imported / 'config.gin'}", f"--model_dir={run}",
                         *(f"--gin_bindings={b}" for b in bindings)]) == 0
    finally:
        gin.clear_config()
        seqio.TaskRegistry.remove("own_tokenizer_text")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("eval_loss" in r for r in records)
    kept = gin_files.folder_vocabulary(str(run))  # the run keeps the import's tokenizer and ids
    assert kept.sp_model == own.sp_model and kept.vocab_size == own.vocab_size
    import_ids = gin_files.folder_generation_ids(ModelDir(str(imported)))
    assert gin_files.folder_generation_ids(ModelDir(str(run))) == import_ids


@pytest.mark.slow
def test_a_byt5_folder_imports_loads_and_exports_with_its_byte_vocabulary(tmp_path):
    """ByT5 (T5 v1.1 over bytes) saves only a tokenizer_config.json naming ByT5Tokenizer: it reads as seqio's
    ByteVocabulary, which encodes as ByT5Tokenizer does, and decodes greedily as generate does."""
    import ptmjax

    tokenizer = transformers.ByT5Tokenizer()
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=len(tokenizer), feed_forward_proj="gated-gelu", tie_word_embeddings=False, **SMALL_T5,
    )).eval()
    saved(tmp_path / "hf", tokenizer, model)
    imported = tmp_path / "imported"
    assert cli.main(["convert", "--from-hf", str(tmp_path / "hf"), "--to", str(imported)]) == 0
    texts = [*TEXTS, "Naïve café: 東京", "x"]
    for folder, vocab in ((tmp_path / "hf", tokenizer_dir.read_vocabulary(str(tmp_path / "hf"))),
                          (imported, gin_files.folder_vocabulary(str(imported)))):
        assert isinstance(vocab, seqio.ByteVocabulary) and vocab.vocab_size == len(tokenizer) == 384
        for text in texts:
            assert list(vocab.encode(text)) == tokenizer(text, add_special_tokens=False)["input_ids"]
        loaded = ptmjax.load(str(folder))
        for text, prediction in zip(texts, loaded.predict(texts, max_decode_length=6), strict=True):
            want = model.generate(**tokenizer(text, return_tensors="pt"), max_new_tokens=6, do_sample=False)
            assert list(prediction.tokens[0]) == want[0, 1:].tolist()[: len(prediction.tokens[0])], text
    out = tmp_path / "out"
    assert cli.main(["convert", "--from", str(imported), "--to-hf", str(out)]) == 0
    assert transformers.AutoTokenizer.from_pretrained(out)(texts)["input_ids"] == tokenizer(texts)["input_ids"]


def test_a_tokenizer_class_without_files_ptmjax_reads_is_named(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": "CanineTokenizer"}')
    with pytest.raises(ValueError, match="holds a CanineTokenizer without any of spiece.model"):
        tokenizer_dir.read_vocabulary(str(tmp_path))
