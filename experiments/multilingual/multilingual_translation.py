"""Measure (c) of the multilingual experiment: translation from English by an encoder-decoder warm-started from
a pre-trained encoder (XLM's recipe; Rothe et al.'s BERT2BERT), fine-tuned briefly on one language pair.

The encoder-decoder is `Bart` of the encoder's sizes (`ptmjax.models.encoder_warm_start`): both stacks' layers,
embeddings and output bias from the encoder, the decoder's cross-attention fresh; the encoder reads English
(language 0), the decoder the target language's id. It trains through ptmjax's `Trainer` on the train split of
'ptmjax_gettext_translate_en_{locale}' (inputs 'translate English to German: ...', T5's format), then decodes
held-out test pairs greedily (ptmjax.decoding) and is scored by the task's own metrics: sacrebleu's corpus BLEU
and chrF (`ptmjax.metrics.bleu`, `chrf`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import optax
import seqio

from ptmjax import decoding, metrics, partitioning
from ptmjax.data import pipeline
from ptmjax.families.token_loss import LossConfig
from ptmjax.models.bart import Bart
from ptmjax.models.encoder import EncoderConfig
from ptmjax.models.encoder_warm_start import warm_start_config, warm_start_params
from ptmjax.objectives.common import EOS_ID
from ptmjax.partitioning import MeshConfig
from ptmjax.tasks import multilingual
from ptmjax.training.trainer import Trainer

IDS = decoding.GenerationIds(eos_token_id=EOS_ID, pad_token_id=0, decoder_start_token_id=0)  # T5's convention
DECODE_BATCH = 100


def fine_tune(config: EncoderConfig, encoder_params, locale: str, language_id: int, *, length: int, steps: int,
              batch_size: int, learning_rate: float, seed: int) -> tuple[Bart, Any, list[float]]:
    """The warm-started encoder-decoder trained on English -> `locale` (AdamW, 10% warm-up, then constant);
    returns the model, its parameters and every step's loss."""
    model = Bart(warm_start_config(config))
    mesh = partitioning.make_mesh(MeshConfig(), jax.devices()[:1])
    schedule = optax.warmup_constant_schedule(0.0, learning_rate, max(steps // 10, 1))
    trainer = Trainer(model, optax.adamw(schedule, weight_decay=0.01), schedule, mesh, MeshConfig().rules,
                      LossConfig(z_loss=0.0))
    state = trainer.init_state(jax.random.key(seed))
    warm = warm_start_params(jax.device_get(encoder_params), jax.device_get(state.params), 0, language_id)
    state = trainer.with_params(state, jax.device_put(warm, trainer.state_shardings.params))
    dataset = pipeline.get_dataset(multilingual.translation_task_name(locale), "train",
                                   {"inputs": length, "targets": length}, batch_size, seed=seed, shuffle=True,
                                   pack=False)
    losses = []
    for step, batch in zip(range(steps), dataset.as_numpy_iterator(), strict=False):
        state, stats = trainer.train_step(state, partitioning.global_batch(batch, mesh),
                                          jax.random.fold_in(jax.random.key(seed), step))
        losses.append(float(jax.device_get(stats["loss"])))
    return model, jax.device_get(state.params), losses


def source_rows(vocabulary: seqio.Vocabulary, locale: str, english: Sequence[str], length: int) -> np.ndarray:
    """int32 [n, length]: the task's inputs ('translate English to {language}: ' + English, cut, then EOS)."""
    rows = np.zeros((len(english), length), np.int32)
    prefix = f"translate English to {multilingual.LANGUAGE_NAMES[locale]}: "
    for i, text in enumerate(english):
        ids = [*vocabulary.encode(prefix + text)[: length - 1], EOS_ID]
        rows[i, : len(ids)] = ids
    return rows


def translate(model: Bart, params, vocabulary: seqio.Vocabulary, rows: np.ndarray, max_length: int) -> list[str]:
    """Greedy translations of the source rows, each up to its first EOS."""
    config = decoding.DecodeConfig("greedy", max_decode_length=max_length)
    predict = jax.jit(lambda params, batch: decoding.predict(decoding.encoder_decoder_prefill, model, params, batch,
                                                             config, IDS))
    texts = []
    for i in range(0, len(rows), DECODE_BATCH):
        tokens = np.asarray(predict(params, {"encoder_input_tokens": rows[i:i + DECODE_BATCH]}).tokens[:, 0])
        for row in tokens.tolist():
            texts.append(vocabulary.decode(row[: row.index(EOS_ID)] if EOS_ID in row else row))
    return texts


def translation_scores(config: EncoderConfig, encoder_params, vocabulary: seqio.Vocabulary, locale: str,
                       language_id: int, pairs: Sequence[tuple[str, str]], *, length: int, steps: int,
                       batch_size: int, learning_rate: float, seed: int) -> dict[str, Any]:
    """{'bleu', 'chrf': corpus scores on `pairs` (English, reference), 'pairs', 'loss': the mean of the last
    tenth of the fine-tuning losses, 'examples': three (reference, prediction) pairs}."""
    model, params, losses = fine_tune(config, encoder_params, locale, language_id, length=length, steps=steps,
                                      batch_size=batch_size, learning_rate=learning_rate, seed=seed)
    english, references = zip(*pairs, strict=True)
    predictions = translate(model, params, vocabulary, source_rows(vocabulary, locale, english, length), length)
    return {**metrics.bleu(references, predictions), **metrics.chrf(references, predictions), "pairs": len(pairs),
            "loss": float(np.mean(losses[-max(len(losses) // 10, 1):])),
            "examples": [list(pair) for pair in zip(references[:3], predictions[:3], strict=True)]}
