"""The model API: a Flax module with its family record, the one way every tool initialises parameters (real or
abstract), draws rngs, builds batches, computes the loss and scores and decodes targets.

Why a registry of plain `Family` records (ptmjax/families/registry.py) instead of a model base class per family
(T5X's `BaseModel`): the train step is family-free, so a family differs only in data (its kind, feature
converter and field names) and a few functions (its loss, the logits its targets are scored against, its
decoding); the Flax modules stay plain `nn.Module`s that know nothing of training.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from ptmjax import decoding
from ptmjax.families import losses
from ptmjax.families.chunked_logits import chunked_token_cross_entropy
from ptmjax.families.family import Family
from ptmjax.families.losses import Stats
from ptmjax.families.registry import family_of
from ptmjax.families.token_loss import LossConfig
from ptmjax.layers import layer_stack

Array = jax.Array
Batch = Mapping[str, Array]
EVAL_SAMPLE_SEED = 0  # eval draws (ELECTRA's generator samples) use a fixed key, so evaluations compare


@dataclasses.dataclass(frozen=True)
class ModelApi:
    """A Flax module with its family: parameters, rngs, batches, loss and scores.

    Every method is pure over explicit parameters; jit them as needed.
    """

    module: nn.Module
    family: Family
    # Variables `forward` (the loss) applies the module with besides its parameters: a run's layer schedule
    # (ptmjax/training/layer_schedule.py), set per step by `with_variables`.
    variables: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False, hash=False)

    def with_variables(self, variables: Mapping[str, Any]) -> ModelApi:
        """This API, its `forward` (and `loss`) applying the module with `variables` beside the parameters."""
        return dataclasses.replace(self, variables=dict(variables))

    def rngs(self, rng: jax.Array | None, train: bool) -> dict[str, jax.Array]:
        """The rngs of one application: 'dropout' in training, and the family's own streams.

        Without `rng` (evaluation), the family's streams draw from a fixed key.
        """
        if rng is None:
            rng = jax.random.key(EVAL_SAMPLE_SEED)
        rngs = {name: jax.random.fold_in(rng, i + 1) for i, name in enumerate(self.family.rng_streams)}
        if train:
            rngs["dropout"] = rng
        return rngs

    def init(self, rng: jax.Array) -> Any:
        """The parameters, boxed with their logical axes (nn.Partitioned).

        The family's init inputs (one token each for a language model) suffice: parameter shapes do not
        depend on length.
        Under `jax.eval_shape` this allocates nothing.
        """
        return self.module.init({"params": rng, **self.rngs(rng, train=False)}, **self._dummy_inputs())["params"]

    def init_around(self, rng: jax.Array, present: Any) -> Any:
        """The parameters (unboxed): those of `present`, and the rest initialised as `init(rng)` would, but with
        `present` in place, so an initialiser that reads another parameter (prompt tuning's 'vocab' init reads
        the token table) reads the given one: a restored checkpoint's, when fine-tuning starts."""
        _, variables = self.module.apply(
            {"params": present}, **self._dummy_inputs(), rngs={"params": rng, **self.rngs(rng, train=False)},
            mutable=["params"],
        )
        return nn.unbox(variables["params"])

    def _dummy_inputs(self) -> dict[str, Array]:
        return {name: jnp.ones(spec.shape, spec.dtype) for name, spec in self.family.init_inputs.items()}

    @functools.cached_property
    def boxed_abstract_params(self) -> Any:
        """`init`'s result as ShapeDtypeStructs in nn.Partitioned boxes; nothing is allocated."""
        return jax.eval_shape(self.init, jax.random.key(0))

    @property
    def abstract_params(self) -> Any:
        """The parameters' shapes and dtypes (ShapeDtypeStructs), unboxed."""
        return nn.unbox(self.boxed_abstract_params)

    @property
    def logical_axes(self) -> Any:
        """The parameters' logical axis names (a tree of PartitionSpecs)."""
        return nn.get_partition_spec(self.boxed_abstract_params)

    @property
    def scanning(self) -> layer_stack.LayerStacks | None:
        """The config if the module scans its layers, else None."""
        return layer_stack.scanning_config(self.module)

    def unscanned(self) -> ModelApi:
        """The same model with plain (unscanned) layers: the layout the optimizer, golden files and
        Hugging Face see. `layer_stack.scan` / `unscan` convert parameters between the two."""
        return self.with_scan_layers(False) if self.scanning else self

    def with_scan_layers(self, scan_layers: bool) -> ModelApi | None:
        """The same model with `scan_layers` set; None for a family without layer stacks."""
        other = layer_stack.with_scan_layers(self.module, scan_layers)
        return None if other is None else model_api(other)

    def model_inputs(self, batch: Batch) -> dict[str, Array]:
        """The features of `batch` the module takes: all but the target fields."""
        return {name: value for name, value in batch.items() if name not in self.family.target_fields}

    def loss(
        self, params: Any, batch: Batch, loss_config: LossConfig, dropout_rng: jax.Array | None = None
    ) -> tuple[Array, Array, Stats]:
        """Runs the module on `batch` (dropout on iff `dropout_rng` is given).

        Returns (summed token loss, per-batch loss including the sown aux losses, stats);
        see ptmjax/training/steps.py for how the train step combines them.
        With `loss_config.logits_chunk_size` the module gives its final hidden states and the
        logits are made a chunk of positions at a time (ptmjax/families/chunked_logits.py).
        """
        outputs, variables = self.forward(params, batch, loss_config, dropout_rng)
        return self.loss_terms(params, outputs, variables, batch, loss_config)

    def forward(
        self, params: Any, batch: Batch, loss_config: LossConfig, dropout_rng: jax.Array | None = None,
        mutable: tuple[str, ...] = ("losses",),
    ) -> tuple[Any, Mapping[str, Any]]:
        """The module's outputs on `batch` as `loss` reads them (the final hidden states with
        `loss_config.logits_chunk_size`), and its sown `mutable` collections."""
        if self.family.loss is None:
            raise ValueError(
                f"{type(self.module).__name__} is not trained on its own; train the model that holds it "
                "(ELECTRA's discriminator: ElectraPretraining)"
            )
        train = dropout_rng is not None
        chunked = loss_config.logits_chunk_size is not None
        if chunked:
            self.check_chunkable()
        return self.module.apply(
            {"params": params, **self.variables}, **self.model_inputs(batch), enable_dropout=train,
            rngs=self.rngs(dropout_rng, train), mutable=list(mutable), method="hidden_states" if chunked else None,
        )

    def loss_terms(
        self, params: Any, outputs: Any, variables: Mapping[str, Any], batch: Batch, loss_config: LossConfig
    ) -> tuple[Array, Array, Stats]:
        """`loss` of the outputs and sown variables `forward` gave."""
        if loss_config.logits_chunk_size is not None:
            terms = losses.chunked_sequence_to_sequence_loss(self.logits_fn(params), outputs, batch, loss_config)
        else:
            terms = self.family.loss(outputs, batch, loss_config)
        sown = jax.tree.leaves(variables.get("losses", {}))
        aux = sum((jnp.sum(x.astype(jnp.float32)) for x in sown), jnp.zeros((), jnp.float32))
        stats = terms.stats
        if sown:  # fixed when the step is traced: a model without MoE layers has no 'moe_aux_loss'
            tokens = stats.counts["token_loss"]
            stats = stats.merge(Stats.of(moe_aux_loss=(aux * tokens, tokens)))
        return terms.token_loss, terms.batch_loss + aux, stats

    def logits_fn(self, params: Any):
        """The output layer alone, final hidden states [b, c, embed] -> logits [b, c, vocab] (T5, BART, GPT-2)."""
        return functools.partial(self.module.apply, {"params": params}, method="logits")

    def check_chunkable(self) -> None:
        """Raise unless the module is a language model with `hidden_states` and `logits` methods (T5, BART, GPT-2)."""
        methods = all(callable(getattr(self.module, name, None)) for name in ("hidden_states", "logits"))
        if self.family.loss is not losses.sequence_to_sequence_loss or not methods:
            raise ValueError(
                f"LossConfig.logits_chunk_size needs T5, BART or GPT-2, got {type(self.module).__name__}; "
                "set LossConfig.logits_chunk_size = None for this model"
            )

    def score(self, params: Any, batch: Batch, logits_chunk_size: int | None = None) -> Array:
        """float32 [b]: each row's log-likelihood of its targets, `sum_t w_t log p(y_t | ...)`.

        The targets and weights are the family's (`Family.targets`, `Family.loss_weights`):
        the decoder targets of an encoder-decoder or decoder-only model, the
        masked positions of an MLM (a pseudo-log-likelihood). No dropout. With
        `logits_chunk_size` (T5, BART, GPT-2) the logits are made that many
        positions at a time, as the chunked loss makes them.
        """
        if logits_chunk_size is None:
            return self.score_and_greedy(params, batch)[0]
        targets = self._scored_targets(batch)
        self.check_chunkable()
        hidden = self.module.apply({"params": params}, **self.model_inputs(batch), rngs=self.rngs(None, False),
                                   method="hidden_states")
        token_log_probs = -chunked_token_cross_entropy(self.logits_fn(params), hidden, targets, logits_chunk_size)[0]
        return jnp.sum(token_log_probs * batch[self.family.loss_weights].astype(jnp.float32), axis=-1)

    def score_and_greedy(self, params: Any, batch: Batch) -> tuple[Array, Array]:
        """(`score`, bool [b]: whether every weighted target is its position's most likely token, so that greedy
        decoding would produce the targets: lm-evaluation-harness's `is_greedy`)."""
        targets = self._scored_targets(batch)
        outputs = self.module.apply({"params": params}, **self.model_inputs(batch), rngs=self.rngs(None, False))
        log_probs = jax.nn.log_softmax(self.family.target_logits(outputs).astype(jnp.float32), axis=-1)
        token_log_probs = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]  # [b, t]
        weights = batch[self.family.loss_weights]
        greedy = jnp.all((jnp.argmax(log_probs, axis=-1) == targets) | (weights == 0), axis=-1)
        return jnp.sum(token_log_probs * weights.astype(jnp.float32), axis=-1), greedy

    def _scored_targets(self, batch: Batch) -> Array:
        """The family's target tokens; raises for a model without any (a task head, ELECTRA's discriminator)."""
        if self.family.targets is None:
            what = "a fine-tuning head" if self.family.task_head else "an encoder trained inside another model"
            raise ValueError(
                f"{type(self.module).__name__} is {what} without target tokens to score; score with a "
                "language model (T5, BART, GPT-2) or a masked-LM encoder"
            )
        return batch[self.family.targets]

    def head_predictions(self, params: Any, batch: Batch) -> Array:
        """A task head's prediction per row (class ids, values, tag ids per token, answer spans); no dropout."""
        if self.family.head_predictions is None:
            raise ValueError(
                f"{type(self.module).__name__} has no task head; heads are the models of "
                "ptmjax/models/encoder_tasks.py and gpt2_tasks.py"
            )
        outputs = self.module.apply({"params": params}, **self.model_inputs(batch), rngs=self.rngs(None, False))
        return self.family.head_predictions(outputs, batch)

    def predict(
        self, params: Any, batch: Batch, config: decoding.DecodeConfig, ids: decoding.GenerationIds,
        rng: jax.Array | None = None,
    ) -> decoding.DecodeOutput:
        """Decodes `batch` with a key/value cache as `config` says (ptmjax/decoding); pure, so jit it
        with `config` and `ids` static. Encoder-decoders read 'encoder_input_tokens'; decoder-only
        models a prompt in 'decoder_input_tokens' (see decoding.prefill)."""
        if self.family.predict is None:
            raise ValueError(
                f"{type(self.module).__name__} does not generate text; decode with an encoder-decoder (T5, BART) "
                "or a decoder-only model (GPT-2)"
            )
        return self.family.predict(self.module, params, batch, config, ids, rng)


def model_api(module: nn.Module) -> ModelApi:
    """`module` with its registered family (raises for an unknown class)."""
    return ModelApi(module, family_of(module))
