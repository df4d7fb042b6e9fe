"""Which teacher layer each student layer learns from (or starts as): the layer maps of DistilBERT, TinyBERT
and BERT-PKD, as lists of 0-based teacher layer indices, one per student layer."""

from __future__ import annotations

LAYER_MAPS = ("uniform", "last", "alternate")


def layer_map(kind: str, student_layers: int, teacher_layers: int) -> list[int]:
    """The teacher layer of each of `student_layers` layers, by `kind`:

    - 'uniform': TinyBERT's g(m) = m·N/M, student layer m (1-based) to teacher layer m·N/M, so the last
      layers meet (12 -> 4: [2, 5, 8, 11]); where M divides N, BERT-PKD-skip's every (N/M)-th layer
      (12 -> 6: [1, 3, 5, 7, 9, 11]).
    - 'last': BERT-PKD-last, the last M teacher layers (12 -> 6: [6, 7, 8, 9, 10, 11]).
    - 'alternate': DistilBERT's initialisation, every other teacher layer from the first
      (12 -> 6: [0, 2, 4, 6, 8, 10]); DistilBERT's own list, [0, 2, 4, 7, 9, 11], can be given as a list.
    """
    if kind not in LAYER_MAPS:
        raise ValueError(f"unknown layer map {kind!r}: use one of {', '.join(LAYER_MAPS)}, or a list of teacher "
                         "layers")
    if not 0 < student_layers <= teacher_layers:
        raise ValueError(f"a student of {student_layers} layers cannot map onto a teacher of {teacher_layers}: it "
                         "needs between 1 and the teacher's number of layers")
    if kind == "last":
        return list(range(teacher_layers - student_layers, teacher_layers))
    if kind == "alternate":
        stride = teacher_layers // student_layers
        return [m * stride for m in range(student_layers)]
    return [(m + 1) * teacher_layers // student_layers - 1 for m in range(student_layers)]


def checked_layer_map(layers: str | list[int], student_layers: int, teacher_layers: int) -> list[int]:
    """`layer_map(layers, ...)` for a kind; a list given, checked: one valid teacher layer per student layer."""
    if isinstance(layers, str):
        return layer_map(layers, student_layers, teacher_layers)
    layers = list(layers)
    if len(layers) != student_layers or not all(0 <= i < teacher_layers for i in layers):
        raise ValueError(f"layer map {layers} must give each of the student's {student_layers} layers a teacher "
                         f"layer in 0..{teacher_layers - 1}")
    return layers
