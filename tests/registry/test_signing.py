"""Signed versions: `warp publish --sign-key`, WARP_TRUSTED_KEYS on every read, `inspect --verify` signers.

docs/formats/registry.md "Signatures": an Ed25519 signature over the dataset id and the version
hash in the envelope's ``metadata.signatures``; with WARP_TRUSTED_KEYS set a version no trusted
key signed is refused, exit 77, naming the version and the key ids it has. Keys are made here
with ``cryptography``; stores are real (a folder, moto's S3 server).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from warpdata.core.canonical import canonical_json
from warpdata.core.errors import ExitCode, UntrustedVersionError
from warpdata.read.dataset import dataset
from warpdata.registry.manifest import SEAL_KEY, SIGNATURES_KEY, seal_of
from warpdata.registry.signing import key_id, parse_trusted_keys


def _key(tmp_path: Path, name: str) -> tuple[Path, ed25519.Ed25519PrivateKey, str]:
    """A PEM Ed25519 private key file, the key, and its key id."""
    k = ed25519.Ed25519PrivateKey.generate()
    p = tmp_path / f"{name}.pem"
    p.write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    raw = k.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return p, k, key_id(raw)


def _ssh_line(k: ed25519.Ed25519PrivateKey, comment: str = "release@warp") -> str:
    return k.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                       serialization.PublicFormat.OpenSSH).decode() + f" {comment}"


def _pem_public(k: ed25519.Ed25519PrivateKey) -> str:
    return k.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def _table(tmp_path: Path, n: int = 3, name: str = "t") -> Path:
    p = tmp_path / f"{name}.parquet"
    pq.write_table(pa.table({"id": list(range(n)), "name": [f"r{i}" for i in range(n)]}), p)
    return p


def _publish(cli, store, did: str, table: Path, *extra) -> str:
    r = cli("publish", did, "--table", f"main={table}", "--store", store, "-q", *extra)
    assert r.code == 0, r.err
    return r.out.strip()


def _manifest_path(store: Path, did: str, version: str) -> Path:
    return store / "datasets" / did / "versions" / f"{version}.json"


def _rewrite(path: Path, change, *, reseal: bool = True) -> None:
    doc = json.loads(path.read_bytes())
    change(doc)
    if reseal:  # what anyone with write access to the store can do: the seal is recomputable
        doc["metadata"].pop(SEAL_KEY, None)
        doc["metadata"][SEAL_KEY] = seal_of(doc)
    path.write_bytes(canonical_json(doc))


@pytest.fixture
def signed(cli, tmp_path, monkeypatch):
    """A store with ws/signed signed by `release` (trusted), and a trusted-keys file."""
    key, k, kid = _key(tmp_path, "release")
    store = tmp_path / "store"
    version = _publish(cli, store, "ws/signed", _table(tmp_path), "--sign-key", key)
    trusted = tmp_path / "trusted_keys"
    trusted.write_text(f"# release key\n{_ssh_line(k)}\n\n")
    return store, version, kid, key, trusted


def test_signed_version_reads_with_its_key_trusted(cli, signed, monkeypatch):
    store, version, kid, _, trusted = signed
    doc = json.loads(_manifest_path(store, "ws/signed", version).read_bytes())
    [sig] = doc["metadata"][SIGNATURES_KEY]
    assert sig["key_id"] == kid and sig["algorithm"] == "ed25519" and len(bytes.fromhex(sig["signature"])) == 64
    monkeypatch.setenv("WARP_TRUSTED_KEYS", str(trusted))
    r = cli("head", "ws/signed", "--store", store)
    assert r.code == 0, r.err
    assert "r2" in r.out
    assert cli("warm", "ws/signed", "--store", store).code == 0
    assert dataset("ws/signed", store=str(store)).version == version
    monkeypatch.setenv("WARP_STORE", str(store))  # inspect has no --store: it reads WARP_STORE
    r = cli("inspect", "ws/signed", "--verify", "--json")
    assert r.code == 0, r.err
    assert r.json()["signers"] == [{"key_id": kid, "algorithm": "ed25519", "valid": True, "trusted": True}]
    r = cli("inspect", "ws/signed", "--verify")
    assert r.code == 0 and kid in r.out and "signers" in r.out


def test_a_pem_public_key_is_trusted_too(cli, signed, monkeypatch, tmp_path):
    store, version, kid, key, _ = signed
    k = serialization.load_pem_private_key(key.read_bytes(), password=None)
    other, _, _ = _key(tmp_path, "other")
    trusted = tmp_path / "pem_keys"
    trusted.write_text(_ssh_line(ed25519.Ed25519PrivateKey.generate()) + "\n" + _pem_public(k))
    monkeypatch.setenv("WARP_TRUSTED_KEYS", str(trusted))
    assert cli("head", "ws/signed", "--store", store).code == 0
    assert set(parse_trusted_keys(trusted.read_text(), "x")) >= {kid}


@pytest.mark.parametrize("command", ["head", "stream", "warm", "info", "why", "diff", "inspect"])
def test_an_unsigned_version_is_refused_by_every_read(cli, tmp_path, monkeypatch, command):
    _, k, _ = _key(tmp_path, "release")
    store = tmp_path / "store"
    v1 = _publish(cli, store, "ws/plain", _table(tmp_path, 3))
    v2 = _publish(cli, store, "ws/plain", _table(tmp_path, 4, "t2"))
    trusted = tmp_path / "trusted_keys"
    trusted.write_text(_ssh_line(k) + "\n")
    monkeypatch.setenv("WARP_TRUSTED_KEYS", str(trusted))
    monkeypatch.setenv("WARP_STORE", str(store))
    args = {"head": ("head", "ws/plain"), "stream": ("stream", "ws/plain"), "warm": ("warm", "ws/plain"),
            "info": ("info", "ws/plain"), "why": ("why", "ws/plain", "0"),
            "diff": ("diff", "ws/plain", "--from", v1[:12], "--to", v2[:12]),
            "inspect": ("inspect", "ws/plain", "--verify")}[command]
    r = cli(*args)
    assert r.code == 77, (r.code, r.err)
    assert "no key in WARP_TRUSTED_KEYS" in r.err and "the version is unsigned" in r.err
    assert f"ws/plain@{v2}" in r.err or f"ws/plain@{v1}" in r.err


def test_the_python_api_raises_a_typed_error(cli, tmp_path, monkeypatch):
    _, k, _ = _key(tmp_path, "release")
    store = tmp_path / "store"
    version = _publish(cli, store, "ws/plain", _table(tmp_path))
    trusted = tmp_path / "trusted_keys"
    trusted.write_text(_ssh_line(k) + "\n")
    monkeypatch.setenv("WARP_TRUSTED_KEYS", str(trusted))
    with pytest.raises(UntrustedVersionError) as ei:
        dataset("ws/plain", store=str(store))
    assert ei.value.exit_code == ExitCode.NOPERM == 77 and version in ei.value.message
    assert isinstance(ei.value, PermissionError) and ei.value.details["key_ids"] == []


def test_a_signature_by_an_untrusted_key_is_refused_naming_its_key_id(cli, signed, tmp_path, monkeypatch):
    store, version, kid, _, _ = signed
    _, stranger, skid = _key(tmp_path, "stranger")
    trusted = tmp_path / "only_stranger"
    trusted.write_text(_ssh_line(stranger) + "\n")
    monkeypatch.setenv("WARP_TRUSTED_KEYS", str(trusted))
    r = cli("head", "ws/signed", "--store", store)
    assert r.code == 77, r.err
    assert f"ws/signed@{version}" in r.err and f"{kid} (untrusted)" in r.err and skid not in r.err
    monkeypatch.setenv("WARP_STORE", str(store))
    monkeypatch.delenv("WARP_TRUSTED_KEYS")
    r = cli("inspect", "ws/signed", "--verify", "--json")  # no trusted keys: the signer, valid, not trusted
    assert r.code == 0, r.err
    assert r.json()["signers"] == [{"key_id": kid, "algorithm": "ed25519", "valid": True, "trusted": False}]


def test_two_signers(cli, tmp_path, monkeypatch):
    a, ka, kida = _key(tmp_path, "a")
    b, _, kidb = _key(tmp_path, "b")
    store = tmp_path / "store"
    version = _publish(cli, store, "ws/two", _table(tmp_path), "--sign-key", a, "--sign-key", b, "--sign-key", a)
    doc = json.loads(_manifest_path(store, "ws/two", version).read_bytes())
    assert [s["key_id"] for s in doc["metadata"][SIGNATURES_KEY]] == [kida, kidb]
    trusted = tmp_path / "trusted"
    trusted.write_text(_ssh_line(ka) + "\n")
    monkeypatch.setenv("WARP_TRUSTED_KEYS", str(trusted))
    assert cli("head", "ws/two", "--store", store).code == 0


def test_a_signature_moved_from_another_version_is_refused(cli, signed, tmp_path, monkeypatch):
    store, version, kid, _, trusted = signed
    sigs = json.loads(_manifest_path(store, "ws/signed", version).read_bytes())["metadata"][SIGNATURES_KEY]
    other = _publish(cli, store, "ws/signed", _table(tmp_path, 5, "t5"))  # unsigned, now latest
    _rewrite(_manifest_path(store, "ws/signed", other), lambda d: d["metadata"].__setitem__(SIGNATURES_KEY, sigs))
    monkeypatch.setenv("WARP_TRUSTED_KEYS", str(trusted))
    r = cli("head", "ws/signed", "--store", store)
    assert r.code == 77, r.err
    assert f"ws/signed@{other}" in r.err and f"{kid} (trusted key, signature does not verify)" in r.err
    assert cli("head", "ws/signed", "--version", version[:12], "--store", store).code == 0  # the signed one still reads


def test_a_signature_moved_from_another_dataset_is_refused(cli, signed, tmp_path, monkeypatch):
    store, version, kid, _, trusted = signed
    sigs = json.loads(_manifest_path(store, "ws/signed", version).read_bytes())["metadata"][SIGNATURES_KEY]
    forged = _publish(cli, store, "ws/forged", _table(tmp_path))  # the same table, another dataset
    _rewrite(_manifest_path(store, "ws/forged", forged), lambda d: d["metadata"].__setitem__(SIGNATURES_KEY, sigs))
    monkeypatch.setenv("WARP_TRUSTED_KEYS", str(trusted))
    r = cli("head", "ws/forged", "--store", store)
    assert r.code == 77, r.err
    assert f"ws/forged@{forged}" in r.err and "signature does not verify" in r.err


def _flip(d: dict) -> None:
    sig = d["metadata"][SIGNATURES_KEY][0]
    raw = bytearray(bytes.fromhex(sig["signature"]))
    raw[10] ^= 0x01
    sig["signature"] = bytes(raw).hex()


def test_flipped_signature_bytes_are_refused(cli, signed, monkeypatch):
    store, version, kid, _, trusted = signed
    path = _manifest_path(store, "ws/signed", version)
    good = path.read_bytes()
    _rewrite(path, _flip, reseal=False)  # edited, seal left: the seal catches it, exit 65
    r = cli("head", "ws/signed", "--store", store)
    assert r.code == 65 and "its seal" in r.err, r.err
    path.write_bytes(good)
    _rewrite(path, _flip)  # edited and resealed: the signature catches it
    monkeypatch.setenv("WARP_TRUSTED_KEYS", str(trusted))
    r = cli("head", "ws/signed", "--store", store)
    assert r.code == 77 and f"{kid} (trusted key, signature does not verify)" in r.err, r.err
    monkeypatch.delenv("WARP_TRUSTED_KEYS")
    monkeypatch.setenv("WARP_STORE", str(store))
    r = cli("inspect", "ws/signed", "--verify")
    assert r.code == 1 and f"the signature of key {kid} does not verify" in r.err, r.err


def test_a_removed_seal_is_refused_for_the_current_format(cli, signed, monkeypatch):
    store, version, _, _, _ = signed
    path = _manifest_path(store, "ws/signed", version)
    assert json.loads(path.read_bytes())["format_version"] == 4
    _rewrite(path, lambda d: d["metadata"].pop(SEAL_KEY), reseal=False)
    r = cli("head", "ws/signed", "--store", store)
    assert r.code == 65 and "has no seal" in r.err and "so it was removed" in r.err, r.err


def test_the_trusted_check_is_per_store_copy_not_per_version(cli, signed, tmp_path, monkeypatch):
    """One process reads a version signed in store A, then the same version unsigned in store B
    through another cache: the memo of checked versions must not let B's copy through. (Through
    the same cache B's read uses the cached manifest A served, signed: the same version, so the
    same bytes the signer signed; blobs are checked against it whichever store serves them.)"""
    import shutil

    store, version, _, _, trusted = signed
    copy = tmp_path / "copy"
    shutil.copytree(store, copy)
    _rewrite(_manifest_path(copy, "ws/signed", version), lambda d: d["metadata"].pop(SIGNATURES_KEY))
    monkeypatch.setenv("WARP_TRUSTED_KEYS", str(trusted))
    assert dataset("ws/signed", store=str(store)).version == version
    assert dataset("ws/signed", store=str(store)).version == version  # memoised
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "another-cache"))
    with pytest.raises(UntrustedVersionError, match="the version is unsigned"):
        dataset("ws/signed", store=str(copy))


def test_republishing_with_a_key_says_the_stored_version_keeps_its_signatures(cli, tmp_path):
    key, _, _ = _key(tmp_path, "release")
    store = tmp_path / "store"
    t = _table(tmp_path)
    _publish(cli, store, "ws/late", t)
    r = cli("publish", "ws/late", "--table", f"main={t}", "--store", store, "--sign-key", key, "--json")
    assert r.code == 0, r.err
    assert r.json()["signatures_stored"] is False
    assert "--sign-key: version" in r.err and "keeps the signatures it has" in r.err


@pytest.mark.parametrize("case", ["missing", "not a key", "rsa", "directory"])
def test_a_bad_sign_key_fails_before_anything_is_written(cli, tmp_path, case):
    store = tmp_path / "store"
    key = tmp_path / "key.pem"
    if case == "not a key":
        key.write_text("hello\n")
    elif case == "rsa":
        k = rsa.generate_private_key(public_exponent=65537, key_size=1024)
        key.write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption()))
    elif case == "directory":
        key.mkdir()
    r = cli("publish", "ws/x", "--table", f"main={_table(tmp_path)}", "--store", store, "--sign-key", key)
    assert r.code == {"missing": 66, "not a key": 2, "rsa": 2, "directory": 2}[case], r.err
    assert f"--sign-key {key}" in r.err and "openssl genpkey -algorithm ed25519" in r.err
    assert not (store / "datasets").exists()


def test_an_openssh_private_key_signs_too(cli, tmp_path, monkeypatch):
    k = ed25519.Ed25519PrivateKey.generate()
    key = tmp_path / "id_ed25519"
    key.write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                    serialization.NoEncryption()))
    store = tmp_path / "store"
    _publish(cli, store, "ws/ssh", _table(tmp_path), "--sign-key", key)
    trusted = tmp_path / "trusted"
    trusted.write_text(_ssh_line(k) + "\n")
    monkeypatch.setenv("WARP_TRUSTED_KEYS", str(trusted))
    assert cli("head", "ws/ssh", "--store", store).code == 0


@pytest.mark.parametrize("content", [None, "", "# only a comment\n", "ssh-rsa AAAAB3NzaC1yc2E= x\n",
                                     "ssh-ed25519 not-base64 x\n"])
def test_a_bad_trusted_keys_file_is_a_config_error(cli, signed, tmp_path, monkeypatch, content):
    store, _, _, _, _ = signed
    path = tmp_path / "bad_keys"
    if content is not None:
        path.write_text(content)
    monkeypatch.setenv("WARP_TRUSTED_KEYS", str(path))
    r = cli("head", "ws/signed", "--store", store)
    assert r.code == 78, r.err
    assert f"WARP_TRUSTED_KEYS={path}" in r.err
    if content and "ssh-" in content:
        assert "line 1" in r.err


@pytest.mark.s3
def test_signed_and_unsigned_versions_on_s3(cli, s3, tmp_path, monkeypatch):
    key, k, kid = _key(tmp_path, "release")
    monkeypatch.setenv("WARP_STORE", s3.url("warp"))
    r = cli("publish", "ws/s3signed", "--table", f"main={_table(tmp_path)}", "--sign-key", key, "--json")
    assert r.code == 0, r.err
    assert r.json()["signed_by"] == [kid] and r.json()["signatures_stored"] is True
    unsigned = _publish(cli, s3.url("warp"), "ws/s3plain", _table(tmp_path, 4, "t4"))
    trusted = tmp_path / "trusted"
    trusted.write_text(_ssh_line(k) + "\n")
    monkeypatch.setenv("WARP_TRUSTED_KEYS", str(trusted))
    r = cli("head", "ws/s3signed")
    assert r.code == 0, r.err
    r = cli("head", "ws/s3plain")
    assert r.code == 77 and f"ws/s3plain@{unsigned}" in r.err, r.err


def _without_cryptography(*args, env=None) -> subprocess.CompletedProcess:
    """``warp ARGS`` in a process where ``import cryptography`` fails, as where the extra is not installed."""
    code = ("import sys; sys.modules['cryptography'] = None; from warpdata.cli.app import main; "
            f"sys.exit(main({[str(a) for a in args]!r}))")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def test_without_the_sign_extra_signing_and_trusting_are_exit_78_and_plain_reads_work(cli, signed, tmp_path):
    store, version, _, key, trusted = signed
    r = _without_cryptography("publish", "ws/nocrypto", "--table", f"main={_table(tmp_path, 2, 't2')}",
                              "--store", store, "--sign-key", key)
    assert r.returncode == 78, r.stderr
    assert "--sign-key needs the 'cryptography' package" in r.stderr and "[sign]" in r.stderr
    assert not (store / "datasets" / "ws" / "nocrypto").exists()
    r = _without_cryptography("head", "ws/signed", "--store", store, env={"WARP_TRUSTED_KEYS": str(trusted)})
    assert r.returncode == 78 and "'cryptography' package" in r.stderr, r.stderr
    r = _without_cryptography("head", "ws/signed", "--store", store)  # a signed version, no trusted keys: no check
    assert r.returncode == 0 and "r2" in r.stdout, r.stderr


def test_a_malformed_signature_list_is_a_data_error(cli, signed, monkeypatch):
    store, version, _, _, trusted = signed
    _rewrite(_manifest_path(store, "ws/signed", version), lambda d: d["metadata"].__setitem__(SIGNATURES_KEY, "ed25519"))
    monkeypatch.setenv("WARP_TRUSTED_KEYS", str(trusted))
    r = cli("head", "ws/signed", "--store", store)
    assert r.code == 65 and "metadata.signatures is not a list of signatures" in r.err, r.err
