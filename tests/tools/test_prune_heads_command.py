"""`ptmjax prune-heads`: the folder holds the source's parameters with the chosen heads sliced out and rebuilds the
pruned model; `--rounds` records each round and computes the masked full model; a scanned source is written
unscanned, equal to its unscanned copy's folder; `--keep_shapes` writes them zeroed at full size, which exports to
transformers' BERT at logit parity with the masked model; a head-pruned folder's export is refused in one line."""

import dataclasses
import json

import jax
import numpy as np
import pytest
from flax import linen as nn

from ptmjax import cli, gin_files
from ptmjax.compress.head_importance import least_important, lowest, normalised
from ptmjax.compress.head_masks import head_masked, with_masks
from ptmjax.compress.head_pruning import head_pruned, prune_params
from ptmjax.convert import checkpoint
from ptmjax.families.model_api import model_api
from ptmjax.layers import layer_stack
from ptmjax.models import Bert, BertConfig
from ptmjax.storage.checkpoints import Checkpointer
from ptmjax.storage.model_dir import ModelDir

CONFIG = BertConfig(vocab_size=2176, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_length=32,
                    dropout_rate=0.0, attention_dropout_rate=0.0)
TASK = ["--task", "ptmjax_stdlib_mlm_nsp", "--num_batches", "2", "--inputs_length", "32", "--targets_length", "32"]


def source_folder(path, config=CONFIG):
    """A BERT folder at step 3 (scanned where `config` scans, from the same parameters); returns them unscanned."""
    params = jax.device_get(nn.unbox(model_api(Bert(CONFIG)).init(jax.random.key(0))))
    path.mkdir()
    (path / "config.gin").write_text(checkpoint.model_gin(Bert(config)))
    checkpointer = Checkpointer(str(path / "checkpoints"), asynchronous=False)
    checkpointer.save_params(3, layer_stack.scan(params, config) if config.scan_layers else params)
    checkpointer.close()
    return params


def pruned_logits(folder, tokens):
    """The logits of the pruned model a folder's config.gin builds, with its checkpoint's parameters."""
    model, _ = gin_files.read_model_config(folder)
    return model.apply({"params": folder.read_params(model_api(model).abstract_params, step=3)}, tokens).mlm_logits


def masked_logits(params, pruned, tokens):
    masked = head_masked(Bert(CONFIG))
    masks = {path: np.array([0.0 if h in heads else 1.0 for h in range(4)], np.float32)
             for path, heads in pruned.items()}
    return masked.apply({"params": with_masks(masked, params, masks)}, tokens).mlm_logits


def test_the_written_folder_holds_the_sliced_params_and_its_export_is_refused(tmp_path, capsys):
    params = source_folder(tmp_path / "bert")
    target = tmp_path / "pruned"
    assert cli.main(["prune-heads", "--from", str(tmp_path / "bert"), "--to", str(target), "--fraction", "0.5",
                     *TASK]) == 0
    record = json.loads((target / "head_importance.json").read_text())
    pruned = {path: tuple(heads) for path, heads in record["pruned_heads"].items()}
    assert sum(map(len, pruned.values())) == 4  # half of 2 x 4 heads, one at least kept in each layer
    (only,) = record["rounds"]
    scores = {path: np.asarray(values) for path, values in only["importance"].items()}
    assert pruned == least_important(normalised(scores), 0.5)
    folder = ModelDir(str(target))
    model, _ = gin_files.read_model_config(folder)
    assert model == head_pruned(Bert(CONFIG), pruned)
    stored = folder.read_params(model_api(model).abstract_params, step=3)
    jax.tree.map(np.testing.assert_array_equal, stored, jax.device_get(prune_params(params, pruned)))
    assert cli.main(["inspect", str(target)]) == 0
    capsys.readouterr()
    assert cli.main(["convert", "--from", str(target), "--to-hf", str(tmp_path / "hf")]) == 1
    error = capsys.readouterr().err
    assert "holds a head-pruned model, and transformers 5 has no per-layer head counts" in error
    assert "--keep_shapes` from the source folder" in error and error.count("\n") == 1
    assert cli.main(["prune-heads", "--from", str(target), "--to", str(tmp_path / "again"), "--fraction", "0.25",
                     *TASK]) == 1
    assert "holds a head-pruned model already" in capsys.readouterr().err


