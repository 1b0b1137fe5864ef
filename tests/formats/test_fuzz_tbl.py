"""Seeded mutation fuzzing of the TBL reader and of tar-to-tbl.

Every mutated .tbl must end in exactly one of two ways: a typed warp error
(a :class:`~warpdata.core.errors.WarpError`), or a read that is identical to the
original's (samples, infos, metadata). With the metadata CRC extension
(docs/formats/tbl-v2.md) every byte a reader uses is under a CRC, so a
changed byte may never come back as changed data, neither through a
verifying reader nor unnoticed by ``verify_all``. A second pass edits
structural fields and then repairs every CRC, so the checks behind the
CRCs (ranges, overlaps, block walk, sizes) must hold on their own: typed
errors only, never an untyped exception.

The tar fuzz feeds mutated archives to the converter: a typed error with no
output left behind, or an output whose every payload is a member's bytes
from the input and which verifies clean.
"""

from __future__ import annotations

import importlib.util
import os
import random
import struct
from pathlib import Path

import pytest
from warpdata.core.errors import WarpError
from warpdata.formats import tbl

HERE = Path(__file__).parents[1]
GOLDEN = HERE / "golden" / "tbl"
SEED = 20261123
BASES = ["warp_none.tbl", "warp_lz4.tbl", "warp_zstd.tbl"]


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _snapshot(r: tbl.TblReader) -> tuple:
    return (len(r), [bytes(r.read(i)) for i in range(len(r))], [r.info(i) for i in range(len(r))],
            [r.metadata(i) for i in range(len(r))], [r.key(i) for i in range(len(r))])


def _mutate(rng: random.Random, b: bytes) -> tuple[str, bytes]:
    x = bytearray(b)
    kind = rng.choice(["bit", "bit", "bit", "byte", "run", "truncate", "append", "insert", "delete", "u64"])
    at = rng.randrange(len(x))
    if kind == "bit":
        x[at] ^= 1 << rng.randrange(8)
    elif kind == "byte":
        x[at] = (x[at] + rng.randrange(1, 256)) & 0xFF
    elif kind == "run":
        n = rng.randint(2, 16)
        x[at:at + n] = bytes(rng.randrange(256) for _ in range(len(x[at:at + n])))
    elif kind == "truncate":
        del x[at:]
    elif kind == "append":
        x += bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    elif kind == "insert":
        x[at:at] = bytes([rng.randrange(256)])
    elif kind == "delete":
        del x[at]
    else:  # an extreme little-endian integer anywhere
        v = rng.choice([2 ** 63 - 1, 2 ** 64 - 1, 2 ** 63, 2 ** 32 - 1, 2 ** 31, 0])
        x[at:at + 8] = struct.pack("<Q", v)[: len(x[at:at + 8])]
    if bytes(x) == b:
        x += b"\0"  # every case changes the file
    return f"{kind}@{at}", bytes(x)


def _outcome(path: Path, reference: tuple, *, verify: bool) -> str:
    """'error' (typed), 'intact' (identical read) or 'changed'; anything untyped propagates."""
    try:
        with tbl.TblReader(path, verify=verify) as r:
            got = _snapshot(r)
            problems = [] if verify else r.verify_all()
    except WarpError:
        return "error"
    if problems:
        return "error"
    return "intact" if got == reference else "changed"


@pytest.mark.parametrize("base", BASES)
def test_random_mutations_are_caught_or_harmless(tmp_path, base, record_property):
    src = (GOLDEN / base).read_bytes()
    with tbl.TblReader(GOLDEN / base) as r:
        reference = _snapshot(r)
    rng = random.Random(f"{SEED}-{base}")
    counts = {"error": 0, "intact": 0}
    p = tmp_path / "m.tbl"
    for case in range(200):  # 3 bases x 200 = 600 random cases
        what, data = _mutate(rng, src)
        p.write_bytes(data)
        for verify in (True, False):
            try:
                got = _outcome(p, reference, verify=verify)
            except Exception as e:  # the property under test: nothing untyped escapes
                pytest.fail(f"{base} case {case} ({what}, verify={verify}): untyped {type(e).__name__}: {e}")
            assert got != "changed", f"{base} case {case} ({what}, verify={verify}): silent corruption"
        counts[got] += 1
    record_property("outcomes", counts)  # the fuzz table (--junitxml)
    # the mutations really hit checked bytes: most are caught, a few (appended bytes) are harmless
    assert counts["error"] > 150 and counts["error"] + counts["intact"] == 200


def test_every_single_byte_flip_is_caught(tmp_path):
    """Exhaustive over warp_lz4.tbl: flipping any one byte of the file is a typed error (no byte is unused)."""
    src = (GOLDEN / "warp_lz4.tbl").read_bytes()
    with tbl.TblReader(GOLDEN / "warp_lz4.tbl") as r:
        reference = _snapshot(r)
    p = tmp_path / "m.tbl"
    missed = []
    for at in range(len(src)):
        x = bytearray(src)
        x[at] ^= 0x5A
        p.write_bytes(x)
        if _outcome(p, reference, verify=True) != "error" or _outcome(p, reference, verify=False) != "error":
            missed.append(at)
    assert missed == []


