"""Long documents split into bounded pieces before tokenising, so that memory does not grow with their length.

Tokenising one document costs memory in proportion to its length: with the
SentencePiece vocabulary, a 5 MB line took 540 MB more than short lines to give
a first batch, and a training run over a 50 MB line reached 19.7 GB.
`split_long_lines` cuts every line longer than `max_bytes` into consecutive
pieces of at most `max_bytes` bytes, each a document of its own. A piece ends
after the last whitespace byte in the second half of its window where there is
one, else before the last UTF-8 character start, so no character is cut. Joined,
the pieces are the line, byte for byte; the cuts are a pure function of the text
(deterministic), and a shorter line passes through unchanged.
"""

from __future__ import annotations

import tensorflow as tf

DEFAULT_MAX_DOCUMENT_BYTES = 65536
_WHITESPACE_BYTES = (ord(" "), ord("\t"), ord("\n"), ord("\r"), ord("\v"), ord("\f"))


def check_max_bytes(max_bytes: int) -> None:
    """Raises a ValueError naming the bad value unless a piece can hold any UTF-8 character (4 bytes)."""
    if not isinstance(max_bytes, int) or max_bytes < 4:
        raise ValueError(
            f"max_document_bytes={max_bytes!r} must be an integer of at least 4 (one UTF-8 character); "
            f"the default is {DEFAULT_MAX_DOCUMENT_BYTES}"
        )


def _piece_length(window: tf.Tensor, max_bytes: int) -> tf.Tensor:
    """Bytes of the next piece, given the `max_bytes + 1` bytes from its start (more text follows)."""
    data = tf.io.decode_raw(window, tf.uint8)
    lengths = tf.range(1, max_bytes + 1)  # a piece of `length` bytes ends with data[length - 1]
    ends_in_space = tf.reduce_any(tf.equal(data[:max_bytes, None], _WHITESPACE_BYTES), axis=1)
    next_starts_character = tf.not_equal(tf.bitwise.bitwise_and(data[1:], 0xC0), 0x80)
    after_space = tf.reduce_max(tf.where(ends_in_space & (lengths > max_bytes // 2), lengths, 0))
    before_character = tf.reduce_max(tf.where(next_starts_character, lengths, 0))
    fallback = tf.where(before_character > 0, before_character, max_bytes)  # not UTF-8: cut anywhere
    return tf.where(after_space > 0, after_space, fallback)


def document_pieces(text: tf.Tensor, max_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES) -> tf.Tensor:
    """A string scalar -> a vector of pieces of at most `max_bytes` bytes that join to it (see the module doc)."""
    check_max_bytes(max_bytes)
    length = tf.strings.length(text)

    def split() -> tf.Tensor:
        def cut(start: tf.Tensor, pieces: tf.TensorArray) -> tuple[tf.Tensor, tf.TensorArray]:
            remaining = length - start
            piece = tf.cond(
                remaining <= max_bytes,
                lambda: remaining,
                lambda: _piece_length(tf.strings.substr(text, start, max_bytes + 1), max_bytes),
            )
            return start + piece, pieces.write(pieces.size(), tf.strings.substr(text, start, piece))

        pieces = tf.TensorArray(tf.string, size=0, dynamic_size=True)
        _, pieces = tf.while_loop(lambda start, _: start < length, cut, (tf.constant(0), pieces))
        return pieces.stack()

    return tf.cond(length <= max_bytes, lambda: tf.reshape(text, [1]), split)


def split_long_lines(lines: tf.data.Dataset, max_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES) -> tf.data.Dataset:
    """A dataset of string lines -> one string per piece of each line, in order (see the module doc)."""
    check_max_bytes(max_bytes)
    return lines.map(lambda line: document_pieces(line, max_bytes), num_parallel_calls=tf.data.AUTOTUNE).unbatch()
