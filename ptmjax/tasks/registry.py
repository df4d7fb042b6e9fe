"""Registering seqio tasks and mixtures: every ptmjax task and mixture is registered through here.

Registering a name again replaces the old entry, so re-imports and notebooks do not crash.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence

import seqio

from ptmjax.data.without_autograph import without_autograph


def output_features(vocabulary: seqio.Vocabulary) -> dict[str, seqio.Feature]:
    """'inputs' and 'targets' int32 features sharing `vocabulary`, EOS appended."""
    return {
        "inputs": seqio.Feature(vocabulary, add_eos=True, required=False),
        "targets": seqio.Feature(vocabulary, add_eos=True),
    }


def objective_preprocessors(objective: Callable, text_key: str = "text", append_eos: bool = True) -> list[Callable]:
    """Text feature `text_key` -> tokenize -> cache point -> `objective` (-> EOS when `append_eos`).

    All but the cache point build their map functions without AutoGraph (`without_autograph`)."""
    return [
        without_autograph(functools.partial(seqio.preprocessors.rekey, key_map={"targets": text_key})),
        without_autograph(functools.partial(seqio.preprocessors.tokenize, copy_pretokenized=False)),
        seqio.CacheDatasetPlaceholder(),
        without_autograph(objective),
        *([without_autograph(seqio.preprocessors.append_eos_after_trim)] if append_eos else []),
    ]


def register_task(
    name: str,
    source: seqio.DataSource,
    preprocessors: Sequence[Callable],
    vocabulary: seqio.Vocabulary,
    metric_fns: Sequence[Callable] = (),
    postprocess_fn: Callable | None = None,
    features: Mapping[str, seqio.Feature] | None = None,
) -> seqio.Task:
    """Registers (or replaces) a task with 'inputs'/'targets' of `vocabulary` (or `features`), scored by
    `metric_fns` on the targets and the predictions that `postprocess_fn` makes of the decoded text."""
    seqio.TaskRegistry.remove(name)
    return seqio.TaskRegistry.add(
        name, source=source, output_features=dict(features or output_features(vocabulary)),
        preprocessors=list(preprocessors), metric_fns=list(metric_fns), postprocess_fn=postprocess_fn,
    )


def register_mixture(
    name: str, tasks_and_rates: Sequence[tuple[str | seqio.Task | seqio.Mixture, float]], **mixture_kwargs
) -> seqio.Mixture:
    """Registers (or replaces) a mixture of registered tasks, named or given as objects, with sampling rates.

    Gin-configurable, so a mixture needs no Python:
    `train.mixture_or_task_name = @register_mixture()`, `register_mixture.name = 'my_mix'`,
    `register_mixture.tasks_and_rates = [('ptmjax_stdlib_span_corruption', 1.0), (@register_text_files_task(), 3.0)]`.
    """
    entries = [(getattr(task, "name", task), rate) for task, rate in tasks_and_rates]
    registered = {*seqio.TaskRegistry.names(), *seqio.MixtureRegistry.names()}
    unknown = [task for task, _ in entries if task not in registered]
    if unknown:
        raise ValueError(f"mixture {name!r} names unregistered tasks {unknown}; register them first")
    seqio.MixtureRegistry.remove(name)
    return seqio.MixtureRegistry.add(name, entries, **mixture_kwargs)
