"""English -> X sentence pairs from the machine's gettext catalogs (`gettext_catalogs`): cleaned, filtered, split.

For a locale (the directory name: 'de', 'pt_BR', 'sr@latin'), every catalog's messages with a msgid and a
non-empty first translation give a pair (msgid, msgstr[0]): for plural forms the singular msgid and the
first form; a context (msgctxt) is dropped. Then:

* cleaning (`clean_pair`): accelerator marks go: the CJK form 'ファイル(_F)' / '打开(&O)'; a '&' that starts a
  word ('&File', not 'AT&T' or '&amp;'); the '_' of a word with exactly one '_' before a letter ('_Open',
  'Ö_ffnen'), unless that very word is on both sides (an identifier such as 'LC_ALL'); whitespace runs
  (newlines of help texts included) become one space; a side left empty drops the pair;
* sentence-like (`is_sentence_like`): at least `MIN_WORDS` words in the English, no placeholder on either
  side (`placeholders`: printf '%s' '%-5.2lf' '%1$s' '%%', Python '%(name)s', Qt '%1', '{name}' '{0}',
  shell '$VAR' '${VAR}' '$1'), the translation differs from the English, and the catalog is not one of
  iso-codes' name lists (domains 'iso_*': countries, languages, currencies, scripts);
* duplicates: a (English, translation) pair is kept once, at its first occurrence (catalogs in path order,
  messages in file order; several translations of one English message are all kept);
* split (`split_of`): by the SHA-256 of the English text: 90% 'train', 5% 'validation', 5% 'test'. It depends
  on the English alone, so a sentence is in the same split in every language and on every machine.

English locales ('en', 'en_GB', 'en@quot', ...) are not targets. Without catalogs, `available_locales` is
empty and `sentence_pairs` raises an error that says where it looked (`require_catalogs`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
from collections.abc import Iterator, Sequence

from ptmjax.data import gettext_catalogs

MIN_WORDS = 4
ISO_DOMAIN_PREFIX = "iso_"
SPLIT_PERCENTS = {"train": 90, "validation": 5, "test": 5}
SPLITS = tuple(SPLIT_PERCENTS)
ENGLISH = "en"

_CJK_ACCELERATOR = re.compile(r"\s*\([_&][^\W_]\)")
_AMPERSAND_ACCELERATOR = re.compile(r"(?<!\S)&(?=[^\W\d_])(?!\w+;)")
_UNDERSCORED_WORD = re.compile(r"\w*_\w*")
_ACCELERATED_WORD = re.compile(r"[^\W_]*_[^\W\d_][^\W_]*")  # one '_', before a letter
_PLACEHOLDER = re.compile("|".join((
    r"%\(\w+\)[-+ #0]*\d*(?:\.\d+)?[diouxXeEfFgGcrsa]",  # Python's %(name)s
    r"%(?:\d+\$)?[-+ #0']*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|q|j|z|Z|t)?[diouxXeEfFgGaAcspn%]",  # printf
    r"%<\w+>",  # gettext's system-dependent '%<PRIu64>'
    r"%\d+",  # Qt's '%1'
    r"\{\w*(?:![rsa])?(?::[^{}]*)?\}",  # '{name}', '{0}', '{}', '{0:>8}'
    r"\$\{\w+\}|\$[A-Za-z_]\w*|\$\d",  # '${VAR}', '$VAR', '$1'
)))


def placeholders(text: str) -> list[str]:
    """The format specifiers and variables in `text`, in order."""
    return _PLACEHOLDER.findall(text)


def _without_accelerators(text: str, identifiers: set[str]) -> str:
    if "&" in text:  # the checks before each pattern save most of the time on 1.4M pairs
        text = _AMPERSAND_ACCELERATOR.sub("", _CJK_ACCELERATOR.sub("", text))
    if "_" in text:
        text = _ACCELERATED_WORD.sub(
            lambda word: word[0] if word[0] in identifiers else word[0].replace("_", "", 1),
            _CJK_ACCELERATOR.sub("", text),
        )
    return text


def clean_pair(english: str, translation: str) -> tuple[str, str] | None:
    """(English, translation) without accelerator marks, whitespace collapsed; None when a side is left empty."""
    identifiers = set()
    if "_" in english and "_" in translation:
        identifiers = set(_UNDERSCORED_WORD.findall(english)) & set(_UNDERSCORED_WORD.findall(translation))
    cleaned = tuple(" ".join(_without_accelerators(text, identifiers).split()) for text in (english, translation))
    return cleaned if all(cleaned) else None


def is_sentence_like(english: str, translation: str, domain: str = "") -> bool:
    """A cleaned pair worth training on (see the module doc): >= MIN_WORDS English words, no placeholders,
    a real translation, not from an ISO name list."""
    return (
        not domain.startswith(ISO_DOMAIN_PREFIX)
        and len(english.split()) >= MIN_WORDS
        and english != translation
        and not placeholders(english)
        and not placeholders(translation)
    )


def split_of(english: str) -> str:
    """'train', 'validation' or 'test' from the SHA-256 of the English text (90/5/5)."""
    bucket = int.from_bytes(hashlib.sha256(english.encode("utf-8")).digest()[:8], "big") % 100
    for split, percent in SPLIT_PERCENTS.items():
        if bucket < percent:
            return split
        bucket -= percent
    raise AssertionError("SPLIT_PERCENTS must sum to 100")


def is_english(locale: str) -> bool:
    """'en', 'en_GB', 'en@quot': English variants, which are not translation targets."""
    return re.split(r"[_@]", locale)[0] == ENGLISH


@dataclasses.dataclass(frozen=True)
class LocalePairs:
    """One locale's pairs: counts of unique pairs before and after cleaning, and the sentence-like ones."""

    locale: str
    catalogs: int
    raw: int
    cleaned: int
    sentences: tuple[tuple[str, str], ...]

    def split(self, split: str) -> tuple[tuple[str, str], ...]:
        """The sentence-like pairs of one split, in corpus order."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r} of the gettext pairs; known: {', '.join(SPLITS)}")
        return tuple(pair for pair in self.sentences if split_of(pair[0]) == split)


def _raw_pairs(paths: Sequence[str]) -> Iterator[tuple[str, str, str]]:
    """(domain, msgid, msgstr[0]) of every translated message."""
    for path in paths:
        domain = gettext_catalogs.domain_of(path)
        for message in gettext_catalogs.read_catalog(path).messages:
            if message.msgid and message.msgstr[0]:
                yield domain, message.msgid, message.msgstr[0]


@functools.cache
def locale_pairs(locale: str, roots: tuple[str, ...] | None = None) -> LocalePairs:
    """The pairs of `locale` from its catalogs under `roots` (default `gettext_catalogs.locale_dirs()`)."""
    paths = gettext_catalogs.catalog_paths(roots).get(locale)
    if not paths:
        raise ValueError(f"no gettext catalogs for locale {locale!r} under {roots or gettext_catalogs.locale_dirs()}; "
                         f"available: {', '.join(available_locales(roots)) or 'none'}")
    raw, cleaned, sentences = set(), set(), {}
    for domain, msgid, msgstr in _raw_pairs(paths):
        raw.add((msgid, msgstr))
        pair = clean_pair(msgid, msgstr)
        if pair is not None:
            cleaned.add(pair)
            if is_sentence_like(*pair, domain):
                sentences.setdefault(pair, None)
    return LocalePairs(locale, len(paths), len(raw), len(cleaned), tuple(sentences))


def available_locales(roots: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The non-English locales with catalogs under `roots`, sorted."""
    return tuple(locale for locale in gettext_catalogs.catalog_paths(roots) if not is_english(locale))


def require_catalogs(roots: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """`available_locales`, or a ValueError saying where no catalog was found and how to get some."""
    locales = available_locales(roots)
    if not locales:
        raise ValueError(
            f"no gettext catalogs (<dir>/<locale>/LC_MESSAGES/*.mo) under {roots or gettext_catalogs.locale_dirs()}: "
            f"install packages with their translations (Debian: not excluded by dpkg's path-exclude) or point "
            f"${gettext_catalogs.LOCALE_DIRS_ENV} at folders that hold some"
        )
    return locales


def sentence_pairs(locale: str, split: str, roots: tuple[str, ...] | None = None) -> tuple[tuple[str, str], ...]:
    """The sentence-like (English, translation) pairs of `locale` in `split`."""
    require_catalogs(roots)
    return locale_pairs(locale, roots).split(split)
