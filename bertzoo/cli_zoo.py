"""``bertzoo zoo list|show`` (the preset registry) and ``bertzoo viz`` (attention heatmaps)."""

from __future__ import annotations

from .cli import main  # noqa: F401
