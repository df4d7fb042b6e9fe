"""PNG plots of probing results (matplotlib, Agg backend): attention statistics as layers x heads heatmaps,
one example's attention maps, and probe accuracy by layer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def plot_attention_statistics(statistics: Mapping[str, np.ndarray], path: str) -> str:
    """One heatmap per statistic ([layers, heads] each, layer 1 at the top) side by side; returns `path`."""
    fig, axes = plt.subplots(1, len(statistics), figsize=(3.6 * len(statistics), 3.2), squeeze=False)
    for ax, (name, values) in zip(axes[0], statistics.items(), strict=True):
        image = ax.imshow(values, aspect="auto", cmap="viridis")
        ax.set(title=name, xlabel="head", ylabel="layer")
        ax.set_xticks(range(values.shape[1]), [str(i + 1) for i in range(values.shape[1])])
        ax.set_yticks(range(values.shape[0]), [str(i + 1) for i in range(values.shape[0])])
        fig.colorbar(image, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_attention_maps(attention: np.ndarray, tokens: Sequence[str], path: str) -> str:
    """One example's maps, attention [layers, heads, q, k] over its `tokens` (q = k = len(tokens)), as a
    layers x heads grid (queries down, keys across); returns `path`."""
    layers, heads = attention.shape[:2]
    fig, axes = plt.subplots(layers, heads, figsize=(2.2 * heads, 2.2 * layers), squeeze=False)
    labels = tokens if len(tokens) <= 24 else None
    for layer in range(layers):
        for head in range(heads):
            ax = axes[layer][head]
            ax.imshow(attention[layer, head], vmin=0.0, vmax=1.0, cmap="Blues")
            ax.set_title(f"layer {layer + 1} head {head + 1}", fontsize=7)
            if labels is None:
                ax.set_xticks([])
                ax.set_yticks([])
            else:
                ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=5)
                ax.set_yticks(range(len(labels)), labels, fontsize=5)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_probe_accuracy(layers: Sequence[int], accuracy: Sequence[float], chance: float, path: str) -> str:
    """Validation accuracy (0-100) of the probe of each layer (0 = embeddings), with the chance level."""
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(layers, accuracy, marker="o", label="linear probe")
    ax.axhline(chance, color="grey", linestyle="--", label="majority class")
    ax.set(xlabel="layer (0 = embeddings)", ylabel="validation accuracy (%)", ylim=(0, 100))
    ax.set_xticks(list(layers))
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