@pytest.mark.slow
def test_rounds_are_recorded_and_the_folder_computes_the_masked_full_model(tmp_path):
    """Half of 2 x 4 heads in two rounds of two: round 2 scores the model with round 1's heads masked (null in its
    normalised scores), and its choice is the lowest two of the others as head_importance.json records them."""
    params = source_folder(tmp_path / "bert")
    target = tmp_path / "pruned"
    assert cli.main(["prune-heads", "--from", str(tmp_path / "bert"), "--to", str(target), "--fraction", "0.5",
                     "--rounds", "2", *TASK]) == 0
    record = json.loads((target / "head_importance.json").read_text())
    first, second = ({path: tuple(heads) for path, heads in done["pruned_heads"].items()} for done in record["rounds"])
    scores = [{path: np.array(values, np.float64) for path, values in done["normalised_importance"].items()}
              for done in record["rounds"]]
    importance = {path: np.asarray(values) for path, values in record["rounds"][1]["importance"].items()}
    assert first == lowest(scores[0], 2)
    np.testing.assert_allclose(scores[1]["layers_0/attention"], normalised(importance, first)["layers_0/attention"])
    assert all(np.isnan(scores[1][path][list(heads)]).all() for path, heads in first.items())
    pruned = {path: tuple(heads) for path, heads in record["pruned_heads"].items()}
    assert pruned == lowest(scores[1], 4, first) and sum(map(len, second.values())) == 2
    assert set(pruned) >= set(second) and record["unscanned"] is False
    tokens = np.random.default_rng(0).integers(5, 2176, (2, 12)).astype(np.int32)
    np.testing.assert_allclose(pruned_logits(ModelDir(str(target)), tokens), masked_logits(params, pruned, tokens),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_a_scanned_source_is_written_unscanned_as_its_unscanned_copy_is(tmp_path, capsys):
    scanned = dataclasses.replace(CONFIG, scan_layers=True)
    params = source_folder(tmp_path / "scanned", scanned)
    source_folder(tmp_path / "plain")
    folders = {}
    for name in ("scanned", "plain"):
        folders[name] = tmp_path / f"{name}_pruned"
        assert cli.main(["prune-heads", "--from", str(tmp_path / name), "--to", str(folders[name]), "--fraction",
                         "0.5", "--rounds", "2", *TASK]) == 0
        if name == "scanned":
            assert "scans its layers: scoring its heads and writing" in capsys.readouterr().out
    records = {name: json.loads((folder / "head_importance.json").read_text()) for name, folder in folders.items()}
    assert records["scanned"]["pruned_heads"] == records["plain"]["pruned_heads"]
    assert [done["pruned_heads"] for done in records["scanned"]["rounds"]] == [
        done["pruned_heads"] for done in records["plain"]["rounds"]]
    pruned = {path: tuple(heads) for path, heads in records["plain"]["pruned_heads"].items()}
    model, _ = gin_files.read_model_config(ModelDir(str(folders["scanned"])))
    assert model == head_pruned(Bert(CONFIG), pruned)
    tokens = np.random.default_rng(0).integers(5, 2176, (2, 12)).astype(np.int32)
    got, want = (pruned_logits(ModelDir(str(folders[name])), tokens) for name in ("scanned", "plain"))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, masked_logits(params, pruned, tokens), rtol=1e-5, atol=1e-5)


