"""The parameter-efficient methods and their parameter patterns from gin, as run files bind them."""

from __future__ import annotations

import gin
import pytest
from lora_test_models import GPT2_TINY

import ptmjax.configurables  # noqa: F401  (registers everything gin binds)
from ptmjax.adapt.adapters import ADAPTER_PARAMS, AdapterSettings
from ptmjax.adapt.p_tuning import PTuningSettings
from ptmjax.adapt.prefix_tuning import PREFIX_PARAMS, PrefixSettings
from ptmjax.adapt.prompt_tuning import PROMPT_PARAMS, PromptSettings
from ptmjax.models import GPT2

TINY = [f"GPT2Config.{name} = {getattr(GPT2_TINY, name)!r}"
        for name in ("vocab_size", "d_model", "num_heads", "num_layers", "d_ff", "max_length")]


@pytest.mark.parametrize(("method", "bindings", "field", "settings"), [
    ("adapters", ["placement = 'pfeiffer'", "bottleneck = 8"], "adapters", AdapterSettings("pfeiffer", 8)),
    ("prompt_tuning", ["length = 5", "init = 'uniform'"], "prompt_tuning", PromptSettings(5, "uniform")),
    ("p_tuning", ["length = 5", "hidden = 16"], "p_tuning", PTuningSettings(5, "vocab", 16)),
    ("prefix_tuning", ["length = 4", "hidden = None"], "prefix_tuning", PrefixSettings(4, None)),
])
def test_each_method_is_configurable_and_so_are_the_patterns(method, bindings, field, settings):
    gin.clear_config()
    try:
        gin.parse_config([
            f"{method}.model = @GPT2()", "GPT2.config = @GPT2Config()", *TINY,
            *(f"{method}.{binding}" for binding in bindings),
        ])
        model = gin.get_configurable(f"ptmjax.adapt.{method}")()
        patterns = [gin.config.parse_value(f"%ptmjax.adapt.{name}_PARAMS").scoped_configurable_fn()
                    for name in ("ADAPTER", "PROMPT", "PREFIX")]
    finally:
        gin.clear_config()
    assert isinstance(model, GPT2) and model.config.d_model == GPT2_TINY.d_model
    assert getattr(model, field) == settings
    assert patterns == [ADAPTER_PARAMS, PROMPT_PARAMS, PREFIX_PARAMS]
