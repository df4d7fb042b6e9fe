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
3.05 s to 1.78 s. `without_autograph_converter(converter)` does the same
for a seqio feature converter, whose packing it replaces with
`packing.trim_and_pack` (seqio's loops over a tensor in Python); every model
family's converter is built with it (`ptmjax.families.model_api`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import seqio
import tensorflow as tf

from ptmjax.data import packing


def without_autograph(preprocessor: Callable) -> Callable:
    """`preprocessor` (a function or a functools.partial of one) with its map functions traced as written.

    The signature stays visible to seqio, which passes `sequence_length` and
    `output_features` to the preprocessors that take them."""
    if isinstance(preprocessor, functools.partial):
        return functools.partial(without_autograph(preprocessor.func), *preprocessor.args, **preprocessor.keywords)
    return tf.autograph.experimental.do_not_convert(preprocessor)


@functools.cache
def without_autograph_converter(converter: type[seqio.FeatureConverter]) -> type[seqio.FeatureConverter]:
    """`converter`, of the same name, with its map functions traced as written and packing by
    `packing.trim_and_pack` (seqio's packing needs AutoGraph): the same batches."""

    class Converter(converter):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            for nested in vars(self).values():  # seqio's DecoderFeatureConverter delegates to converters it makes
                if isinstance(nested, seqio.FeatureConverter):
                    nested.__class__ = without_autograph_converter(type(nested))  # adds methods, no state

        def __call__(self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
            return without_autograph(super().__call__)(ds, task_feature_lengths)

        def _pack_or_pad(self, ds: tf.data.Dataset, packed_lengths: Mapping[str, int]) -> tf.data.Dataset:
            if self.pack and not self._use_custom_packing_ops:
                return packing.trim_and_pack(ds, packed_lengths)
            return super()._pack_or_pad(ds, packed_lengths)

    Converter.__name__ = Converter.__qualname__ = converter.__name__
    Converter.__module__, Converter.__doc__ = converter.__module__, converter.__doc__
    return Converter
