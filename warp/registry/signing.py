"""Signed versions: Ed25519 signatures in a manifest's envelope, checked against ``WARP_TRUSTED_KEYS``.

docs/formats/registry.md, "Signatures". The seal (``metadata.seal_sha256``) proves a manifest
was not edited after it was written, but anyone who can write the store can write a sealed
manifest. A signature proves who published a version, given a key the reader trusts:

* ``warp publish --sign-key KEY`` (an unencrypted Ed25519 private key: PEM from ``openssl genpkey
  -algorithm ed25519``, or OpenSSH from ``ssh-keygen -t ed25519 -N ''``) adds to ``metadata.signatures`` (a list: several signers) one
  ``{"algorithm": "ed25519", "key_id", "public_key", "signature"}``. The signed message is
  :func:`message`: a fixed context line, the dataset id and the version hash, so a signature
  cannot be moved to another version or another dataset. ``key_id`` is the first 16 hex of the
  SHA-256 of the raw 32-byte public key; ``public_key`` and ``signature`` are lowercase hex (not
  base64: a base64 string may begin with ``/``, which a manifest refuses as a local path).
* ``WARP_TRUSTED_KEYS`` names a file of public keys (:func:`trusted_keys`: OpenSSH
  ``ssh-ed25519 AAAA... comment`` lines and PEM ``PUBLIC KEY`` blocks; blank lines and ``#``
  comments skipped). When it is set, :func:`require_trusted` refuses every version that no key
  in it signed (:class:`~warpdata.core.errors.UntrustedVersionError`, exit 77, naming the
  version and the key ids it has); the store's and the read API's manifest loads call it, once
  per process per (version, signatures, key file).

``cryptography`` is imported on use (the ``sign`` extra): a reader without ``WARP_TRUSTED_KEYS``
never loads it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import threading
from dataclasses import dataclass
from typing import Any

from warpdata.core import envvars
from warpdata.core.canonical import canonical_json
from warpdata.core.errors import (
    ConfigError,
    ManifestCorruptedError,
    MissingInputError,
    UntrustedVersionError,
    UsageError,
    missing_dependency,
)
from warpdata.registry.manifest import SIGNATURES_KEY, Manifest

__all__ = ["ALGORITHM", "Signer", "SigningKey", "key_id", "load_signing_key", "message", "require_trusted",
           "sign", "signers", "trusted_keys"]

ALGORITHM = "ed25519"
CONTEXT = b"warp signed version v1\n"
KEY_HINT = "make one with 'openssl genpkey -algorithm ed25519 -out KEY.pem' (unencrypted PEM)"
TRUSTED_HINT = ("WARP_TRUSTED_KEYS names a file of Ed25519 public keys, one 'ssh-ed25519 AAAA... comment' "
                "line or PEM 'PUBLIC KEY' block each (docs/formats/registry.md, Signatures)")
_MAX_SIGNATURES = 64


def _crypto(feature: str):
    # lazy third-party import: cryptography is the `sign` extra, loaded only to sign or to check
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise missing_dependency(feature, "cryptography", extra="sign") from None
    return ed25519


def message(dataset_id: str, version_hash: str) -> bytes:
    """The bytes a signature covers: the context line, the dataset id and the version hash."""
    return CONTEXT + dataset_id.encode("utf-8") + b"\n" + version_hash.encode("ascii")


def key_id(raw_public: bytes) -> str:
    """A public key's id: the first 16 hex digits of the SHA-256 of its raw 32 bytes."""
    return hashlib.sha256(raw_public).hexdigest()[:16]


@dataclass(frozen=True)
class SigningKey:
    path: str
    key_id: str
    public_raw: bytes
    private: Any  # cryptography's Ed25519PrivateKey


def load_signing_key(path: str | os.PathLike) -> SigningKey:
    """A PEM Ed25519 private key file (``--sign-key``)."""
    ed25519 = _crypto("--sign-key")
    from cryptography.hazmat.primitives import serialization
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            data = f.read(1 << 16)
    except FileNotFoundError:
        raise MissingInputError(f"--sign-key {p}: no such file", hint=KEY_HINT) from None
    except IsADirectoryError:
        raise UsageError(f"--sign-key {p}: it is a directory", hint=KEY_HINT) from None
    try:
        key = serialization.load_ssh_private_key(data, password=None) \
            if data.lstrip().startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----") else \
            serialization.load_pem_private_key(data, password=None)
    except TypeError:  # encrypted
        raise UsageError(f"--sign-key {p}: the key is encrypted", hint=KEY_HINT) from None
    except ValueError:
        raise UsageError(f"--sign-key {p}: not a PEM private key", hint=KEY_HINT) from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise UsageError(f"--sign-key {p}: a {type(key).__name__.removeprefix('_')} key, not Ed25519", hint=KEY_HINT)
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return SigningKey(p, key_id(raw), raw, key)


