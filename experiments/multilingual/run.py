"""The multilingual comparison: monolingual (English) vs multilingual masked LM, each with and without XLM's
translation LM on the gettext message pairs (both orders), at equal compute, measured by cross-lingual retrieval
of held-out pairs, zero-shot transfer of a classifier fine-tuned on English, and translation en -> de, fr by an
encoder-decoder warm-started from the encoder.

Run: python experiments/multilingual/run.py [--setting full] [--seeds 0 1]

Every model is the same tiny BERT with XLM's language embedding (`BertConfig.num_languages`), pre-trained through
ptmjax's `Trainer` on the tasks of `ptmjax.tasks.multilingual` (`register_multilingual_tasks`) over one shared
multilingual SentencePiece vocabulary, for the same steps, batch and length: only the rows differ. Then, per
pre-trained model (`measures.py`): retrieval accuracy at 1 of held-out message pairs (en -> X and X -> en)
from mean-pooled embeddings, and a linear head on the mean-pooled encoder fine-tuned (all parameters) on English
messages labelled with their package, scored on the test messages of every language; and, per translated
language, a BART of the encoder's sizes warm-started from it (`multilingual_translation.py`), fine-tuned on that
language pair, greedy-decoded and scored with BLEU and chrF. A run whose result.json is
under runs/multilingual/<setting>/ is reused. Results go next to this script: results[_full].md, .json, .png.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import optax

from ptmjax import partitioning
from ptmjax.data import feature_converters, multilingual_vocabulary, pipeline
from ptmjax.families.token_loss import LossConfig
from ptmjax.models.bert import Bert, BertConfig
from ptmjax.partitioning import MeshConfig
from ptmjax.tasks import multilingual, registry
from ptmjax.training.trainer import Trainer

EXPERIMENT_DIR = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(EXPERIMENT_DIR))  # the multilingual_*.py modules beside this script
import multilingual_measures as measures  # noqa: E402
import multilingual_report as report  # noqa: E402
import multilingual_translation as translation  # noqa: E402

REPO_DIR = EXPERIMENT_DIR.parents[1]
LOCALES = ("de", "fr", "es", "ru", "it", "uk")
MONOLINGUAL_TLM_MIXTURE = "ptmjax_gettext_mlm_en_and_tlm"
ARMS = {  # the name in the table -> its pre-training task or mixture
    "English MLM": multilingual.mlm_task_name("en"),
    "English MLM + TLM": MONOLINGUAL_TLM_MIXTURE,
    "multilingual MLM": multilingual.MLM_MIXTURE,
    "multilingual MLM + TLM": multilingual.XLM_MIXTURE,
}
LAST_LOSSES = 50  # the pre-training loss reported is the mean of the last 50 steps'


@dataclasses.dataclass(frozen=True)
class Setting:
    """The knobs that differ between the reduced (default) and the full comparison."""

    name: str
    vocab_pieces: int
    d_model: int
    num_layers: int
    length: int
    batch_size: int
    pretrain_steps: int
    seeds: tuple[int, ...]
    finetune_steps: int
    per_class: int  # English fine-tuning messages per label
    retrieval_pairs: int  # held-out pairs per language
    translate_steps: int  # fine-tuning steps of the warm-started encoder-decoder per language pair
    translate_pairs: int  # held-out pairs translated per language pair
    pretrain_lr: float = 1e-3
    finetune_lr: float = 3e-4
    translate_lr: float = 1e-3


REDUCED = Setting("reduced", vocab_pieces=4000, d_model=64, num_layers=2, length=64, batch_size=32,
                  pretrain_steps=400, seeds=(0, 1, 2), finetune_steps=100, per_class=150, retrieval_pairs=200,
                  translate_steps=200, translate_pairs=200)
SMOKE = Setting("smoke", vocab_pieces=1000, d_model=32, num_layers=1, length=32, batch_size=8, pretrain_steps=3,
                seeds=(0,), finetune_steps=2, per_class=8, retrieval_pairs=20, translate_steps=2, translate_pairs=8)
FULL = Setting("full", vocab_pieces=8000, d_model=128, num_layers=4, length=128, batch_size=64,
               pretrain_steps=10000, seeds=(0, 1, 2, 3, 4), finetune_steps=500, per_class=500, retrieval_pairs=500,
               translate_steps=2000, translate_pairs=500)


SETTINGS = {setting.name: setting for setting in (SMOKE, REDUCED, FULL)}
tables = report.tables  # the README's generated tables (tests/test_docs.py renders them)


def model_of(setting: Setting, vocab_size: int) -> Bert:
    return Bert(BertConfig(vocab_size, setting.d_model, max(setting.d_model // 32, 1), setting.num_layers,
                           4 * setting.d_model, max_length=setting.length, nsp_head=False,
                           num_languages=len(LOCALES) + 1))


def register(setting: Setting):
    """The shared vocabulary, and the tasks and mixtures of `ARMS` registered over it."""
    vocabulary = multilingual_vocabulary.multilingual_vocabulary(setting.vocab_pieces, locales=LOCALES)
    multilingual.register_multilingual_tasks(LOCALES, vocabulary=vocabulary)
    for locale in multilingual.TRANSLATION_LOCALES:
        multilingual.register_gettext_translation_task(locale, vocabulary=vocabulary)
    registry.register_mixture(MONOLINGUAL_TLM_MIXTURE, [(ARMS["English MLM"], 1.0), (multilingual.TLM_MIXTURE, 1.0)])
    return vocabulary


def pretrain(setting: Setting, model: Bert, task: str, seed: int) -> tuple[Any, list[float]]:
    """Pre-trains `model` on `task` on one device; returns its parameters and every step's loss."""
    mesh = partitioning.make_mesh(MeshConfig(), jax.devices()[:1])
    schedule = optax.warmup_cosine_decay_schedule(0.0, setting.pretrain_lr, setting.pretrain_steps // 10,
                                                  setting.pretrain_steps)
    trainer = Trainer(model, optax.adamw(schedule, weight_decay=0.01), schedule, mesh, MeshConfig().rules,
                      LossConfig(z_loss=0.0))
    state = trainer.init_state(jax.random.key(seed))
    dataset = pipeline.get_dataset(
        task, "train", {"inputs": setting.length, "targets": setting.length}, setting.batch_size, seed=seed,
        shuffle=True, pack=False, feature_converter=feature_converters.TranslationLmFeatureConverter,
    )
    losses = []
    for step, batch in zip(range(setting.pretrain_steps), dataset.as_numpy_iterator(), strict=False):
        state, metrics = trainer.train_step(state, partitioning.global_batch(batch, mesh),
                                            jax.random.fold_in(jax.random.key(seed), step))
        losses.append(float(jax.device_get(metrics["loss"])))
    return jax.device_get(state.params), losses


