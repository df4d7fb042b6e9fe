"""Bad text files get a clear error, or a warning with counts, before any training step."""

import os

import pytest

from ptmjax.data import pipeline, text_files, vocabularies
from ptmjax.models import EncoderDecoder, T5Config
from ptmjax.tasks import pretraining
from ptmjax.training.run import train

CONFIG = T5Config(
    vocab_size=2176, d_model=32, num_heads=4, head_dim=8, d_ff=64, num_encoder_layers=1,
    num_decoder_layers=1, ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.0,
)
LENGTHS = {"inputs": 32, "targets": 8}
TEXT = "Every line of this file is one short document about reading text files.\n" * 200


def first_batch(task_name: str) -> dict:
    """The first training batch of a task (byte vocabulary: nothing to train)."""
    return next(pipeline.get_dataset(task_name, "train", LENGTHS, 8, seed=0, shuffle=False).as_numpy_iterator())


def test_an_empty_training_file_stops_the_run_before_any_step_naming_it(tmp_path):
    """Unfixed: a bare StopIteration at the first step."""
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    task = pretraining.register_text_files_task("reliability_c_empty", str(empty))
    model_dir = tmp_path / "run"
    with pytest.raises(ValueError, match=f"^the 'train' files hold no text \\(empty or blank\\): {empty}; point"):
        train(str(model_dir), model=EncoderDecoder(CONFIG), mixture_or_task_name=task, task_feature_lengths=LENGTHS,
              batch_size=8, num_steps=2, show_progress=False)
    assert not any((model_dir / "checkpoints").glob("*"))  # no checkpoint (the split check runs first)
    assert not (model_dir / "metrics.jsonl").exists() or not (model_dir / "metrics.jsonl").read_text()


def test_blank_files_are_refused_naming_them(tmp_path):
    """Unfixed: training on files of blank lines spun forever without a batch."""
    blank, empty = tmp_path / "blank.txt", tmp_path / "empty.txt"
    blank.write_text("\n  \n\t\n")
    empty.write_text("")
    with pytest.raises(
        ValueError, match=f"^the 'validation' files hold no text \\(empty or blank\\): {blank}, {empty};"
    ):
        text_files.check_text_files([str(blank), str(empty)], "validation")


def test_a_mostly_binary_file_is_refused_naming_it(tmp_path):
    good, empty, binary = tmp_path / "good.txt", tmp_path / "empty.txt", tmp_path / "model.txt"
    good.write_text(TEXT)
    empty.write_text("")  # an empty file beside text is fine
    binary.write_bytes(bytes(range(256)) * 400 + TEXT.encode())  # 61% control characters or invalid UTF-8
    files = [str(good), str(empty), str(binary)]
    pretraining.register_text_files_task("reliability_c_binary", files, vocabulary=_bytes())
    size = os.path.getsize(binary)
    with pytest.raises(ValueError, match=f"^{binary} is binary, not text: at least 62,400 of its {size:,} bytes"):
        first_batch("reliability_c_binary")
    pretraining.register_text_files_task("reliability_c_text", [str(good), str(empty)], vocabulary=_bytes())
    assert first_batch("reliability_c_text")["encoder_input_tokens"].any()


def test_invalid_utf8_warns_with_the_count_of_undecodable_bytes_and_trains(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes(TEXT.encode() + "Caf\xe9 cr\xe8me, na\xefve.\n".encode("latin-1") * 10 + b"\xff\xfe\n")
    pretraining.register_text_files_task("reliability_c_latin1", str(path), vocabulary=_bytes())
    size = os.path.getsize(path)
    with pytest.warns(UserWarning, match=f"^{path}: 32 of its {size:,} bytes are not valid UTF-8; .* convert"):
        assert first_batch("reliability_c_latin1")["encoder_input_tokens"].any()


def test_characters_across_read_blocks_are_not_counted_as_undecodable(tmp_path):
    path = tmp_path / "long.txt"
    path.write_bytes(b"a" * (text_files.READ_BLOCK_BYTES - 1) + "\u00e9\u4e2d\n".encode() * 3)  # 'é' straddles blocks
    scan = text_files.scan_text_file(str(path))
    assert (scan.undecodable_bytes, scan.control_bytes, scan.has_text, scan.is_binary) == (0, 0, True, False)


def _bytes():
    return vocabularies.byte_vocabulary()
