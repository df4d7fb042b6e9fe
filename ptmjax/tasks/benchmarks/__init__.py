"""The surveys' downstream benchmarks as seqio tasks in T5's text-to-text format, one module per family.

`glue`, `superglue`, `squad`, `summarization` and `translation` each register their tasks on import
(`ptmjax.configurables` imports them all), over TFDS data that a user prepares; registering reads nothing.
Each has a `register_*` function (gin-configurable) that registers them again with another vocabulary
and name prefix, e.g. a converted model's own vocabulary.
"""
