"""`ptmjax prune-heads`: the folder holds the source's parameters with the chosen heads sliced out and rebuilds the
pruned model; `--keep_shapes` writes them zeroed at full size, which exports to transformers' BERT at logit parity
with the masked model; a head-pruned folder's export is refused in one line."""

import json

import jax
import numpy as np
import pytest
from flax import linen as nn

from ptmjax import cli, gin_files
from ptmjax.compress.head_importance import least_important, normalised
from ptmjax.compress.head_masks import head_masked, with_masks
from ptmjax.compress.head_pruning import head_pruned, prune_params
from ptmjax.convert import checkpoint
from ptmjax.families.model_api import model_api
from ptmjax.models import Bert, BertConfig
from ptmjax.storage.checkpoints import Checkpointer
from ptmjax.storage.model_dir import ModelDir

CONFIG = BertConfig(vocab_size=2176, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_length=32,
                    dropout_rate=0.0, attention_dropout_rate=0.0)
TASK = ["--task", "ptmjax_stdlib_mlm_nsp", "--num_batches", "2", "--inputs_length", "32", "--targets_length", "32"]


def source_folder(path):
    params = jax.device_get(nn.unbox(model_api(Bert(CONFIG)).init(jax.random.key(0))))
    path.mkdir()
    (path / "config.gin").write_text(checkpoint.model_gin(Bert(CONFIG)))
    checkpointer = Checkpointer(str(path / "checkpoints"), asynchronous=False)
    checkpointer.save_params(3, params)
    checkpointer.close()
    return params


def test_the_written_folder_holds_the_sliced_params_and_its_export_is_refused(tmp_path, capsys):
    params = source_folder(tmp_path / "bert")
    target = tmp_path / "pruned"
    assert cli.main(["prune-heads", "--from", str(tmp_path / "bert"), "--to", str(target), "--fraction", "0.5",
                     *TASK]) == 0
    record = json.loads((target / "head_importance.json").read_text())
    pruned = {path: tuple(heads) for path, heads in record["pruned_heads"].items()}
    assert sum(map(len, pruned.values())) == 4  # half of 2 x 4 heads, one at least kept in each layer
    scores = {path: np.asarray(values) for path, values in record["importance"].items()}
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
