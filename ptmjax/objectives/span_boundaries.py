"""SpanBERT's span boundary features: for each predicted token, the tokens just outside its span.

A span is a maximal run of consecutive selected positions (spans drawn next to
each other are one span, so both boundary tokens are always unselected and
seen as they are). For a selected position i in the span s..e:

* 'span_left' = s - 1 and 'span_right' = e + 1, the indices of the boundary
  tokens x_{s-1} and x_{e+1} of the span boundary objective;
* 'span_position' = i - s + 1, its position in the span (1..e - s + 1).

A span touching the first or the last position has no token on that side: its
positions get span_position 0, as every unselected position does (all three
features are 0 there), and the boundary objective leaves them out. All int32,
of the sequence's length.
"""

from __future__ import annotations

import tensorflow as tf

SPAN_LEFT, SPAN_RIGHT, SPAN_POSITION = "span_left", "span_right", "span_position"
FEATURES = (SPAN_LEFT, SPAN_RIGHT, SPAN_POSITION)


def span_boundaries(selected: tf.Tensor) -> dict[str, tf.Tensor]:
    """bool [n] selected positions -> {'span_left', 'span_right', 'span_position'}: int32 [n] each (module doc)."""
    selected = tf.cast(selected, tf.bool)
    n = tf.size(selected)
    positions = tf.range(n)
    before = tf.concat([[False], selected[:-1]], 0)
    after = tf.concat([selected[1:], [False]], 0)
    # [spans + 1]: a last entry so that the gathers below are in range when nothing is selected
    starts = tf.concat([tf.boolean_mask(positions, selected & ~before), [0]], 0)
    ends = tf.concat([tf.boolean_mask(positions, selected & ~after), [0]], 0)
    span = tf.maximum(tf.cumsum(tf.cast(selected & ~before, tf.int32)) - 1, 0)  # the span of each selected position
    left, right = tf.gather(starts, span) - 1, tf.gather(ends, span) + 1
    predicted = selected & (left >= 0) & (right < n)
    zero = tf.zeros_like(positions)
    return {
        SPAN_LEFT: tf.where(predicted, left, zero),
        SPAN_RIGHT: tf.where(predicted, right, zero),
        SPAN_POSITION: tf.where(predicted, positions - left, zero),
    }
