"""Multilingual tasks over the machine's gettext sentence pairs (`ptmjax.data.message_pairs`).

Importing this module registers, reading nothing (a machine without catalogs learns so when a dataset is
first asked for):

* 'ptmjax_gettext_translate_en_de' and 'ptmjax_gettext_translate_en_fr': inputs 'translate English to
  German: {English}', targets the translation (T5's format), splits 'train', 'validation', 'test';
  metrics 'bleu' (`metrics.bleu`) and 'chrf' (`metrics.chrf`), both sacrebleu's corpus scores.
  `register_gettext_translation_task(locale)` adds another target language of `LANGUAGE_NAMES`.

`register_multilingual_tasks` reads the catalogs and registers XLM's pre-training data. The languages are
'en' (id 0) and then the locales in the given order (ids 1, 2, ...); a locale's name in a task replaces
'@' by '_' ('sr@latin' -> 'sr_latin'):

* 'ptmjax_gettext_mlm_{language}': BERT masked LM (`masked_lm.bert_mlm`: sentences concatenated into
  streams, 15% selected) over the language's sentence-like texts ('en': the English sides of all the
  locales' pairs), with 'positions' and 'language_ids' (`translation_lm.with_language_ids`);
* 'ptmjax_gettext_tlm_en_{language}': XLM's translation LM (`translation_lm.translation_lm`) over
  (English, translation) pairs, language ids (0, the locale's); 'ptmjax_gettext_tlm_{language}_en' the same
  pairs the other way round, [translation </s> English </s>] with language ids (the locale's, 0) (XLM
  trains TLM in both orders);
* mixtures 'ptmjax_gettext_mlm' over the MLM tasks and 'ptmjax_gettext_tlm' over the TLM tasks of both orders, each
  temperature-sampled by the 'train' sizes (texts, pairs: `mixtures.register_temperature_mixture`), and
  'ptmjax_gettext_xlm', those two at equal rates (XLM's MLM + TLM).

All of them give 'inputs', 'targets', 'loss_mask', 'positions', 'language_ids', which
`feature_converters.TranslationLmFeatureConverter` reads; the last three are output features of the
tasks (`xlm_features`), since a seqio mixture keeps only those. The vocabulary defaults to
`multilingual_vocabulary.multilingual_vocabulary()`, trained on first use.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import gin
import seqio
import tensorflow as tf

from ptmjax import metrics
from ptmjax.data import message_pairs, multilingual_vocabulary
from ptmjax.objectives import masked_lm, translation_lm
from ptmjax.tasks import mixtures, registry, text_to_text

LANGUAGE_NAMES = {"de": "German", "fr": "French", "es": "Spanish", "it": "Italian", "pt_BR": "Portuguese",
                  "ru": "Russian", "uk": "Ukrainian", "ja": "Japanese", "ko": "Korean", "zh_CN": "Chinese"}
TRANSLATION_LOCALES = ("de", "fr")
DEFAULT_TEMPERATURE = 2.0
MIN_TRAIN_PAIRS = 1000
MLM_MIXTURE, TLM_MIXTURE, XLM_MIXTURE = "ptmjax_gettext_mlm", "ptmjax_gettext_tlm", "ptmjax_gettext_xlm"


def task_language(language: str) -> str:
    """A locale as it appears in task names: '@' -> '_'."""
    return language.replace("@", "_")


def translation_task_name(locale: str) -> str:
    return f"ptmjax_gettext_translate_en_{task_language(locale)}"


def mlm_task_name(language: str) -> str:
    return f"ptmjax_gettext_mlm_{task_language(language)}"


def tlm_task_name(locale: str, to_english: bool = False) -> str:
    """The TLM task over English -> `locale` pairs, or `locale` -> English ones with `to_english`."""
    language = task_language(locale)
    return f"ptmjax_gettext_tlm_{language}_en" if to_english else f"ptmjax_gettext_tlm_en_{language}"


def xlm_features(vocabulary: seqio.Vocabulary) -> dict[str, seqio.Feature]:
    """'inputs', 'targets' of `vocabulary`, and the int32 'loss_mask', 'positions', 'language_ids'."""
    extra = {name: seqio.Feature(seqio.PassThroughVocabulary(1), add_eos=False, required=False)
             for name in (masked_lm.LOSS_MASK_KEY, translation_lm.POSITIONS_KEY, translation_lm.LANGUAGE_IDS_KEY)}
    return {**registry.output_features(vocabulary), **extra}


def _string_dataset(columns: dict[str, Sequence[str]], shuffle_files: bool, seed: int | None) -> tf.data.Dataset:
    dataset = tf.data.Dataset.from_tensor_slices({key: tf.constant(list(texts), tf.string)
                                                  for key, texts in columns.items()})
    if shuffle_files:
        dataset = dataset.shuffle(len(next(iter(columns.values()))), seed=seed, reshuffle_each_iteration=True)
    return dataset


def _pairs_dataset_fn(split: str, shuffle_files: bool, seed: int | None = None, *, locale: str, prefix: str = "",
                      roots: tuple[str, ...] | None) -> tf.data.Dataset:
    """{'inputs': `prefix` + English, 'targets': the translation} of one split."""
    pairs = message_pairs.sentence_pairs(locale, split, roots)
    return _string_dataset({"inputs": [prefix + english for english, _ in pairs],
                            "targets": [translation for _, translation in pairs]}, shuffle_files, seed)


def _texts_dataset_fn(split: str, shuffle_files: bool, seed: int | None = None, *, language: str,
                      locales: tuple[str, ...], roots: tuple[str, ...] | None) -> tf.data.Dataset:
    texts = multilingual_vocabulary.language_texts(locales, split, roots)[language]
    return _string_dataset({"text": texts}, shuffle_files, seed)


@gin.configurable
def register_gettext_translation_task(locale: str, vocabulary: seqio.Vocabulary | None = None,
                              roots: tuple[str, ...] | None = None) -> seqio.Task:
    """(Re-)registers 'ptmjax_gettext_translate_en_{locale}' (module doc); `locale` from LANGUAGE_NAMES."""
    if locale not in LANGUAGE_NAMES:
        raise ValueError(f"no English name for locale {locale!r} to write the prompt with; known: "
                         f"{', '.join(LANGUAGE_NAMES)} (add it to multilingual.LANGUAGE_NAMES)")
    source = seqio.FunctionDataSource(
        functools.partial(_pairs_dataset_fn, locale=locale, prefix=f"translate English to {LANGUAGE_NAMES[locale]}: ",
                          roots=roots), splits=message_pairs.SPLITS)
    return text_to_text.register(translation_task_name(locale), source, None,
                                 vocabulary or multilingual_vocabulary.multilingual_vocabulary(),
                                 (metrics.bleu, metrics.chrf))


def _register_mlm_task(language: str, language_id: int, locales: tuple[str, ...], vocabulary: seqio.Vocabulary,
                       roots: tuple[str, ...] | None) -> seqio.Task:
    source = seqio.FunctionDataSource(
        functools.partial(_texts_dataset_fn, language=language, locales=locales, roots=roots),
        splits=message_pairs.SPLITS)
    preprocessors = [*registry.objective_preprocessors(masked_lm.bert_mlm, append_eos=False),
                     functools.partial(translation_lm.with_language_ids, language_id=language_id)]
    return registry.register_task(mlm_task_name(language), source, preprocessors, vocabulary,
                                  features=xlm_features(vocabulary))


def _register_tlm_task(locale: str, language_id: int, vocabulary: seqio.Vocabulary,
                       roots: tuple[str, ...] | None, to_english: bool) -> seqio.Task:
    """TLM over the pairs ('inputs' English, 'targets' the translation), the translation first with `to_english`."""
    source = seqio.FunctionDataSource(functools.partial(_pairs_dataset_fn, locale=locale, roots=roots),
                                      splits=message_pairs.SPLITS)
    sides = {"source_key": "targets", "target_key": "inputs", "source_language_id": language_id,
             "target_language_id": 0} if to_english else {"source_language_id": 0, "target_language_id": language_id}
    options = translation_lm.TranslationLMOptions(**sides)
    preprocessors = [*text_to_text.TEXT_PREPROCESSORS[:2],
                     functools.partial(translation_lm.translation_lm, options=options)]
    return registry.register_task(tlm_task_name(locale, to_english), source, preprocessors, vocabulary,
                                  features=xlm_features(vocabulary))


def default_locales(min_train_pairs: int = MIN_TRAIN_PAIRS, roots: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The locales with at least `min_train_pairs` sentence-like 'train' pairs, sorted (reads every catalog)."""
    return tuple(locale for locale in message_pairs.require_catalogs(roots)
                 if len(message_pairs.sentence_pairs(locale, "train", roots)) >= min_train_pairs)


