"""Property: warp's presigned S3 GET URLs (warp/storage/s3sign.py) equal botocore's.

For random buckets, keys (every character class), regions of every partition (aws, aws-cn, aws-us-gov
and the others botocore knows), endpoints (none, or http/https with ports, capitals, IPv4 and IPv6
literals, paths with dot segments), addressing style as warp sets it, expiries, access keys, secrets,
session tokens and signing times, the URL of ``SigV4Presigner.for_config(config).presign`` equals the
URL of botocore's ``generate_presigned_url("get_object")`` on a client made with the same settings
(``Config(signature_version="s3v4", s3={"addressing_style": "path" or "auto"})``), botocore's clock
frozen at the same second. URLs are compared parsed: scheme, host (netloc), path and the query
parameters as a dict (the signature included).

Where warp's presigner declines (answers None), the reader signs with botocore itself
(warp/storage/s3reads.py); the test accepts a decline only for the inputs listed in
:func:`may_decline` (pseudo-regions, custom endpoints without path-style, names botocore refuses or
signs another way). An endpoint with ``user:pw@`` is refused by warp with a ConfigError naming the
setting, before anything is signed.

``WARP_PRESIGN_EXAMPLES=2000`` runs the property over 2,000 examples instead of the profile's;
``WARP_PRESIGN_CENSUS=600`` runs the census test: 600 cases drawn from a fixed seed apart from
Hypothesis's engine (whose choices follow the code under test), the same cases for any version of
s3sign.py; it never fails and prints the tally (equal, declined, refused, mismatched and how) for
before/after comparisons. It uses Hypothesis internals (``ConjectureData``), so it is opt-in.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import hashlib
import json
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.control import BuildContext
from hypothesis.errors import StopTest
from hypothesis.internal.conjecture.data import ConjectureData
from warpdata.core.errors import ConfigError
from warpdata.storage.locations import StorageConfig
from warpdata.storage.s3sign import SigV4Presigner

pytest.importorskip("botocore")
boto3 = pytest.importorskip("boto3")
import botocore  # noqa: E402
import botocore.auth  # noqa: E402
from botocore.config import Config  # noqa: E402

PARTITIONS = json.loads((Path(botocore.__file__).parent / "data" / "partitions.json").read_text())["partitions"]
NAMED_REGIONS = sorted(r for p in PARTITIONS for r in p["regions"])

# what botocore would read besides the client's arguments: cleared for both sides
_AWS_ISOLATION = {"AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
_AWS_CLEARED = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION",
                "AWS_DEFAULT_REGION", "AWS_USE_FIPS_ENDPOINT", "AWS_USE_DUALSTACK_ENDPOINT",
                "AWS_S3_US_EAST_1_REGIONAL_ENDPOINT", "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS",
                "WARP_S3_ENDPOINT", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")


@dataclass(frozen=True)
class Case:
    bucket: str
    key: str
    region: str
    endpoint: str | None
    path_style: bool
    expires: int
    access_key: str
    secret_key: str
    token: str | None
    when: int  # the signing second (UTC)


# -- strategies ----------------------------------------------------------

_NO_NUL = st.characters(exclude_categories=("Cs",), exclude_characters="\x00")  # environment values
_AREAS = ["east", "west", "north", "south", "central", "northeast", "southeast", "northwest", "southwest"]
_PREFIXES = ["us", "eu", "ap", "sa", "ca", "me", "af", "il", "mx",  # aws
             "cn", "cn", "us-gov", "us-gov",  # aws-cn, aws-us-gov (twice: the partitions the issue names)
             "us-iso", "us-isob", "eu-isoe", "us-isof", "eusc-de"]
_ODD_REGIONS = ["aws-global", "aws-cn-global", "aws-us-gov-global", "fips-us-gov-west-1", "us-east-1-fips",
                "auto", "garage", "minio", "local", "US-EAST-1", "xx-foo-1", "us-gov-1", "cn-1"]

regions = st.one_of(
    st.sampled_from([r for r in NAMED_REGIONS if not r.endswith("-global")]),
    st.builds(lambda p, a, n: f"{p}-{a}-{n}", st.sampled_from(_PREFIXES),
              st.sampled_from(_AREAS) | st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True), st.integers(1, 99)),
    st.sampled_from(_ODD_REGIONS),
)


def _mixed_case(draw, s: str) -> str:
    flips = draw(st.lists(st.booleans(), min_size=len(s), max_size=len(s)))
    return "".join(c.upper() if f else c for c, f in zip(s, flips, strict=True))


@st.composite
def hosts(draw) -> str:
    kind = draw(st.sampled_from(["dns", "dns", "dns", "ipv4", "ipv6", "fixed"]))
    if kind == "dns":
        label = r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?"
        return _mixed_case(draw, draw(st.from_regex(rf"{label}(\.{label}){{0,3}}", fullmatch=True)))
    if kind == "ipv4":
        return str(draw(st.ip_addresses(v=4)))
    if kind == "ipv6":
        a = draw(st.ip_addresses(v=6))
        return "[" + _mixed_case(draw, draw(st.sampled_from([a.compressed, a.exploded]))) + "]"
    return draw(st.sampled_from(["localhost", "127.0.0.1", "MinIO.Example.COM", "[::1]", "[FE80::1]",
                                 "s3.eu-west-1.amazonaws.com", "S3.AmazonAWS.com", "host.example.", "x"]))


_SEGMENTS = ["prefix", "S3", "a", "..", ".", "", "x y", "~u", "%41", "é", "a+b", "v1"]
_USERINFO = ["user:pw@", "User:P%40ss@", "user@", ":pw@", "u:@"]


@st.composite
def endpoints(draw) -> str | None:
    if draw(st.integers(0, 4)) == 0:
        return None
    scheme = draw(st.sampled_from(["http", "https", "HTTP"]))
    port = draw(st.one_of(st.none(), st.sampled_from([80, 443, 9000, 4566]), st.integers(1, 65535)))
    path = draw(st.one_of(st.just(""), st.just("/"),
                          st.lists(st.sampled_from(_SEGMENTS), min_size=1, max_size=4).map(lambda s: "/" + "/".join(s))))
    userinfo = draw(st.sampled_from([""] * 9 + _USERINFO))
    return f"{scheme}://{userinfo}{draw(hosts())}{'' if port is None else f':{port}'}{path}"


buckets = st.one_of(
    st.from_regex(r"[a-z0-9][a-z0-9-]{1,20}[a-z0-9]", fullmatch=True),
    st.from_regex(r"[a-z0-9][a-z0-9-]{0,8}(\.[a-z0-9][a-z0-9-]{0,8}){1,3}", fullmatch=True),
    st.from_regex(r"[a-zA-Z0-9._-]{1,70}", fullmatch=True),
    st.sampled_from(["MyBucket", "my_bucket", "ab", "a" * 63, "a" * 64, "192.168.1.1", "-abc", "abc-", "a..b",
                     "xn--abc", "bucket--x-s3", "bench", "b.c", "my bucket", "arn:aws:s3:::x"]),
)

_KEY_SPECIALS = " /+%~=&?#:;@!$'()*,[]\"<>^`{|}\\\t\n\x7f.-_é漢\U0001f600\u00a0\u200b"
keys = st.one_of(
    st.text(alphabet=st.characters(exclude_categories=("Cs",)), min_size=1, max_size=64),
    st.text(alphabet=st.sampled_from("abcXYZ019" + _KEY_SPECIALS), min_size=1, max_size=40),
    st.sampled_from(["a/../b", "./a", "/lead", "trail/", "a//b", "..", ".", "%2F", "~", "+", " ", "=", "%",
                     "blobs/sha256/ab/" + "ab" * 32, "datasets/ws/n a+me/latest.json"]),
)

tokens = st.one_of(
    st.none(),
    st.from_regex(r"[A-Za-z0-9+/]{20,120}={0,2}", fullmatch=True),
    st.text(alphabet=_NO_NUL, min_size=1, max_size=60),
)


@st.composite
def cases(draw) -> Case:
    endpoint = draw(endpoints())
    # a custom endpoint is path-style as warp sets it (WARP_S3_PATH_STYLE, or any non-AWS host), mostly
    path_style = draw(st.booleans() if endpoint is None else st.sampled_from([True, True, True, False]))
    return Case(
        bucket=draw(buckets), key=draw(keys), region=draw(regions), endpoint=endpoint,
        path_style=path_style, expires=draw(st.integers(1, 604800)),
        access_key=draw(st.one_of(st.from_regex(r"(AKIA|ASIA)[A-Z0-9]{16}", fullmatch=True),
                                  st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7e),
                                          min_size=1, max_size=30))),
        secret_key=draw(st.text(alphabet=_NO_NUL, min_size=1, max_size=50)),
        token=draw(tokens),
        when=draw(st.integers(946684800, 4102444799)),  # 2000-2099
    )


# -- the two sides -------------------------------------------------------

@contextlib.contextmanager
def _environ(values: dict[str, str | None]):
    """``os.environ`` with ``values`` set (None: removed) for the block; restored after."""
    saved = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _botocore_clock(when: int):
    """botocore's signing clock (``botocore.auth.get_current_datetime``, a naive UTC datetime) stopped
    at ``when``; warp's clock is not touched (warp is given ``now=when``)."""
    frozen = datetime.datetime.fromtimestamp(when, datetime.UTC).replace(tzinfo=None)
    real = botocore.auth.get_current_datetime
    botocore.auth.get_current_datetime = lambda *a, **k: frozen
    try:
        yield
    finally:
        botocore.auth.get_current_datetime = real


