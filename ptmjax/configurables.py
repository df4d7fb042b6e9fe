"""Imports everything gin can bind, so that gin files need no `import` lines.

Importing this module also registers the seqio tasks and mixtures.
"""

import gin
from flax import linen as nn  # noqa: F401  (kept for gin's @nn... references in user files)

from ptmjax import checkpoints, partitioning  # noqa: F401
from ptmjax.data import tasks  # noqa: F401
from ptmjax.models import t5
from ptmjax.training import loop, losses, optimizers, schedules  # noqa: F401

gin.external_configurable(t5.EncoderDecoder, module="ptmjax.models")