@gin.configurable
def register_multilingual_tasks(
    locales: Sequence[str] | None = None,
    temperature: float = DEFAULT_TEMPERATURE,
    vocabulary: seqio.Vocabulary | None = None,
    min_train_pairs: int = MIN_TRAIN_PAIRS,
    roots: Sequence[str] | None = None,
) -> seqio.Mixture:
    """Registers the MLM and TLM tasks and mixtures of the module doc; returns 'ptmjax_gettext_xlm'.

    Args:
      locales: the non-English languages, in language-id order (1, 2, ...); None: `default_locales`.
      temperature: T of the mixtures' rates p ~ n ** (1 / T) (1: by size; mT5: 3.33).
      vocabulary: defaults to `multilingual_vocabulary.multilingual_vocabulary()`.
      min_train_pairs: with locales None, the fewest 'train' pairs a locale needs to be taken.
      roots: the locale folders; None: `gettext_catalogs.locale_dirs()`.
    """
    roots = None if roots is None else tuple(roots)
    locales = tuple(locales) if locales is not None else default_locales(min_train_pairs, roots)
    available = message_pairs.require_catalogs(roots)
    unknown = [locale for locale in locales if locale not in available or message_pairs.is_english(locale)]
    if unknown or not locales:
        raise ValueError(f"locales {unknown or list(locales)} have no gettext catalogs here (or are English); "
                         f"available: {', '.join(available)}")
    vocabulary = vocabulary or multilingual_vocabulary.multilingual_vocabulary()
    texts = multilingual_vocabulary.language_texts(locales, "train", roots)
    for language_id, language in enumerate(texts):
        _register_mlm_task(language, language_id, locales, vocabulary, roots)
        if language != message_pairs.ENGLISH:
            for to_english in (False, True):
                _register_tlm_task(language, language_id, vocabulary, roots, to_english)
    mixtures.register_temperature_mixture(MLM_MIXTURE, [mlm_task_name(language) for language in texts], temperature,
                                          sizes={mlm_task_name(language): len(t) for language, t in texts.items()})
    tlm_sizes = {tlm_task_name(locale, to_english): len(message_pairs.sentence_pairs(locale, "train", roots))
                 for locale in locales for to_english in (False, True)}
    mixtures.register_temperature_mixture(TLM_MIXTURE, list(tlm_sizes), temperature, sizes=tlm_sizes)
    return registry.register_mixture(XLM_MIXTURE, [(MLM_MIXTURE, 1.0), (TLM_MIXTURE, 1.0)])


for _locale in TRANSLATION_LOCALES:
    register_gettext_translation_task(_locale)