_CLIENTS: dict[tuple, object] = {}


def botocore_url(c: Case) -> str:
    ck = (c.region, c.endpoint, c.path_style, c.access_key, c.secret_key, c.token)
    client = _CLIENTS.get(ck)
    if client is None:
        if len(_CLIENTS) > 256:
            _CLIENTS.clear()
        client = _CLIENTS[ck] = boto3.client(
            "s3", region_name=c.region, endpoint_url=c.endpoint, aws_access_key_id=c.access_key,
            aws_secret_access_key=c.secret_key, aws_session_token=c.token,
            config=Config(signature_version="s3v4", s3={"addressing_style": "path" if c.path_style else "auto"}))
    with _botocore_clock(c.when):
        return client.generate_presigned_url("get_object", Params={"Bucket": c.bucket, "Key": c.key},
                                             ExpiresIn=c.expires)


def warp_url(c: Case) -> str | None:
    """warp's URL as the reader gets it: ``for_config`` of a StorageConfig, credentials from the
    environment; None where warp leaves the signing to botocore."""
    env = {**_AWS_ISOLATION, **dict.fromkeys(_AWS_CLEARED), "AWS_ACCESS_KEY_ID": c.access_key,
           "AWS_SECRET_ACCESS_KEY": c.secret_key, "AWS_SESSION_TOKEN": c.token}
    with _environ(env):
        signer = SigV4Presigner.for_config(StorageConfig(endpoint_url=c.endpoint, region=c.region,
                                                         path_style=c.path_style))
    return None if signer is None else signer.presign(c.bucket, c.key, c.expires, now=c.when)


