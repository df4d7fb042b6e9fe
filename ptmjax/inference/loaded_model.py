"""`LoadedModel`: a generative model with its parameters on a mesh, its vocabulary and generation ids,
generating from and scoring texts (`ptmjax.load` makes one)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import seqio
from flax import linen as nn
from jax.sharding import Mesh

from ptmjax import partitioning
from ptmjax.data.fixed_batches import bucket_length, fixed_batches, round_up
from ptmjax.decoding import DecodeConfig, DecodeOutput, GenerationIds
from ptmjax.decoding.sharded import jit_predict
from ptmjax.inference.loaded_base import Loaded
from ptmjax.inference.rows import RowFormat
from ptmjax.inference.text import Inputs, check_texts, encode, fit_to_limit, until_eos

DEFAULT_BATCH_SIZE = 8


@dataclasses.dataclass(frozen=True)
class Prediction:
    """One input's decodes, best first: texts (before EOS), their token ids, and their scores
    (the model's log-likelihood; beam search divides it by the length penalty)."""

    inputs: str
    outputs: tuple[str, ...]
    scores: tuple[float, ...]
    tokens: tuple[tuple[int, ...], ...]


@dataclasses.dataclass(eq=False, repr=False)
class LoadedModel(Loaded):
    """A model ready to generate and score.

    module: the Flax module; params: its parameters, laid out on `mesh` by `rules`;
    vocabulary, generation_ids: how text becomes ids and where decoding starts and stops;
    row_format: how ids become rows (inference/rows.py); source: where it was loaded from;
    batch_size: rows per jitted call (rounded up to the mesh's data-parallel size);
    task_name, task_feature_lengths: a run's training task and lengths (None otherwise);
    max_input_length: the most ids an input may have (None: as many as the positions allow) and
    max_input_length_source, where that limit comes from: a longer input is refused, or cut with
    `truncate=True`, before it reaches the model (a long prompt would compile and allocate for its length).
    """

    module: nn.Module
    params: Any
    vocabulary: seqio.Vocabulary
    generation_ids: GenerationIds
    mesh: Mesh
    rules: partitioning.Rules
    row_format: RowFormat
    source: str
    batch_size: int = DEFAULT_BATCH_SIZE
    task_name: str | None = None
    task_feature_lengths: Mapping[str, int] | None = None
    max_input_length: int | None = None
    max_input_length_source: str = "max_input_length"
    _predictors: dict[DecodeConfig, Callable[..., DecodeOutput]] = dataclasses.field(default_factory=dict, repr=False)
    _scorer: Callable[..., tuple[jax.Array, jax.Array]] | None = dataclasses.field(default=None, repr=False)

    @property
    def decoder_only(self) -> bool:
        return self.api.family.decoder_only

    def decode_config(self, config: DecodeConfig | None = None, **overrides: Any) -> DecodeConfig:
        """`config` (default: DecodeConfig() with its gin bindings) with `overrides` replaced."""
        config = DecodeConfig() if config is None else config
        fields = {f.name for f in dataclasses.fields(DecodeConfig)}
        unknown = sorted(set(overrides) - fields)
        if unknown:
            raise ValueError(f"unknown decode options {unknown}; DecodeConfig has {', '.join(sorted(fields))}")
        return dataclasses.replace(config, **overrides)

    def generate(
        self, inputs: Inputs, config: DecodeConfig | None = None, *, seed: int = 0,
        batch_size: int | None = None, truncate: bool = False, **overrides: Any,
    ) -> list[str] | list[list[str]]:
        """The generated text of each input: a string, or a list of num_decodes strings (best first) when
        num_decodes > 1. `inputs`: texts, or token id lists used as they are (special tokens included).
        `overrides`: DecodeConfig fields (method='beam', num_beams=4, ...); sampling draws from `seed`.
        An input longer than the model takes (`max_input_length`, the positions) is an error, or with
        `truncate` cut to its first ids with a warning."""
        config = self.decode_config(config, **overrides)
        predictions = self.predict(inputs, config, seed=seed, batch_size=batch_size, truncate=truncate)
        if config.num_decodes == 1:
            return [p.outputs[0] for p in predictions]
        return [list(p.outputs) for p in predictions]

    def predict(
        self, inputs: Inputs, config: DecodeConfig | None = None, *, seed: int = 0,
        batch_size: int | None = None, truncate: bool = False, **overrides: Any,
    ) -> list[Prediction]:
        """`generate` with scores and token ids: one `Prediction` per input."""
        batches = self.iter_predict(inputs, config, seed=seed, batch_size=batch_size, truncate=truncate, **overrides)
        return [p for batch in batches for p in batch]

    def iter_predict(
        self, inputs: Inputs, config: DecodeConfig | None = None, *, seed: int = 0,
        batch_size: int | None = None, truncate: bool = False, **overrides: Any,
    ) -> Iterator[list[Prediction]]:
        """`predict` one batch at a time (for progress bars). Every batch has the same shape: one compile.
        Bad inputs are refused here, before the first batch is asked for."""
        config = self.decode_config(config, **overrides)
        texts, ids = self._encoded(inputs, "inputs", self.row_format.add_eos)
        room = self._prompt_limit(config.max_decode_length)
        ids = self._fitted(ids, truncate, room)
        rows = self.row_format.predict_rows(ids, bucket_length(max(map(len, ids)), room))
        return self._predicted_batches(texts, rows, config, seed, batch_size)

    def _predicted_batches(
        self, texts: list[str], rows: Mapping[str, np.ndarray], config: DecodeConfig, seed: int,
        batch_size: int | None,
    ) -> Iterator[list[Prediction]]:
        run = self._predictor(config)
        eos = self.generation_ids.for_decoding().eos_token_id
        key = jax.random.key(seed)
        start = 0
        for index, (batch, real) in enumerate(fixed_batches(rows, self._batch_size(batch_size))):
            rng = jax.random.fold_in(key, index) if config.method == "sample" else None
            output = jax.device_get(run(self.params, batch, rng))
            batch_predictions = []
            for row in range(real):
                tokens = tuple(tuple(until_eos(t, eos)) for t in output.tokens[row])
                batch_predictions.append(Prediction(
                    texts[start + row], tuple(self.vocabulary.decode(list(t)) for t in tokens),
                    tuple(float(s) for s in output.scores[row]), tokens,
                ))
            start += real
            yield batch_predictions

    def score(self, inputs: Inputs, targets: Inputs, *, batch_size: int | None = None,
              truncate: bool = False) -> np.ndarray:
        """float32 [n]: log p(target_i | input_i), EOS included (`ModelApi.score` of the family's rows);
        inputs longer than `max_input_length` as `generate` treats them."""
        return self.score_and_greedy(inputs, targets, batch_size=batch_size, truncate=truncate)[0]

    def score_and_greedy(self, inputs: Inputs, targets: Inputs, *, batch_size: int | None = None,
                         truncate: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(`score`, bool [n]: whether greedy decoding would produce each target, every one of its tokens the most
        likely at its position). Token id lists are used as they are, a target's EOS only where it has one."""
        _, input_ids = self._encoded(inputs, "inputs", self.row_format.add_eos)
        input_ids = self._fitted(input_ids, truncate, None)
        _, target_ids = self._encoded(targets, "targets", True, bos=not self.row_format.causal)
        if len(input_ids) != len(target_ids):
            raise ValueError(f"{len(input_ids)} inputs but {len(target_ids)} targets; pass one target per input")
        longest_input, longest_target = max(map(len, input_ids)), max(map(len, target_ids))
        limit = getattr(self.config, "max_length", None)
        if self.row_format.causal:  # a row is one stream of input + target ids shifted by one: only its length counts
            longest = max(len(x) + len(y) for x, y in zip(input_ids, target_ids, strict=True)) - 1
            input_length, target_length = 1, bucket_length(longest, limit)  # score_rows: input + target - 1 long
        elif self.decoder_only and limit is not None:  # seqio's PrefixLM rows are input + target ids long
            input_length = bucket_length(longest_input, limit - longest_target)
            target_length = bucket_length(longest_target, limit - input_length)
        else:
            input_length, target_length = bucket_length(longest_input, limit), bucket_length(longest_target, limit)
        rows = self.row_format.score_rows(input_ids, target_ids, input_length, target_length)
        scorer = self._jitted_score()
        scores, greedy = [], []
        with jax.set_mesh(self.mesh):
            for batch, real in fixed_batches(rows, self._batch_size(batch_size)):
                batch_scores, batch_greedy = jax.device_get(scorer(self.params, batch))
                scores.append(np.asarray(batch_scores)[:real])
                greedy.append(np.asarray(batch_greedy)[:real])
        return np.concatenate(scores), np.concatenate(greedy)

    def _encoded(
        self, inputs: Inputs, name: str, add_eos: bool, bos: bool = True
    ) -> tuple[list[str], list[list[int]]]:
        """(texts, token ids) of strings (encoded) or of token id lists (used as they are, decoded for the texts)."""
        if not isinstance(inputs, str) and len(inputs) and all(_is_ids(x) for x in inputs):
            ids = [[int(i) for i in x] for x in inputs]
            return [self.vocabulary.decode(x) for x in ids], ids
        texts = check_texts(inputs, name)
        bos_id = self.row_format.bos_id if bos else None
        return texts, [encode(self.vocabulary, t, bos_id, add_eos) for t in texts]

    def _fitted(self, ids: list[list[int]], truncate: bool, room: int | None) -> list[list[int]]:
        """`ids` within `max_input_length` and the decoder-only prompt `room` (see `fit_to_limit`)."""
        limits = [(self.max_input_length, self.max_input_length_source),
                  (room, f"{type(self.module).__name__}'s positions less the decode length")]
        known = [(limit, why) for limit, why in limits if limit is not None]
        return fit_to_limit(ids, *min(known), truncate) if known else ids

    def _prompt_limit(self, max_decode_length: int) -> int | None:
        """The most prompt ids a row may hold: a learned position table bounds prompt and decode together."""
        limit = getattr(self.config, "max_length", None)
        if limit is None or not self.decoder_only:
            return limit
        room = limit - max_decode_length - (0 if self.row_format.causal else 1)  # PrefixLM rows start with 0
        if room < 1:
            raise ValueError(
                f"max_decode_length={max_decode_length} leaves no room for a prompt in {type(self.module).__name__}'s "
                f"{limit} positions; lower it"
            )
        return room

    def _batch_size(self, batch_size: int | None) -> int:
        size = self.batch_size if batch_size is None else batch_size
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"batch_size must be a positive int, got {size!r}")
        return round_up(size, partitioning.data_parallel_size(self.mesh))

    def _predictor(self, config: DecodeConfig) -> Callable[..., DecodeOutput]:
        """The jitted decode of `config` (jit caches one executable per batch shape)."""
        if config not in self._predictors:
            self._predictors[config] = jit_predict(
                self.api.predict, self.api.boxed_abstract_params, self.mesh, self.rules, config, self.generation_ids
            )
        return self._predictors[config]

    def _jitted_score(self) -> Callable[..., tuple[jax.Array, jax.Array]]:
        if self._scorer is None:
            api, rules = self.api, self.rules
            with jax.set_mesh(self.mesh):
                shardings = partitioning.logical_shardings(api.boxed_abstract_params, self.mesh, rules)

            def score(params: Any, batch: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
                with nn.logical_axis_rules(rules):
                    return api.score_and_greedy(params, batch)

            rows = partitioning.batch_sharding(self.mesh)
            self._scorer = jax.jit(score, in_shardings=(shardings, rows), out_shardings=(rows, rows))
        return self._scorer

    def summary(self) -> dict[str, str]:
        """What `_repr_html_` shows: model, parameters, vocabulary, generation ids, mesh, source."""
        ids = ", ".join(f"{k}={v}" for k, v in self.generation_ids.to_hf().items())
        family = self.api.family.kind.value
        rows = "causal: one stream of ids" if self.row_format.causal else self.api.family.feature_converter.__name__
        return {
            "model": f"{type(self.module).__name__} ({type(self.config).__name__}, {family})",
            "parameters": f"{self.num_params:,}",
            "vocabulary": f"{type(self.vocabulary).__name__}, {self.vocabulary.vocab_size:,} ids",
            "generation ids": ids,
            "rows": rows,
            "mesh": self.mesh_summary(),
            "source": self.source,
        }


def _is_ids(value: Any) -> bool:
    """Whether `value` is a non-empty sequence of ints (token ids)."""
    if isinstance(value, np.ndarray):
        return value.ndim == 1 and value.size > 0 and np.issubdtype(value.dtype, np.integer)
    return isinstance(value, Sequence) and len(value) > 0 and all(isinstance(i, int | np.integer) for i in value)
