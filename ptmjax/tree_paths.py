"""Naming the leaves of a pytree by 'a/b/0/c' paths, alike for live arrays and a checkpoint's saved metadata."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jax
from flax import traverse_util


def leaves_by_path(tree: Any) -> list[tuple[str, Any]]:
    """[(path, leaf)] of `tree` (none for None)."""
    if tree is None:
        return []
    return [(path_name(p), v) for p, v in jax.tree_util.tree_leaves_with_path(tree)]


def shapes_by_path(tree: Any) -> dict[str, tuple[int, ...]]:
    """{path: shape} of `tree`'s array leaves (arrays, ShapeDtypeStructs or saved ArrayMetadata)."""
    return {p: tuple(v.shape) for p, v in leaves_by_path(tree)}


def shape_differences(there: dict[str, tuple[int, ...]], here: dict[str, tuple[int, ...]], shown: int = 3) -> str:
    """'a/b is (2, 3) there, absent here; ... and 4 more' for the paths whose shapes differ between two
    {path: shape} maps (parameters first), '' when none do."""
    differences = [
        f"{path} is {there.get(path, 'absent')} there, {here.get(path, 'absent')} here"
        for path in sorted(there.keys() | here.keys(), key=lambda p: (not p.startswith("params/"), p))
        if there.get(path) != here.get(path)
    ]
    more = f" and {len(differences) - shown} more" if len(differences) > shown else ""
    return "; ".join(differences[:shown]) + more if differences else ""


def path_name(keys: tuple[Any, ...]) -> str:
    """'encoder/layers_0/kernel' of a key path: dict keys, attribute names and indices alike."""
    parts = []
    for key in keys:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return "/".join(parts)


def subtree(tree: Any, paths: Iterable[str]) -> dict:
    """The nested dict `tree` cut to the leaves at `paths`."""
    flat = traverse_util.flatten_dict(tree, sep="/")
    return traverse_util.unflatten_dict({path: flat[path] for path in paths}, sep="/")


def overlay(tree: Any, replacements: Any) -> dict:
    """The nested dict `tree` with the leaves that the nested dict `replacements` has replaced."""
    flat = traverse_util.flatten_dict(tree, sep="/")
    flat.update(traverse_util.flatten_dict(replacements, sep="/"))
    return traverse_util.unflatten_dict(flat, sep="/")
