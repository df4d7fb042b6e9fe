"""How a loaded model shows itself: `repr` and a notebook table (`_repr_html_`) of its `summary()`."""

from __future__ import annotations

import html


class SummaryRepr:
    """Mixin for a class with `module`, `mesh` and `summary() -> {row: text}`."""

    def summary(self) -> dict[str, str]:
        raise NotImplementedError

    def mesh_summary(self) -> str:
        """The mesh's axes of size > 1 and its device count, or '1 device'."""
        devices = self.mesh.devices.size
        axes = ", ".join(f"{axis}={size}" for axis, size in self.mesh.shape.items() if size > 1)
        return f"{axes} ({devices} devices)" if axes else "1 device"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(" + ", ".join(f"{k}: {v}" for k, v in self.summary().items()) + ")"

    def _repr_html_(self) -> str:
        cell = 'style="text-align:left"'
        body = "".join(
            f"<tr><th {cell}>{html.escape(k)}</th><td {cell}>{html.escape(v)}</td></tr>"
            for k, v in self.summary().items()
        )
        return f"<table><caption>{html.escape(type(self.module).__name__)}</caption><tbody>{body}</tbody></table>"
