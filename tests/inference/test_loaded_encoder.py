"""`ptmjax.load` of an encoder folder: hidden states, pooled embeddings and masked-token predictions of texts of
unequal lengths, against transformers on each text alone (BERT with a WordPiece tokenizer, RoBERTa with a
byte-level BPE whose pad id is 1, and a BertModel folder without its head)."""

import json

import numpy as np
import pytest
from hf_folders import SMALL_BERT, byte_level_bpe, saved, wordpiece_tokenizer, write_sentence_transformers_files

import ptmjax
from ptmjax.inference import LoadedEncoder

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TEXTS = ["Return the sum of a and b, or raise ValueError when either is negative.", "Open a file.", "x"]


@pytest.fixture(scope="module", params=["BertForMaskedLM", "RobertaForMaskedLM", "BertModel"])
def encoder_dir(request, tmp_path_factory):
    """(folder, the transformers model saved there, its tokenizer)."""
    path = tmp_path_factory.mktemp(request.param)
    if request.param.startswith("Roberta"):
        tokenizer = byte_level_bpe(transformers.RobertaTokenizer, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
        config = transformers.RobertaConfig(vocab_size=len(tokenizer), max_position_embeddings=66, **SMALL_BERT)
    else:
        tokenizer = wordpiece_tokenizer(transformers.BertTokenizer)
        config = transformers.BertConfig(vocab_size=len(tokenizer), max_position_embeddings=64, **SMALL_BERT)
    torch.manual_seed(0)
    model = getattr(transformers, request.param)(config).eval()
    saved(path, tokenizer, model)
    return path, model, tokenizer


def reference_states(model, tokenizer, text):
    """transformers' last hidden states [length, d] of `text` alone."""
    with torch.no_grad():
        output = model(**tokenizer(text, return_tensors="pt"), output_hidden_states=True)
    return output.hidden_states[-1][0].numpy()


def test_hidden_states_and_embeddings_equal_transformers_on_each_text_alone(encoder_dir):
    path, model, tokenizer = encoder_dir
    loaded = ptmjax.load(str(path))
    assert isinstance(loaded, LoadedEncoder) and "LoadedEncoder(model: Bert" in repr(loaded)
    assert loaded.tokenize(TEXTS) == tokenizer(TEXTS)["input_ids"]  # [CLS] ... [SEP] / <s> ... </s>
    want = [reference_states(model, tokenizer, text) for text in TEXTS]
    for got, expected in zip(loaded.hidden_states(TEXTS), want, strict=True):
        np.testing.assert_allclose(got, expected, atol=2e-5)
    np.testing.assert_allclose(loaded.embed(TEXTS), [h.mean(0) for h in want], atol=2e-5)
    np.testing.assert_allclose(loaded.embed(TEXTS, pooling="cls"), [h[0] for h in want], atol=2e-5)
    normalised = loaded.embed(TEXTS, pooling="max", normalize=True)
    np.testing.assert_allclose(normalised, [h.max(0) / np.linalg.norm(h.max(0)) for h in want], atol=2e-5)


def test_fill_mask_ranks_the_mask_positions_as_the_masked_lm_head_does(encoder_dir):
    path, model, tokenizer = encoder_dir
    loaded = ptmjax.load(str(path))
    mask = tokenizer.mask_token
    texts = [f"Return the {mask} of a and b.", f"Open a {mask} and {mask} it."]
    if not hasattr(model, "lm_head") and not hasattr(model, "cls"):  # a base model: its import's head is fresh
        assert len(loaded.fill_mask(texts)[1]) == 2
        return
    got = loaded.fill_mask(texts, top_k=3)
    for text, answers in zip(texts, got, strict=True):
        inputs = tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            probabilities = torch.softmax(model(**inputs).logits[0], -1).numpy()
        positions = np.flatnonzero(inputs["input_ids"][0].numpy() == tokenizer.mask_token_id)
        assert len(answers) == len(positions)
        for answer, position in zip(answers, positions, strict=True):
            best = np.argsort(-probabilities[position])[:3]
            assert [token for token, _ in answer] == [loaded.vocabulary.decode([int(t)]) for t in best]
            np.testing.assert_allclose([p for _, p in answer], probabilities[position][best], atol=1e-5)


def test_bad_inputs_name_the_fix(encoder_dir):
    loaded = ptmjax.load(str(encoder_dir[0]))
    with pytest.raises(ValueError, match="pooling='sum' is unknown; use one of mean, cls, max"):
        loaded.embed(TEXTS, pooling="sum")
    with pytest.raises(ValueError, match="holds no mask token"):
        loaded.fill_mask(["no mask here"])
    with pytest.raises(ValueError, match="more than the 64 this model takes"):
        loaded.embed([" ".join(["word"] * 100)])


@pytest.fixture(scope="module")
def sentence_transformers_dir(tmp_path_factory):
    """A sentence-transformers folder as that library saves one: a BertModel with its tokenizer, modules.json,
    1_Pooling/config.json (mean), 2_Normalize/ and sentence_bert_config.json (max_seq_length 16)."""
    path = tmp_path_factory.mktemp("sentence_transformer")
    tokenizer = wordpiece_tokenizer(transformers.BertTokenizer)
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(vocab_size=len(tokenizer), max_position_embeddings=64,
                                                           **SMALL_BERT)).eval()
    saved(path, tokenizer, model)
    write_sentence_transformers_files(path, pooling="mean", max_seq_length=16)
    return path, model, tokenizer


