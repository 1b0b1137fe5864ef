"""Hostile input: path escapes, bombs, huge declared sizes and SQL injection.

Each ETL case runs ``warp`` in a subprocess whose address space is capped
(``RLIMIT_AS``), so a memory bomb shows up as an untyped ``MemoryError``
(exit 70) instead of swapping the machine; every case must end in its typed
exit code with a message naming the problem, and the child's peak RSS is
checked. The reproducers live in ``tests/malformed/warehouse/`` (one folder
per case, ``expected.json`` says the exit code and what stderr must name);
symlinks, FIFOs and device files are made at run time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from support.datasets import make_rows, publish
from warpdata.sampledata.photos import encode_jpeg, synthetic_photo

CORPUS = Path(__file__).parent / "malformed" / "warehouse"
EXPECTED = json.loads((CORPUS / "expected.json").read_text())
AS_LIMIT = 1536 << 20  # address space of each capped child (warp etl itself needs ~0.6 GiB of it)

# runs the CLI under the cap and reports its own peak RSS (KiB) on the last line of stderr: VmHWM,
# the high-water mark of this process image (ru_maxrss would carry the forking pytest worker's RSS
# across fork+exec and fail the bound whenever that worker had grown)
_LAUNCHER = """
import resource, sys
lim = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
from warpdata.cli.app import main
try:
    rc = main(sys.argv[2:])
finally:
    hwm = [ln for ln in open("/proc/self/status") if ln.startswith("VmHWM:")][0].split()[1]
    sys.stderr.write("\\nPEAK_RSS_KIB=%s\\n" % hwm)
