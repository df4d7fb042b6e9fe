"""The pre-training and fine-tuning loss of each model family, as sums that add over microbatches and batches.

A family's loss turns the model's outputs and the batch into `LossTerms`:
- `token_loss`: a loss summed over the batch's weighted target tokens; the
  train step divides it by the number of such tokens in the whole (global,
  accumulated) batch;
- `batch_loss`: a loss that is already a mean over this batch (next-sentence
  prediction over rows, ELECTRA's discriminator over all real tokens); the
  train step adds it once per batch;
- `stats`: metric sums and their counts, for logging. A family without a
  per-batch loss has no 'batch_loss' metric (it would always be 0); whether it
  has one is known when the loss is traced, from the model (e.g. BERT with or
  without its sentence-pair head), not from values.
The fine-tuning heads (classification, regression, span QA) weigh whole
examples ('example_weight'): their "tokens" are examples, so the optimised
value is the mean per-example loss.

The 'accuracy' metric (and 'eval_accuracy') is teacher-forced token
accuracy: the share of weighted target tokens that are the argmax of their
logits, each predicted from the true context (a decoder: the true tokens
before it), not the accuracy of generated text. The 'loss' metric is the
whole objective as optimised: the token loss per token plus the mean over
microbatches (and eval batches) of the batch loss.
Rows that are all padding (ptmjax's pipelines pad with id 0, e.g. the last
evaluation batch) count for nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp

from ptmjax.families.chunked_logits import chunked_token_cross_entropy
from ptmjax.families.token_loss import LossConfig, argmax_hits, token_cross_entropy
from ptmjax.layers import precision

Array = jax.Array
Batch = Mapping[str, Array]


@flax.struct.dataclass
class Stats:
    """Metric sums and their counts; metric = sum / count. Adds over microbatches and eval batches."""

    sums: dict[str, Array]
    counts: dict[str, Array]

    @classmethod
    def of(cls, **sums_and_counts: tuple[Array, Array]) -> Stats:
        """Stats.of(name=(sum, count), ...)."""
        return cls(
            sums={k: jnp.asarray(s, jnp.float32) for k, (s, _) in sums_and_counts.items()},
            counts={k: jnp.asarray(c, jnp.float32) for k, (_, c) in sums_and_counts.items()},
        )

    def __add__(self, other: Stats) -> Stats:
        return jax.tree.map(jnp.add, self, other)

    def merge(self, other: Stats) -> Stats:
        """The metrics of both (names must differ)."""
        clash = set(self.sums) & set(other.sums)
        if clash:
            raise ValueError(f"metric names {sorted(clash)} are given twice")
        return Stats({**self.sums, **other.sums}, {**self.counts, **other.counts})

    def metrics(self) -> dict[str, Array]:
        """Each metric's sum / count; 'loss' = token_loss + batch_loss (if any); 'num_tokens' = the weighted
        target tokens; every mean NLL '<name>_nll' also as '<name>_perplexity' (its exp)."""
        out = {k: self.sums[k] / jnp.maximum(self.counts[k], 1.0) for k in self.sums}
        out.update({f"{k[: -len('_nll')]}_perplexity": jnp.exp(out[k]) for k in self.sums if k.endswith("_nll")})
        out["loss"] = out["token_loss"] + out.get("batch_loss", 0.0)
        out["num_tokens"] = self.counts["token_loss"]
        return out


class LossTerms(NamedTuple):
    """A family loss's result (see the module docstring)."""

    token_loss: Array
    batch_loss: Array
    stats: Stats


def loss_terms(
    logits: Array, targets: Array, weights: Array, loss_config: LossConfig,
    batch_loss: Array | None = None, **extra_stats: tuple[Array, Array],
) -> LossTerms:
    """Token cross-entropy of logits [b, t, V] against targets [b, t] under weights [b, t],
    with an optional per-batch loss and further (sum, count) metrics.
    """
    loss, z = token_cross_entropy(logits, targets, loss_config.z_loss, loss_config.label_smoothing)
    correct = argmax_hits(logits, targets)
    return weighted_terms(loss, z, correct, weights, batch_loss, **extra_stats)


