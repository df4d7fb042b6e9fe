"""The parameters of a run's best evaluation so far, by one metric, in their own model folder MODEL_DIR/best/.

```
MODEL_DIR/best/              a folder of parameters alone (ptmjax/training/params_folder.py)
  best.json                  {"metric", "mode", "step", "value"}
```

Why a folder of its own rather than Orbax's `best_fn` on the run's
checkpoints: with `best_fn` Orbax keeps the best `max_to_keep` checkpoints and
deletes the newest ones, so a killed run could no longer resume from its last
step; here checkpoints/ keeps the newest and resuming is as before, while
best/ is a model folder that `ptmjax eval --model_dir MODEL_DIR/best`,
`ptmjax convert --from` and `train.init_checkpoint` read. A resumed run
replays the steps after its checkpoint, which give the same values again,
so best.json (saved after the parameters) stays right; a value must beat the
best strictly to replace it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from ptmjax.storage.model_dir import ModelDir
from ptmjax.training.params_folder import ParamsFolder

BEST_DIR = "best"
BEST_FILE = "best.json"
MODES = ("max", "min")


class BestCheckpoint:
    """Keeps MODEL_DIR/best/ at the step whose `metric` is highest (mode 'max') or lowest ('min').

    `config` is the run's config.gin text; `base` the run's base folder and step
    (ptmjax/training/saved_part.py) when it saves only what it trains. With `read_only` (every process but
    the first of a multi-host run) the process takes part in the (collective)
    saves but writes no file itself.
    """

    def __init__(
        self, model_dir: str, metric: str, mode: str, config: str, read_only: bool = False,
        base: tuple[ModelDir, int] | None = None,
    ):
        if mode not in MODES:
            raise ValueError(f"train.best_checkpoint_mode={mode!r} is unknown; use 'max' or 'min'")
        self.folder = ModelDir(os.path.join(model_dir, BEST_DIR))
        self.metric, self.mode, self.read_only = metric, mode, read_only
        self.record = self._read_record()
        self._params = ParamsFolder(model_dir, BEST_DIR, config, read_only, base)

    @property
    def record_path(self) -> str:
        return os.path.join(self.folder.path, BEST_FILE)

    def update(self, step: int, metrics: Mapping[str, float], params: Any) -> bool:
        """Saves `params` as the best if `metrics[self.metric]` beats the best so far; returns whether it did."""
        if self.metric not in metrics:
            raise ValueError(
                f"train.best_checkpoint_metric={self.metric!r} is not among the evaluated metrics "
                f"{sorted(metrics)}; pick one of them"
            )
        value = float(metrics[self.metric])
        if self.record is not None:
            best = self.record["value"]
            if not (value > best if self.mode == "max" else value < best):
                return False
        self._params.save(step, params)
        self.record = {"metric": self.metric, "mode": self.mode, "step": int(step), "value": value}
        if not self.read_only:
            with open(self.record_path, "w") as f:
                json.dump(self.record, f, indent=2)
                f.write("\n")
        return True

    def close(self) -> None:
        self._params.close()

    def _read_record(self) -> dict[str, Any] | None:
        """best.json of an earlier (interrupted) run of the same folder, if any; it must track the same metric."""
        if not os.path.isfile(self.record_path):
            return None
        with open(self.record_path) as f:
            record = json.load(f)
        if (record["metric"], record["mode"]) != (self.metric, self.mode):
            raise ValueError(
                f"{self.record_path} tracks {record['metric']!r} ({record['mode']}), not {self.metric!r} "
                f"({self.mode}); bind train.best_checkpoint_metric/mode to match, or move {self.folder.path} away"
            )
        return record