sys.exit(rc)
"""


class Capped:
    def __init__(self, code: int, out: str, err: str, peak_kib: int) -> None:
        self.code, self.out, self.err, self.peak_kib = code, out, err, peak_kib


def run_capped(*args: str, cwd: Path, env: dict | None = None, limit: int = AS_LIMIT, timeout: int = 300) -> Capped:
    full_env = {**os.environ, "WARP_WORKERS": "1", "MALLOC_ARENA_MAX": "2", "OMP_NUM_THREADS": "1",
                "OPENBLAS_NUM_THREADS": "1", **(env or {})}
    p = subprocess.run([sys.executable, "-c", _LAUNCHER, str(limit), *map(str, args)], cwd=cwd, env=full_env,
                       capture_output=True, text=True, timeout=timeout)
    err, _, tail = p.stderr.rpartition("PEAK_RSS_KIB=")
    # the number may be followed by what a library prints at exit (DuckDB's leak warning): keep it
    number, _, after = tail.strip().partition("\n")
    peak = int(number) if number.strip().isdigit() else -1
    return Capped(p.returncode, p.stdout, err + after if peak >= 0 else p.stderr, peak)


def _jpeg(seed: int) -> bytes:
    return encode_jpeg(synthetic_photo(np.random.default_rng(seed), 60, 40))


def _case(name: str, tmp_path: Path) -> Path:
    d = tmp_path / "data" / name
    shutil.copytree(CORPUS / name, d)
    for i, img in enumerate(EXPECTED[name]["images"]):
        (d / "images").mkdir(exist_ok=True)
        (d / "images" / img).write_bytes(_jpeg(i))
    return d


def _assert_typed(r: Capped, code: int) -> None:
    assert "internal error" not in r.err and "Traceback" not in r.err, r.err
    assert r.code == code, (r.code, r.err)
    assert 0 < r.peak_kib < AS_LIMIT // 1024, r.peak_kib


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_malformed_warehouse_corpus(name, tmp_path):
    d = _case(name, tmp_path)
    r = run_capped("etl", "-c", "t.toml", cwd=d)
    _assert_typed(r, EXPECTED[name]["exit"])
    for s in EXPECTED[name]["expect"]:
        assert s in r.err, (s, r.err)
    assert not list(d.glob("wh/v*")), "nothing is published when the build is refused"


def _sources(d: Path) -> list[str]:
    (v,) = d.glob("wh/v*")
    return pq.read_table(v / "sources.parquet").column("key").to_pylist()


def _quarantine(d: Path) -> dict[str, str]:
    (v,) = d.glob("wh/v*")
    t = pq.read_table(v / "quarantine.parquet")
    return dict(zip(t.column("sample_id").to_pylist(), t.column("reason").to_pylist(), strict=True))


def test_label_paths_never_pull_in_outside_files(tmp_path):
    """Absolute, '..' and symlinked names: quarantined path-outside-root, never read, never a source.

    The outside image is a valid JPEG whose boxes fit, so only the confinement keeps it out."""
    secret = tmp_path / "secret.jpg"
    secret.write_bytes(_jpeg(99))
    d = _case("coco_path_escape", tmp_path)
    doc = json.loads((d / "annotations.json").read_text())
    links = {"to_secret.jpg": secret, "to_passwd.jpg": Path("/etc/passwd"), "to_zero.jpg": Path("/dev/zero")}
    for name, target in links.items():
        (d / "images" / name).symlink_to(target)
    os.mkfifo(d / "images" / "fifo.jpg")  # opening it blocking would hang the ETL forever
    (d / "images" / "inside_link.jpg").symlink_to(d / "images" / "ok.jpg")  # a link that stays inside is fine
    names = [*links, "fifo.jpg", "inside_link.jpg", str(secret), "../../secret.jpg"]
    doc["images"] += [{"id": 100 + i, "file_name": n} for i, n in enumerate(names)]
    doc["annotations"] = [{"id": 1, "image_id": 100, "category_id": 1, "bbox": [1, 1, 5, 5]},
                          {"id": 2, "image_id": 100 + names.index(str(secret)), "category_id": 1, "bbox": [1, 1, 5, 5]}]
    (d / "annotations.json").write_text(json.dumps(doc))

    r = run_capped("etl", "-c", "t.toml", cwd=d)
    _assert_typed(r, 65)  # far over the invalid threshold
    assert "path-outside-root" in r.err

    r = run_capped("etl", "-c", "t.toml", "--allow-invalid", cwd=d)
    _assert_typed(r, 0)
    assert _sources(d) == ["images/inside_link.jpg", "images/ok.jpg"]
    q = _quarantine(d)
    for name in links:
        assert q[f"images/{name}"] == "path-outside-root"
    assert q["images/fifo.jpg"] == "unreadable"
    for n in ("/etc/passwd", "/dev/zero", str(secret), "../../secret.jpg"):
        assert q[n] == "path-outside-root", n
    (v,) = d.glob("wh/v*")
    secret_bytes = secret.read_bytes()
    assert not any(secret_bytes[:256] in p.read_bytes() for p in v.iterdir() if p.is_file())


def test_label_file_that_is_a_device_is_refused(tmp_path):
    d = _case("coco_path_escape", tmp_path)
    (d / "annotations.json").unlink()
    (d / "annotations.json").symlink_to("/dev/zero")
    r = run_capped("etl", "-c", "t.toml", cwd=d)
    _assert_typed(r, 65)
    assert "annotations.json" in r.err and "not a regular file" in r.err


def test_label_file_over_the_limit_is_refused_unread(tmp_path):
    d = _case("coco_path_escape", tmp_path)
    with open(d / "annotations.json", "ab") as f:
        f.truncate(3 << 30)  # sparse: 3 GB declared, over the address-space cap if it were read whole
    (d / "t.toml").write_text((d / "t.toml").read_text() + "[limits]\nmax_label_mb = 2048\n")
    r = run_capped("etl", "-c", "t.toml", cwd=d)
    _assert_typed(r, 65)
    assert "max_label_mb" in r.err and "2048 MB limit" in r.err


def test_image_over_the_limit_is_quarantined_unread(tmp_path):
    d = _case("coco_path_escape", tmp_path)
    with open(d / "images" / "big.jpg", "wb") as f:
        f.truncate(2 << 30)  # sparse 2 GB "image"
    doc = json.loads((d / "annotations.json").read_text())
    doc["images"] = [{"id": 1, "file_name": "ok.jpg"}, {"id": 2, "file_name": "big.jpg"}]
    (d / "annotations.json").write_text(json.dumps(doc))
    r = run_capped("etl", "-c", "t.toml", "--allow-invalid", cwd=d)
    _assert_typed(r, 0)
    assert _quarantine(d) == {"images/big.jpg": "too-large"}
    assert r.peak_kib < 1 << 20  # far below the file: it was never read


def test_a_large_coco_listing_stays_bounded(tmp_path):
    """150,000 listed images that do not exist: memory follows the entries (~1 KB each), no bomb."""
    d = tmp_path / "big"
    (d / "images").mkdir(parents=True)
    n = 150_000
    doc = {"images": [{"id": i, "file_name": f"{i}.jpg"} for i in range(n)], "annotations": [],
           "categories": [{"id": 1, "name": "a"}]}
    (d / "annotations.json").write_text(json.dumps(doc))
    (d / "t.toml").write_text('[source]\nformat = "coco"\n[output]\nroot = "wh"\n')
    r = run_capped("etl", "-c", "t.toml", cwd=d)
    _assert_typed(r, 65)
    assert f"missing-file x{n}" in r.err
    assert r.peak_kib < 768 << 10, r.peak_kib


# -- --filter is one expression, nothing else ------------------------------------------------------


@pytest.fixture
def store(tmp_path, monkeypatch):
    url = str(tmp_path / "store")
    publish(url, "ws/demo", {"main": [make_rows(300, 0), make_rows(200, 300)]}, tmp_path, row_group_size=100)
    monkeypatch.setenv("WARP_STORE", url)
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


INJECTIONS = {
    "1=1; COPY (SELECT 1) TO 'pwned.csv'": "not one SQL expression",
    "1=1) UNION SELECT * FROM read_text('/etc/passwd') WHERE (1=1": "UNION",
    "id IN (SELECT 1 FROM read_text('/etc/passwd'))": "subquery",
    "EXISTS (SELECT * FROM read_csv('/etc/passwd'))": "subquery",
    "getenv('HOME') <> ''": "getenv()",
    "id > 1 AND st_aera(label) > 0": "st_aera()",  # a typo must not make DuckDB fetch an extension
    "id > 1 -- ) OR (1=1": None,  # a comment is only a comment
    "nope > 3": "no column 'nope'",
    "id > 1 ORDER BY 1": "not one SQL expression",
    "repeat(label, 1000000000) = ''": "repeat()",  # output size driven by a literal
}


@pytest.mark.parametrize("expr", sorted(INJECTIONS))
def test_filter_injection_is_a_usage_error(cli, store, expr):
    r = cli("stream", "ws/demo", "--columns", "id", "--filter", expr, "--format", "csv")
    want = INJECTIONS[expr]
    if want is None:
        assert r.code == 0, r.err
        assert len(r.out.splitlines()) == 1 + 498
        return
    assert r.code == 2, (r.code, r.err)
    assert r.out == ""
    assert want in r.err, r.err
    assert list(store.iterdir()) == []  # nothing written (pwned.csv)


def test_allowed_filters_still_work(cli, store):
    r = cli("stream", "ws/demo", "--columns", "id", "--format", "csv", "--filter",
            "lower(label) LIKE 'label-3%' AND id BETWEEN 10 AND 30 AND label IS NOT NULL AND id NOT IN (24)")
    assert r.code == 0, r.err
    assert [int(x) for x in r.out.split()[1:]] == [10, 17]


def test_filter_injection_capped_subprocess(store):
    r = run_capped("stream", "ws/demo", "--filter", "1=1; COPY (SELECT 1) TO 'pwned.csv'", cwd=store)
    _assert_typed(r, 2)
    assert r.out == "" and not (store / "pwned.csv").exists()


def test_every_connection_is_locked_down():
    import duckdb
    import pyarrow as pa
    from warpdata.core import sqlgate
    con = sqlgate.connect()
    settings = dict(con.execute("SELECT name, value FROM duckdb_settings() WHERE name IN "
                                "('autoinstall_known_extensions', 'autoload_known_extensions')").fetchall())
    assert settings == {"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"}
    con.register("t", pa.table({"x": [1, 2]}))
    sqlgate.lock(con)
    assert con.execute("SELECT sum(x) FROM t").fetchone() == (3,)  # what was registered still reads
    with pytest.raises(duckdb.PermissionException):
        con.execute("SELECT * FROM read_text('/etc/passwd')").fetchall()
    with pytest.raises(duckdb.Error):
        con.execute("SET enable_external_access = true")
    hidden = pa.table({"secret": [1]})  # noqa: F841 (a local DuckDB's replacement scan would read by name)
    with pytest.raises(duckdb.CatalogException):
        con.execute("SELECT * FROM hidden").fetchall()


# -- Table.query: one read-only SELECT over the table, nothing else ---------------------------------

QUERY_ATTACKS = {
    "COPY (SELECT * FROM main) TO 'pwned.csv'": "is not a SELECT query",
    "SELECT 1; COPY (SELECT 1) TO 'pwned.csv'": "is not a SELECT query",
    "ATTACH 'pwned.db' AS x": "is not a SELECT query",
    "INSTALL httpfs": "is not a SELECT query",
    "LOAD httpfs": "is not a SELECT query",
    "PRAGMA enable_external_access": "is not a SELECT query",
    "SET enable_external_access = true": "is not a SELECT query",
    "CREATE TABLE pwned AS SELECT * FROM main": "is not a SELECT query",
    "SELECT * FROM main; SELECT * FROM main": "holds 2 statements",
    "SELECT * FROM read_text('/etc/passwd')": "table function read_text()",
    "SELECT * FROM read_csv('/etc/passwd')": "table function read_csv()",
    "SELECT * FROM '/etc/passwd'": "reads the table '/etc/passwd'",  # DuckDB's replacement scan of a path
    "SELECT * FROM glob('/*')": "table function glob()",
    "SELECT * FROM query_table('main')": "table function query_table()",
    "SELECT id FROM main UNION ALL SELECT 1 FROM read_parquet('/x.parquet')": "table function read_parquet()",
    "WITH t AS (SELECT * FROM read_text('/etc/passwd')) SELECT * FROM t": "table function read_text()",
    "SELECT * FROM main WHERE id IN (SELECT 1 FROM read_csv('/etc/passwd'))": "table function read_csv()",
    "SELECT * FROM other": "reads the table 'other'",
    "SELECT * FROM main JOIN duckdb_settings() s ON true": "table function duckdb_settings()",
    "SELECT * FROM main.main": "qualified tables",
    "SELECT getenv('HOME') FROM main": "getenv()",
    "SELECT current_setting('enable_external_access')": "current_setting()",
    "SELECT main.st_aera(label) FROM main": "qualified functions",
    "SELECT st_aera(label) FROM main": "st_aera()",  # a typo must not make DuckDB fetch an extension
    "SELECT repeat(label, 1000000000) FROM main": "repeat()",
    "SELECT * FROM main WHERE id = $x": "parameter",
    "": "is empty",
    # a WITH name counts only in its own scope, and never shadows a catalog object
    "SELECT * FROM duckdb_views, (WITH duckdb_views AS (SELECT 1) SELECT 1)": "name of a catalog object",
    "SELECT * FROM pg_settings, (WITH pg_settings AS (SELECT 1) SELECT 1)": "name of a catalog object",
    "SELECT * FROM warp_all_columns, (WITH warp_all_columns AS (SELECT 1) SELECT 1)": "name of a catalog object",
    "WITH main AS (SELECT 1 AS id) SELECT * FROM main": "the name of the table",
    "SELECT * FROM t, (WITH t AS (SELECT 1) SELECT * FROM t)": "reads the table 't'",
    "WITH a AS (SELECT * FROM b), b AS (SELECT * FROM main) SELECT * FROM a": "reads the table 'b'",
    "WITH a AS (SELECT * FROM a) SELECT * FROM a": "reads the table 'a'",  # not recursive: not itself
    "SELECT * FROM main WHERE " + "NOT " * 600 + "id > 1": "levels deep",
    "SELECT * FROM main WHERE id IN (" + ",".join(map(str, range(200_000))) + ")": "over the limit",
}


@pytest.mark.parametrize("sql", sorted(QUERY_ATTACKS))
def test_query_attack_is_a_usage_error_and_writes_nothing(store, sql):
    import warpdata
    from warpdata.core.errors import UsageError

    t = warpdata.dataset("ws/demo").table("main")
    with pytest.raises(UsageError, match="query") as ei:
        t.query(sql)
    assert QUERY_ATTACKS[sql] in ei.value.message
    assert ei.value.exit_code == 2
    assert list(store.iterdir()) == []  # nothing written (pwned.csv, pwned.db)


def test_allowed_queries_still_work(store):
    import warpdata

    t = warpdata.dataset("ws/demo").table("main")
    got = t.query("WITH c AS (SELECT label, count(*) AS n, max(id) AS top FROM main WHERE id < 100 GROUP BY label) "
                  "SELECT label, n, top, rank() OVER (ORDER BY n DESC, label) AS r FROM c ORDER BY r LIMIT 2")
    assert got.column_names == ["label", "n", "top", "r"]
    assert got.to_pylist() == [{"label": "label-0", "n": 15, "top": 98, "r": 1},
                               {"label": "label-1", "n": 15, "top": 99, "r": 2}]
    assert t.query("SELECT count(*) AS n FROM MAIN m1 JOIN main m2 USING (id)").to_pylist() == [{"n": 500}]
    assert t.query("WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT n + 1 FROM r WHERE n < 5), "
                   "s AS (SELECT * FROM r) SELECT sum(n) AS t FROM s").to_pylist() == [{"t": 15}]
    assert t.query("SELECT count(*) AS n FROM (WITH a AS (SELECT id FROM main WHERE id < 10) SELECT * FROM a)"
                   ).to_pylist() == [{"n": 10}]


def test_a_select_view_hides_its_other_columns_from_filters_queries_and_reads(store):
    import warpdata
    from warpdata.core.errors import UsageError

    view = warpdata.dataset("ws/demo").table("main").select(["id", "label"])
    for run in (lambda: view.filter("x > 0").count(), lambda: view.filter("payload IS NOT NULL").to_arrow(),
                lambda: view.query("SELECT x FROM main"), lambda: view.select(["id", "x"]),
                lambda: view.filter("id > 0").select(["payload"]), lambda: list(view.batches(columns=["x"]))):
        with pytest.raises(UsageError) as ei:
            run()
        assert re.search(r"\b(x|payload)\b", ei.value.message), ei.value.message
    assert view.filter("id < 3").to_arrow().column_names == ["id", "label"]
    assert view.filter("label = 'label-1'").count() == 72


def test_a_runaway_query_is_stopped_by_the_time_limit(store):
    import warpdata
    from warpdata.core.sqlgate import QueryLimitError

    t = warpdata.dataset("ws/demo").table("main")
    with pytest.raises(QueryLimitError, match="time limit of 1 s") as ei:
        t.query("WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r", timeout=1)
    assert ei.value.exit_code == 2 and "WARP_SQL_TIMEOUT" in ei.value.hint


def test_a_query_over_the_memory_limit_is_typed(store, monkeypatch):
    import warpdata
    from warpdata.core.sqlgate import QueryLimitError

    monkeypatch.setenv("WARP_SQL_MEMORY", "16MB")
    t = warpdata.dataset("ws/demo").table("main")
    with pytest.raises(QueryLimitError, match="memory limit of 16.0 MB") as ei:
        t.query("WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT n + 1 FROM r WHERE n < 2000000) "
                "SELECT count(DISTINCT n) FROM r", timeout=120)
    assert "WARP_SQL_MEMORY" in ei.value.hint


def test_query_connections_are_bounded_and_settable(monkeypatch):
    from warpdata.core import sqlgate
    from warpdata.core.errors import ConfigError

    def settings() -> dict:
        con = sqlgate.connect()
        try:
            return dict(con.execute("SELECT name, value FROM duckdb_settings() WHERE name IN ('threads', "
                                    "'memory_limit', 'max_expression_depth', 'temp_directory', "
                                    "'python_enable_replacements')").fetchall())
        finally:
            con.close()

    got = settings()
    assert int(got["threads"]) == max(1, (os.cpu_count() or 1) // 2)
    assert got["temp_directory"] == "" and got["python_enable_replacements"] == "false"
    assert int(got["max_expression_depth"]) <= 2 * sqlgate.MAX_DEPTH
    monkeypatch.setenv("WARP_SQL_THREADS", "1")
    monkeypatch.setenv("WARP_SQL_MEMORY", "100MiB")
    got = settings()
    assert got["threads"] == "1" and got["memory_limit"] == "100.0 MiB"
    for name, bad in (("WARP_SQL_MEMORY", "100"), ("WARP_SQL_THREADS", "0"), ("WARP_SQL_TIMEOUT", "soon")):
        monkeypatch.setenv(name, bad)
        with pytest.raises(ConfigError, match=name):
            sqlgate.connect()
        monkeypatch.delenv(name)


@pytest.mark.parametrize("expr, named", [
    ("NOT " * 600 + "id > 1", "levels deep"),
    ("id IN (" + ",".join(map(str, range(200_000))) + ")", "over the limit"),
])
def test_filters_past_the_depth_and_length_limits_are_usage_errors(cli, store, expr, named):
    r = cli("stream", "ws/demo", "--columns", "id", "--filter", expr, "--format", "csv")
    assert r.code == 2, (r.code, r.err[-500:])
    assert named in r.err and "internal error" not in r.err and r.out == ""


# -- feature cache and publish: symlinks out of the folder -------------------------------------------


def test_feature_scan_reads_nothing_outside_its_root(tmp_path):
    from warpdata.etl.quarantine import Quarantine
    from warpdata.features.scan import scan

    root = tmp_path / "src"
    root.mkdir()
    (root / "a.jpg").write_bytes(_jpeg(1))
    (root / "a.txt").write_text("a cat")
    outside = tmp_path / "outside.jpg"
    outside.write_bytes(_jpeg(2))
    (root / "b.jpg").symlink_to(outside)
    (root / "b.txt").write_text("a dog")
    (root / "c.jpg").write_bytes(_jpeg(3))
    (root / "c.txt").symlink_to("/etc/hostname")
    os.mkfifo(root / "d.jpg")
    (root / "d.txt").write_text("a pipe")
    q = Quarantine()
    res = scan(root, q)
    assert [i.key for i in res.items] == ["a.jpg"]
    assert {r.sample_id: r.reason for r in q.records} == {"b.jpg": "path-outside-root", "c.jpg": "path-outside-root",
                                                         "d.jpg": "unreadable"}


@pytest.mark.parametrize("forge,where", [
    (lambda s: s[1].update(first_record=s[1]["first_record"] + 1), "sources/1"),  # a gap between folders
    (lambda s: s[0].update(records=s[0]["records"] + 1, first_record=0) or s[1].update(
        first_record=s[1]["first_record"] + 1), "sources"),  # ranges past the last record
    (lambda s: s[0].update(name="d7"), "sources/0"),
    (lambda s: s[0].update(num_repeats=10**9), "sources/0/num_repeats"),  # an epoch of 10^9 samples
    (lambda s: s[0].update(num_repeats=0), "sources/0/num_repeats"),
    (lambda s: s[0].update(path="/etc"), "sources/0"),  # no field outside the schema
    (lambda s: s.clear(), "sources"),
])
def test_forged_feature_cache_sources_are_refused_even_when_resealed(tmp_path, forge, where):
    """A manifest's `sources` decides how often a loader samples each record: a resealed forgery
    that leaves records unweighted, double-counts them or asks for a huge epoch is refused."""
    from warpdata.core.canonical import seal
    from warpdata.core.errors import DataError
    from warpdata.features.reader import ShardCache
    from warpdata.features.writer import CacheSpec, SourceDir, build_cache

    dirs = []
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        for i in range(2):
            (tmp_path / d / f"{i}.jpg").write_bytes(_jpeg(i))
            (tmp_path / d / f"{i}.txt").write_text(f"{d} {i}")
        dirs.append(SourceDir(str(tmp_path / d), 2))
    build_cache(CacheSpec(source="", output=str(tmp_path / "cache"), size=(16, 16), sources=dirs))
    mp = tmp_path / "cache" / "manifest.json"
    doc = json.loads(mp.read_text())
    doc.pop("content_sha256")
    forge(doc["sources"])
    mp.write_text(json.dumps(seal(doc)))
    with pytest.raises(DataError) as ei:
        ShardCache(tmp_path / "cache")
    assert ei.value.exit_code == 65 and "manifest.json" in ei.value.message
    assert where in ei.value.message or ei.value.details.get("json_path", "").startswith(where)


def test_publish_from_refuses_symlinks_leaving_the_artifact(tmp_path):
    from warpdata.core.errors import DataError
    from warpdata.publishing.from_artifacts import check_symlinks, describe_source

    art = tmp_path / "art"
    (art / "sub").mkdir(parents=True)
    (art / "manifest.json").write_text(json.dumps({"kind": "demo"}))
    (art / "sub" / "inside").symlink_to(art / "manifest.json")
    assert describe_source(art).kind == "demo"  # a link that stays inside is fine
    (art / "sub" / "key").symlink_to(Path.home())
    with pytest.raises(DataError, match=r"sub/key is a symlink to .*outside"):
        describe_source(art)
    assert check_symlinks(art, follow_symlinks=True) == 2


def test_publish_artifact_refuses_a_link_out_of_the_folder(cli, tmp_path, monkeypatch):
    """`warp publish --artifact NAME=DIR` with a link to /etc/passwd: exit 65, nothing published."""
    monkeypatch.setenv("WARP_STORE", str(tmp_path / "store"))
    art = tmp_path / "art"
    art.mkdir()
    (art / "a.txt").write_text("hi\n")
    (art / "p.txt").symlink_to("/etc/passwd")
    r = cli("publish", "demo/art", "--artifact", f"files={art}")
    assert r.code == 65 and "p.txt is a symlink to /etc/passwd" in r.err and "--follow-symlinks" in r.err
    assert r.out == "" and not list((tmp_path / "store").rglob("latest*"))
    r = cli("publish", "demo/art", "--artifact", f"files={art}", "--follow-symlinks", "-q")
    assert r.code == 0, r.err


# -- read path: HTTP hosts and registrations that lie ---------------------------------------

def _web_store(tmp_path):
    from support.datasets import write_media

    write_media(tmp_path / "media", 4)
    return publish(str(tmp_path / "store"), "ws/web", {"main": [make_rows(200, 0, image_every=4)]}, tmp_path,
                   row_group_size=100, media=tmp_path / "media")


@pytest.mark.parametrize("lie, code, named", [
    # a 206 for other bytes than asked: never taken as the asked-for range
    (lambda m, p, r: (206, {"Content-Range": "bytes 0-9/999"}, b"0123456789") if r and "blobs" in p else None,
     78, "Content-Range"),
    # a redirect loop ends after 5 hops
    (lambda m, p, r: (302, {"Location": p}, b"") if "blobs" in p else None, 78, "too many redirects"),
    # a redirect to a local file is refused, not followed
    (lambda m, p, r: (302, {"Location": "file:///etc/passwd"}, b"") if "blobs" in p else None, 78,
     "not an http(s) URL"),
    # a range that is not the one asked for (and shorter): the host's fault, named as such
    # (one request policy for every store, docs/formats/registry.md)
    (lambda m, p, r: (206, {"Content-Range": f"bytes {r.split('=')[1].split('-')[0]}-0/1"}, b"x")
     if r and "blobs" in p else None, 78, "answered a ranged read with another range"),
    # 401 / 403 name the web host's access rules
    (lambda m, p, r: (403, {}, b"no") if "blobs" in p else None, 78, "HTTP 403"),
])
def test_lying_http_host(cli, tmp_path, monkeypatch, lie, code, named):
    from support.httpserve import StaticServer

    _web_store(tmp_path)
    with StaticServer(tmp_path / "store", lie=lie) as host:
        monkeypatch.setenv("WARP_STORE", host.url)
        r = cli("stream", "ws/web", "--columns", "id", "--mode", "remote")
        assert r.code == code, r.err
        assert named in r.err and r.out == ""


def test_tampered_registration_cannot_escape_its_folder(cli, tmp_path, monkeypatch):
    from warpdata.registry import register as reg

    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "media").mkdir()
    (tmp_path / "media" / "a.txt").write_bytes(b"a")
    assert cli("register", "ws/r", "--artifact", f"media={tmp_path / 'media'}").code == 0
    p = reg.registry_path("ws/r")
    doc = json.loads(p.read_text())
    doc["artifacts"]["media"]["members"]["../../etc/passwd"] = ["0" * 64, 1, None]
    doc["version_hash"] = reg.content_hash(doc)  # a consistent forgery
    p.write_text(json.dumps(doc))
    r = cli("cat", "ws/r", "--artifact", "media", "--ref", "../../etc/passwd")
    assert r.code == 65 and "not a path inside" in r.err and str(p) in r.err and r.out == ""


# -- ingest: decompression bombs, impossible headers, NUL bytes (tests/malformed/images/) -----------

IMAGES = Path(__file__).parent / "malformed" / "images"


def _png(seed: int) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(synthetic_photo(np.random.default_rng(seed), 24, 16)).save(buf, "PNG")
    return buf.getvalue()


def _ingested(store: Path, name: str) -> tuple[list[str], dict[str, str]]:
    import warpdata

    ds = warpdata.dataset(name, store=str(store))
    main = ds.table("main").to_arrow().column("id").to_pylist()
    q = ds.table("quarantine").to_arrow().to_pylist() if "quarantine" in ds.tables else []
    return main, {r["path"]: r["reason"] for r in q}


def test_ingest_quarantines_bombs_and_impossible_headers_and_keeps_same_named_classes(tmp_path):
    root = tmp_path / "pets"
    for d in ("cat", "dog", "odd"):
        (root / d).mkdir(parents=True)
    (root / "cat" / "0.png").write_bytes(_png(1))
    (root / "dog" / "0.png").write_bytes(_png(2))  # the same stem in another class: its own row
    shutil.copy(IMAGES / "png_bomb_30000x30000.png", root / "odd" / "bomb.png")
    shutil.copy(IMAGES / "png_impossible_header.png", root / "odd" / "impossible.png")
    env = {"WARP_STORE": str(tmp_path / "store"), "WARP_CACHE_DIR": str(tmp_path / "cache")}
    r = run_capped("ingest", "imagefolder", root, "ws/pets", cwd=tmp_path, env=env)
    _assert_typed(r, 0)
    assert r.peak_kib < 1 << 20  # 2.7 GB of declared pixels, never decoded
    main, q = _ingested(tmp_path / "store", "ws/pets")
    assert main == ["cat/0.png", "dog/0.png"]
    assert q == {"odd/bomb.png": "too-many-pixels", "odd/impossible.png": "impossible-header"}
    r = run_capped("ingest", "imagefolder", root, "ws/small", "--max-pixels", "100", cwd=tmp_path, env=env)
    _assert_typed(r, 65)  # every image over a 100-pixel cap: nothing left to publish
    assert "too-many-pixels" in r.err


def test_ingest_csv_with_a_nul_byte_in_one_path_quarantines_that_row(tmp_path):
    root = tmp_path / "files"
    root.mkdir()
    for i in range(3):
        (root / f"{i}.png").write_bytes(_png(i))
    (tmp_path / "list.csv").write_text("image,label\n0.png,a\n1\x00.png,b\n2.png,c\n")
    env = {"WARP_STORE": str(tmp_path / "store"), "WARP_CACHE_DIR": str(tmp_path / "cache")}
    r = run_capped("ingest", "csv", tmp_path / "list.csv", "ws/nul", "--file-column", "image", "--root", root,
                   cwd=tmp_path, env=env)
    _assert_typed(r, 0)
    assert "bad-path 1" in r.err
    import warpdata

    ds = warpdata.dataset("ws/nul", store=str(tmp_path / "store"))
    assert ds.table("main").to_arrow().column("image").to_pylist() == ["0.png", "2.png"]
    (q,) = ds.table("quarantine").to_arrow().to_pylist()
    assert q["reason"] == "bad-path" and q["path"] == "1\x00.png" and q["source"] == "row 1"


def test_etl_quarantines_bombs_and_impossible_headers_undecoded(tmp_path):
    d = _case("coco_path_escape", tmp_path)
    shutil.copy(IMAGES / "png_bomb_30000x30000.png", d / "images" / "bomb.png")
    shutil.copy(IMAGES / "png_impossible_header.png", d / "images" / "impossible.png")
    doc = json.loads((d / "annotations.json").read_text())
    doc["images"] = [{"id": 1, "file_name": "ok.jpg"}, {"id": 2, "file_name": "bomb.png"},
                     {"id": 3, "file_name": "impossible.png"}]
    doc["annotations"] = []
    (d / "annotations.json").write_text(json.dumps(doc))
    r = run_capped("etl", "-c", "t.toml", "--allow-invalid", cwd=d)
    _assert_typed(r, 0)
    assert _quarantine(d) == {"images/bomb.png": "too-many-pixels", "images/impossible.png": "impossible-header"}
    assert r.peak_kib < 1 << 20


def test_feature_cache_quarantines_bombs_and_impossible_headers(tmp_path):
    from warpdata.features.writer import CacheSpec, build_cache

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jpg").write_bytes(_jpeg(1))
    shutil.copy(IMAGES / "png_bomb_30000x30000.png", src / "b.png")
    shutil.copy(IMAGES / "png_impossible_header.png", src / "c.png")
    for k in "abc":
        (src / f"{k}.txt").write_text(f"caption {k}")
    build_cache(CacheSpec(source=str(src), output=str(tmp_path / "cache"), size=(16, 16)), allow_invalid=True)
    q = [json.loads(x) for x in (tmp_path / "cache" / "quarantine.jsonl").read_text().splitlines()]
    assert {r["sample_id"]: r["reason"] for r in q} == {"b.png": "too-many-pixels", "c.png": "impossible-header"}
    assert (tmp_path / "cache" / "keys.txt").read_text().split() == ["a.jpg"]


# -- encoder plugins that return garbage ------------------------------------------------------------

_PLUGIN = '''
import numpy as np

from warpdata.formats.featshard import FieldSpec


class Emb:
    def __init__(self, mode, dim=4):
        self.mode, self.dim = mode, dim

    def embed(self, items):
        n = len(items)
        if self.mode == "ragged":
            return [[1.0] * (4 if i != 1 else 3) for i in range(n)]
        if self.mode == "strings":
            return [["a", "b", "c", "d"] for _ in range(n)]
        if self.mode == "zero-width":
            return np.zeros((n, 0), np.float32)
        if self.mode == "nan":
            v = np.ones((n, 4), np.float32)
            v[2, 1] = np.nan
            return v
        if self.mode == "zeros":
            v = np.ones((n, 4), np.float32)
            v[[0, 3]] = 0
            return v
        if self.mode == "huge":  # finite, but a float32 norm overflows
            v = np.full((n, 4), 3e38, np.float32)
            v[:, 0] = (np.arange(n) % 10) * 1e37
            return v
        return np.ones((n, 4), np.float32)

    def identity(self):
        return {"name": "hostile-" + self.mode}


def embedder(device="cpu", mode="ok"):
    return Emb(mode)


class Feat:
    def __init__(self, mode):
        self.mode = mode

    def fields(self, h, w):
        return [FieldSpec("z", "float32", (4,))]

    def encode(self, pixels, captions):
        n = len(captions)
        if self.mode == "ragged":
            return {"z": [[1.0] * (4 if i != 1 else 2) for i in range(n)]}
        if self.mode == "strings":
            return {"z": np.array([["x"] * 4] * n)}
        return {"z": np.zeros((n, 0), np.float32)}

    def identity(self):
        return {"name": "hostile-feat-" + self.mode}


def features(device="cpu", dtype="float16", mode="ragged"):
    return Feat(mode)
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "hostile_encoders.py").write_text(_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path / "plugins"))
    return "hostile_encoders"


@pytest.mark.parametrize("mode, named", [
    ("ragged", "ragged"), ("strings", "text"), ("zero-width", "zero-width"), ("nan", "NaN or infinite"),
    ("zeros", "all-zero"),
])
def test_embedding_plugin_garbage_is_typed_and_names_the_rows(cli, store, plugin, mode, named):
    r = cli("embeddings", "add", "ws/demo", "--column", "label", "--encoder", f"{plugin}:embedder",
            "--option", f"mode={mode}")
    assert r.code == 65, (r.code, r.err)
    assert "internal error" not in r.err and named in r.err and f"{plugin}:embedder" in r.err
    row = {"ragged": 1, "strings": 0, "nan": 2}.get(mode)
    if row is not None:
        assert f"row {row} (id {row})" in r.err, r.err
    if mode == "zeros":  # rows 0 and 3 of each 256-row batch
        assert "4 all-zero vector(s)" in r.err and "rows 0 (id 0), 3 (id 3), 256 (id 256)" in r.err


def test_embedding_vectors_whose_length_overflows_float32_still_search(cli, store, plugin):
    r = cli("embeddings", "add", "ws/demo", "--column", "label", "--encoder", f"{plugin}:embedder",
            "--option", "mode=huge", "--name", "huge")
    assert r.code == 0, r.err
    import warpdata

    emb = warpdata.dataset("ws/demo").embeddings("huge")
    hits = emb.search(7, k=1, exact=True)
    assert hits[0]["row"] % 10 == 7 and abs(hits[0]["distance"]) < 1e-5  # not every distance 1.0
    # rows 7, 17, ... of every 256-row batch are the same vector: ties go to the lower row whatever k
    # is (argpartition alone picks any of the tied rows, depending on the CPU's SIMD kernels)
    wide = emb.search(7, k=60, exact=True)
    assert [h["row"] for h in emb.search(7, k=3, exact=True)] == [h["row"] for h in wide[:3]]
    assert hits == wide[:1]
    assert wide == sorted(wide, key=lambda h: (h["distance"], h["row"]))


@pytest.mark.parametrize("mode, named", [("ragged", "ragged"), ("strings", "text"), ("zero-width", "zero-width")])
def test_feature_cache_encoder_garbage_is_typed_and_names_the_sample(tmp_path, plugin, mode, named):
    from warpdata.features.encoders import EncoderOutputError
    from warpdata.features.writer import CacheSpec, build_cache

    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"{i}.jpg").write_bytes(_jpeg(i))
        (src / f"{i}.txt").write_text(f"caption {i}")
    spec = CacheSpec(source=str(src), output=str(tmp_path / "cache"), size=(16, 16),
                     encoder=f"{plugin}:features", encoder_options={"mode": mode}, caching_device="cpu")
    with pytest.raises(EncoderOutputError) as ei:
        build_cache(spec, workers=1)
    assert ei.value.exit_code == 65 and named in ei.value.message and f"{plugin}" in ei.value.message
    if mode == "ragged":
        assert "'1.jpg'" in ei.value.message, ei.value.message


# -- formats: offsets past the end, absurd shapes ----------------------------------------------------

def test_tbl_metadata_crc_offset_past_the_end_is_typed(cli):
    path = Path(__file__).parent / "malformed" / "tbl" / "metadata_crc_offset_past_end.tbl"
    r = cli("inspect", path, "--verify")
    assert r.code == 1 and "internal error" not in r.err, r.err
    assert f"{path}: metadata block 1" in r.err and "has no CRC in the block CRC table" in r.err
    from warpdata.formats import tbl

    problems = tbl.TblReader(path, verify=False).verify_all()
    assert problems and problems[0].check.startswith("metadata")


_READ_ZARR = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1536 << 20, 1536 << 20))
from warpdata.core.errors import WarpError
from warpdata.storage.zarr_store import read_array
try:
    read_array(sys.argv[1])
except WarpError as e:
    print(type(e).__name__, e.exit_code, e.message)
"""


