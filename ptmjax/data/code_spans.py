"""Code spans in docstring prose: identifiers and literals, word by word, as BIO tags.

A word is a whitespace-separated unit of the text. Spans are whole words; the first rule that
applies at a word wins, and a span's later words are not looked at again:

1. A quoted string is a literal (LIT): a word that starts, after any of '([{', with a quote
   (' or ", optionally after one of b r f u) opens it, and the first word within `MAX_SPAN_WORDS`
   words that ends with the same quote, before any of ')]}.,;:!?', closes it ("'utf-8'",
   "'hello world'," = 2 words). Unclosed, the word is left to the rules below.
2. A call is an identifier (IDENT): a word that starts, after any of '([{`*', with a name
   directly followed by '(' opens it, and the word that balances its parentheses within
   `MAX_SPAN_WORDS` words closes it ("open()", "stdev([1.5, 2.5])" = 2 words); unbalanced, the
   span is that word alone.
3. One word, with '([{`*' stripped from its start and ')]}`.,;:!?*' from its end, is
   - a literal if it is a number (42, -1, 3.14, 1e-5, 0x1F) or True, False or None;
   - an identifier if it is a dotted name whose parts are not all one letter ("os.path",
     not "e.g."), a name with '_' ("max_length"), or a public class or function of the module
     the docstring documents (`module_names`: "variance" in statistics' docstrings, not in others).

So the same spelling is tagged by its context: the quote or bracket that opens or closes a span
words away, or which module the text documents.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
import warnings
from collections.abc import Sequence

TAGS = ("O", "B-IDENT", "I-IDENT", "B-LIT", "I-LIT")
MAX_SPAN_WORDS = 8
_OPENERS = "([{`*"
_CLOSERS = ")]}`.,;:!?*"
_QUOTE_START = re.compile(r"[([{]*[bBrRfFuU]?(['\"])")
_CALL_START = re.compile(r"[([{`*]*[A-Za-z_][\w.]*\(")
_NUMBER = re.compile(r"[-+]?(?:0[xXoObB][0-9a-fA-F_]+|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)")
_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
_NAME = re.compile(r"\w*[A-Za-z]\w*")
_KEYWORD_LITERALS = frozenset({"True", "False", "None"})


@functools.cache
def module_names(module: str) -> frozenset[str]:
    """Public classes and functions defined in the stdlib `module` (empty when it does not import)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            namespace = vars(importlib.import_module(module))
        except ImportError:
            return frozenset()
    return frozenset(
        name for name, obj in namespace.items()
        if not name.startswith("_") and (inspect.isclass(obj) or inspect.isroutine(obj))
        and getattr(obj, "__module__", None) == module
    )


def _quote_end(words: Sequence[str], start: int) -> int | None:
    """The index of the word that closes the quoted string opened at `start`, else None."""
    opening = _QUOTE_START.match(words[start])
    if not opening:
        return None
    quote = opening.group(1)
    for end in range(start, min(start + MAX_SPAN_WORDS, len(words))):
        closing = words[end].rstrip(_CLOSERS)
        after_opening = opening.end() if end == start else 0
        if len(closing) > after_opening and closing.endswith(quote):
            return end
    return None


def _call_end(words: Sequence[str], start: int) -> int | None:
    """The index of the word that balances the parentheses of the call opened at `start`, else None."""
    if not _CALL_START.match(words[start]):
        return None
    depth = 0
    for end in range(start, min(start + MAX_SPAN_WORDS, len(words))):
        depth += words[end].count("(") - words[end].count(")")
        if depth <= 0:
            return end
    return start


def _word_kind(word: str, names: frozenset[str]) -> str | None:
    """'LIT', 'IDENT' or None for a word on its own (rule 3 of the module doc)."""
    core = word.lstrip(_OPENERS).rstrip(_CLOSERS)
    if core in _KEYWORD_LITERALS or _NUMBER.fullmatch(core):
        return "LIT"
    if _DOTTED.fullmatch(core) and any(len(part) > 1 for part in core.split(".")):
        return "IDENT"
    if _NAME.fullmatch(core) and ("_" in core or core in names):
        return "IDENT"
    return None


def code_spans(words: Sequence[str], module: str) -> list[tuple[int, int, str]]:
    """(first word, last word, 'IDENT' or 'LIT') of each span in `words` of a docstring of `module`."""
    names = module_names(module)
    spans, index = [], 0
    while index < len(words):
        quote_end = _quote_end(words, index)
        call_end = None if quote_end is not None else _call_end(words, index)
        kind = _word_kind(words[index], names)
        if quote_end is not None:
            spans.append((index, quote_end, "LIT"))
            index = quote_end
        elif call_end is not None:
            spans.append((index, call_end, "IDENT"))
            index = call_end
        elif kind:
            spans.append((index, index, kind))
        index += 1
    return spans


def bio_tags(num_words: int, spans: Sequence[tuple[int, int, str]]) -> list[int]:
    """Each word's index into `TAGS`: B- on a span's first word, I- on the rest, O outside spans."""
    tags = [TAGS.index("O")] * num_words
    for first, last, kind in spans:
        tags[first] = TAGS.index(f"B-{kind}")
        for index in range(first + 1, last + 1):
            tags[index] = TAGS.index(f"I-{kind}")
    return tags
