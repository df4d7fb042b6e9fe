"""Imports everything gin can bind, so that gin files need no `import` lines.

Importing this module also registers the seqio tasks and mixtures.
"""

import gin
import optax

from ptmjax import partitioning  # noqa: F401
from ptmjax.adapt import adapters, bitfit, lora, p_tuning, prefix_tuning, prompt_tuning, sentence_embedding
from ptmjax.compress.distillation import Distillation
from ptmjax.compress.early_exit import EXIT_PARAMS, early_exit
from ptmjax.compress.early_exit_loss import ExitLoss
from ptmjax.compress.fake_quantization import fake_quantized
from ptmjax.compress.head_pruning import head_pruned
from ptmjax.compress.hidden_projection import hidden_projection
from ptmjax.compress.magnitude_pruning import MagnitudePruning
from ptmjax.compress.quantization import quantized
from ptmjax.compress.retention_search import RetentionSearch, retention_search
from ptmjax.compress.token_dropping import power_bert
from ptmjax.data import language_tags, segment_stream_converter  # noqa: F401
from ptmjax.families import token_loss  # noqa: F401
from ptmjax.families.registry import MODEL_CLASSES
from ptmjax.objectives import translation_lm  # noqa: F401
from ptmjax.storage import checkpoints  # noqa: F401
from ptmjax.tasks import (  # noqa: F401
    classification_head,
    docstring_pairs,
    documents,
    long_documents,
    mixtures,
    module_classification,
    multilingual,
    objective_mixture,
    pretraining,
    question_answering,
    registry,
    summaries,
    tagging,
)
from ptmjax.tasks.benchmarks import glue, squad, summarization, superglue, translation
from ptmjax.training import (  # noqa: F401
    layer_depth,
    loss_scaling,
    multihost,
    nonfinite,
    optimizers,
    progressive_layer_drop,
    progressive_stacking,
    recurrent_memory,
    run,
    schedules,
)

for model_class in MODEL_CLASSES:
    gin.external_configurable(model_class, module="ptmjax.models")
gin.external_configurable(lora.lora, module="ptmjax.adapt")
gin.external_configurable(Distillation, module="ptmjax.compress")
gin.external_configurable(hidden_projection, module="ptmjax.compress")
for weight_schedule in (optax.constant_schedule, optax.linear_schedule, optax.piecewise_constant_schedule,
                        optax.cosine_decay_schedule):  # the distillation weights' schedules
    gin.external_configurable(weight_schedule, module="optax")
gin.external_configurable(MagnitudePruning, module="ptmjax.compress")
gin.external_configurable(quantized, module="ptmjax.compress")
gin.external_configurable(head_pruned, module="ptmjax.compress")
gin.external_configurable(fake_quantized, module="ptmjax.compress")
gin.external_configurable(early_exit, module="ptmjax.compress")
gin.external_configurable(ExitLoss, module="ptmjax.compress")
gin.external_configurable(power_bert, module="ptmjax.compress")
gin.external_configurable(retention_search, module="ptmjax.compress")
gin.external_configurable(RetentionSearch, module="ptmjax.compress")
gin.external_configurable(adapters.adapters, module="ptmjax.adapt")
gin.external_configurable(prompt_tuning.prompt_tuning, module="ptmjax.adapt")
gin.external_configurable(p_tuning.p_tuning, module="ptmjax.adapt")
gin.external_configurable(prefix_tuning.prefix_tuning, module="ptmjax.adapt")
gin.external_configurable(sentence_embedding.sentence_encoder, module="ptmjax.adapt")
gin.external_configurable(pretraining.register_text_files_task, module="ptmjax.tasks")
gin.external_configurable(classification_head.register_module_head_task, module="ptmjax.tasks")
gin.external_configurable(docstring_pairs.register_pairs_task, module="ptmjax.tasks")
gin.external_configurable(tagging.register_tagging_task, module="ptmjax.tasks")
gin.external_configurable(question_answering.register_qa_task, module="ptmjax.tasks")
gin.external_configurable(registry.register_mixture, module="ptmjax.tasks")
gin.external_configurable(glue.register_glue_tasks, module="ptmjax.tasks")
gin.external_configurable(superglue.register_super_glue_tasks, module="ptmjax.tasks")
gin.external_configurable(squad.register_squad_task, module="ptmjax.tasks")
gin.external_configurable(summarization.register_summarization_tasks, module="ptmjax.tasks")
gin.external_configurable(translation.register_translation_task, module="ptmjax.tasks")
# Parameter-path patterns for train.trainable, e.g. `train.trainable = [%ptmjax.adapt.LORA_PARAMS]`.
gin.constant("ptmjax.adapt.LORA_PARAMS", lora.LORA_PARAMS)
gin.constant("ptmjax.adapt.BITFIT_PARAMS", bitfit.BITFIT_PARAMS)
gin.constant("ptmjax.adapt.ADAPTER_PARAMS", adapters.ADAPTER_PARAMS)
gin.constant("ptmjax.adapt.PROMPT_PARAMS", prompt_tuning.PROMPT_PARAMS)
gin.constant("ptmjax.adapt.PREFIX_PARAMS", prefix_tuning.PREFIX_PARAMS)
gin.constant("ptmjax.compress.EXIT_PARAMS", EXIT_PARAMS)  # the exits alone: DeeBERT's second stage
