"""Imports everything gin can bind, so that gin files need no `import` lines.

Importing this module also registers the seqio tasks and mixtures.
"""

import gin

from ptmjax import partitioning  # noqa: F401
from ptmjax.data import downstream_tasks, language_tags, mixtures, objective_tasks, summary_tasks, tasks  # noqa: F401
from ptmjax.evaluation.tasks import glue, squad, summarization, superglue, translation
from ptmjax.models import albert, bart, bert, electra, encoder_tasks, gpt2, gpt2_tasks, permutation_lm, t5
from ptmjax.objectives import translation_lm  # noqa: F401
from ptmjax.training import checkpoints, loop, losses, multihost, nonfinite, optimizers, schedules  # noqa: F401

gin.external_configurable(t5.EncoderDecoder, module="ptmjax.models")
gin.external_configurable(gpt2.GPT2, module="ptmjax.models")
gin.external_configurable(bert.Bert, module="ptmjax.models")
gin.external_configurable(bart.Bart, module="ptmjax.models")
gin.external_configurable(albert.Albert, module="ptmjax.models")
gin.external_configurable(electra.ElectraPretraining, module="ptmjax.models")
gin.external_configurable(electra.ElectraDiscriminator, module="ptmjax.models")
gin.external_configurable(electra.ElectraGenerator, module="ptmjax.models")
gin.external_configurable(permutation_lm.PermutationLM, module="ptmjax.models")
gin.external_configurable(encoder_tasks.EncoderForSequenceClassification, module="ptmjax.models")
gin.external_configurable(encoder_tasks.EncoderForTokenClassification, module="ptmjax.models")
gin.external_configurable(encoder_tasks.EncoderForQuestionAnswering, module="ptmjax.models")
gin.external_configurable(gpt2_tasks.GPT2ForSequenceClassification, module="ptmjax.models")
gin.external_configurable(tasks.register_text_files_task, module="ptmjax.data.tasks")
gin.external_configurable(tasks.register_mixture, module="ptmjax.data.tasks")
gin.external_configurable(glue.register_glue_tasks, module="ptmjax.evaluation.tasks")
gin.external_configurable(superglue.register_super_glue_tasks, module="ptmjax.evaluation.tasks")
gin.external_configurable(squad.register_squad_task, module="ptmjax.evaluation.tasks")
gin.external_configurable(summarization.register_summarization_tasks, module="ptmjax.evaluation.tasks")
gin.external_configurable(translation.register_translation_task, module="ptmjax.evaluation.tasks")