def weighted_terms(
    loss: Array, z: Array, correct: Array, weights: Array, batch_loss: Array | None = None,
    **extra_stats: tuple[Array, Array],
) -> LossTerms:
    """Per-token loss, z-loss term and argmax hits [b, t] summed under weights [b, t] (see `loss_terms`)."""
    weights = weights.astype(jnp.float32)
    token_loss, tokens = jnp.sum(loss * weights), jnp.sum(weights)
    if batch_loss is not None:
        extra_stats["batch_loss"] = (batch_loss, 1.0)
    stats = Stats.of(
        token_loss=(token_loss, tokens), z_loss=(jnp.sum(z * weights), tokens),
        accuracy=(jnp.sum(correct * weights), tokens), **extra_stats,
    )
    return LossTerms(token_loss, jnp.zeros((), jnp.float32) if batch_loss is None else batch_loss, stats)


def real_rows(tokens: Array) -> Array:
    """bool [b]: rows with any non-padding (non-zero) token."""
    return jnp.any(tokens != 0, axis=1)


def sequence_to_sequence_loss(logits: Array, batch: Batch, loss_config: LossConfig) -> LossTerms:
    """Decoder logits against 'decoder_target_tokens' under 'decoder_loss_weights' (T5, BART, GPT-2)."""
    return loss_terms(logits, batch["decoder_target_tokens"], batch["decoder_loss_weights"], loss_config)


def chunked_sequence_to_sequence_loss(
    logits_fn: Callable[[Array], Array], hidden: Array, batch: Batch, loss_config: LossConfig
) -> LossTerms:
    """`sequence_to_sequence_loss(logits_fn(hidden), ...)` with the logits made
    `loss_config.logits_chunk_size` positions at a time (ptmjax/families/chunked_logits.py)."""
    terms = chunked_token_cross_entropy(
        logits_fn, hidden, batch["decoder_target_tokens"], loss_config.logits_chunk_size, loss_config.z_loss,
        loss_config.label_smoothing,
    )
    return weighted_terms(*terms, batch["decoder_loss_weights"])


def masked_lm_loss(outputs: Any, batch: Batch, loss_config: LossConfig) -> LossTerms:
    """MLM on the 'loss_mask' positions, plus the sentence-pair loss (NSP / SOP) when the model has that head.

    outputs: `.mlm_logits` [b, s, V] and `.sentence_pair_logits` ([b, 2] or None);
    the batch gives 'target_tokens', 'loss_mask' and, with the head, 'sentence_label' [b].
    """
    mlm = (outputs.mlm_logits, batch["target_tokens"], batch["loss_mask"], loss_config)
    sentence_logits = outputs.sentence_pair_logits
    if sentence_logits is None:
        return loss_terms(*mlm)
    rows = real_rows(batch["input_tokens"]).astype(jnp.float32)
    labels = batch["sentence_label"]
    log_probs = jax.nn.log_softmax(sentence_logits.astype(jnp.float32))
    nll = -jnp.take_along_axis(log_probs, labels[:, None], axis=-1)[:, 0]
    num_rows = jnp.sum(rows)
    right = jnp.sum((jnp.argmax(sentence_logits, axis=-1) == labels) * rows)
    return loss_terms(
        *mlm, batch_loss=jnp.sum(nll * rows) / jnp.maximum(num_rows, 1.0),
        sentence_loss=(jnp.sum(nll * rows), num_rows), sentence_accuracy=(right, num_rows),
    )