def sign(manifest: Manifest, keys: list[SigningKey]) -> Manifest:
    """``manifest`` with one signature per key added to ``metadata.signatures`` (one per key id)."""
    keys = list({k.key_id: k for k in keys}.values())  # a key given twice signs once
    sigs = [s for s in _signatures(manifest, "manifest") if s["key_id"] not in {k.key_id for k in keys}]
    msg = message(manifest.dataset_id, manifest.version_hash)
    for k in keys:
        sigs.append({"algorithm": ALGORITHM, "key_id": k.key_id,
                     "public_key": k.public_raw.hex(), "signature": k.private.sign(msg).hex()})
    return Manifest(manifest.dataset_id, tables=manifest.tables, artifacts=manifest.artifacts,
                    bindings=manifest.bindings, stats=manifest.stats,
                    metadata={**manifest.metadata, SIGNATURES_KEY: sigs})


def _signatures(manifest: Manifest, source: str) -> list[dict[str, str]]:
    sigs = manifest.metadata.get(SIGNATURES_KEY, [])
    ok = isinstance(sigs, list) and len(sigs) <= _MAX_SIGNATURES and all(
        isinstance(s, dict) and all(isinstance(s.get(k), str) for k in ("algorithm", "key_id", "public_key", "signature"))
        for s in sigs)
    if not ok:
        raise ManifestCorruptedError(
            f"{source}: metadata.{SIGNATURES_KEY} is not a list of signatures "
            "({algorithm, key_id, public_key, signature})",
            hint="the store copy was altered: restore it, or delete it and publish the version again with --sign-key")
    return sigs


def _b64(s: str) -> bytes | None:
    try:
        return base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError):
        return None


def _hex(s: str) -> bytes | None:
    if not re.fullmatch(r"(?:[0-9a-f]{2})+", s):
        return None
    return bytes.fromhex(s)


@dataclass(frozen=True)
class Signer:
    """One signature of a version: its key id, whether it verifies (with the public key it
    carries, whose id it must be) and whether a trusted key of that id verifies it."""

    key_id: str
    algorithm: str
    valid: bool
    trusted: bool

    def to_dict(self) -> dict[str, Any]:
        return {"key_id": self.key_id, "algorithm": self.algorithm, "valid": self.valid, "trusted": self.trusted}


def _verifies(ed25519, raw: bytes | None, sig: bytes | None, msg: bytes) -> bool:
    if raw is None or sig is None or len(raw) != 32 or len(sig) != 64:
        return False
    from cryptography.exceptions import (
        InvalidSignature,  # lazy: cryptography is optional (the sign extra)
    )

    try:
        ed25519.Ed25519PublicKey.from_public_bytes(raw).verify(sig, msg)
        return True
    except (InvalidSignature, ValueError):  # a bad signature, or 32 bytes that are no public key
        return False


def signers(manifest: Manifest, trusted: dict[str, bytes] | None = None, *, source: str = "manifest") -> list[Signer]:
    """Every signature of ``manifest``, checked (``trusted``: key id -> raw public key)."""
    sigs = _signatures(manifest, source)
    if not sigs:
        return []
    ed25519 = _crypto("checking a version's signatures")
    msg = message(manifest.dataset_id, manifest.version_hash)
    out = []
    for s in sigs:
        raw, sig = _hex(s["public_key"]), _hex(s["signature"])
        ours = s["algorithm"] == ALGORITHM
        valid = ours and raw is not None and key_id(raw) == s["key_id"] and _verifies(ed25519, raw, sig, msg)
        t = (trusted or {}).get(s["key_id"])
        out.append(Signer(s["key_id"], s["algorithm"], valid, ours and t is not None and _verifies(ed25519, t, sig, msg)))
    return out


# -- trusted keys ----------------------------------------------------------------------------

_KEYS: dict[tuple[str, int, int], dict[str, bytes]] = {}
_VERIFIED: set[tuple[str, str, str, str]] = set()
_MU = threading.Lock()


