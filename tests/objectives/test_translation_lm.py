"""XLM translation LM: the [src </s> tgt </s>] layout, positions, language ids, cutting, masking rates, seeds."""

import numpy as np
import pytest
import seqio
import tensorflow as tf
from objective_helpers import MASK_ID, features, random_examples

from ptmjax.objectives import masked_lm
from ptmjax.objectives import translation_lm as tlm

LENGTH = 64
KEYS = {"inputs", "targets", "loss_mask", "positions", "language_ids"}


@pytest.fixture(scope="module")
def pairs() -> list[tuple[np.ndarray, np.ndarray]]:
    sources, targets = random_examples(400, 1, 50, seed=3), random_examples(400, 1, 50, seed=4)
    return list(zip(sources, targets, strict=True))


def translate(pairs, seed: int = 1, keys=("inputs", "targets"), **options) -> list[dict[str, list[int]]]:
    options = tlm.TranslationLMOptions(**options)
    dataset = tf.data.Dataset.from_generator(
        lambda: ({keys[0]: s, keys[1]: t} for s, t in pairs),
        output_signature={key: tf.TensorSpec([None], tf.int32) for key in keys},
    )
    with seqio.utils.map_seed_manager(seed):
        out = tlm.translation_lm(dataset, {"inputs": LENGTH}, features(), options)
    return [{k: v.tolist() for k, v in x.items()} for x in out.as_numpy_iterator()]


@pytest.fixture(scope="module")
def translated(pairs) -> list[dict[str, list[int]]]:
    return translate(pairs)


def kept_lengths(source: int, target: int, budget: int = LENGTH - 2) -> tuple[int, int]:
    """Independent rule: cut the longer side down to its half, then the other to what is left."""
    if source + target <= budget:
        return source, target
    half = budget // 2
    if source <= half:
        return source, budget - source
    if target <= budget - half:
        return budget - target, target
    return half, budget - half


def test_layout_positions_and_language_ids(pairs, translated):
    cut = 0
    for (source, target), x in zip(pairs, translated, strict=True):
        assert set(x) == KEYS and len({len(v) for v in x.values()}) == 1 and len(x["targets"]) <= LENGTH
        s, t = kept_lengths(len(source), len(target))
        cut += (s, t) != (len(source), len(target))
        assert x["targets"] == source[:s].tolist() + [1] + target[:t].tolist() + [1]
        assert x["positions"] == list(range(s + 1)) + list(range(t + 1))
        assert x["language_ids"] == [0] * (s + 1) + [1] * (t + 1)
    assert cut > 50  # the cutting rule was exercised


def test_dtypes(pairs):
    dataset = tf.data.Dataset.from_tensors({"inputs": pairs[0][0], "targets": pairs[0][1]})
    out = tlm.translation_lm(dataset, {"inputs": LENGTH}, features())
    assert set(out.element_spec) == KEYS
    assert all(spec.dtype == tf.int32 and spec.shape.rank == 1 for spec in out.element_spec.values())


def test_masking_rates_over_both_halves(translated):
    selected = eligible = masked = unchanged = 0
    half_rates = {0: [0, 0], 1: [0, 0]}  # language -> [selected, eligible]
    for x in translated:
        inputs, targets, loss = map(np.array, (x["inputs"], x["targets"], x["loss_mask"]))
        is_token = targets > 1
        assert not loss[~is_token].any(), "</s> is never selected"
        assert (inputs[loss == 0] == targets[loss == 0]).all()
        assert loss.sum() == max(1, round(0.15 * is_token.sum()))
        selected, eligible = selected + loss.sum(), eligible + is_token.sum()
        masked += (inputs[loss == 1] == MASK_ID).sum()
        unchanged += (inputs[loss == 1] == targets[loss == 1]).sum()
        for language in (0, 1):
            on = np.array(x["language_ids"]) == language
            half_rates[language][0] += loss[on].sum()
            half_rates[language][1] += is_token[on].sum()
    assert abs(selected / eligible - 0.15) < 0.01, selected / eligible
    assert abs(masked / selected - 0.8) < 0.04, masked / selected
    assert abs(unchanged / selected - 0.1) < 0.03, unchanged / selected  # random ids rarely equal the original
    for language, (chosen, total) in half_rates.items():
        assert abs(chosen / total - 0.15) < 0.02, (language, chosen / total)


def test_named_features_and_language_ids(pairs):
    names = {"source_key": "en", "target_key": "fr", "source_language_id": 3, "target_language_id": 7}
    for (source, target), x in zip(pairs[:5], translate(pairs[:5], keys=("en", "fr"), **names), strict=True):
        s, t = kept_lengths(len(source), len(target))
        assert x["language_ids"] == [3] * (s + 1) + [7] * (t + 1)


def test_deterministic_per_seed(pairs, translated):
    assert translate(pairs[:30]) == translated[:30]
    assert translate(pairs[:30], seed=2) != translated[:30]


def test_bad_arguments_are_named(pairs):
    with pytest.raises(ValueError, match=r"lack \['fr'\]"):
        translate(pairs[:1], target_key="fr")
    with pytest.raises(ValueError, match="both 'inputs'"):
        translate(pairs[:1], target_key="inputs")
    with pytest.raises(ValueError, match="mask_rate \\+ random_rate"):
        translate(pairs[:1], rates=masked_lm.MaskingRates(mask_rate=0.95))
    dataset = tf.data.Dataset.from_tensors({"inputs": pairs[0][0], "targets": pairs[0][1]})
    with pytest.raises(ValueError, match="inputs length 3"):
        tlm.translation_lm(dataset, {"inputs": 3}, features())
