"""The multilingual vocabulary: its temperature-sampled training text on hand-written catalogs, and, trained on
this machine's catalogs, a low unknown-piece rate on every language's validation text."""

import pytest
from gettext_files import machine_locales_or_skip, write_catalog

from ptmjax.data import multilingual_vocabulary as mv


def _sentences(prefix: str, count: int) -> dict[str, str]:
    return {f"{prefix} message number {i} is here": f"{prefix} Nachricht Nummer {i} ist hier" for i in range(count)}


def test_training_text_is_temperature_sampled_by_language(tmp_path):
    write_catalog(tmp_path, "de", "app", _sentences("first", 400))
    write_catalog(tmp_path, "fr", "app", {english: german.replace("Nachricht", "message") for english, german in
                                          _sentences("second", 40).items()})
    roots = (str(tmp_path),)
    texts = mv.language_texts(("de", "fr"), "train", roots)
    sizes = {language: len(sentences) for language, sentences in texts.items()}
    assert sizes["en"] == sizes["de"] + sizes["fr"]  # English: every locale's English sides, each once
    weights = {language: n ** 0.5 for language, n in sizes.items()}  # T = 2
    quotas = {language: min(sizes[language], round(300 * weight / sum(weights.values())))
              for language, weight in weights.items()}
    sample = mv.training_sentences(("de", "fr"), 2.0, 300, roots)
    assert len(sample) == sum(quotas.values())
    for language, sentences in texts.items():
        assert len(set(sample) & set(sentences)) == quotas[language], language
    assert quotas["fr"] == sizes["fr"] and quotas["de"] < sizes["de"]  # the small language is sampled up


MAX_UNKNOWN_RATE = 0.01


@pytest.mark.parametrize(("locales", "pieces", "max_sentences"), [
    (("de", "ru", "ja"), 3000, 12_000),  # Latin, Cyrillic, CJK: about 10 s on 2 shared cores
    pytest.param(("de", "ru", "el", "ka", "he", "hi", "ja", "zh_CN", "ko"), 8000, 40_000, marks=pytest.mark.slow),
])
def test_the_vocabulary_covers_each_language(locales, pieces, max_sentences):
    """Under 1% of the pieces of any language's validation text are unk (measured: at most 0.28%)."""
    locales = machine_locales_or_skip(*locales)
    vocabulary = mv.LazyMultilingualVocabulary(pieces, 100, locales, max_sentences=max_sentences)
    assert vocabulary.vocab_size == pieces + 100
    validation = mv.language_texts(locales, "validation")
    rates = {language: mv.unknown_rate(vocabulary, texts) for language, texts in validation.items() if texts}
    assert len(rates) == len(locales) + 1 and max(rates.values()) < MAX_UNKNOWN_RATE, rates
    english = "Delete the selected files from the disk"
    assert vocabulary.decode(vocabulary.encode(english)) == english


def test_unknown_rate_counts_unk_pieces():
    class Stub:
        unk_id = 2

        def encode(self, text):
            return [2 if char == "?" else 5 for char in text]

    assert mv.unknown_rate(Stub(), ["ab?", "c"]) == pytest.approx(1 / 4)
    assert mv.unknown_rate(Stub(), []) == 0


def test_settings_make_the_vocabulary_and_a_machine_without_catalogs_is_told(tmp_path):
    assert mv.multilingual_vocabulary(4000, locales=["de"]) is mv.multilingual_vocabulary(4000, locales=("de",))
    assert mv.LazyMultilingualVocabulary(4000, locales=["de"]) != mv.LazyMultilingualVocabulary(4000, locales=["fr"])
    empty = mv.LazyMultilingualVocabulary(4000, roots=(str(tmp_path),))
    with pytest.raises(ValueError, match="no gettext catalogs .*PTMJAX_LOCALE_DIRS"):
        empty.encode("text")


def test_the_cached_model_is_keyed_by_the_settings_and_the_catalogs_bytes(tmp_path):
    write_catalog(tmp_path / "a", "de", "app", _sentences("first", 5))
    write_catalog(tmp_path / "b", "de", "app", _sentences("first", 5))
    write_catalog(tmp_path / "c", "de", "app", _sentences("other", 5))
    same, copy, changed = (mv.model_path(100, ("de",), 2.0, 50, (str(tmp_path / name),)) for name in "abc")
    assert same == copy != changed
    assert same != mv.model_path(100, ("de",), 1.0, 50, (str(tmp_path / "a"),))
    assert same != mv.model_path(200, ("de",), 2.0, 50, (str(tmp_path / "a"),))