# fields a reader parses, as (offset, struct format) relative to the header, an index
# entry or a metadata block header; the CRCs are repaired after the edit
_HEADER_FIELDS = [(8, "<Q"), (16, "<I"), (24, "<Q"), (32, "<Q"), (40, "<I"), (56, "<I")]
_ENTRY_FIELDS = [(0, "<Q"), (8, "<I"), (12, "<I"), (16, "<H"), (18, "<H"), (20, "<B"), (21, "<B")]
_BLOCK_FIELDS = [(0, "<Q"), (8, "<I"), (12, "<H")]
_EXTREMES = [0, 1, 2 ** 7, 2 ** 8 - 1, 2 ** 15, 2 ** 16 - 1, 2 ** 31, 2 ** 32 - 1, 2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1]


def test_structural_edits_with_repaired_crcs_raise_only_typed_errors(tmp_path):
    g = _module(GOLDEN / "make_golden.py", "tbl_make_golden_fuzz")
    p = tmp_path / "s.tbl"
    rng = random.Random(SEED)
    typed = 0
    for case in range(300):
        base = rng.choice(BASES)
        x = bytearray((GOLDEN / base).read_bytes())
        n = struct.unpack_from("<Q", x, 8)[0]
        moff, msize = struct.unpack_from("<QQ", x, 24)
        region = rng.choice(["header", "entry", "block"])
        if region == "header":
            off, fmt = rng.choice(_HEADER_FIELDS)
        elif region == "entry":
            f_off, fmt = rng.choice(_ENTRY_FIELDS)
            off = 64 + 24 * rng.randrange(n) + f_off
        else:  # the first block: its header is at the start of the section
            f_off, fmt = rng.choice(_BLOCK_FIELDS)
            off = moff + f_off
        bits = struct.calcsize(fmt) * 8
        value = rng.choice([v for v in _EXTREMES if v < 2 ** bits] + [rng.randrange(2 ** bits)])
        struct.pack_into(fmt, x, off, value)
        if region == "block":
            x = g._remeta(x)
        x = g._reindex(x)  # index CRC and header CRC
        p.write_bytes(x)
        try:
            with tbl.TblReader(p, verify=True) as r:
                _snapshot(r)
                r.verify_all()
        except WarpError:
            typed += 1
        except Exception as e:
            pytest.fail(f"case {case} ({base} {region} @{off} = {value}): untyped {type(e).__name__}: {e}")
    assert typed > 100


# ----------------------------------------------------------------------- tar --
def test_tar_mutations_give_typed_errors_or_correct_output(tmp_path):
    from warpdata.tbl.converter import ConvertRequest, convert

    cases = _module(HERE / "malformed" / "tar" / "make_cases.py", "tar_cases_fuzz")
    src = b"".join(cases.member(f"s/{i:04d}.png", cases.PNG + bytes([i]) * (i * 37))
                   + cases.member(f"s/{i:04d}.cls", str(i).encode()) for i in range(6)) + cases.END
    rng = random.Random(SEED)
    outdir = tmp_path / "out"
    outdir.mkdir()
    ok = errors = 0
    for case in range(150):
        x = bytearray(src)
        kind = rng.choice(["size", "size", "bit", "truncate", "header-byte"])
        hdr = 512 * rng.choice([i for i in range(len(src) // 512) if src[512 * i + 257:512 * i + 262] == b"ustar"])
        if kind == "size":  # the size field: digits, garbage, base-256, signs
            field = rng.choice([
                b"%011o\0" % rng.randrange(8 ** 11),
                bytes(rng.randrange(256) for _ in range(12)),
                b"\x80" + rng.randrange(2 ** 88).to_bytes(11, "big"),
                b"\xff" + rng.randrange(2 ** 88).to_bytes(11, "big"),
                b"-0000000001\0", b"+0000000001\0", b"0x000000001\0", b" " * 12, b"\0" * 12,
            ])
            x[hdr + 124:hdr + 136] = field
        elif kind == "bit":
            at = rng.randrange(len(x))
            x[at] ^= 1 << rng.randrange(8)
        elif kind == "truncate":
            del x[rng.randrange(len(x)):]
        else:
            x[hdr + rng.randrange(512)] = rng.randrange(256)
        if kind in ("size", "header-byte") and rng.random() < 0.8:  # mostly: a header that passes its checksum
            h = x[hdr:hdr + 512]
            h[148:156] = b" " * 8
            x[hdr + 148:hdr + 156] = b"%06o\0 " % sum(h)
        inp = tmp_path / "in.tar"
        inp.write_bytes(x)
        out = outdir / "o.tbl"
        try:
            res = convert(ConvertRequest(str(inp), str(out), workers=1, fsync=False, max_member_bytes=1 << 20))
        except WarpError:
            errors += 1
            assert os.listdir(outdir) == [], f"case {case} ({kind}): output left behind"
            continue
        except Exception as e:
            pytest.fail(f"tar case {case} ({kind}): untyped {type(e).__name__}: {e}")
        ok += 1
        with tbl.TblReader(out) as r:
            assert len(r) == res.samples > 0
            assert r.verify_all() == []
            for i in range(len(r)):
                assert bytes(r[i]) in x  # a payload is one member's bytes, as they are in the input
        if kind == "truncate" and len(x) >= len(src) - 512:  # inside the second end block: all there
            assert res.samples == 6
        elif kind == "truncate":  # only a cut between two members is tolerated (as tar(1) does)
            assert len(x) % 512 == 0, f"case {case}: a cut at byte {len(x)} converted without an error"
        os.unlink(out)
    assert ok > 10 and errors > 50