def parsed(url: str) -> tuple:
    u = urlsplit(url)
    return u.scheme, u.netloc, u.path, {k: v for k, v in parse_qs(u.query, keep_blank_values=True).items()}


def _userinfo(endpoint: str | None) -> bool:
    return endpoint is not None and "@" in urlsplit(endpoint).netloc


def may_decline(c: Case) -> bool:
    """The inputs warp leaves to botocore (the presigner answers None): a FIPS or dual-stack
    pseudo-region; no endpoint and a region outside the partitions' region patterns (aws-global,
    made-up names); a custom endpoint without path-style (botocore's own addressing choice); a region that is
    not a plain lowercase host label; a bucket botocore validates, refuses or signs another way
    (ARNs, S3 Express ``--x-s3`` names, characters outside ``[a-zA-Z0-9._-]``)."""
    if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", c.region) or "fips" in c.region or "dualstack" in c.region:
        return True
    if c.endpoint is None:
        if not any(re.fullmatch(p["regionRegex"].strip("^$"), c.region) for p in PARTITIONS):
            return True
    elif not c.path_style:
        return True
    return not re.fullmatch(r"[a-zA-Z0-9._-]{1,255}", c.bucket) or c.bucket.endswith("--x-s3")


@dataclass
class Verdict:
    kind: str  # equal, declined, refused, botocore-refused, mismatch
    detail: str = ""


