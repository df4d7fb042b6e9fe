"""MoE options for tests of `MoeBlock` alone: a `MoeConfig` of a model with one stack of `layers` layers."""

import dataclasses

from ptmjax.layers.moe import MoeConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoeOptions(MoeConfig):
    layers: int = 2

    def layer_stacks(self) -> dict[str, int]:
        return {"layers": self.layers}