def span_boundary_mlm_loss(outputs: Any, batch: Batch, loss_config: LossConfig) -> LossTerms:
    """SpanBERT: each 'loss_mask' token's MLM cross-entropy plus, where it has span boundaries, its span boundary
    objective's (the paper's L_MLM(x_i) + L_SBO(x_i)), divided by the number of MLM tokens as the MLM loss is.

    outputs: `.mlm_logits`, `.span_boundary_logits` [b, s, V] and `.span_boundary_weights` [b, s]
    (ptmjax/models/span_bert.py); the batch gives 'target_tokens' and 'loss_mask'. 'accuracy' stays the MLM's;
    'mlm_loss' is the MLM term alone, 'sbo_loss' and 'sbo_accuracy' are over the SBO's tokens.
    """
    targets, weights = batch["target_tokens"], batch["loss_mask"].astype(jnp.float32)
    z_loss, smoothing = loss_config.z_loss, loss_config.label_smoothing
    mlm, mlm_z = token_cross_entropy(outputs.mlm_logits, targets, z_loss, smoothing)
    sbo, sbo_z = token_cross_entropy(outputs.span_boundary_logits, targets, z_loss, smoothing)
    on_span = outputs.span_boundary_weights
    sbo_weights = weights * on_span
    sbo_tokens = jnp.sum(sbo_weights)
    sbo_hits = argmax_hits(outputs.span_boundary_logits, targets)
    return weighted_terms(
        mlm + sbo * on_span, mlm_z + sbo_z * on_span, argmax_hits(outputs.mlm_logits, targets), weights,
        mlm_loss=(jnp.sum(mlm * weights), jnp.sum(weights)), sbo_loss=(jnp.sum(sbo * sbo_weights), sbo_tokens),
        sbo_accuracy=(jnp.sum(sbo_hits * sbo_weights), sbo_tokens),
    )


def permuted_lm_loss(logits: Array, batch: Batch, loss_config: LossConfig) -> LossTerms:
    """XLNet: the query stream's logits against 'target_tokens' on the 'loss_mask' positions (the order's tail)."""
    return loss_terms(logits, batch["target_tokens"], batch["loss_mask"], loss_config)


def replaced_token_detection_loss(outputs: Any, batch: Batch, loss_config: LossConfig) -> LossTerms:
    """ELECTRA: the generator's MLM loss on 'loss_mask' positions (per token) plus
    `loss_config.discriminator_weight` times the discriminator's sigmoid cross-entropy,
    averaged over every real token of the batch.

    outputs: `.generator_logits` [b, s, V], `.discriminator_logits` [b, s], `.is_replaced` [b, s].
    """
    real = (batch["input_tokens"] != 0).astype(jnp.float32)
    num_real = jnp.sum(real)
    logits = outputs.discriminator_logits.astype(jnp.float32)
    labels = outputs.is_replaced.astype(jnp.float32)
    bce = jnp.maximum(logits, 0.0) - logits * labels + jnp.log1p(jnp.exp(-jnp.abs(logits)))
    right = jnp.sum(((logits > 0) == (labels > 0.5)) * real)
    return loss_terms(
        outputs.generator_logits, batch["target_tokens"], batch["loss_mask"], loss_config,
        batch_loss=loss_config.discriminator_weight * jnp.sum(bce * real) / jnp.maximum(num_real, 1.0),
        discriminator_loss=(jnp.sum(bce * real), num_real), discriminator_accuracy=(right, num_real),
        replaced_fraction=(jnp.sum(labels * real), num_real),
    )


def sequence_classification_loss(logits: Array, batch: Batch, loss_config: LossConfig) -> LossTerms:
    """Cross-entropy of logits [b, num_labels] against 'label' [b], summed over 'example_weight' [b].

    The train step divides by the summed weights, so the optimised value is the mean per-example loss
    (with LossConfig's z-loss and label smoothing, as every token loss); 'accuracy' is over examples.
    """
    return loss_terms(logits[:, None], batch["label"][:, None], batch["example_weight"][:, None], loss_config)


