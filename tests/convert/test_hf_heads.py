"""Each converter declares its Hugging Face classes (`HEADS`), and `convert/hf.py` finds every one of them."""

import importlib
import pathlib

from ptmjax.convert import hf
from ptmjax.families.registry import MODEL_CLASSES

CONVERT = pathlib.Path(hf.__file__).parent


def test_every_converter_module_is_found_with_its_heads():
    declared = {}
    for path in sorted(CONVERT.glob("hf_*.py")):
        module = importlib.import_module(f"ptmjax.convert.{path.stem}")
        declared.update({model_type: module for model_type in getattr(module, "HEADS", {})})
    assert {model_type: module for model_type, (module, _) in hf.FAMILIES.items()} == declared
    assert sorted(declared) == ["albert", "bart", "bert", "electra", "gpt2", "longt5", "mbart", "mpnet", "mt5",
                                "roberta", "t5", "xlm-roberta"]


def test_every_converted_class_is_a_registered_model_class():
    converted = {head.model_class for _, heads in hf.FAMILIES.values() for head in heads.values()}
    assert converted <= set(MODEL_CLASSES), sorted(c.__name__ for c in converted - set(MODEL_CLASSES))
