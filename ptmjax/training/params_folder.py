"""A model folder of parameters alone that a run keeps beside its checkpoints: MODEL_DIR/best/, MODEL_DIR/ema/.

```
MODEL_DIR/<name>/
  config.gin                 the run's resolved config
  checkpoints/<step>/        the parameters alone ({'step', 'params'}, as an import), one step only
  base.json                  (runs that save only what they train) as the run's
```

Every tool reads it as it reads the run's folder: `ptmjax infer` and `eval
--model_dir MODEL_DIR/<name>`, `ptmjax convert --to-hf`, `ptmjax.load`,
`train.init_checkpoint`.
"""

from __future__ import annotations

import os
from typing import Any

from ptmjax.storage.checkpoints import Checkpointer
from ptmjax.storage.model_dir import ModelDir


class ParamsFolder:
    """MODEL_DIR/`name`/ of a run whose resolved config is `config`, over the run's `base` if it has one.
    With `read_only` (every process but the first of a multi-host run) the process takes part in the
    (collective) saves but writes no file itself. `asynchronous` saves write in the background while
    training goes on (the next save, and closing, wait for them); otherwise a save returns once on disk."""

    def __init__(self, model_dir: str, name: str, config: str, read_only: bool = False,
                 base: tuple[ModelDir, int] | None = None, asynchronous: bool = False):
        self.folder = ModelDir(os.path.join(model_dir, name))
        self.read_only = read_only
        if not read_only:
            os.makedirs(self.folder.path, exist_ok=True)
            with open(self.folder.config_path, "w") as f:
                f.write(config)
            if base is not None:  # a run that saves only what it trains: so does this folder
                self.folder.write_base(*base)
        self.asynchronous = asynchronous
        self._checkpointer = Checkpointer(self.folder.checkpoints_path, max_to_keep=1, asynchronous=asynchronous)

    def save(self, step: int, params: Any) -> None:
        """Makes `params` the folder's parameters, at `step` (a step it holds already is kept: a replayed step
        after a resume gives the same values)."""
        self._checkpointer.wait()
        if step not in self._checkpointer.all_steps():
            self._checkpointer.save_params(step, params)
            if not self.asynchronous:
                self._checkpointer.wait()

    def close(self) -> None:
        self._checkpointer.close()
