"""Test helpers for gettext catalogs: a .mo writer built from the format's description, and the machine's
catalogs (or a skip that says they are missing)."""

import pathlib
import struct

import pytest

from ptmjax.data import gettext_catalogs, message_pairs

MAGIC = 0x950412DE
UTF8_HEADER = "Content-Type: text/plain; charset=UTF-8\nPlural-Forms: nplurals=2; plural=(n != 1);\n"


def mo_bytes(entries: list[tuple[bytes, bytes]], byte_order: str = "<", revision: int = 0) -> bytes:
    """A .mo file of (original, translation) byte strings, in the given order (no hash table)."""
    count = len(entries)
    originals_at, translations_at = 28, 28 + 8 * count
    strings_at = translations_at + 8 * count
    words, blob = [], b""
    for column in (0, 1):
        for entry in entries:
            words += [len(entry[column]), strings_at + len(blob)]
            blob += entry[column] + b"\0"
    header = struct.pack(f"{byte_order}7I", MAGIC, revision, count, originals_at, translations_at, 0, 0)
    return header + struct.pack(f"{byte_order}{len(words)}I", *words) + blob


def encoded_entries(header: str, messages: dict[str, str], charset: str = "utf-8") -> list[tuple[bytes, bytes]]:
    """The header entry and messages (msgid -> msgstr; '\\0' separates plural forms) in msgid order, as gettext
    sorts them."""
    entries = [("", header), *sorted(messages.items())]
    return [(original.encode(charset), translation.encode(charset)) for original, translation in entries]


def write_catalog(root: pathlib.Path, locale: str, domain: str, messages: dict[str, str],
                  header: str = UTF8_HEADER) -> pathlib.Path:
    """Writes `root`/`locale`/LC_MESSAGES/`domain`.mo (UTF-8)."""
    path = root / locale / "LC_MESSAGES" / f"{domain}.mo"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(mo_bytes(encoded_entries(header, messages)))
    return path


def machine_locales_or_skip(*wanted: str) -> tuple[str, ...]:
    """The machine's locales among `wanted` (all when none given); skips the test, saying why, without them."""
    available = message_pairs.available_locales()
    found = tuple(locale for locale in wanted if locale in available) if wanted else available
    if not found:
        pytest.skip(f"no gettext catalogs for {list(wanted) or 'any locale'} under {gettext_catalogs.locale_dirs()} "
                    f"on this machine (set ${gettext_catalogs.LOCALE_DIRS_ENV} to folders that hold some)")
    return found
