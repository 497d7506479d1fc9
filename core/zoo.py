"""The zoo's preset registry: one small TOML file per system (core/presets/), validated when loaded.

A preset is::

    description = "one line"
    paper = "which seed paper it implements"
    [train]
    key = value        # any TrainConfig field (trainer/config.py)

``bertzoo train --preset NAME`` starts from it; ``--preset path/to/file.toml`` takes a user's copy. Listing and
validating import no torch, except to check the keys of a preset's ``encoder_overrides``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields
from pathlib import Path

from .errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

PRESETS_DIR = Path(__file__).parent / "presets"
TOP_LEVEL_KEYS = ("description", "paper", "train")


class PresetError(UserError, ValueError):
    """A preset that does not exist or does not validate; the message names the file and the key."""


@dataclass(frozen=True)
class Preset:
    name: str
    path: Path
    description: str
    paper: str
    train: dict  # TrainConfig fields

    def config(self, **overrides):
        """The resolved TrainConfig: dataclass defaults, then this preset, then ``overrides``."""
        from bertzoo.trainer.config import TrainConfig

        values = {**self.train, **overrides, "preset": self.name}
        # Encoder overrides add to the preset's rather than replace them: --encoder num_hidden_layers=2 on the SSAF
        # preset keeps its sparsegen-lin attention.
        values["encoder_overrides"] = {**self.train.get("encoder_overrides", {}), **overrides.get("encoder_overrides", {})}
        try:
            return TrainConfig(**values)
        except (TypeError, ValueError) as e:
            if overrides:  # the preset alone was validated when it was loaded: an override is wrong
                raise
            raise PresetError(f"{self.path}: {e}") from e


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.toml"))


def load_preset(name_or_path: str | Path) -> Preset:
    """A bundled preset by name, or a TOML file by path."""
    path = Path(name_or_path)
    if path.suffix != ".toml":
        path = PRESETS_DIR / f"{name_or_path}.toml"
        if not path.is_file():
            raise PresetError(f"no preset named {str(name_or_path)!r}; bundled presets: {', '.join(preset_names())} "
                              "(or give the path of a .toml file)")
    if not path.is_file():
        raise PresetError(f"preset file {path} does not exist")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise PresetError(f"{path}: not valid TOML: {e}") from e
    unknown = sorted(set(data) - set(TOP_LEVEL_KEYS))
    if unknown:
        raise PresetError(f"{path}: unknown top-level key(s) {unknown}; a preset has {list(TOP_LEVEL_KEYS)}")
    for key in ("description", "paper"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise PresetError(f"{path}: '{key}' must be a non-empty string")
    train = data.get("train", {})
    if not isinstance(train, dict):
        raise PresetError(f"{path}: [train] must be a table of TrainConfig fields")
    _check_train_keys(path, train)
    preset = Preset(path.stem, path, data["description"].strip(), data["paper"].strip(), train)
    preset.config()  # validates values (choices, ranges) now, with the file named
    return preset


def _check_train_keys(path: Path, train: dict) -> None:
    from bertzoo.trainer.config import TrainConfig

    known = {f.name for f in fields(TrainConfig)}
    for key in sorted(train):
        if key == "preset":
            raise PresetError(f"{path}: [train] must not set 'preset' (it is the preset's own name)")
        if key not in known:
            close = [k for k in sorted(known) if k.split("_")[0] == key.split("_")[0]]
            hint = f"; did you mean one of {close}?" if close else ""
            raise PresetError(f"{path}: unknown [train] key {key!r}{hint}")
    overrides = train.get("encoder_overrides", {})
    if not isinstance(overrides, dict):
        raise PresetError(f"{path}: [train] encoder_overrides must be a table")
    if overrides:
        from bertzoo.trainer.model import EncoderConfig  # imports torch: only for presets that change the encoder

        encoder_keys = {f.name for f in fields(EncoderConfig)}
        for key in sorted(set(overrides) - encoder_keys):
            raise PresetError(f"{path}: unknown encoder_overrides key {key!r}; known: {sorted(encoder_keys)}")
