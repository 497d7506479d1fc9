"""Vendored third-party files (no code): each folder says what it holds, its version, hashes and licence."""
