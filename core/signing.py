"""Ed25519 signatures of an artifact's manifest (``cryptography``, which the serve and export extras install)."""

from __future__ import annotations

from pathlib import Path

from .errors import UserError


class SigningError(UserError):
    """A key file that cannot be used; the message names it."""


def _load(path: str | Path, private: bool):
    try:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
        from cryptography.hazmat.primitives.serialization import load_pem_private_key, load_pem_public_key
    except ImportError as e:
        raise SigningError("signing needs the cryptography package: pip install cryptography") from e
    try:
        data = Path(path).read_bytes()
        key = load_pem_private_key(data, password=None) if private else load_pem_public_key(data)
    except (OSError, ValueError, TypeError) as e:
        raise SigningError(f"{path}: not a readable PEM {'private' if private else 'public'} key ({e})") from e
    expected = Ed25519PrivateKey if private else Ed25519PublicKey
    if not isinstance(key, expected):
        raise SigningError(f"{path}: an Ed25519 key is needed (openssl genpkey -algorithm ed25519), got "
                           f"{type(key).__name__}")
    return key


def sign(message: bytes, private_key: str | Path) -> bytes:
    return _load(private_key, private=True).sign(message)


def verify_signature(message: bytes, signature: bytes, public_key: str | Path) -> bool:
    from cryptography.exceptions import InvalidSignature

    try:
        _load(public_key, private=False).verify(signature, message)
    except InvalidSignature:
        return False
    return True
