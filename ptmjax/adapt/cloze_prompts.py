"""Discrete prompts for masked LMs (PET, LM-BFF): a template and a verbalizer turn classification into a cloze.

`ClozePrompt("{text} It is about {mask} .", ("json", "os", ...))` puts an
example's text at `{text}` and the model's mask token at `{mask}`; class c is
the single token of its verbalizer word c. A class's score is the masked LM's
logit of that token at the mask, and the zero-shot prediction is the
highest-scoring class (Schick and Schütze, 2021; Gao et al., 2021).

Fine-tuning on the cloze (PET) trains the masked LM itself: `cloze_rows`
gives each example as a masked-LM row whose only target is the gold class's
token at the mask, which `register_cloze_task` offers to `ptmjax train` with
the model's own masked-LM family; the loss is the cross-entropy over the whole
vocabulary at the mask. The text is cut, never the template, to fit a length.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import seqio
import tensorflow as tf
from flax import linen as nn

from ptmjax.families.model_api import model_api
from ptmjax.families.registry import MASKED_LM
from ptmjax.objectives import common
from ptmjax.tasks import registry

TEXT, MASK = "{text}", "{mask}"


@dataclasses.dataclass(frozen=True)
class ClozePrompt:
    """A template with one `{text}` and one `{mask}`, and one verbalizer word per class."""

    template: str
    verbalizer: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.template.count(TEXT) != 1 or self.template.count(MASK) != 1:
            raise ValueError(f"cloze template {self.template!r} needs exactly one {TEXT} and one {MASK}")
        if len(set(self.verbalizer)) != len(self.verbalizer) or len(self.verbalizer) < 2:
            raise ValueError(f"verbalizer {self.verbalizer!r} needs two or more distinct words, one per class")
        object.__setattr__(self, "verbalizer", tuple(self.verbalizer))

    def class_ids(self, vocabulary: seqio.Vocabulary) -> np.ndarray:
        """int32 [classes]: each verbalizer word's token; a word of several tokens is named."""
        ids = []
        for word in self.verbalizer:
            tokens = vocabulary.encode(word)
            if len(tokens) != 1:
                pieces = [vocabulary.decode([t]) for t in tokens]
                raise ValueError(f"verbalizer word {word!r} is {len(tokens)} tokens {pieces}; pick words of one token")
            ids.append(tokens[0])
        return np.asarray(ids, np.int32)

    def encode(self, vocabulary: seqio.Vocabulary, text: str, length: int, mask_id: int) -> tuple[list[int], int]:
        """The prompt's token ids with EOS (at most `length`, the text cut to fit) and the mask's position.

        The template's literal parts are encoded on their own, each as SentencePiece encodes a text's start."""
        parts = [part for part in re.split(r"(\{text\}|\{mask\})", self.template) if part.strip()]
        literal = {i: vocabulary.encode(part) for i, part in enumerate(parts) if part not in (TEXT, MASK)}
        budget = length - 2 - sum(len(ids) for ids in literal.values())  # the mask and EOS
        if budget < 1:
            raise ValueError(f"cloze template {self.template!r} leaves no room for text in {length} tokens")
        ids: list[int] = []
        for i, part in enumerate(parts):
            if part == MASK:
                at = len(ids)
            ids += [mask_id] if part == MASK else vocabulary.encode(text)[:budget] if part == TEXT else literal[i]
        return [*ids, vocabulary.eos_id], at


def cloze_rows(
    prompt: ClozePrompt, vocabulary: seqio.Vocabulary, examples: Iterable[tuple[str, int]], length: int,
    mask_id: int | None = None,
) -> dict[str, np.ndarray]:
    """Masked-LM rows of (text, class) examples, padded to `length`: 'input_tokens' (the prompt),
    'target_tokens' (the prompt with the class token at the mask), 'loss_mask' (1 at the mask)."""
    mask_id = common.default_mask_id(vocabulary, mask_id, "cloze prompt")
    class_ids = prompt.class_ids(vocabulary)
    rows = {name: [] for name in ("input_tokens", "target_tokens", "loss_mask")}
    for text, label in examples:
        ids, at = prompt.encode(vocabulary, text, length, mask_id)
        padded = np.zeros(length, np.int32)
        padded[: len(ids)] = ids
        target = padded.copy()
        target[at] = class_ids[label]
        rows["input_tokens"].append(padded)
        rows["target_tokens"].append(target)
        rows["loss_mask"].append((np.arange(length) == at).astype(np.int32))
    return {name: np.stack(values) for name, values in rows.items()}


def cloze_scores(model: nn.Module, params: Any, input_tokens: np.ndarray, loss_mask: np.ndarray,
                 class_ids: np.ndarray, batch_size: int = 32) -> np.ndarray:
    """float32 [n, classes]: the masked LM's logit of each class token at each row's mask."""
    api = model_api(model)
    if api.family.loss is not MASKED_LM.loss:
        raise ValueError(f"cloze prompts score masked LMs (BERT, RoBERTa, ALBERT); {type(model).__name__} is not one")

    @jax.jit
    def scores(params, tokens, at):
        logits = api.family.target_logits(api.module.apply({"params": params}, input_tokens=tokens))  # [b, s, v]
        at_mask = jnp.sum(logits * at[..., None].astype(logits.dtype), axis=1)  # [b, v]
        return at_mask[:, class_ids]

    out = [np.asarray(scores(params, input_tokens[i : i + batch_size], loss_mask[i : i + batch_size]))
           for i in range(0, len(input_tokens), batch_size)]
    return np.concatenate(out)


def register_cloze_task(
    name: str, prompt: ClozePrompt, vocabulary: seqio.Vocabulary,
    examples_by_split: dict[str, Sequence[tuple[str, int]]], length: int, metric_fns: Sequence[Any] = (),
) -> seqio.Task:
    """A seqio task of the cloze rows of each split, for `ptmjax train` of a masked LM (PET fine-tuning).

    Its features are those of ptmjax/data/feature_converters.py `MaskedLmFeatureConverter` at `length`.
    """

    def dataset_fn(split: str, shuffle_files: bool, seed: int | None = None) -> tf.data.Dataset:
        rows = cloze_rows(prompt, vocabulary, examples_by_split[split], length)
        dataset = tf.data.Dataset.from_tensor_slices(
            {"inputs": rows["input_tokens"], "targets": rows["target_tokens"], "loss_mask": rows["loss_mask"]}
        )
        return dataset.shuffle(len(rows["loss_mask"]), seed=seed) if shuffle_files else dataset

    features = {key: seqio.Feature(vocabulary, add_eos=False) for key in ("inputs", "targets")}
    source = seqio.FunctionDataSource(dataset_fn, splits=tuple(examples_by_split))
    return registry.register_task(name, source, [], vocabulary, metric_fns, features=features)

