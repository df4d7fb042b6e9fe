"""UniLM: each mask by hand, the model reading under it, the objective's rows, the mixture's rates, the
per-mask evaluation loss, and (slow) the demo run writing one loss per mask."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio
from cli_runs import train_from_cli
from flax import linen as nn

from ptmjax.families.model_api import model_api
from ptmjax.families.token_loss import LossConfig
from ptmjax.models import BertConfig, UniLM
from ptmjax.models.unilm import UNILM_MASKS, unified_lm_mask

CONFIG = BertConfig(vocab_size=2176, d_model=16, num_heads=2, num_layers=2, d_ff=32, max_length=32, nsp_head=False,
                    dropout_rate=0.0, attention_dropout_rate=0.0)
TOKENS = np.array([[5, 6, 7, 8, 9, 0]], np.int32)  # five tokens and one pad
TYPES = np.array([[0, 0, 1, 1, 1, 0]], np.int32)  # seq2seq: source 5 6, target 7 8 9
# Rows are queries, columns keys; '1' may attend.
HAND_CHECKED = {
    "bidirectional": ["111110", "111110", "111110", "111110", "111110", "000000"],
    "left_to_right": ["100000", "110000", "111000", "111100", "111110", "000000"],
    "right_to_left": ["111110", "011110", "001110", "000110", "000010", "000000"],
    "sequence_to_sequence": ["110000", "110000", "111000", "111100", "111110", "000000"],
}


@pytest.mark.parametrize("mask", UNILM_MASKS)
def test_each_mask_by_hand(mask):
    kind = np.full_like(TOKENS, UNILM_MASKS.index(mask))
    got = np.asarray(unified_lm_mask(jnp.asarray(TOKENS), jnp.asarray(TYPES), jnp.asarray(kind)))[0, 0]
    want = np.array([[c == "1" for c in row] for row in HAND_CHECKED[mask]])
    np.testing.assert_array_equal(got, want)


def test_rows_of_different_masks_in_one_batch():
    tokens, types = np.repeat(TOKENS, 4, 0), np.repeat(TYPES, 4, 0)
    kinds = np.repeat(np.arange(4, dtype=np.int32)[:, None], TOKENS.shape[1], 1)
    got = np.asarray(unified_lm_mask(jnp.asarray(tokens), jnp.asarray(types), jnp.asarray(kinds)))[:, 0]
    for row, mask in enumerate(UNILM_MASKS):
        np.testing.assert_array_equal(got[row], [[c == "1" for c in r] for r in HAND_CHECKED[mask]], err_msg=mask)


@pytest.fixture(scope="module")
def model_and_params():
    model = UniLM(CONFIG)
    return model, nn.unbox(model_api(model).init(jax.random.key(0)))


@pytest.mark.parametrize("mask", UNILM_MASKS)
def test_the_model_reads_only_what_its_mask_allows(model_and_params, mask):
    """Changing token j changes the logits at query i exactly when the mask lets i see j (through any layer:
    the masks here are transitive, so one layer's reach is the whole stack's)."""
    model, params = model_and_params
    kind = np.full_like(TOKENS, UNILM_MASKS.index(mask))

    def logits(tokens):
        return np.asarray(model.apply({"params": params}, tokens, TYPES, kind).mlm_logits)[0, :5]

    base = logits(TOKENS)
    for j in range(5):
        changed = TOKENS.copy()
        changed[0, j] = 30
        moved = np.abs(logits(changed) - base).max(axis=-1) > 1e-6  # per query
        sees = np.array([row[j] == "1" for row in HAND_CHECKED[mask][:5]])
        np.testing.assert_array_equal(moved, sees, err_msg=f"{mask}: token {j}")


def test_without_mask_kinds_the_model_is_bidirectional_bert(model_and_params):
    from ptmjax.models import Bert

    model, params = model_and_params
    got = model.apply({"params": params}, TOKENS).mlm_logits
    want = Bert(CONFIG).apply({"params": params}, TOKENS).mlm_logits
    np.testing.assert_allclose(got, want, atol=1e-6)
    with pytest.raises(ValueError, match="nsp_head = False"):
        model_api(UniLM(BertConfig(vocab_size=40, d_model=16, num_heads=2, num_layers=1, d_ff=32))).init(
            jax.random.key(0))


LENGTHS = {"inputs": 32, "targets": 32}


def rows(name: str, split: str, count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    from ptmjax.tasks import unilm  # noqa: F401  (registers the tasks)

    dataset = seqio.get_mixture_or_task(name).get_dataset(LENGTHS, split=split, shuffle=True, seed=seed,
                                                          num_epochs=None)
    return list(dataset.take(count).as_numpy_iterator())


@pytest.mark.parametrize("mask", UNILM_MASKS)
def test_each_task_marks_its_rows(mask):
    from ptmjax.tasks import unilm

    splits = []
    for row in rows(unilm.task_name(mask), "validation", 40):
        n = len(row["inputs"])
        assert row["lm_mask_kind"].tolist() == [UNILM_MASKS.index(mask)] * n
        assert len(row["token_type_ids"]) == len(row["loss_mask"]) == n and row["loss_mask"].sum() > 0
        if mask == "sequence_to_sequence":  # 0^k 1^(n-k), 1 <= k <= n-1: both segments non-empty
            k = int(np.sum(row["token_type_ids"] == 0))
            assert 1 <= k <= n - 1 and row["token_type_ids"].tolist() == [0] * k + [1] * (n - k)
            splits.append(k)
        else:
            assert not row["token_type_ids"].any()
    assert mask != "sequence_to_sequence" or len(set(splits)) > 10, splits


def test_the_mixture_draws_each_mask_at_its_rate():
    from ptmjax.tasks import unilm

    n = 3000
    kinds = np.array([row["lm_mask_kind"][0] for row in rows(unilm.UNILM_MIXTURE, "train", n, seed=1)])
    for index, mask in enumerate(UNILM_MASKS):
        rate, observed = unilm.UNILM_RATES[mask], np.mean(kinds == index)
        standard_error = math.sqrt(rate * (1 - rate) / n)  # binomial; 4 of them: a false alarm in 1 of 16,000
        assert abs(observed - rate) < 4 * standard_error, (mask, observed, rate, standard_error)


def test_per_mask_evaluation_loss_is_the_mask_rows_masked_lm_loss(model_and_params):
    """The task's metric of its scores and masked-token counts equals the family loss (no z-loss) of its rows."""
    from ptmjax.data import pipeline
    from ptmjax.families.registry import family_of
    from ptmjax.tasks import unilm

    model, params = model_and_params
    api = model_api(model)
    task = unilm.task_name("right_to_left")
    dataset = pipeline.get_dataset(task, "validation", LENGTHS, 8, seed=0, shuffle=False, pack=False,
                                   feature_converter=family_of(model).feature_converter)
    batch = {k: jnp.asarray(v) for k, v in next(dataset.as_numpy_iterator()).items()}
    scores = api.score(params, batch)
    counts = [unilm.masked_token_count("text", {"loss_mask": np.asarray(m)}, is_target=True)
              for m in batch["loss_mask"]]
    metric = unilm.masked_token_loss(counts, np.asarray(scores).tolist())["loss"]
    _, _, stats = api.loss(params, batch, LossConfig(z_loss=0.0))
    np.testing.assert_allclose(metric, float(stats.metrics()["loss"]), rtol=1e-5)


@pytest.mark.slow  # a gin training run from the CLI
def test_unilm_demo_trains_and_writes_one_loss_per_mask(tmp_path):
    from ptmjax.tasks import unilm

    records = train_from_cli("runs/unilm_demo.gin", tmp_path, 4, "train.inference_eval_examples = 16")
    assert all(math.isfinite(r["loss"]) for r in records if "loss" in r)
    per_mask = {mask: [r[f"eval_{unilm.task_name(mask)}/loss"] for r in records
                       if f"eval_{unilm.task_name(mask)}/loss" in r] for mask in UNILM_MASKS}
    assert all(len(values) == 1 and math.isfinite(values[0]) for values in per_mask.values()), per_mask