def test_a_scanned_source_that_binds_scan_layers_by_an_include_is_refused_in_one_line(tmp_path, capsys):
    source_folder(tmp_path / "scanned", dataclasses.replace(CONFIG, scan_layers=True))
    config = tmp_path / "scanned" / "config.gin"
    (tmp_path / "scan.gin").write_text("BertConfig.scan_layers = True\n")
    config.write_text(f"include '{tmp_path / 'scan.gin'}'\n" + config.read_text().replace(
        "BertConfig.scan_layers = True\n", ""))
    assert cli.main(["prune-heads", "--from", str(tmp_path / "scanned"), "--to", str(tmp_path / "out"),
                     "--fraction", "0.5", *TASK]) == 1
    error = capsys.readouterr().err
    assert "scans the model's layers, but not by a line" in error and error.count("\n") == 1


def test_keep_shapes_exports_the_masked_model_to_transformers_at_logit_parity(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    params = source_folder(tmp_path / "bert")
    target = tmp_path / "zeroed"
    assert cli.main(["prune-heads", "--from", str(tmp_path / "bert"), "--to", str(target), "--fraction", "0.5",
                     "--keep_shapes", *TASK]) == 0
    pruned = json.loads((target / "head_importance.json").read_text())["pruned_heads"]
    assert cli.main(["convert", "--from", str(target), "--to-hf", str(tmp_path / "hf")]) == 0
    hf_model = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf").eval()
    tokens = np.random.default_rng(0).integers(5, 2176, (2, 12)).astype(np.int32)
    with torch.no_grad():
        want = hf_model(torch.as_tensor(tokens, dtype=torch.long)).prediction_logits.numpy()
    masks = {path: np.array([0.0 if h in heads else 1.0 for h in range(4)], np.float32)
             for path, heads in pruned.items()}
    masked = head_masked(Bert(CONFIG))
    got = masked.apply({"params": with_masks(masked, params, masks)}, tokens).mlm_logits
    print("max |transformers - masked|", np.abs(np.asarray(got) - want).max())
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_ptmjax_load_of_a_pruned_t5_scores_and_decodes_as_its_zeroed_full_size_copy(tmp_path):
    """Cached decoding reads each layer's kept heads of T5's shared relative-position bias."""
    import ptmjax
    from ptmjax.models import EncoderDecoder, T5Config

    t5 = EncoderDecoder(T5Config(vocab_size=2176, d_model=32, num_heads=4, head_dim=8, d_ff=64, num_encoder_layers=2,
                                 num_decoder_layers=2, ffn_activations=("gelu", "linear"), tie_embeddings=False,
                                 dropout_rate=0.0))
    (tmp_path / "t5").mkdir()
    (tmp_path / "t5" / "config.gin").write_text(checkpoint.model_gin(t5) + "train.mixture_or_task_name = "
                                                "'ptmjax_pretrain'\ntrain.task_feature_lengths = {'inputs': 64, "
                                                "'targets': 16}\n")
    checkpointer = Checkpointer(str(tmp_path / "t5" / "checkpoints"), asynchronous=False)
    checkpointer.save_params(5, jax.device_get(nn.unbox(model_api(t5).init(jax.random.key(0)))))
    checkpointer.close()
    outputs = []
    for name, flags in (("pruned", []), ("zeroed", ["--keep_shapes"])):
        assert cli.main(["prune-heads", "--from", str(tmp_path / "t5"), "--to", str(tmp_path / name), "--task",
                         "ptmjax_pretrain", "--fraction", "0.5", "--num_batches", "2", *flags]) == 0
        model = ptmjax.load(str(tmp_path / name))
        texts = ["Open the file.", "Return the sum of a and b."]
        outputs.append((model.score(texts, ["a file", "the sum"]), model.generate(texts)))
    (pruned_scores, pruned_texts), (zeroed_scores, zeroed_texts) = outputs
    np.testing.assert_allclose(pruned_scores, zeroed_scores, rtol=1e-5)
    assert pruned_texts == zeroed_texts
