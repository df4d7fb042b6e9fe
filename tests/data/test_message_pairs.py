"""Cleaning hand-checked strings, the sentence-like filter, duplicates, the stable split and its proportions,
and this machine's pairs."""

import math

import pytest
from gettext_files import machine_locales_or_skip, write_catalog

from ptmjax.data import gettext_catalogs, message_pairs
from ptmjax.data.message_pairs import clean_pair, is_sentence_like, placeholders


@pytest.mark.parametrize(("english", "translation", "expected"), [
    ("_Open", "Ö_ffnen", ("Open", "Öffnen")),  # GTK mnemonics, also inside a word
    ("Save _As…", "名前を付けて保存(_A)…", ("Save As…", "名前を付けて保存…")),  # the CJK form
    ("&File", "&Datei", ("File", "Datei")),  # Qt/KDE marks
    ("Open (&O)", "打开(&O)", ("Open", "打开")),
    ("use AT&T syntax", "AT&T-Syntax verwenden", ("use AT&T syntax", "AT&T-Syntax verwenden")),
    ("Tom &amp; Jerry", "Tom &amp; Jerry", ("Tom &amp; Jerry", "Tom &amp; Jerry")),
    ("LC_ALL is not set", "LC_ALL ist nicht gesetzt", ("LC_ALL is not set", "LC_ALL ist nicht gesetzt")),
    ("set max_size", "max_size setzen", ("set max_size", "max_size setzen")),  # an identifier on both sides
    ("  Usage:\n\tgit  add\n", "Verwendung:\n git add", ("Usage: git add", "Verwendung: git add")),
    ("(_F)", "(_F)", None),  # nothing left
])
def test_cleaning_hand_checked_strings(english, translation, expected):
    assert clean_pair(english, translation) == expected


def test_placeholders():
    text = "%s of %-5.2lf %1$s %% %(name)s %1 {0} {name} {} $HOME ${PATH} $1 100%"
    assert placeholders(text) == ["%s", "%-5.2lf", "%1$s", "%%", "%(name)s", "%1", "{0}", "{name}", "{}", "$HOME",
                                  "${PATH}", "$1"]
    assert placeholders("Delete the selected file now?") == []


def test_sentence_like():
    assert is_sentence_like("Delete the selected file now?", "Die ausgewählte Datei jetzt löschen?", "nautilus")
    assert not is_sentence_like("Delete the file", "Datei löschen")  # three words
    assert not is_sentence_like("Delete %s from the disk", "%s von der Platte löschen")
    assert not is_sentence_like("Delete the file {name} now", "Die Datei {name} jetzt löschen")
    assert not is_sentence_like("Republic of the Congo", "Republik Kongo ja", "iso_3166-1")  # an ISO list
    assert not is_sentence_like("git bisect run <cmd>...", "git bisect run <cmd>...")  # not translated


def test_the_split_hashes_the_english_alone_in_fixed_proportions():
    assert message_pairs.split_of("Delete the selected file now?") == message_pairs.split_of(
        "Delete the selected file now?")
    n = 20_000
    splits = [message_pairs.split_of(f"sentence number {i}") for i in range(n)]
    for split, percent in message_pairs.SPLIT_PERCENTS.items():
        p = percent / 100
        assert abs(splits.count(split) / n - p) < 4 * math.sqrt(p * (1 - p) / n), split


MESSAGES = {
    "Delete the selected file now?": "Die ausgewählte Datei jetzt löschen?",
    "_Open the file in a new window": "Datei in neuem _Fenster öffnen",
    "Delete %s from the disk": "%s von der Platte löschen",
    "Quit": "Beenden",
    "Untranslated message stays empty": "",
    "one file was deleted from here\0%d files were deleted": "eine Datei wurde hier gelöscht\0%d Dateien",
}


def test_pairs_counts_duplicates_and_the_split_do_not_depend_on_order(tmp_path):
    for root, order in ((tmp_path / "a", 1), (tmp_path / "b", -1)):
        messages = dict(list(MESSAGES.items())[::order])
        write_catalog(root, "de", "app", messages)
        write_catalog(root, "de", "copy", messages)  # the same pairs again
        write_catalog(root, "de", "iso_3166-1", {"Republic of the Congo here": "Republik Kongo hier"})
        write_catalog(root, "en_GB", "app", {"Colour of the text here": "Colour of the text here"})
    first, second = (message_pairs.locale_pairs("de", (str(tmp_path / name),)) for name in "ab")
    assert (first.catalogs, first.raw, first.cleaned) == (3, 6, 6)  # unique pairs; the empty msgstr is none
    assert set(first.sentences) == {
        ("Delete the selected file now?", "Die ausgewählte Datei jetzt löschen?"),
        ("Open the file in a new window", "Datei in neuem Fenster öffnen"),
        ("one file was deleted from here", "eine Datei wurde hier gelöscht"),  # the singular and form 0
    }
    assert set(second.sentences) == set(first.sentences)
    for split in message_pairs.SPLITS:
        assert set(first.split(split)) == set(second.split(split))
        assert all(message_pairs.split_of(english) == split for english, _ in first.split(split))
    assert message_pairs.available_locales((str(tmp_path / "a"),)) == ("de",)  # English is no target


def test_no_catalogs_is_an_error_that_says_where_it_looked(tmp_path):
    with pytest.raises(ValueError, match=f"no gettext catalogs .* under \\('{tmp_path}',\\).*PTMJAX_LOCALE_DIRS"):
        message_pairs.sentence_pairs("de", "train", (str(tmp_path),))
    write_catalog(tmp_path / "french", "fr", "app", {"a": "b"})  # a new root: listings are cached per root
    with pytest.raises(ValueError, match="no gettext catalogs for locale 'de'.*available: fr"):
        message_pairs.sentence_pairs("de", "train", (str(tmp_path / "french"),))


def test_the_machines_german_pairs():
    machine_locales_or_skip("de")
    pairs = message_pairs.locale_pairs("de")
    assert pairs.raw >= pairs.cleaned >= len(pairs.sentences) > 100
    assert len(set(pairs.sentences)) == len(pairs.sentences)
    for english, translation in pairs.sentences[::50]:
        assert is_sentence_like(english, translation) and clean_pair(english, translation) == (english, translation)
    by_split = {split: len(pairs.split(split)) for split in message_pairs.SPLITS}
    assert sum(by_split.values()) == len(pairs.sentences)
    assert by_split["train"] > 0.85 * len(pairs.sentences)
    assert gettext_catalogs.catalog_paths()["de"]
