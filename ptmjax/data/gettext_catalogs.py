"""GNU gettext message catalogs (.mo files), read directly: real English -> X parallel text on most machines.

Debian packages install their translations as `<locale dir>/<language>/LC_MESSAGES/<domain>.mo`
(git, coreutils, PostgreSQL, GnuPG, iso-codes, ...). The binary format (GNU gettext manual, "The Format
of GNU MO Files"):

* a header of 32-bit words in the file's byte order, told by the magic number 0x950412de read
  little- or big-endian: magic, revision (major version 0 or 1 in the upper 16 bits), the number of
  strings N, the offset of the table of original strings, the offset of the table of translations;
* each table holds N (length, offset) pairs of 32-bit words; a string is `length` bytes at `offset`
  (a NUL follows it);
* an original is `msgid`, or `msgctxt \\x04 msgid` with a context, or `msgid \\0 msgid_plural` for
  plural forms, whose translation is `msgstr[0] \\0 msgstr[1] ...`;
* the entry with the empty msgid is the catalog's header, 'Key: value' lines; its Content-Type names
  the charset of every other string.

`parse_catalog` decodes with the declared charset, and falls back to UTF-8 when the header names no
charset or one Python does not know ('CHARSET', left by an unedited template: the stdlib's
`gettext.GNUTranslations` refuses such a catalog). A string that does not decode in the charset is
decoded as UTF-8 if it can be, else the message is dropped and counted in `Catalog.undecodable`.
"""

from __future__ import annotations

import codecs
import dataclasses
import functools
import os
import pathlib
import struct
from collections.abc import Mapping

LITTLE_ENDIAN_MAGIC = 0x950412DE
SUPPORTED_MAJOR_REVISIONS = (0, 1)
CONTEXT_SEPARATOR = "\x04"
DEFAULT_CHARSET = "utf-8"
LOCALE_DIRS_ENV = "PTMJAX_LOCALE_DIRS"
DEFAULT_LOCALE_DIRS = ("/usr/share/locale", "/usr/local/share/locale")


@dataclasses.dataclass(frozen=True)
class Message:
    """One entry: `msgstr` holds one translation per plural form (one without plural forms)."""

    msgid: str
    msgstr: tuple[str, ...]
    context: str | None = None
    msgid_plural: str | None = None


@dataclasses.dataclass(frozen=True)
class Catalog:
    """A parsed .mo file: its header fields (lower-case keys), the charset used, its messages in file order
    (the header entry excluded), and how many messages did not decode."""

    header: Mapping[str, str]
    charset: str
    messages: tuple[Message, ...]
    undecodable: int = 0


def _byte_order(data: bytes, name: str) -> str:
    if len(data) < 20:
        raise ValueError(f"{name} is not a gettext .mo file: {len(data)} bytes, a header needs 20")
    for order in ("<", ">"):
        if struct.unpack_from(f"{order}I", data)[0] == LITTLE_ENDIAN_MAGIC:
            return order
    raise ValueError(f"{name} is not a gettext .mo file: magic {data[:4].hex()}, expected 950412de either byte order")


def _raw_strings(data: bytes, name: str) -> list[tuple[bytes, bytes]]:
    """(original, translation) byte strings in file order."""
    order = _byte_order(data, name)
    revision, count, originals, translations = struct.unpack_from(f"{order}4I", data, 4)
    if revision >> 16 not in SUPPORTED_MAJOR_REVISIONS:
        raise ValueError(f"{name} has .mo revision {revision >> 16}.{revision & 0xFFFF}; only major 0 and 1 exist")
    if max(originals, translations) + 8 * count > len(data):
        raise ValueError(f"{name} is truncated: its tables of {count} strings end past its {len(data)} bytes")
    table = functools.partial(struct.unpack_from, f"{order}{2 * count}I", data)
    columns = []
    for words in (table(originals), table(translations)):
        spans = list(zip(words[1::2], words[0::2], strict=True))  # (offset, length)
        if any(offset + length >= len(data) for offset, length in spans):
            raise ValueError(f"{name} is corrupt: a string runs past its {len(data)} bytes")
        columns.append([data[offset:offset + length] for offset, length in spans])
    return list(zip(*columns, strict=True))


