"""Parsing shared by the sub-commands: KEY=VALUE overrides (--encoder, --set)."""

from __future__ import annotations

import json

import click


def parse_overrides(pairs: tuple[str, ...]) -> dict:
    overrides = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--encoder or --set")
        try:
            overrides[key] = json.loads(raw)
        except json.JSONDecodeError:
            overrides[key] = raw  # a bare string such as attention=sparsegen_lin
    return overrides
