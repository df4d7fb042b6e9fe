"""A student's first parameters taken from its teacher's: DistilBERT's initialisation from every other layer.

Each student parameter inside a layer stack (`.../layers_{i}/...`) is taken from the teacher's layer the layer
map gives student layer i in the same stack; every other parameter (embeddings, final norms, heads) from the
teacher's parameter of the same path. Parameters the teacher lacks, or holds with another shape (another
width), keep their fresh initialisation.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
from flax import traverse_util

from ptmjax.compress.layer_maps import checked_layer_map
from ptmjax.tree_paths import overlay, shapes_by_path

LAYER = re.compile(r"^(?P<stack>(?:.*?/)?)layers_(?P<index>\d+)(?P<rest>/.*)$")


def stack_depths(shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
    """{stack prefix: number of layers} of a parameter tree's {path: shape} (unscanned layout)."""
    depths: dict[str, int] = {}
    for path in shapes:
        found = LAYER.match(path)
        if found:
            depths[found["stack"]] = max(depths.get(found["stack"], 0), int(found["index"]) + 1)
    return depths


def teacher_paths(student: dict[str, tuple[int, ...]], teacher: dict[str, tuple[int, ...]],
                  layers: str | Sequence[int]) -> dict[str, str]:
    """{student path: the teacher path it starts from} for the paths of equal shape (see the module doc)."""
    student_depths, teacher_depths = stack_depths(student), stack_depths(teacher)
    maps = {stack: checked_layer_map(layers, depth, teacher_depths.get(stack, 0))
            for stack, depth in student_depths.items() if stack in teacher_depths}
    sources = {}
    for path, shape in student.items():
        found = LAYER.match(path)
        source = path
        if found:
            if found["stack"] not in maps:
                continue
            source = f"{found['stack']}layers_{maps[found['stack']][int(found['index'])]}{found['rest']}"
        if teacher.get(source) == shape:
            sources[path] = source
    return sources


def student_from_teacher(student_params: Any, teacher_params: Any, layers: str | Sequence[int]) -> Any:
    """`student_params` with every parameter `teacher_paths` finds taken from `teacher_params`: copies, laid out
    as the teacher's (the same sharding rules give the same layout to arrays of the same path and shape)."""
    sources = teacher_paths(shapes_by_path(student_params), shapes_by_path(teacher_params), layers)
    teacher = traverse_util.flatten_dict(teacher_params, sep="/")
    taken = {path: jnp.copy(teacher[source]) for path, source in sources.items()}
    print(f"Initialised {len(taken)} of {len(shapes_by_path(student_params))} student parameter arrays from the "
          "teacher's")
    return overlay(student_params, traverse_util.unflatten_dict(taken, sep="/"))
