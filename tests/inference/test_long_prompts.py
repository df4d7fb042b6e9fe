"""An input longer than a model takes (an encoder-decoder run's trained inputs length, its tokenizer's
model_max_length, or `max_input_length`) is refused before it reaches the model, or cut to its first ids with a
warning when the user asks (`truncate=True`, `ptmjax infer --truncate_inputs`), and the cut input decodes as the
same ids given cut. (Was: a 10,000-token prompt to T5 was bucketed to 16,384 and XLA tried to allocate 69 GB.)"""

import dataclasses
import json
import re

import pytest

from ptmjax import cli
from ptmjax.inference.loading import input_limit

LONG = "x = 1\n" * 2000  # 12,000 bytes: 12,001 ids of the run's byte vocabulary with EOS
TRAINED = "the inputs length it trained on, train.task_feature_lengths['inputs']"


def test_a_run_takes_the_inputs_length_it_trained_on(t5_model):
    assert (t5_model.max_input_length, t5_model.max_input_length_source) == (32, TRAINED)


def test_a_longer_input_is_refused_naming_it_and_the_ways_out(t5_model):
    with pytest.raises(ValueError, match="^" + re.escape(
        f"input 2 of 2 has 12001 tokens, more than the 32 this model takes ({TRAINED}); shorten it, pass "
        "truncate=True (ptmjax infer --truncate_inputs) to keep the first 32 tokens of each longer input, or load "
        "it with max_input_length=N (--max_input_length N)"
    )):
        t5_model.generate(["def f(x):", LONG], max_decode_length=4)
    with pytest.raises(ValueError, match="^input 1 of 1 has 12001 tokens"):
        t5_model.score([LONG], ["y"])


def test_truncate_cuts_to_the_first_ids_with_a_warning_and_decodes_as_the_cut_ids(t5_model):
    eos = t5_model.vocabulary.eos_id
    short, ids = (t5_model.vocabulary.encode(text) + [eos] for text in ("def f(x):", LONG))
    with pytest.warns(UserWarning, match=re.escape(
        f"1 of 2 inputs had more than 32 tokens ({TRAINED}; the longest 12001) and were cut to their first 32"
    )):
        cut = t5_model.predict(["def f(x):", LONG], max_decode_length=4, truncate=True)
    want = t5_model.predict([short, ids[:32]], max_decode_length=4)
    assert [p.tokens for p in cut] == [p.tokens for p in want]
    assert [p.scores for p in cut] == [p.scores for p in want]


def test_max_input_length_raises_the_limit(t5_model):
    model = dataclasses.replace(t5_model, max_input_length=64, max_input_length_source="max_input_length")
    assert len(model.generate(["y" * 60], max_decode_length=2)) == 1
    with pytest.raises(ValueError, match=r"^input 1 of 1 has 66 tokens, more than the 64 this model takes "
                                         r"\(max_input_length\)"):
        model.generate(["y" * 65], max_decode_length=2)


def test_ptmjax_infer_refuses_or_truncates_as_asked(t5_run, tmp_path, capsys):
    (tmp_path / "prompts.txt").write_text("def f(x):\n" + LONG.replace("\n", " ") + "\n")
    args = ["infer", "--model_dir", t5_run, "--input_file", str(tmp_path / "prompts.txt"), "--max_decode_length=4",
            "--output", str(tmp_path / "out.jsonl")]
    assert cli.main(args) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "error: input 2 of 2 has 12001 tokens, more than the 32" in error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prompts.txt"]  # no output, no temporary file
    with pytest.warns(UserWarning, match="1 of 2 inputs had more than 32 tokens"):
        assert cli.main([*args, "--truncate_inputs"]) == 0
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize("config,want", [
    ({"model_max_length": 512}, (512, "its tokenizer's model_max_length")),
    ({"model_max_length": int(1e30)}, (None, "")),  # what transformers writes for a tokenizer without a length
    ({}, (None, "")),
])
def test_an_import_takes_its_tokenizers_model_max_length(t5_model, tmp_path, config, want):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    imported = dataclasses.replace(t5_model, task_feature_lengths=None)
    assert input_limit(imported, str(tmp_path)) == want
