"""PNG figures: training curves and attention heatmaps (matplotlib, headless).

Every figure is written atomically (temp file + rename) so a crash never leaves a half-written PNG next to a
checkpoint.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on training machines; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    os.replace(tmp, path)
    return path


def line_plot(path: str | Path, series: dict[str, tuple[Sequence[float], Sequence[float]]], title: str, xlabel: str,
              ylabel: str) -> Path:
    """One axes, one line per named (x, y) series."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, (x, y) in series.items():
        ax.plot(list(x), list(y), label=name, linewidth=1.4)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    if len(series) > 1:
        ax.legend()
    return _save(fig, path)


def training_curves(log_path: str | Path, png_path: str | Path) -> Path | None:
    """Loss per task (and per auxiliary objective) against step, and dev metrics per evaluation, from a run's
    train_log.jsonl. Returns None when the log has nothing to plot yet."""
    losses: dict[str, tuple[list[int], list[float]]] = {}
    dev: dict[str, tuple[list[int], list[float]]] = {}
    for line in Path(log_path).read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        for name, value in record.get("loss", {}).items():
            xs, ys = losses.setdefault(name, ([], []))
            xs.append(record["step"])
            ys.append(value)
        for task, metrics in record.get("dev", {}).items():
            for name, value in metrics.items():
                if name in ("n", "total") or name.endswith("_total") or not isinstance(value, int | float):
                    continue
                xs, ys = dev.setdefault(f"{task} {name}", ([], []))
                xs.append(record["step"])
                ys.append(value / 100 if task == "qa" else value)  # QA EM/F1 are percentages
    if not losses:
        return None
    fig, axes = plt.subplots(1, 2 if dev else 1, figsize=(12 if dev else 7, 4), squeeze=False)
    for name, (x, y) in losses.items():
        axes[0, 0].plot(x, y, label=name, linewidth=1.2)
    axes[0, 0].set(title="training loss (mean over each logging window)", xlabel="step", ylabel="loss")
    axes[0, 0].legend(fontsize=8)
    axes[0, 0].grid(alpha=0.3)
    if dev:
        for name, (x, y) in dev.items():
            axes[0, 1].plot(x, y, marker="o", label=name, linewidth=1.2)
        axes[0, 1].set(title="dev metrics (QA rescaled to [0, 1])", xlabel="step", ylabel="value")
        axes[0, 1].legend(fontsize=7)
        axes[0, 1].grid(alpha=0.3)
    return _save(fig, png_path)


def attention_grid(path: str | Path, attentions: np.ndarray, tokens: Sequence[str], title: str,
                   heads: Sequence[int] | None = None) -> Path:
    """Heatmaps of one sentence's attention, layers as rows and heads as columns, tokens on both axes (query rows,
    key columns), as in the papers' figures. ``attentions``: [layers, heads, tokens, tokens]."""
    layers, num_heads = attentions.shape[:2]
    heads = list(range(num_heads)) if heads is None else list(heads)
    cell = 1.6 if len(tokens) <= 16 else 2.2
    fig, axes = plt.subplots(layers, len(heads), figsize=(cell * len(heads), cell * layers), squeeze=False)
    show_labels = len(tokens) <= 24  # beyond that the tick labels overlap into noise
    for i in range(layers):
        for j, h in enumerate(heads):
            ax = axes[i, j]
            ax.imshow(attentions[i, h], cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_title(f"head {h}", fontsize=7)
            if j == 0:
                ax.set_ylabel(f"layer {i}", fontsize=7)
            if show_labels and i == layers - 1:
                ax.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=max(3, 7 - len(tokens) // 8))
            if show_labels and j == 0:
                ax.set_yticks(range(len(tokens)), tokens, fontsize=max(3, 7 - len(tokens) // 8))
    zeros = float((attentions == 0).mean())
    fig.suptitle(f"{title}  (exact zeros: {zeros:.1%})", fontsize=10)
    return _save(fig, path)

