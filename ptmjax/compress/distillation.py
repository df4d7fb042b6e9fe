"""Knowledge distillation: the run's model (the student) trained to match a frozen teacher in one jitted step,
on the same mesh, the teacher's parameters in the train state's extra entry 'teacher' (ptmjax/compress/teacher.py).

`train.objective = @Distillation()` makes the train step minimise

    hard_weight * the family's own loss
    + soft_weight * T² KL(teacher || student) of the target logits at temperature T, on the loss's weighted positions
    + hidden_weight * a hidden-state loss between mapped layers (DistilBERT's cosine, TinyBERT's squared error,
      or BERT-PKD's patient loss on the first position's states, summed over the layer pairs and weighted by the
      row's targets)
    + attention_weight * an attention loss between mapped layers (MiniLM's KL, or TinyBERT's squared error)
    + value_weight * MiniLM's value-relation KL between mapped layers

each weight a number or a schedule of the run's steps (ptmjax/compress/distillation_weights.py), each term
summed over the weighted target positions like the token loss (the step divides by their count); the layer
terms are averaged over the mapped layers and over each row's tokens, weighted as the row's targets are. The
teacher runs without dropout and gets no gradient. With `LossConfig.logits_chunk_size` (T5, BART, GPT-2) both
models' logits are made a chunk of positions at a time, so neither's [batch, length, vocab] logits exist at
once. The layer losses read the stack the probing tools read (ptmjax/adapt/probing/layer_features.py): the
encoder family, GPT-2, and T5's and BART's encoder; they need unscanned layers (and, for attention, equal head
counts and einsum attention). Hidden states of unequal widths are compared by squared error through TinyBERT's
learned projection, which the student carries (`hidden_projection(student, teacher_width)`,
ptmjax/compress/hidden_projection.py). The evaluation step, decoding, export and every tool see the student
alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from ptmjax.adapt.interception import settings_of
from ptmjax.adapt.probing.layer_features import probed_stack, recorded_layer_calls, stack_attention, stack_depth
from ptmjax.compress import distillation_losses as losses
from ptmjax.compress import fake_quantization, hidden_projection
from ptmjax.compress.distillation_weights import DistillationStep, Weight, bad_weights, is_on, scheduled, weight_at
from ptmjax.compress.fake_quantization import FakeQuantizationSettings
from ptmjax.compress.layer_maps import checked_layer_map
from ptmjax.compress.student_init import student_from_teacher
from ptmjax.compress.teacher import TEACHER, FrozenTeacher
from ptmjax.families.losses import Stats
from ptmjax.families.model_api import Batch, ModelApi, model_api
from ptmjax.families.token_loss import LossConfig
from ptmjax.layers import layer_stack

HIDDEN_LOSSES = {"cosine": losses.hidden_cosine, "mse": losses.hidden_mse}
PATIENT = "pkd"  # BERT-PKD's patient loss on the first position's ([CLS]) states, per row
ATTENTION_LOSSES = {"kl": losses.attention_kl, "mse": losses.attention_mse}


@dataclasses.dataclass(frozen=True)
class Distillation:
    """The distillation objective (see the module docstring).

    Attributes:
      teacher_dir: the teacher's model folder (a run's, or an import's); its newest checkpoint is read.
      teacher: the teacher's model; None: the student's own architecture (a fake-quantized student's float
        model). Bind it with a gin scope, e.g.
        `Distillation.teacher = @teacher/EncoderDecoder()` and `teacher/T5Config.num_encoder_layers = 12`.
      temperature: T of the soft targets.
      hard_weight, soft_weight, hidden_weight, attention_weight, value_weight: each term's weight (0 leaves it
        out), or an optax schedule of the step (ptmjax/compress/distillation_weights.py).
      hidden_loss: 'cosine', 'mse' or 'pkd' (BERT-PKD's normalised [CLS] states); 'mse' goes through the
        student's projection when it has one (`hidden_projection`; needed for unequal widths). attention_loss:
        'kl' or 'mse'.
      layers: the teacher layer of each student layer in the layer losses: 'uniform', 'last', 'alternate'
        (ptmjax/compress/layer_maps.py) or a list of teacher layer indices.
      init_layers: a fresh student starts from its teacher's parameters, each layer from the teacher layer this
        map gives it (DistilBERT: 'alternate', or [0, 2, 4, 7, 9, 11]) and the rest from the same paths
        (ptmjax/compress/student_init.py); None: the student's own initialisation.
    """

    teacher_dir: str
    teacher: nn.Module | None = None
    temperature: float = 2.0
    hard_weight: Weight = 1.0
    soft_weight: Weight = 1.0
    hidden_weight: Weight = 0.0
    attention_weight: Weight = 0.0
    value_weight: Weight = 0.0
    hidden_loss: str = "cosine"
    attention_loss: str = "kl"
    layers: str | Sequence[int] = "uniform"
    init_layers: str | Sequence[int] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, int | float) or self.temperature <= 0:
            raise ValueError(f"Distillation.temperature={self.temperature!r} must be a positive number, e.g. 2.0")
        bad = bad_weights(self._weights)
        if bad:
            raise ValueError(f"{', '.join(bad)}: each weight must be a number >= 0 (0 leaves its term out) or an "
                             "optax schedule, e.g. @optax.linear_schedule()")
        for name, value, known in (("hidden_loss", self.hidden_loss, [*HIDDEN_LOSSES, PATIENT]),
                                   ("attention_loss", self.attention_loss, ATTENTION_LOSSES)):
            if value not in known:
                raise ValueError(f"Distillation.{name}={value!r}: use one of {', '.join(known)}")

    def extra_state(self, model: nn.Module) -> tuple[FrozenTeacher] | tuple[FrozenTeacher, DistillationStep]:
        """The teacher's parameters (and the step count, for scheduled weights), for a run training `model`;
        checks first that the layer losses can map it."""
        teacher = FrozenTeacher(self.teacher_model(model), self.teacher_dir)
        self._check_projection(model, teacher.module)
        if self._reads_layers:
            self._layer_map(model_api(model), teacher.api)
        return (teacher, DistillationStep()) if scheduled(self._weights) else (teacher,)

    def teacher_model(self, student: nn.Module) -> nn.Module:
        """`teacher`, or the student's own architecture: a fake-quantized student's float model (TernaryBERT),
        without a projection."""
        if self.teacher is not None:
            return self.teacher
        if hidden_projection.settings_of(student) is not None:
            return self.teacher_model(hidden_projection.base_model(student))
        if settings_of(student, FakeQuantizationSettings) is not None:
            return fake_quantization.base_model(student)
        return student

    def initial_params(self, params: Any, extra: Mapping[str, Any]) -> Any | None:
        """The fresh student's parameters taken from the teacher's by `init_layers`; None without it."""
        if self.init_layers is None:
            return None
        return student_from_teacher(params, extra[TEACHER], self.init_layers)

    def __call__(
        self, api: ModelApi, params: Any, batch: Batch, loss_config: LossConfig, rng: jax.Array | None,
        extra: Mapping[str, Any],
    ) -> tuple[jax.Array, jax.Array, Stats, dict[str, Any]]:
        """The Objective (ptmjax/training/objective.py): the weighted terms, and each alone as a metric."""
        teacher_api = model_api(self.teacher_model(api.module))
        layers = self._reads_layers
        student, student_layers = self._forward(api, params, batch, loss_config, rng, layers)
        teacher, teacher_layers = self._forward(teacher_api, extra[TEACHER], batch, loss_config, None, layers)
        token_loss, batch_loss, stats = api.loss_terms(params, *student, batch, loss_config)
        weights = batch[api.family.loss_weights].astype(jnp.float32)
        tokens = jnp.sum(weights)
        weight = {name: weight_at(value, extra) for name, value in self._weights.items()}
        terms = {"distill_hard": weight["hard_weight"] * token_loss}
        if is_on(self.soft_weight):
            soft = self._soft(api, params, student[0], teacher_api, extra[TEACHER], teacher[0], loss_config)
            terms["distill_soft"] = weight["soft_weight"] * jnp.sum(soft * weights)
        if layers:
            terms |= self._layer_terms(api, params, teacher_api, student_layers, teacher_layers, batch, weights,
                                       weight)
        stats = stats.merge(Stats.of(**{name: (value, tokens) for name, value in terms.items()}))
        total = sum(terms.values())
        # 'loss' is the objective as optimised (Stats.metrics); each term is logged apart.
        return total, batch_loss, Stats({**stats.sums, "token_loss": total}, stats.counts), {}

    def _forward(
        self, api: ModelApi, params: Any, batch: Batch, loss_config: LossConfig, rng: jax.Array | None, layers: bool,
    ) -> tuple[tuple[Any, Mapping[str, Any]], tuple[list, Any]]:
        """(outputs, sown variables) as `ModelApi.forward` gives them, and the probed stack's (layer calls,
        intermediates) when the layer losses need them."""
        if not layers:
            return api.forward(params, batch, loss_config, rng), ([], None)
        with recorded_layer_calls(probed_stack(api.module)) as calls:
            outputs, variables = api.forward(params, batch, loss_config, rng, mutable=("losses", "intermediates"))
        return (outputs, variables), (calls, variables.get("intermediates"))

    def _soft(
        self, api: ModelApi, params: Any, student: Any, teacher_api: ModelApi, teacher_params: Any, teacher: Any,
        loss_config: LossConfig,
    ) -> jax.Array:
        """T² KL(teacher || student) at each target position."""
        if loss_config.logits_chunk_size is None:
            return losses.soft_cross_entropy(api.family.target_logits(student),
                                             teacher_api.family.target_logits(teacher), self.temperature)
        return losses.chunked_soft_cross_entropy(api.logits_fn(params), student, teacher_api.logits_fn(teacher_params),
                                                 teacher, self.temperature, loss_config.logits_chunk_size)

    def _layer_terms(
        self, api: ModelApi, params: Any, teacher_api: ModelApi, student: tuple[list, Any], teacher: tuple[list, Any],
        batch: Batch, weights: jax.Array, weight: Mapping[str, Any],
    ) -> dict[str, jax.Array]:
        """The hidden-state and attention terms, each averaged over the mapped layers and each row's real tokens,
        times the row's share of the target positions (`weights`, the loss's), so that they sum like the token
        loss; `weight`: each term's weight at this step."""
        mapping = self._layer_map(api, teacher_api)
        if len(student[0]) != len(mapping) or len(teacher[0]) <= max(mapping):
            raise AssertionError(f"recorded {len(student[0])} student and {len(teacher[0])} teacher layer calls "
                                 f"for the layer map {mapping}")
        stack = probed_stack(api.module)
        real = (batch[stack.tokens_field] != stack.pad_id).astype(jnp.float32)  # [b, s]
        row_targets = weights.sum(axis=-1) if weights.ndim > 1 else weights
        per_token = real * (row_targets / jnp.maximum(real.sum(axis=-1), 1.0))[:, None]  # sums to the weights' sum
        terms = {}
        if is_on(self.hidden_weight):
            pairs = [(student[0][i][1], teacher[0][j][1]) for i, j in enumerate(mapping)]
            if self.hidden_loss == PATIENT:  # summed over the layer pairs, as BERT-PKD's
                cls = [jnp.stack([pair[k][:, 0] for pair in pairs], axis=1) for k in (0, 1)]  # [b, layers, width]
                value = losses.patient_states(*cls) * row_targets
            else:
                projected = {"projection": hidden_projection.projection(api.module, params)} if (
                    self.hidden_loss == "mse" and hidden_projection.settings_of(api.module)) else {}
                value = sum(HIDDEN_LOSSES[self.hidden_loss](s, t, **projected) for s, t in pairs) / len(pairs)
                value = value * per_token
            terms["distill_hidden"] = weight["hidden_weight"] * jnp.sum(value)
        if is_on(self.attention_weight):
            s_att, t_att = stack_attention(student[1], stack), stack_attention(teacher[1], probed_stack(
                teacher_api.module))
            value = sum(ATTENTION_LOSSES[self.attention_loss](s_att[i], t_att[j], real)
                        for i, j in enumerate(mapping)) / len(mapping)
            terms["distill_attention"] = weight["attention_weight"] * jnp.sum(value * per_token)
        if is_on(self.value_weight):
            s_val, t_val = (stack_attention(sown[1], probed_stack(model.module), "values")
                            for sown, model in ((student, api), (teacher, teacher_api)))
            value = sum(losses.attention_kl(losses.value_relation(s_val[i], real), losses.value_relation(
                t_val[j], real), real) for i, j in enumerate(mapping)) / len(mapping)
            terms["distill_value"] = weight["value_weight"] * jnp.sum(value * per_token)
        return terms

    @property
    def _weights(self) -> dict[str, Weight]:
        return {name: getattr(self, name) for name in ("hard_weight", "soft_weight", "hidden_weight",
                                                       "attention_weight", "value_weight")}

    @property
    def _reads_layers(self) -> bool:
        return any(is_on(weight) for weight in (self.hidden_weight, self.attention_weight, self.value_weight))

    def _layer_map(self, api: ModelApi, teacher_api: ModelApi) -> list[int]:
        """The teacher layer of each student layer; one-line errors for what the layer losses cannot compare."""
        shapes = []
        for role, model in (("student", api), ("teacher", teacher_api)):
            config = model.module.config
            if layer_stack.scanning_config(model.module) is not None or getattr(config, "remat_policy",
                                                                                 "none") != "none":
                raise ValueError(f"the layer losses read the {role}'s layers one by one: set its scan_layers = False "
                                 "and remat_policy = 'none' (or Distillation.hidden_weight and attention_weight to 0)")
            if (self.attention_weight or self.value_weight) and getattr(config, "attention_kernel",
                                                                         "einsum") != "einsum":
                raise ValueError(f"Distillation.attention_weight and value_weight read the {role}'s attention, which "
                                 f"only attention_kernel = 'einsum' sows (it has {config.attention_kernel!r})")
            probed_stack(model.module)  # raises for a model without a probed stack
            shapes.append((stack_depth(model.module), config.d_model, config.num_heads))
        (student_layers, student_width, student_heads), (teacher_layers, teacher_width, teacher_heads) = shapes
        if self.hidden_weight and student_width != teacher_width and not hidden_projection.settings_of(api.module):
            fix = ("give the student TinyBERT's learned projection: train.model = @hidden_projection(), "
                   f"hidden_projection.teacher_width = {teacher_width}")
            if self.hidden_loss != "mse":
                fix = f"use Distillation.hidden_loss = 'mse' and {fix}"
            raise ValueError(f"Distillation.hidden_loss={self.hidden_loss!r} compares hidden states of equal widths; "
                             f"the student's are {student_width} wide, the teacher's {teacher_width}: {fix}")
        if (self.attention_weight or self.value_weight) and student_heads != teacher_heads:
            raise ValueError(f"Distillation.attention_weight and value_weight compare heads one to one; the student "
                             f"has {student_heads}, the teacher {teacher_heads}")
        return checked_layer_map(self.layers, student_layers, teacher_layers)

    def _check_projection(self, student: nn.Module, teacher: nn.Module) -> None:
        """Refuses a student's projection that the objective would not read, or of another width than the
        teacher's hidden states."""
        settings = hidden_projection.settings_of(student)
        if settings is None:
            return
        if not is_on(self.hidden_weight) or self.hidden_loss != "mse":
            raise ValueError("the student's hidden_projection is read only by Distillation.hidden_loss = 'mse' with "
                             f"hidden_weight > 0 (it has {self.hidden_loss!r}, {self.hidden_weight!r}); set them, or "
                             "train the model without hidden_projection")
        if settings.teacher_width != teacher.config.d_model:
            raise ValueError(f"hidden_projection.teacher_width={settings.teacher_width} but the teacher's hidden "
                             f"states are {teacher.config.d_model} wide; set it to {teacher.config.d_model}")
