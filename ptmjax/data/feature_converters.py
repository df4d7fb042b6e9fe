"""seqio feature converters for encoder-only pre-training (BERT, RoBERTa, ALBERT, ELECTRA).

seqio's own EncoderFeatureConverter takes the loss only where the input is
the mask id; BERT also predicts the 10% of selected tokens that were replaced
by a random id or kept. These converters carry the objective's 'loss_mask'
instead (ptmjax.objectives.masked_lm and sentence_pairs produce it).

Task features (all int32, of the length of 'inputs'):
  inputs, targets, loss_mask; with sentence pairs also token_type_ids and a
  scalar sentence_label (0 = the pair is in order / B follows A, 1 = not).
Model features:
  input_tokens, target_tokens, loss_mask [b, length]; with sentence pairs
  also token_type_ids [b, length] and sentence_label [b].
Permuted LM (XLNet) adds 'permutation_rank' [b, length] to the masked-LM fields.
UniLM adds 'token_type_ids' and its attention masks' kinds 'lm_mask_kind' [b, length].
XLM's translation LM (and its masked-LM streams) adds 'positions' and 'language_ids' [b, length].
SpanBERT's span boundary objective adds 'span_left', 'span_right', 'span_position' [b, length].
Rows are padded with 0, never packed: a row is one example (and one pair).
"""

from __future__ import annotations

from collections.abc import Mapping

import seqio
import tensorflow as tf

Spec = seqio.FeatureConverter.FeatureSpec


class MaskedLmFeatureConverter(seqio.FeatureConverter):
    """'inputs', 'targets', 'loss_mask' -> 'input_tokens', 'target_tokens', 'loss_mask' (padded, unpacked)."""

    TASK_FEATURES = {"inputs": Spec(dtype=tf.int32), "targets": Spec(dtype=tf.int32)}
    MODEL_FEATURES = {
        "input_tokens": Spec(dtype=tf.int32),
        "target_tokens": Spec(dtype=tf.int32),
        "loss_mask": Spec(dtype=tf.int32),
    }
    PACKING_FEATURE_DTYPES = {}
    # Task features beyond TASK_FEATURES (seqio validates only those) -> their model names.
    EXTRA_SEQUENCE_FEATURES = {"loss_mask": "loss_mask"}
    EXTRA_SCALAR_FEATURES: dict[str, str] = {}

    def __init__(self, pack: bool = False, **kwargs):
        if pack:
            raise ValueError(
                f"{type(self).__name__} does not pack: an encoder-only row is one example (and one sentence "
                "pair); set `train.pack = False`"
            )
        super().__init__(pack=False, **kwargs)

    def _convert_features(self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
        length = task_feature_lengths["inputs"]
        if task_feature_lengths["targets"] != length:
            raise ValueError(
                f"masked LM inputs and targets are aligned: task_feature_lengths {dict(task_feature_lengths)} "
                f"must give 'targets' the length of 'inputs' ({length})"
            )
        sequences = {"inputs": "input_tokens", "targets": "target_tokens", **self.EXTRA_SEQUENCE_FEATURES}
        scalars = self.EXTRA_SCALAR_FEATURES
        missing = sorted(set(sequences) - set(ds.element_spec)) + sorted(set(scalars) - set(ds.element_spec))
        if missing:
            raise ValueError(
                f"{type(self).__name__} needs task features {missing}, which the task does not produce "
                f"(it gives {sorted(ds.element_spec)}); use a masked-LM objective such as "
                "ptmjax.objectives.masked_lm.bert_mlm or sentence_pairs.sentence_pair_mlm"
            )
        ds = seqio.utils.trim_and_pad_dataset(ds, {name: length for name in sequences})

        def convert(features: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
            out = {model: tf.cast(features[task], tf.int32) for task, model in sequences.items()}
            out.update({model: tf.cast(features[task], tf.int32) for task, model in scalars.items()})
            return out

        return ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE)

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        length = task_feature_lengths["inputs"]
        lengths = {name: length for name in self.MODEL_FEATURES}
        lengths.update({name: 1 for name in self.EXTRA_SCALAR_FEATURES.values()})  # rank 0: not checked
        return lengths


class SentencePairFeatureConverter(MaskedLmFeatureConverter):
    """Masked LM plus the sentence-pair fields of NSP / SOP: 'token_type_ids' and 'sentence_label'."""

    MODEL_FEATURES = {
        **MaskedLmFeatureConverter.MODEL_FEATURES,
        "token_type_ids": Spec(dtype=tf.int32),
        "sentence_label": Spec(dtype=tf.int32, rank=0),
    }
    EXTRA_SEQUENCE_FEATURES = {"loss_mask": "loss_mask", "token_type_ids": "token_type_ids"}
    EXTRA_SCALAR_FEATURES = {"sentence_label": "sentence_label"}


class PermutedLmFeatureConverter(MaskedLmFeatureConverter):
    """Permuted LM (XLNet): masked-LM fields plus the factorisation order 'permutation_rank' [b, length]."""

    MODEL_FEATURES = {**MaskedLmFeatureConverter.MODEL_FEATURES, "permutation_rank": Spec(dtype=tf.int32)}
    EXTRA_SEQUENCE_FEATURES = {"loss_mask": "loss_mask", "permutation_rank": "permutation_rank"}


class TranslationLmFeatureConverter(MaskedLmFeatureConverter):
    """Masked LM plus XLM's 'positions' (restarting at the second language of a pair) and 'language_ids'
    [b, length] (ptmjax/objectives/translation_lm.py); padding is 0 in both, as in every other field."""

    MODEL_FEATURES = {
        **MaskedLmFeatureConverter.MODEL_FEATURES,
        **{name: Spec(dtype=tf.int32) for name in ("positions", "language_ids")},
    }
    EXTRA_SEQUENCE_FEATURES = {name: name for name in ("loss_mask", "positions", "language_ids")}


class SpanBoundaryFeatureConverter(MaskedLmFeatureConverter):
    """Masked LM plus SpanBERT's boundary features (ptmjax/objectives/span_boundaries.py), each [b, length]."""

    MODEL_FEATURES = {
        **MaskedLmFeatureConverter.MODEL_FEATURES,
        **{name: Spec(dtype=tf.int32) for name in ("span_left", "span_right", "span_position")},
    }
    EXTRA_SEQUENCE_FEATURES = {name: name for name in ("loss_mask", "span_left", "span_right", "span_position")}


class UnifiedLmFeatureConverter(MaskedLmFeatureConverter):
    """Masked LM plus UniLM's 'token_type_ids' (the seq2seq target is 1) and 'lm_mask_kind' (each position's
    attention mask: ptmjax/objectives/unilm.py), each [b, length]."""

    MODEL_FEATURES = {
        **MaskedLmFeatureConverter.MODEL_FEATURES,
        **{name: Spec(dtype=tf.int32) for name in ("token_type_ids", "lm_mask_kind")},
    }
    EXTRA_SEQUENCE_FEATURES = {name: name for name in ("loss_mask", "token_type_ids", "lm_mask_kind")}

    def __call__(self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
        """seqio's Evaluator gives a length for each of the task's output features (ptmjax/tasks/unilm.py declares
        these, so that a mixture keeps them); they follow 'inputs', so only the lengths seqio checks are kept."""
        return super().__call__(ds, {k: v for k, v in task_feature_lengths.items() if k in self.TASK_FEATURES})