def sequence_regression_loss(scores: Array, batch: Batch, loss_config: LossConfig) -> LossTerms:
    """Squared error of scores [b, 1] against the float 'label' [b], summed over 'example_weight' [b] (HF's MSE)."""
    del loss_config  # no z-loss or smoothing for a regression
    weights = batch["example_weight"].astype(jnp.float32)
    error = jnp.square(scores[:, 0].astype(jnp.float32) - batch["label"].astype(jnp.float32))
    total, examples = jnp.sum(error * weights), jnp.sum(weights)
    return LossTerms(total, jnp.zeros((), jnp.float32), Stats.of(token_loss=(total, examples)))


def token_tagging_loss(logits: Array, batch: Batch, loss_config: LossConfig) -> LossTerms:
    """Cross-entropy of logits [b, s, num_labels] against 'tags' on the 'tag_weights' tokens (accuracy over them)."""
    return loss_terms(logits, batch["tags"], batch["tag_weights"], loss_config)


def span_question_answering_loss(outputs: Any, batch: Batch, loss_config: LossConfig) -> LossTerms:
    """The mean of the start and end cross-entropies over the tokens (HF's QA loss), summed over 'example_weight'.

    outputs: `.start_logits`, `.end_logits` [b, s]; the batch gives 'answer_start', 'answer_end' [b].
    'accuracy' is the mean of start and end accuracy, 'span_accuracy' the share of exactly right spans.
    """
    logits = jnp.stack([outputs.start_logits, outputs.end_logits], axis=1)  # [b, 2, s]
    targets = jnp.stack([batch["answer_start"], batch["answer_end"]], axis=1)  # [b, 2]
    weights = batch["example_weight"].astype(jnp.float32)
    both_right = jnp.all(jnp.argmax(logits, axis=-1) == targets, axis=-1)
    return loss_terms(
        logits, targets, jnp.repeat(weights[:, None] / 2, 2, axis=1), loss_config,
        span_accuracy=(jnp.sum(both_right * weights), jnp.sum(weights)),
    )


def cosine_similarities(anchors: Array, candidates: Array) -> Array:
    """float32 [a, c]: the cosine similarity of every anchor [a, d] with every candidate [c, d]
    (sentence-transformers' `cos_sim`: each vector divided by max(its L2 norm, 1e-12))."""
    unit = [x.astype(jnp.float32) / jnp.maximum(jnp.linalg.norm(x.astype(jnp.float32), axis=-1, keepdims=True),
                                                1e-12) for x in (anchors, candidates)]
    return precision.matmul(unit[0], unit[1].T)


def multiple_negatives_ranking_loss(outputs: Any, batch: Batch, loss_config: LossConfig) -> LossTerms:
    """sentence-transformers' MultipleNegativesRankingLoss (its defaults: cosine similarity, one direction, no
    hard negatives): each anchor's cross-entropy against every positive of the batch, its own the label,
    logits `loss_config.similarity_scale` (20) times the cosine similarities; summed over 'example_weight'.

    outputs: `.anchors`, `.positives` [b, d]. The batch is the global one (under jit the similarity matrix
    spans every device's rows, as sentence-transformers' `gather_across_devices=True`), or one micro-batch
    with gradient accumulation; positives of padded rows (weight 0) are no candidates. 'accuracy' is the
    share of anchors whose own positive is the most similar in the batch.
    """
    weights = batch["example_weight"].astype(jnp.float32)
    scores = loss_config.similarity_scale * cosine_similarities(outputs.anchors, outputs.positives)
    scores = jnp.where(weights[None, :] > 0, scores, jnp.finfo(jnp.float32).min)  # finite: no NaN gradients
    own = jnp.diagonal(scores)
    nll = jnp.where(weights > 0, jax.nn.logsumexp(scores, axis=1) - own, 0.0)
    hits = jnp.argmax(scores, axis=1) == jnp.arange(scores.shape[0])
    return weighted_terms(nll, jnp.zeros_like(nll), hits, weights)
