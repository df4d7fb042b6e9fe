"""The .mo parser: hand-written catalogs (both byte orders, plural forms, contexts, charsets, a bad charset
header) and, on this machine's catalogs, the same messages as the standard library's GNUTranslations."""

import gettext
import io

import pytest
from gettext_files import UTF8_HEADER, encoded_entries, machine_locales_or_skip, mo_bytes

from ptmjax.data import gettext_catalogs
from ptmjax.data.gettext_catalogs import Message

MESSAGES = {
    "Open file": "Datei öffnen",
    "one file\0%d files": "eine Datei\0%d Dateien",
    "menu\x04Quit": "Beenden",
    "verb\x04Close": "Schließen",
}
EXPECTED = (
    Message("Open file", ("Datei öffnen",)),
    Message("Quit", ("Beenden",), context="menu"),
    Message("one file", ("eine Datei", "%d Dateien"), msgid_plural="%d files"),
    Message("Close", ("Schließen",), context="verb"),
)


@pytest.mark.parametrize("byte_order", ["<", ">"])
def test_both_byte_orders_plural_forms_and_contexts(byte_order):
    catalog = gettext_catalogs.parse_catalog(mo_bytes(encoded_entries(UTF8_HEADER, MESSAGES), byte_order))
    assert catalog.charset == "utf-8" and catalog.undecodable == 0
    assert catalog.header["plural-forms"] == "nplurals=2; plural=(n != 1);"
    assert catalog.messages == EXPECTED  # msgid order: 'Open file' < 'menu...' < 'one file' < 'verb...'


def test_revision_one_is_read_and_others_are_refused():
    entries = encoded_entries(UTF8_HEADER, {"a": "b"})
    assert gettext_catalogs.parse_catalog(mo_bytes(entries, revision=1 << 16)).messages == (Message("a", ("b",)),)
    with pytest.raises(ValueError, match="revision 2.0"):
        gettext_catalogs.parse_catalog(mo_bytes(entries, revision=2 << 16))


def test_declared_single_byte_charset():
    header = "Content-Type: text/plain; charset=ISO-8859-1\n"
    catalog = gettext_catalogs.parse_catalog(mo_bytes(encoded_entries(header, {"Size": "Größe"}, "latin-1")))
    assert catalog.charset == "iso8859-1" and catalog.messages == (Message("Size", ("Größe",)),)


def test_a_bad_charset_header_falls_back_to_utf8_where_the_stdlib_gives_up():
    header = "Content-Type: text/plain; charset=CHARSET\n"  # an unedited template's header
    data = mo_bytes(encoded_entries(header, {"Size": "Größe"}))
    with pytest.raises(LookupError, match="CHARSET"):
        gettext.GNUTranslations(io.BytesIO(data))
    catalog = gettext_catalogs.parse_catalog(data)
    assert catalog.charset == "utf-8" and catalog.messages == (Message("Size", ("Größe",)),)
    assert gettext_catalogs.parse_catalog(mo_bytes(encoded_entries("", {"a": "ä"}))).charset == "utf-8"


def test_strings_that_do_not_decode_are_counted_not_kept():
    header = "Content-Type: text/plain; charset=ASCII\n"
    entries = [(b"", header.encode()), (b"ok", b"fine"), (b"bad", b"\xff\xfe")]
    catalog = gettext_catalogs.parse_catalog(mo_bytes(entries))
    assert catalog.messages == (Message("ok", ("fine",)),) and catalog.undecodable == 1


def test_broken_files_are_named():
    with pytest.raises(ValueError, match="x.mo is not a gettext .mo file: magic 00000000"):
        gettext_catalogs.parse_catalog(bytes(28), "x.mo")
    with pytest.raises(ValueError, match="header needs 20"):
        gettext_catalogs.parse_catalog(b"\xde\x12\x04\x95", "x.mo")
    data = mo_bytes(encoded_entries(UTF8_HEADER, {"a": "b"}))
    with pytest.raises(ValueError, match="truncated|corrupt"):
        gettext_catalogs.parse_catalog(data[:-6], "x.mo")


def test_listing_by_locale(tmp_path):
    for locale, domain in (("de", "b"), ("de", "a"), ("sr@latin", "a")):
        (tmp_path / locale / "LC_MESSAGES").mkdir(parents=True, exist_ok=True)
        (tmp_path / locale / "LC_MESSAGES" / f"{domain}.mo").write_bytes(b"")
    (tmp_path / "de" / "LC_MESSAGES" / "notes.txt").write_bytes(b"")
    found = gettext_catalogs.catalog_paths((str(tmp_path), str(tmp_path / "missing")))
    assert {locale: [gettext_catalogs.domain_of(p) for p in paths] for locale, paths in found.items()} == {
        "de": ["a", "b"], "sr@latin": ["a"]}


def _as_stdlib_catalog(catalog: gettext_catalogs.Catalog) -> dict:
    """GNUTranslations._catalog's layout: 'ctxt\\x04id' -> str, (id, n) -> str per plural form."""
    entries = {}
    for message in catalog.messages:
        key = message.msgid if message.context is None else f"{message.context}\x04{message.msgid}"
        if message.msgid_plural is None:
            entries[key] = message.msgstr[0]
        else:
            entries.update({(key, index): form for index, form in enumerate(message.msgstr)})
    return entries


def test_the_machines_catalogs_read_as_the_stdlib_reads_them():
    locales = machine_locales_or_skip()
    paths = sorted(path for locale in locales for path in gettext_catalogs.catalog_paths()[locale])
    compared = refused = 0
    for path in paths[:: max(1, len(paths) // 60)]:  # about 60 catalogs across locales and domains
        try:
            with open(path, "rb") as file:
                reference = gettext.GNUTranslations(file)._catalog
        except (UnicodeDecodeError, LookupError, IndexError, ValueError):  # headers the stdlib cannot read
            refused += 1
            continue
        reference = {key: value for key, value in reference.items() if key != ""}  # the header entry
        assert _as_stdlib_catalog(gettext_catalogs.read_catalog(path)) == reference, path
        compared += 1
    assert compared >= min(len(paths), 50) - refused
