"""The gettext multilingual tasks on this machine's catalogs (skipped, with a message, without them): the
translation task's text and its BLEU/chrF, the TLM tasks' [English </s> translation </s>] and [translation </s>
English </s>] with XLM's positions and language ids, both orders at equal rates in the TLM mixture, the MLM
mixture's temperature rates and sampled proportions, the feature converter."""

import collections
import math

import numpy as np
import pytest
import seqio
from data.gettext_files import machine_locales_or_skip

from ptmjax import metrics
from ptmjax.data import feature_converters, message_pairs, pipeline
from ptmjax.tasks import multilingual

LOCALES = ("de", "fr", "ja")
BYTES = seqio.ByteVocabulary()  # nothing to train
LENGTH = 256


@pytest.fixture(scope="module")
def registered():
    """The MLM/TLM tasks of LOCALES with byte ids, T = 2."""
    locales = machine_locales_or_skip(*LOCALES)
    if locales != LOCALES:
        pytest.skip(f"this machine has catalogs for {locales} of {LOCALES} only")
    return multilingual.register_multilingual_tasks(locales, temperature=2.0, vocabulary=BYTES)


def _examples(task_name: str, split: str, count: int) -> list[dict]:
    dataset = seqio.get_mixture_or_task(task_name).get_dataset(
        {"inputs": LENGTH, "targets": LENGTH}, split=split, shuffle=False, seed=0)
    return list(dataset.take(count).as_numpy_iterator())


def test_tlm_examples_concatenate_the_pair_with_reset_positions_and_language_ids(registered):
    pairs = message_pairs.sentence_pairs("fr", "validation")
    checked = 0
    for (english, french), x in zip(pairs, _examples(multilingual.tlm_task_name("fr"), "validation", 200),
                                    strict=False):
        source, target = BYTES.encode(english), BYTES.encode(french)
        if len(source) + len(target) + 2 > LENGTH:  # cut: translation_lm's own tests check the rule
            continue
        assert x["targets"].tolist() == [*source, 1, *target, 1]
        assert x["positions"].tolist() == [*range(len(source) + 1), *range(len(target) + 1)]
        assert x["language_ids"].tolist() == [0] * (len(source) + 1) + [2] * (len(target) + 1)  # en 0, de 1, fr 2
        masked = x["loss_mask"] == 1
        assert (x["inputs"][~masked] == x["targets"][~masked]).all() and masked.any()
        checked += 1
    assert checked > 100


def test_tlm_to_english_puts_the_translation_first_with_its_language_id(registered):
    pairs = message_pairs.sentence_pairs("de", "validation")
    checked = 0
    for (english, german), x in zip(pairs, _examples(multilingual.tlm_task_name("de", to_english=True),
                                                     "validation", 200), strict=False):
        source, target = BYTES.encode(german), BYTES.encode(english)
        if len(source) + len(target) + 2 > LENGTH:
            continue
        assert x["targets"].tolist() == [*source, 1, *target, 1]
        assert x["positions"].tolist() == [*range(len(source) + 1), *range(len(target) + 1)]
        assert x["language_ids"].tolist() == [1] * (len(source) + 1) + [0] * (len(target) + 1)  # de 1, en 0
        checked += 1
    assert checked > 100


def test_the_tlm_mixture_takes_both_orders_at_equal_rates(registered):
    mixture = seqio.get_mixture_or_task(multilingual.TLM_MIXTURE)
    for locale in LOCALES:
        rates = [mixture.get_rate(seqio.get_mixture_or_task(multilingual.tlm_task_name(locale, to_english)))
                 for to_english in (False, True)]
        assert rates[0] == rates[1] > 0
    assert len(mixture.tasks) == 2 * len(LOCALES)


def test_the_feature_converter_pads_every_field(registered):
    task = seqio.get_mixture_or_task(multilingual.tlm_task_name("ja"))
    lengths = {"inputs": LENGTH, "targets": LENGTH}
    raw = list(task.get_dataset(lengths, split="validation", shuffle=False, seed=0).take(8).as_numpy_iterator())
    converted = feature_converters.TranslationLmFeatureConverter()(
        task.get_dataset(lengths, split="validation", shuffle=False, seed=0), lengths)
    names = {"inputs": "input_tokens", "targets": "target_tokens", "loss_mask": "loss_mask",
             "positions": "positions", "language_ids": "language_ids"}
    for x, y in zip(raw, converted.take(8).as_numpy_iterator(), strict=True):
        assert set(y) == set(names.values())
        for task_name, model_name in names.items():
            assert y[model_name].tolist() == x[task_name].tolist() + [0] * (LENGTH - len(x[task_name]))


