"""The code-span rule on hand-tagged sentences, and words to ids with each word's first id known."""

import seqio

from ptmjax.data import code_spans, vocabularies, word_tokens


def spans(text: str, module: str = "json") -> list[tuple[str, str]]:
    words = text.split()
    return [(" ".join(words[first : last + 1]), kind) for first, last, kind in code_spans.code_spans(words, module)]


def test_each_rule_on_a_hand_tagged_sentence():
    assert spans("Call os.path.join() with max_length or 'utf-8', then open(file, 'w') (True, 0x1F) e.g. 3.5") == [
        ("os.path.join()", "IDENT"), ("max_length", "IDENT"), ("'utf-8',", "LIT"), ("open(file, 'w')", "IDENT"),
        ("(True,", "LIT"), ("0x1F)", "LIT"), ("3.5", "LIT"),
    ]
    # A quoted string runs over words; an unclosed quote or call stays one word (and falls to rule 3).
    assert spans('Set "hello big world" or \'never closed here') == [('"hello big world"', "LIT")]
    assert spans("f(a, b, c, d, e, f, g, h, i) then") == [("f(a,", "IDENT")]
    assert spans("It's a don't, i.e. not x.y, key=value but a.b_c.") == [("a.b_c.", "IDENT")]


def test_a_name_is_an_identifier_only_in_its_own_modules_docstrings():
    assert spans("Use dumps to write", "json") == [("dumps", "IDENT")]
    assert spans("Use dumps to write", "csv") == []
    # Defined in json/__init__.py; JSONDecoder, defined in json.decoder, is not json's (nor is its docstring).
    assert code_spans.module_names("json") == {"detect_encoding", "dump", "dumps", "load", "loads"}
    assert code_spans.module_names("no_such_module_here") == frozenset()


def test_bio_tags_of_spans():
    names = [code_spans.TAGS[i] for i in code_spans.bio_tags(6, [(0, 2, "LIT"), (4, 4, "IDENT")])]
    assert names == ["B-LIT", "I-LIT", "I-LIT", "O", "B-IDENT", "O"]


def test_sentencepiece_words_start_with_the_word_boundary_piece():
    vocabulary = vocabularies.stdlib_sentencepiece_vocabulary()
    words = ["Return", "os.path.join(a,", "b)", "unchanged."]
    ids, starts = word_tokens.encode_words(vocabulary, words)
    assert ids == vocabulary.encode(" ".join(words)) and vocabulary.decode(ids) == " ".join(words)
    pieces = [vocabulary.tokenizer.id_to_piece(i) for i in ids]
    assert [i for i, piece in enumerate(pieces) if piece.startswith("▁")] == starts


def test_byte_vocabulary_puts_a_words_first_id_on_the_space_before_it():
    vocabulary = seqio.ByteVocabulary()
    ids, starts = word_tokens.encode_words(vocabulary, ["ab", "c"])
    assert ids == [ord("a") + 3, ord("b") + 3, ord(" ") + 3, ord("c") + 3] and starts == [0, 2]
    assert vocabulary.decode(ids) == "ab c"
