"""Mixtures whose rates follow from task sizes: temperature sampling, as XLM and mT5 use.

With n_i training examples in task i and N = sum(n_i), task i is sampled with
probability p_i proportional to (n_i / N) ** (1 / T)
(`ptmjax.data.temperature_sampling.temperature_sampling_rates`, here as `mixtures.temperature_sampling_rates`):

* T = 1: proportional to size;
* T -> infinity (`math.inf`): uniform over the non-empty tasks;
* mT5 uses T = 1 / 0.3 = 3.33; XLM samples languages with T = 2 (alpha = 0.5).

`register_temperature_mixture` registers a seqio mixture with these rates,
counting each task's examples in its 'train' split unless sizes are given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import gin
import seqio

from ptmjax.data.temperature_sampling import temperature_sampling_rates
from ptmjax.tasks import registry


def count_examples(task_name: str, split: str = "train") -> int:
    """The number of examples in a registered task's source split (its own count, else by reading it)."""
    if task_name not in seqio.TaskRegistry.names():
        known = sorted(name for name in seqio.TaskRegistry.names() if name.startswith("ptmjax"))
        raise ValueError(f"unknown task {task_name!r}; register it first (ptmjax tasks: {', '.join(known)})")
    task = seqio.TaskRegistry.get(task_name)
    if split not in task.splits:
        raise ValueError(f"task {task_name!r} has no split {split!r}; known: {', '.join(task.splits)}")
    count = task.num_input_examples(split)
    if count is None:
        count = int(task.source.get_dataset(split=split, shuffle=False).reduce(0, lambda n, _: n + 1))
    return count


@gin.configurable
def register_temperature_mixture(
    name: str,
    task_names: Sequence[str],
    temperature: float,
    sizes: Mapping[str, int] | None = None,
    split: str = "train",
) -> seqio.Mixture:
    """Registers (or replaces) mixture `name` of `task_names` with temperature-sampling rates.

    Args:
      name: the mixture name.
      task_names: registered tasks.
      temperature: T of p_i ~ (n_i / N) ** (1 / T).
      sizes: examples per task; None counts each task's `split` (source examples, e.g. documents).
      split: the split counted when sizes is None.
    """
    if not task_names:
        raise ValueError(f"mixture {name!r} needs at least one task")
    if sizes is None:
        sizes = {task: count_examples(task, split) for task in task_names}
    missing = [task for task in task_names if task not in sizes]
    if missing:
        raise ValueError(f"sizes {dict(sizes)} lack tasks {missing} of mixture {name!r}")
    rates = temperature_sampling_rates({task: sizes[task] for task in task_names}, temperature)
    return registry.register_mixture(name, [(task, rates[task]) for task in task_names])
