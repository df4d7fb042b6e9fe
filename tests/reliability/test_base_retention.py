"""A run that saves only what it trains keeps the base step it reads out of the base's checkpoint rotation, so
training the base further never breaks it (was: the base's retention deleted that step and the dependant no
longer loaded); a base it cannot write gets a warning, and a step gone anyway is named with the way back."""

import json
import shutil

import numpy as np
import pytest
from reliability_helpers_b import CONFIG, run

from ptmjax.families.model_api import model_api
from ptmjax.models import EncoderDecoder
from ptmjax.storage.model_dir import ModelDir
from ptmjax.tree_paths import leaves_by_path

DECODER = ("decoder/.*",)


def params_of(model_dir) -> dict[str, np.ndarray]:
    return dict(leaves_by_path(ModelDir(str(model_dir)).read_params(model_api(EncoderDecoder(CONFIG)).abstract_params)))


@pytest.mark.slow
def test_training_the_base_further_keeps_the_step_a_dependant_reads(tmp_path, capsys):
    base, lora = tmp_path / "base", tmp_path / "dependant"
    run(base, num_steps=4, keep_checkpoints=1)
    run(lora, num_steps=2, init_checkpoint=str(base), trainable=DECODER)
    assert f"Step 4 of {base} is kept out of its checkpoint rotation for this run" in capsys.readouterr().out
    assert json.loads((base / "dependants.json").read_text()) == [{"model_dir": str(lora), "step": 4}]
    before = params_of(lora)

    run(base, num_steps=8, keep_checkpoints=1)

    assert ModelDir(str(base)).saved_steps() == [4, 8]  # keep_checkpoints=1 alone would have left [8]
    after = params_of(lora)
    assert after.keys() == before.keys()
    for path, value in before.items():
        np.testing.assert_array_equal(after[path], value, err_msg=path)


def test_a_base_that_cannot_be_written_gets_a_warning_naming_what_to_keep(tmp_path, mount):
    base, lora = tmp_path / "base", tmp_path / "dependant"
    run(base, num_steps=2)
    mount(base, "bind")
    with pytest.warns(UserWarning, match=rf"^could not mark step 2 of {base} as kept for {lora} \(Read-only file "
                                         rf"system\): training {base} further may delete it, .* keep a copy of "
                                         rf"{base}/checkpoints/2"):
        run(lora, num_steps=2, init_checkpoint=str(base), trainable=DECODER)
    assert params_of(lora).keys() == params_of(base).keys()


@pytest.mark.slow
def test_a_base_step_gone_anyway_is_named_with_the_way_back(tmp_path):
    base, lora = tmp_path / "base", tmp_path / "dependant"
    run(base, num_steps=4)
    run(lora, num_steps=2, init_checkpoint=str(base), trainable=DECODER)
    shutil.rmtree(base / "checkpoints" / "4")
    with pytest.raises(FileNotFoundError, match=(
        rf"^{lora} takes the parameters it does not save from {base} \(step 4, its base.json\), which is gone "
        rf"\(no checkpoint for step 4 under {base}/checkpoints; saved steps: \[2\]\); put it back, or point "
        rf"{lora}/base.json at a copy of it"
    )):
        params_of(lora)