def compare(c: Case) -> Verdict:
    if _userinfo(c.endpoint):
        try:
            warp_url(c)
        except ConfigError as e:
            userinfo = urlsplit(c.endpoint).netloc.rpartition("@")[0] + "@"
            if "endpoint" not in str(e).lower() or userinfo in str(e):
                return Verdict("mismatch", f"refused, but the message is wrong: {e}")
            return Verdict("refused")
        except Exception as e:
            return Verdict("mismatch", f"warp raised {type(e).__name__}: {e}")
        return Verdict("mismatch", "an endpoint with user:pw@ was not refused")
    try:
        theirs = botocore_url(c)
    except Exception as e:  # botocore refuses the input (invalid region, endpoint, bucket)
        try:
            ours = warp_url(c)
        except ConfigError:
            ours = None
        except Exception as e2:
            return Verdict("mismatch", f"warp raised {type(e2).__name__}: {e2}")
        if ours is not None:
            return Verdict("mismatch", f"botocore refuses ({type(e).__name__}: {e}) but warp signs {ours}")
        return Verdict("botocore-refused")
    try:
        ours = warp_url(c)
    except Exception as e:
        return Verdict("mismatch", f"warp raised {type(e).__name__}: {e}; botocore: {theirs}")
    if ours is None:
        if may_decline(c):
            return Verdict("declined")
        return Verdict("mismatch", f"warp declined; botocore: {theirs}")
    a, b = parsed(theirs), parsed(ours)
    if a == b:
        return Verdict("equal", "same string" if theirs == ours else "same parsed URL, other parameter order")
    what = [n for n, x, y in zip(("scheme", "host", "path", "query"), a, b, strict=True) if x != y]
    if what == ["query"]:
        what = ["signature" if k == "X-Amz-Signature" else k for k in sorted(set(a[3]) | set(b[3]))
                if a[3].get(k) != b[3].get(k)]
    return Verdict("mismatch", f"{'+'.join(what)}: botocore {theirs} warp {ours}")


# -- tests ---------------------------------------------------------------

_EXAMPLES = int(os.environ.get("WARP_PRESIGN_EXAMPLES") or 0)


@settings(**({"max_examples": _EXAMPLES} if _EXAMPLES else {}), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cases())
def test_presigned_urls_equal_botocores(c):
    v = compare(c)
    assert v.kind != "mismatch", f"{c}\n{v.detail}"


@pytest.mark.parametrize("region,host", [
    ("us-east-1", "bench.s3.amazonaws.com"), ("eu-west-1", "bench.s3.amazonaws.com"),
    ("cn-north-1", "bench.s3.cn-north-1.amazonaws.com.cn"), ("cn-northwest-1", "bench.s3.cn-northwest-1.amazonaws.com.cn"),
    ("us-gov-west-1", "bench.s3.us-gov-west-1.amazonaws.com"), ("us-gov-east-1", "bench.s3.us-gov-east-1.amazonaws.com"),
    ("us-iso-east-1", "bench.s3.us-iso-east-1.c2s.ic.gov")])
@pytest.mark.parametrize("path_style", [False, True])
def test_every_partition_is_signed_by_warp_as_botocore_does(region, host, path_style):
    c = Case("bench", "a b/c+d~é", region, None, path_style, 900, "AKIDEXAMPLE", "secret/+=", "tok/en+=", 1700000000)
    ours = warp_url(c)
    assert ours is not None  # signed by warp, not left to botocore
    assert parsed(ours) == parsed(botocore_url(c))
    if not path_style:
        assert urlsplit(ours).netloc == host


@pytest.mark.parametrize("endpoint", ["http://MinIO.Example.COM:9000", "http://[FE80::1]:9000/S3/../store",
                                      "https://[::1]", "http://127.0.0.1:80/a//b/", "HTTP://Host.Example.:443"])
def test_custom_endpoints_are_signed_by_warp_as_botocore_does(endpoint):
    c = Case("bench", "k/é y", "auto", endpoint, True, 60, "AKIDEXAMPLE", "secret", None, 1700000000)
    ours = warp_url(c)
    assert ours is not None
    assert parsed(ours) == parsed(botocore_url(c))