def _header_fields(text: str) -> dict[str, str]:
    """'Key: value' lines (continuation lines appended), keys lower-cased."""
    fields: dict[str, str] = {}
    last = None
    for line in text.split("\n"):
        line = line.strip()
        if ":" in line:
            key, value = line.split(":", 1)
            last = key.strip().lower()
            fields[last] = value.strip()
        elif line and last:
            fields[last] += "\n" + line
    return fields


def declared_charset(header: Mapping[str, str]) -> str:
    """The Content-Type's charset if Python knows it, else UTF-8 (no header, 'CHARSET' of a template)."""
    charset = header.get("content-type", "").partition("charset=")[2].split(";")[0].strip()
    try:
        return codecs.lookup(charset).name if charset else DEFAULT_CHARSET
    except LookupError:
        return DEFAULT_CHARSET


def _decode(raw: bytes, charset: str) -> str | None:
    for encoding in dict.fromkeys((charset, DEFAULT_CHARSET)):
        try:
            return raw.decode(encoding)
        except UnicodeDecodeError:
            continue
    return None


def _message(original: bytes, translation: bytes, charset: str) -> Message | None:
    parts = [_decode(raw, charset) for raw in (*original.split(b"\0"), *translation.split(b"\0"))]
    if None in parts:
        return None
    ids, msgstr = parts[: original.count(b"\0") + 1], tuple(parts[original.count(b"\0") + 1:])
    context, separator, msgid = ids[0].rpartition(CONTEXT_SEPARATOR)
    return Message(msgid, msgstr, context if separator else None, ids[1] if len(ids) > 1 else None)


def parse_catalog(data: bytes, name: str = "<bytes>") -> Catalog:
    """Parses the bytes of a .mo file (see the module doc); `name` goes into errors."""
    strings = _raw_strings(data, name)
    raw_header = next((translation for original, translation in strings if not original), b"")
    charset = declared_charset(_header_fields(raw_header.decode("latin-1")))  # ASCII-safe, enough for the charset
    header = _header_fields(_decode(raw_header, charset) or raw_header.decode("latin-1"))
    messages = [_message(original, translation, charset) for original, translation in strings if original]
    kept = tuple(message for message in messages if message is not None)
    return Catalog(header, charset, kept, undecodable=len(messages) - len(kept))


def read_catalog(path: str | os.PathLike) -> Catalog:
    """Parses one .mo file."""
    return parse_catalog(pathlib.Path(path).read_bytes(), str(path))


def locale_dirs() -> tuple[str, ...]:
    """$PTMJAX_LOCALE_DIRS (colon-separated) if set, else DEFAULT_LOCALE_DIRS."""
    configured = os.environ.get(LOCALE_DIRS_ENV)
    return tuple(filter(None, configured.split(":"))) if configured else DEFAULT_LOCALE_DIRS


@functools.cache
def catalog_paths(roots: tuple[str, ...] | None = None) -> dict[str, tuple[str, ...]]:
    """{locale name (directory name: 'de', 'pt_BR', 'sr@latin'): its .mo files, sorted}, locales sorted;
    roots default to `locale_dirs()`; roots that do not exist are skipped. Cached: a listing per `roots`."""
    found: dict[str, list[str]] = {}
    for root in roots if roots is not None else locale_dirs():
        for path in pathlib.Path(root).glob("*/LC_MESSAGES/*.mo"):
            if path.is_file():
                found.setdefault(path.parent.parent.name, []).append(str(path))
    return {locale: tuple(sorted(found[locale])) for locale in sorted(found)}


def domain_of(path: str | os.PathLike) -> str:
    """The text domain of a catalog: its file name without '.mo' ('coreutils', 'iso_3166-1')."""
    return pathlib.Path(path).stem
