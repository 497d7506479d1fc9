"""``bertzoo pretrain``: masked-language-model pre-training, optionally with attention guidance (paper 003)."""

from __future__ import annotations

from .cli import main  # noqa: F401