def test_zarr_row_of_objects_past_memory_is_typed_before_allocating(tmp_path):
    """2 x 32768 x 32768 u16 with 2 GiB chunks: within every metadata limit, but one row of objects
    would allocate 2 GiB (MemoryError under a 1.5 GiB address space before)."""
    src = Path(__file__).parent / "malformed" / "zarr-rows" / "huge-row-block"
    p = subprocess.run([sys.executable, "-c", _READ_ZARR, str(src)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "MemoryError" not in p.stderr, p.stderr[-2000:]
    assert p.stdout.startswith("DataError 65") and "MAX_ROW_BLOCK_BYTES" in p.stdout, p.stdout


def test_feature_cache_with_quarantined_files_publishes_with_relative_sources(cli, tmp_path, monkeypatch):
    """The quarantine table names files relative to the source root: an absolute path in it made
    `warp publish --from` refuse the cache as holding machine-local paths (exit 65)."""
    from warpdata.features.writer import CacheSpec, build_cache

    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.jpg").write_bytes(_jpeg(1))
    shutil.copy(IMAGES / "png_impossible_header.png", src / "sub" / "c.png")
    (src / "sub" / "d.png").write_bytes(_png(4))  # no caption
    for k in ("a", "sub/c"):
        (src / f"{k}.txt").write_text(f"caption {k}")
    build_cache(CacheSpec(source=str(src.resolve()), output=str(tmp_path / "cache"), size=(16, 16)),
                allow_invalid=True)
    q = [json.loads(x) for x in (tmp_path / "cache" / "quarantine.jsonl").read_text().splitlines()]
    assert sorted(r["source"] for r in q) == ["sub/c.png", "sub/d.png"]
    monkeypatch.setenv("WARP_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "blobs"))
    r = cli("publish", "ws/fc", "--from", tmp_path / "cache")
    assert r.code == 0, r.err
    assert str(tmp_path) not in "".join(p.read_text(errors="replace") for p in (tmp_path / "store").rglob("*.json"))


IMAGE_CASES = json.loads((IMAGES / "expected.json").read_text())


@pytest.mark.parametrize("name", sorted(IMAGE_CASES))
def test_malformed_image_corpus_gets_the_same_reason_in_every_pipeline(name):
    """tests/malformed/images: ingest, the warehouse header pass and the feature cache's driver pass
    quarantine each reproducer with the reason in expected.json, from the header alone (header
    checks only for the warehouse and feature cache, whose decoders find truncation later)."""
    from warpdata.features.writer import header_problem
    from warpdata.publishing.ingest import Rejected, check_file
    from warpdata.warehouse.images import ProbeError, probe

    want = IMAGE_CASES[name]
    with pytest.raises(Rejected) as ei:
        check_file(str(IMAGES), name, max_bytes=1 << 20)
    assert ei.value.reason == want, ei.value.message
    if want in ("too-many-pixels", "impossible-header"):
        with pytest.raises(ProbeError) as pe:
            probe((IMAGES / name).read_bytes())
        assert pe.value.reason == want
        assert header_problem(str(IMAGES / name), 89_478_485).reason == want


def test_paired_ingest_quarantines_a_bomb_on_either_side(tmp_path):
    a, b = tmp_path / "images", tmp_path / "masks"
    a.mkdir()
    b.mkdir()
    for i in range(2):
        (a / f"{i}.png").write_bytes(_png(i))
        (b / f"{i}.png").write_bytes(_png(10 + i))
    shutil.copy(IMAGES / "png_bomb_30000x30000.png", a / "2.png")
    (b / "2.png").write_bytes(_png(12))
    (a / "3.png").write_bytes(_png(3))
    shutil.copy(IMAGES / "gif_65535x65535.gif", b / "3.gif")
    env = {"WARP_STORE": str(tmp_path / "store"), "WARP_CACHE_DIR": str(tmp_path / "cache")}
    r = run_capped("ingest", "paired", a, b, "ws/seg", cwd=tmp_path, env=env)
    _assert_typed(r, 0)
    _main, q = _ingested(tmp_path / "store", "ws/seg")
    assert q == {"2.png": "too-many-pixels", "3.gif": "too-many-pixels"}, q


def test_feature_cache_config_sets_the_pixel_cap(tmp_path, cli):
    """`[limits] max_pixels` in a feature-cache config: an ordinary image over a lowered cap is
    quarantined too-many-pixels, undecoded, like the warehouse's [limits] and ingest --max-pixels."""
    src = tmp_path / "src"
    src.mkdir()
    from PIL import Image

    Image.new("RGB", (8, 8), (10, 20, 30)).save(src / "a.jpg")  # 64 pixels: under the cap
    Image.new("RGB", (64, 64), (30, 20, 10)).save(src / "b.png")  # 4,096 pixels: over it
    (src / "a.txt").write_text("caption a")
    (src / "b.txt").write_text("caption b")
    w, h = 64, 64
    cfg = tmp_path / "fc.toml"
    cfg.write_text(f"""
[source]
format = "captions"
path = "{src}"

[transform]
resolution = 16

[limits]
max_pixels = {w * h - 1}

[validation]
max_invalid_fraction = {{ warn = 0.9, fail = 0.9 }}

[output]
path = "{tmp_path / 'cache'}"
""")
    r = cli("etl", "--config", str(cfg))
    assert r.code == 0, r.err
    q = [json.loads(x) for x in (tmp_path / "cache" / "quarantine.jsonl").read_text().splitlines()]
    assert {x["sample_id"]: x["reason"] for x in q} == {"b.png": "too-many-pixels"}
    cfg.write_text(cfg.read_text().replace(f"max_pixels = {w * h - 1}", "max_pixels = 0"))
    r = cli("etl", "--config", str(cfg))
    assert r.code == 78 and "max_pixels" in r.err, (r.code, r.err)