@pytest.mark.slow
def test_mlm_rates_are_temperature_sampled_and_the_mixture_draws_them(registered):
    texts = {language: len(multilingual.multilingual_vocabulary.language_texts(LOCALES, "train")[language])
             for language in ("en", *LOCALES)}
    weights = {language: n ** 0.5 for language, n in texts.items()}  # n_l ** (1 / T), T = 2
    expected = {language: weight / sum(weights.values()) for language, weight in weights.items()}
    mixture = seqio.get_mixture_or_task(multilingual.MLM_MIXTURE)
    for language in ("en", *LOCALES):
        task = seqio.get_mixture_or_task(multilingual.mlm_task_name(language))
        assert mixture.get_rate(task) / mixture.total_rate == pytest.approx(expected[language], rel=1e-9)
    n = 1500
    dataset = mixture.get_dataset({"inputs": 64, "targets": 64}, split="train", shuffle=True, seed=3,
                                  num_epochs=None)
    drawn = collections.Counter(int(x["language_ids"][0]) for x in dataset.take(n).as_numpy_iterator())
    for language_id, language in enumerate(("en", *LOCALES)):
        p = expected[language]
        assert abs(drawn[language_id] / n - p) < 4 * math.sqrt(p * (1 - p) / n), (language, drawn, expected)


@pytest.mark.slow
def test_the_xlm_mixture_gives_batches_through_the_pipeline(registered):
    batch = next(pipeline.get_dataset(
        multilingual.XLM_MIXTURE, "train", {"inputs": 64, "targets": 64}, 8, seed=0, shuffle=True, pack=False,
        feature_converter=feature_converters.TranslationLmFeatureConverter).as_numpy_iterator())
    assert set(batch) == {"input_tokens", "target_tokens", "loss_mask", "positions", "language_ids"}
    assert all(value.shape == (8, 64) for value in batch.values())
    assert batch["loss_mask"].sum() > 0 and set(np.unique(batch["language_ids"])) <= {0, 1, 2, 3}


def test_mlm_streams_carry_one_language(registered):
    x = _examples(multilingual.mlm_task_name("ja"), "validation", 1)[0]
    assert x["language_ids"].tolist() == [3] * len(x["targets"])
    assert x["positions"].tolist() == list(range(len(x["targets"])))
    texts = "".join(translation for _, translation in message_pairs.sentence_pairs("ja", "validation"))
    stream = bytes(token - 3 for token in x["targets"].tolist()[:-1])  # byte ids are offset by 3; then EOS
    assert x["targets"][-1] == 1 and stream == texts.encode()[: len(stream)]  # the texts in order, concatenated


def test_translation_task_text():
    machine_locales_or_skip("de")
    task = multilingual.register_gettext_translation_task("de", vocabulary=BYTES)
    x = next(task.get_dataset({"inputs": 512, "targets": 512}, split="test", shuffle=False).as_numpy_iterator())
    english, german = message_pairs.sentence_pairs("de", "test")[0]
    assert x["inputs_pretokenized"].decode() == f"translate English to German: {english}"
    assert x["targets_pretokenized"].decode() == german
    assert x["targets"].tolist() == [*BYTES.encode(german), 1][:512]


def _chrf_reference(targets: list[str], predictions: list[str], max_order: int = 6, beta: float = 2.0) -> float:
    """chrF from its definition: character n-gram counts without whitespace summed over the corpus, precision
    and recall averaged over the orders with n-grams on both sides, then F-beta (x 100)."""
    hyp, ref, match = np.zeros(max_order), np.zeros(max_order), np.zeros(max_order)
    for target, prediction in zip(targets, predictions, strict=True):
        t, p = "".join(target.split()), "".join(prediction.split())
        for n in range(1, max_order + 1):
            t_grams = collections.Counter(t[i:i + n] for i in range(len(t) - n + 1))
            p_grams = collections.Counter(p[i:i + n] for i in range(len(p) - n + 1))
            hyp[n - 1] += sum(p_grams.values())
            ref[n - 1] += sum(t_grams.values())
            match[n - 1] += sum((t_grams & p_grams).values())
    orders = (hyp > 0) & (ref > 0)
    precision, recall = (match[orders] / hyp[orders]).mean(), (match[orders] / ref[orders]).mean()
    return 100 * (1 + beta**2) * precision * recall / (beta**2 * precision + recall)


def test_bleu_and_chrf_are_sacrebleus_corpus_scores():
    sacrebleu = pytest.importorskip("sacrebleu")
    task = seqio.get_mixture_or_task(multilingual.translation_task_name("fr"))
    assert set(task.predict_metric_fns) == {metrics.bleu, metrics.chrf}
    targets = ["Le fichier a été supprimé.", "Impossible d'ouvrir le fichier de configuration."]
    predictions = ["Le fichier est supprimé.", "Impossible d'ouvrir ce fichier de configuration."]
    assert metrics.chrf(["abc"], ["abd"])["chrf"] == pytest.approx(100 * 7 / 18)  # by hand: p = r = 7/18
    assert metrics.chrf(targets, predictions)["chrf"] == pytest.approx(_chrf_reference(targets, predictions))
    assert metrics.chrf(targets, predictions)["chrf"] == pytest.approx(
        sacrebleu.corpus_chrf(predictions, [targets]).score)
    assert metrics.bleu(targets, predictions)["bleu"] == pytest.approx(sacrebleu.corpus_bleu(
        predictions, [targets], smooth_method="exp", tokenize="intl").score)


def test_without_catalogs_registration_says_where_it_looked(tmp_path):
    with pytest.raises(ValueError, match="no gettext catalogs .*PTMJAX_LOCALE_DIRS"):
        multilingual.register_multilingual_tasks(["de"], vocabulary=BYTES, roots=[str(tmp_path)])
    with pytest.raises(ValueError, match="no English name for locale 'xx'"):
        multilingual.register_gettext_translation_task("xx")