@pytest.mark.parametrize("var", ["WARP_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"])
def test_an_endpoint_with_userinfo_is_refused_naming_the_setting(var, monkeypatch):
    for k in ("WARP_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "WARP_S3_PROFILE", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv(var, "http://alice:s3cr3t@minio.example.com:9000")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    with pytest.raises(ConfigError) as e:
        SigV4Presigner.for_config(StorageConfig.from_env())
    assert e.value.exit_code == 78
    assert var in str(e.value) and "s3cr3t" not in str(e.value) and "userinfo" in str(e.value)
    assert e.value.details.get("key") == var
    with pytest.raises(ConfigError):  # even where botocore would resolve the credentials
        SigV4Presigner.for_config(StorageConfig(endpoint_url="http://u:p@h:9000", path_style=True, profile="dev"))


def test_a_signing_setting_only_botocore_reads_leaves_the_url_to_botocore(monkeypatch, tmp_path):
    for k, v in {**_AWS_ISOLATION, **dict.fromkeys(_AWS_CLEARED), "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
                 "AWS_SECRET_ACCESS_KEY": "secret"}.items():
        monkeypatch.setenv(k, v) if v is not None else monkeypatch.delenv(k, raising=False)
    gov = StorageConfig(region="us-gov-west-1")
    assert SigV4Presigner.for_config(gov) is not None
    for var, value in (("AWS_USE_FIPS_ENDPOINT", "true"), ("AWS_USE_DUALSTACK_ENDPOINT", "true"),
                       ("AWS_S3_US_EAST_1_REGIONAL_ENDPOINT", "regional"), ("AWS_ENDPOINT_URL_S3", "http://h:1")):
        with monkeypatch.context() as m:
            m.setenv(var, value)
            assert SigV4Presigner.for_config(gov) is None, var
    config = tmp_path / "config"
    config.write_text("[default]\ns3 =\n  addressing_style = virtual\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    assert SigV4Presigner.for_config(gov) is None
    config.write_text("[default]\nregion = us-gov-west-1\n")  # nothing that changes the URL
    assert SigV4Presigner.for_config(gov) is not None


_CENSUS = int(os.environ.get("WARP_PRESIGN_CENSUS") or 0)


@pytest.mark.skipif(not _CENSUS, reason="a census on demand: WARP_PRESIGN_CENSUS=<examples>")
def test_census(capsys):
    tally: collections.Counter = collections.Counter()
    samples: dict[str, str] = {}

    # the cases are drawn first, from a seeded Random, without the string constants Hypothesis collects
    # from the code under test (they would change the cases with the code), so that a census of the old
    # code and of the new one judges the same cases
    from hypothesis.internal.conjecture import providers as hp

    class Provider(hp.HypothesisProvider):
        _local_constants = hp.Constants(integers=hp.SortedSet(), floats=hp.SortedSet(key=hp.float_to_int),
                                        bytes=hp.SortedSet(), strings=hp.SortedSet())

    rnd = random.Random(36)
    drawn: list[Case] = []
    while len(drawn) < _CENSUS:
        data = ConjectureData(random=rnd, provider=Provider)
        try:
            with BuildContext(data, wrapped_test=test_census):
                drawn.append(data.draw(cases()))
        except StopTest:  # a draw past Hypothesis's size limit
            continue
    for c in drawn:
        v = compare(c)
        label = v.kind if v.kind != "mismatch" else "mismatch " + v.detail.split(":", 1)[0]
        if v.kind == "mismatch":
            part = ("aws-cn" if c.region.startswith("cn-") else "aws-us-gov" if c.region.startswith("us-gov-")
                    else "other")
            tally[f"  mismatch by partition: {part}"] += 1
            tally[f"  mismatch by endpoint: {'none' if c.endpoint is None else 'custom'}"] += 1
        tally[label] += 1
        if v.kind == "equal":
            tally[f"  equal: {v.detail}"] += 1
        samples.setdefault(label, f"{c}\n    {v.detail}")
    with capsys.disabled():
        print(f"\npresign census: {len(drawn)} cases (seed 36), sha256 {hashlib.sha256(repr(drawn).encode()).hexdigest()[:16]}")
        for k, v in sorted(tally.items()):
            print(f"{v:6d}  {k}")
        for k, s in sorted(samples.items()):
            if k.startswith("mismatch"):
                print(f"--- {k}\n    {s}")


@pytest.mark.s3
def test_a_read_through_an_endpoint_with_userinfo_exits_78_naming_it(s3, tmp_path, monkeypatch, cli):
    from support.datasets import make_rows, publish

    publish(s3.url(), "ws/demo", {"main": [make_rows(20)]}, tmp_path)
    endpoint = os.environ["WARP_S3_ENDPOINT"]
    monkeypatch.setenv("WARP_STORE", s3.url())
    monkeypatch.setenv("WARP_S3_ENDPOINT", endpoint.replace("://", "://alice:s3cr3t@", 1))
    r = cli("head", "ws/demo", "-n", "2")
    assert r.code == 78, r.err
    assert "WARP_S3_ENDPOINT" in r.err and "userinfo" in r.err and "s3cr3t" not in r.err + r.out
