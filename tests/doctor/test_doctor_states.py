"""``warp doctor WS/NAME --states``: saved states are checked before they are used (issue 36 item 2).

Each file's size and JSON nesting are bounded, every state's fields and ranges are checked (exit 65
naming the field: these were exit 70 or a 2 GiB allocation), and a state whose consumed set does not
give its digests fails the exactly-once check. Memory is measured in a subprocess under an address
space limit (counts, never timings).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

ROWS = 53


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from support.datasets import make_rows, publish

    root = tmp_path_factory.mktemp("doctorstates")
    url = str(root / "store")
    publish(url, "ws/o", {"main": [make_rows(20, payload=1), make_rows(33, 20, payload=1)]}, root / "pub",
            row_group_size=7)
    return url


@pytest.fixture
def final(store, monkeypatch, tmp_path):
    """The final state (JSON) of a one-rank epoch, and a writer of edited copies."""
    import warpdata

    monkeypatch.setenv("WARP_STORE", store)
    for v in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(v, raising=False)
    s = warpdata.dataset("ws/o").table("main").batches(5, columns=["id"], rank=0, world_size=1)
    list(s)
    doc = json.loads(s.state_dict().to_json())

    def write(text: str, name: str = "state.json"):
        p = tmp_path / name
        p.write_text(text)
        return p
    return doc, write


def test_the_saved_state_passes(cli, final):
    doc, write = final
    r = cli("doctor", "ws/o", "--states", write(json.dumps(doc)))
    assert r.code == 0 and "53 of 53 samples yielded once" in r.out, r.out + r.err


@pytest.mark.parametrize(("edit", "field"), [
    (lambda d: {**d, "world": 1_000_000_000}, "world"),  # was 2 GiB in 4 s (a list of every rank)
    (lambda d: {**d, "world": 1e30}, "world"),  # exit 70: OverflowError
    (lambda d: {**d, "seed": "abc"}, "seed"),  # exit 70: ValueError
    (lambda d: {"epoch": 0, "step": 3, "sampler": "x"}, "sampler"),  # exit 70 when first seen
    (lambda d: {**d, "consumed": [[3, 1]]}, "consumed"),
    (lambda d: {**d, "rank": -1}, "rank"),
])
def test_a_malformed_state_is_exit_65_naming_the_field(cli, final, edit, field):
    doc, write = final
    p = write(json.dumps(edit(doc)))
    r = cli("doctor", "ws/o", "--states", p)
    assert r.code == 65, r.out + r.err
    assert f"{p}: the resume state's {field} is" in r.err and "hint:" in r.err and "internal error" not in r.err


@pytest.mark.parametrize(("text", "what"), [
    ("[" * 200_000 + "]" * 200_000, "nested more than 8 deep"),  # was exit 70: RecursionError
    ("[" * 40 + "{}" + "]" * 40, "nested more than 8 deep"),
    (" " * (16 * 2**20 + 1), "more than 16,777,216 bytes"),
])
def test_a_state_file_is_bounded_before_it_is_parsed(cli, final, text, what):
    _, write = final
    p = write(text)
    r = cli("doctor", "ws/o", "--states", p)
    assert r.code == 65 and f"{p}: " in r.err and what in r.err and "internal error" not in r.err, r.err


def test_a_state_whose_consumed_set_was_emptied_fails_exactly_once(cli, final):
    doc, write = final
    r = cli("--json", "doctor", "ws/o", "--states", write(json.dumps({**doc, "consumed": []})))
    assert r.code == 1  # it passed before: its digests still said every sample was read
    bad = [c for c in json.loads(r.out)["checks"] if c["status"] == "FAIL"]
    assert [c["name"] for c in bad] == ["exactly-once"]
    assert "consumed_samples is 53, but its consumed batch intervals give 0" in bad[0]["detail"]


def test_a_world_without_its_states_is_a_failed_check_not_a_list_of_ranks(cli, final):
    doc, write = final
    r = cli("--json", "doctor", "ws/o", "--states", write(json.dumps({**doc, "world": 1 << 20})))
    detail = json.loads(r.out)["checks"][0]["detail"]
    assert r.code == 1 and "world size 1,048,576, missing [1, 2, 3, 4, 5, 6, 7, 8, 9, 10 and 1,048,565 more]" in detail


def test_doctor_states_with_a_claimed_world_stays_small(final, store):
    """Under a 1 GiB address-space limit (the claim of 10^9 ranks listed them: 2 GiB), exit 65 and a small peak."""
    doc, write = final
    p = write(json.dumps({**doc, "world": 1_000_000_000}))
    # the peak of this process's own memory (VmHWM): ru_maxrss after exec keeps the forking parent's peak
    code = ("import resource, sys\n"
            "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
            "from warpdata.cli.app import main\n"
            f"rc = main(['doctor', 'ws/o', '--states', {str(p)!r}])\n"
            "hwm = [ln for ln in open('/proc/self/status') if ln.startswith('VmHWM:')]\n"
            "print('RSS', hwm[0].split()[1] if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "
            "file=sys.stderr)\n"
            "sys.exit(rc)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "WARP_STORE": store})
    assert r.returncode == 65 and "world is 1000000000" in r.stderr, r.stderr
    rss_kb = int(r.stderr.split("RSS ")[1].split()[0])
    assert rss_kb < 400 * 1024, rss_kb