def sentence_transformers_encode(model, tokenizer, texts):
    """sentence-transformers' encode, computed in transformers: each text cut to 16 tokens, the masked mean of
    the last hidden states, L2-normalised."""
    vectors = []
    with torch.no_grad():
        for text in texts:
            states = model(**tokenizer(text, return_tensors="pt", truncation=True, max_length=16)).last_hidden_state
            vectors.append(torch.nn.functional.normalize(states[0].mean(0), dim=0).numpy())
    return np.stack(vectors)


def test_a_sentence_transformers_folder_embeds_as_sentence_transformers_through_import_export_and_infer(
        sentence_transformers_dir, tmp_path, capsys):
    from ptmjax import cli

    path, model, tokenizer = sentence_transformers_dir
    texts = [*TEXTS, " ".join(["word"] * 40)]  # the last is cut to 16 tokens, as sentence-transformers cuts it
    want = sentence_transformers_encode(model, tokenizer, texts)
    loaded = ptmjax.load(str(path))
    assert (loaded.sentence_pooling.pooling, loaded.sentence_pooling.normalize) == ("mean", True)
    np.testing.assert_allclose(loaded.embed(texts, truncate=True), want, atol=2e-5)
    imported, exported = tmp_path / "imported", tmp_path / "exported"
    assert cli.main(["convert", "--from-hf", str(path), "--to", str(imported)]) == 0
    np.testing.assert_allclose(ptmjax.load(str(imported)).embed(texts, truncate=True), want, atol=2e-5)
    assert cli.main(["convert", "--from", str(imported), "--to-hf", str(exported)]) == 0
    assert (exported / "1_Pooling" / "config.json").read_text() == (path / "1_Pooling" / "config.json").read_text()
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n")
    assert cli.main(["infer", "--model_dir", str(imported), "--input_file", str(tmp_path / "texts.txt"), "--embed",
                     "--truncate_inputs"]) == 0
    records = [json.loads(line) for line in (imported / "inference" / "texts.jsonl").read_text().splitlines()]
    assert [r["inputs"] for r in records] == texts
    np.testing.assert_allclose([r["embedding"] for r in records], want, atol=2e-5)
    assert cli.main(["infer", "--model_dir", str(imported), "--input_file", str(tmp_path / "texts.txt"),
                     "--output", str(tmp_path / "other.jsonl")]) == 1
    assert "an encoder embeds texts rather than decoding them; pass --embed" in capsys.readouterr().err