def evaluate(setting: Setting, model: Bert, params, vocabulary, seed: int) -> dict[str, Any]:
    """Retrieval (en -> X, X -> en) per locale and the fine-tuned classifier's accuracy per language."""
    ids = measures.language_ids(LOCALES)
    rows = lambda texts: measures.token_rows(vocabulary, texts, setting.length)  # noqa: E731
    retrieval = {}
    for locale in LOCALES:
        english, translated = zip(*measures.held_out_pairs(locale, setting.retrieval_pairs), strict=True)
        source = measures.embeddings(model, params, rows(english), ids["en"])
        target = measures.embeddings(model, params, rows(translated), ids[locale])
        retrieval[locale] = {"en_to_x": measures.retrieval_accuracy(source, target),
                             "x_to_en": measures.retrieval_accuracy(target, source), "pairs": len(english)}
    texts, labels = measures.classification_train(LOCALES, setting.per_class)
    tuned = measures.fine_tune(model, params, rows(texts), np.asarray(labels), steps=setting.finetune_steps,
                                    batch_size=setting.batch_size, learning_rate=setting.finetune_lr, seed=seed)
    transfer = {}
    for language in ids:
        texts, labels = measures.classification_test(language, LOCALES)
        transfer[language] = {"accuracy": measures.accuracy(model, tuned, rows(texts), np.asarray(labels),
                                                                 ids[language]), "examples": len(texts)}
    translated = {locale: translation.translation_scores(
        model.config, params, vocabulary, locale, ids[locale], measures.held_out_pairs(locale, setting.translate_pairs),
        length=setting.length, steps=setting.translate_steps, batch_size=setting.batch_size,
        learning_rate=setting.translate_lr, seed=seed) for locale in multilingual.TRANSLATION_LOCALES}
    return {"retrieval": retrieval, "classification": transfer, "translation": translated}


def run_arm(setting: Setting, vocabulary, arm: str, seed: int, runs_dir: pathlib.Path) -> dict[str, Any]:
    """One pre-training and its evaluation, cached in runs_dir/<arm>_seed<seed>/result.json."""
    path = runs_dir / f"{report.slug(arm)}_seed{seed}" / "result.json"
    if path.exists():
        return json.loads(path.read_text())
    model = model_of(setting, vocabulary.vocab_size)
    start = time.perf_counter()
    params, losses = pretrain(setting, model, ARMS[arm], seed)
    pretrain_s = time.perf_counter() - start
    result = {"arm": arm, "seed": seed, "pretrain_loss": float(np.mean(losses[-LAST_LOSSES:])),
              "pretrain_s": pretrain_s, **evaluate(setting, model, params, vocabulary, seed),
              "eval_s": time.perf_counter() - start - pretrain_s}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(f"{arm} seed {seed}: {json.dumps(report.headline(result))}", flush=True)
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="reduced")
    parser.add_argument("--runs_dir", default=None, help="default: runs/multilingual/<setting>")
    parser.add_argument("--out_dir", default=str(EXPERIMENT_DIR), help="where results*.md/json/png go")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default: the setting's")
    args = parser.parse_args(argv)
    setting = SETTINGS[args.setting]
    if args.seeds:
        setting = dataclasses.replace(setting, seeds=tuple(args.seeds))
    runs_dir = pathlib.Path(args.runs_dir or REPO_DIR / "runs" / "multilingual" / setting.name)
    start = time.perf_counter()
    vocabulary = register(setting)
    runs = [run_arm(setting, vocabulary, arm, seed, runs_dir) for seed in setting.seeds for arm in ARMS]
    majority = {language: measures.majority_rate(measures.classification_test(language, LOCALES)[1])
                for language in measures.language_ids(LOCALES)}
    report.write(setting, LOCALES, runs, pathlib.Path(args.out_dir), time.perf_counter() - start, majority)


if __name__ == "__main__":
    main()