def _ssh_key(blob: bytes) -> bytes | None:
    """The raw key of an OpenSSH ``ssh-ed25519`` wire-format public key, else None."""
    parts, i = [], 0
    while i + 4 <= len(blob) and len(parts) < 3:
        n = int.from_bytes(blob[i:i + 4], "big")
        parts.append(blob[i + 4:i + 4 + n])
        i += 4 + n
    if i != len(blob) or len(parts) != 2 or parts[0] != b"ssh-ed25519" or len(parts[1]) != 32:
        return None
    return parts[1]


def parse_trusted_keys(text: str, where: str) -> dict[str, bytes]:
    """Key id -> raw public key of every key in ``text`` (the format of ``WARP_TRUSTED_KEYS``)."""
    keys: dict[str, bytes] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line, no = lines[i].strip(), i + 1
        i += 1
        if not line or line.startswith("#"):
            continue
        if line.startswith("-----BEGIN PUBLIC KEY-----"):
            block = [line]
            while i < len(lines) and not block[-1].startswith("-----END"):
                block.append(lines[i].strip())
                i += 1
            raw = _pem_key(("\n".join(block) + "\n").encode("ascii", "replace"))
        else:
            fields = line.split()
            blob = _b64(fields[1]) if len(fields) >= 2 and fields[0] == "ssh-ed25519" else None
            raw = _ssh_key(blob) if blob is not None else None
        if raw is None:
            raise ConfigError(f"{where} line {no}: not an Ed25519 public key ('ssh-ed25519 AAAA...' or a PEM "
                              "'PUBLIC KEY' block)", hint=TRUSTED_HINT)
        keys[key_id(raw)] = raw
    if not keys:
        raise ConfigError(f"{where}: holds no public key, so no version would be read", hint=TRUSTED_HINT)
    return keys


def _pem_key(data: bytes) -> bytes | None:
    ed25519 = _crypto("WARP_TRUSTED_KEYS")
    from cryptography.hazmat.primitives import serialization
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError):
        return None
    if not isinstance(key, ed25519.Ed25519PublicKey):
        return None
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def trusted_keys(path: str) -> dict[str, bytes]:
    """The keys of the file ``WARP_TRUSTED_KEYS`` names, read again when it changes."""
    where = f"WARP_TRUSTED_KEYS={path}"
    try:
        st = os.stat(path)
        memo = _KEYS.get((path, st.st_mtime_ns, st.st_size))
        if memo is not None:
            return memo
        with open(path, "rb") as f:
            data = f.read(1 << 20)
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file", hint=TRUSTED_HINT) from None
    except OSError as e:
        raise ConfigError(f"{where}: cannot be read ({e.strerror})", hint=TRUSTED_HINT) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not UTF-8 text", hint=TRUSTED_HINT) from None
    keys = parse_trusted_keys(text, where)
    with _MU:
        _KEYS[(path, st.st_mtime_ns, st.st_size)] = keys
    return keys


def configured_keys() -> tuple[str, dict[str, bytes]] | None:
    """``(path, keys)`` when ``WARP_TRUSTED_KEYS`` is set, else None."""
    path = envvars.get("WARP_TRUSTED_KEYS")
    return (path, trusted_keys(path)) if path else None


def require_trusted(manifest: Manifest, source: str) -> None:
    """Refuse ``manifest`` unless a key of ``WARP_TRUSTED_KEYS`` signed it (nothing when unset)."""
    conf = configured_keys()
    if conf is None:
        return
    path, keys = conf
    sigs = manifest.metadata.get(SIGNATURES_KEY, [])
    memo = (manifest.dataset_id, manifest.version_hash,
            hashlib.sha256(canonical_json(sigs)).hexdigest() if sigs else "",
            hashlib.sha256(b"".join(sorted(keys.values()))).hexdigest())
    if memo in _VERIFIED:
        return
    found = signers(manifest, keys, source=source)
    if not any(s.trusted for s in found):
        has = ", ".join(f"{s.key_id} ({'trusted key, signature does not verify' if s.key_id in keys else 'untrusted'})"
                        for s in found) or "none: the version is unsigned"
        raise UntrustedVersionError(
            f"{manifest.dataset_id}@{manifest.version_hash}: no key in WARP_TRUSTED_KEYS={path} signed this "
            f"version; its signatures: {has}",
            hint="have a trusted signer publish it with 'warp publish --sign-key KEY' (a version stored unsigned: "
                 "delete its manifest, and latest.json if it names it, first), or trust the signer's key",
            dataset=manifest.dataset_id, version=manifest.version_hash, key_ids=[s.key_id for s in found])
    with _MU:
        if len(_VERIFIED) >= 4096:
            _VERIFIED.clear()
        _VERIFIED.add(memo)
