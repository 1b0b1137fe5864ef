"""A real S3 protocol server for tests: moto on 127.0.0.1, with request counting.

Fixtures (made available to every test by ``tests/conftest.py``):

``moto_server`` (session)
    One moto S3 server per test process (per xdist worker), run as a
    subprocess bound to ``127.0.0.1`` on a free port (never 0.0.0.0). A WSGI
    middleware records every S3 request; ``moto_server.endpoint`` is its URL.
    It dies with the test process, however that ends (``support.tether``).

``s3`` (function)
    A fresh bucket (``warp-test-<hex>``, created with boto3) and the
    environment every client needs, set with monkeypatch: dummy credentials,
    ``AWS_ENDPOINT_URL`` / ``WARP_S3_ENDPOINT``, ``WARP_S3_PATH_STYLE=1``,
    region us-east-1, no IMDS, no user AWS config files. So s3fs, pyarrow
    (via ``StorageConfig``), DuckDB and boto3 all reach the server. Attributes:

    * ``s3.bucket``, ``s3.endpoint``, ``s3.client`` (boto3)
    * ``s3.url(prefix="warp")`` -> ``"s3://<bucket>/warp"`` (a store URL)
    * ``s3.env`` -> dict of the variables above, for ``subprocess`` calls
      (merge it into ``os.environ``)
    * ``s3.requests(method=None, key_prefix=None)`` -> recorded requests to
      this bucket: dicts with ``method``, ``key``, ``query``, ``range``
    * ``s3.count(method=None, key_prefix=None)`` -> how many of them
    * ``s3.reset_counts()`` -> forget requests recorded so far (all buckets)

    Key prefixes are matched against the object key inside the bucket, e.g.
    ``s3.count("PUT", "warp/blobs/")`` counts blob uploads under store
    prefix ``warp``. Listing requests have key ``""``.

Run ``python tests/support/s3fixtures.py --serve`` to start a server by hand (or from
a benchmark: :func:`start_moto_server`): it prints ``READY <port>`` and
serves until killed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass

import pytest

__all__ = ["MotoServer", "S3Env", "moto_server", "s3", "s3_env", "start_moto_server"]

CONTROL_PATH = "/__warp__/requests"


# -- server side (runs in the subprocess) -------------------------------------

def _serve() -> None:
    from moto.moto_server.threaded_moto_server import MotoRequestHandler
    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    app = DomainDispatcherApplication(create_backend_app)
    log: list[dict] = []
    lock = threading.Lock()

    def counting(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path == CONTROL_PATH:
            if environ["REQUEST_METHOD"] == "DELETE":
                with lock:
                    log.clear()
                body = b"{}"
            else:
                with lock:
                    body = json.dumps(log).encode()
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        bucket, _, key = path.lstrip("/").partition("/")
        with lock:
            log.append({"method": environ["REQUEST_METHOD"], "bucket": urllib.parse.unquote(bucket),
                        "key": urllib.parse.unquote(key), "query": environ.get("QUERY_STRING", ""),
                        "range": environ.get("HTTP_RANGE"), "if_none_match": environ.get("HTTP_IF_NONE_MATCH")})
        return app(environ, start_response)

    server = make_server("127.0.0.1", 0, counting, threaded=True, request_handler=MotoRequestHandler)
    sys.stdout.write(f"READY {server.server_address[1]}\n")
    sys.stdout.flush()
    server.serve_forever()


# -- client side ---------------------------------------------------------------

class MotoServer:
    """Handle on a moto server subprocess: ``endpoint``, ``requests()``, ``reset()``, ``stop()``."""

    def __init__(self, proc: subprocess.Popen, port: int) -> None:
        self.proc = proc
        self.port = port
        self.endpoint = f"http://127.0.0.1:{port}"

    def requests(self) -> list[dict]:
        with urllib.request.urlopen(self.endpoint + CONTROL_PATH, timeout=30) as r:
            return json.loads(r.read())

    def reset(self) -> None:
        req = urllib.request.Request(self.endpoint + CONTROL_PATH, method="DELETE")
        urllib.request.urlopen(req, timeout=30).close()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_moto_server() -> MotoServer:
    """Start moto (with request counting) on 127.0.0.1, a free port; wait until it serves.

    The server ends with the process that started it, even one killed with ``kill -9``
    (:mod:`support.tether`): a crashed test worker leaves no server behind."""
    from support.tether import tethered

    proc = subprocess.Popen(tethered([sys.executable, os.path.abspath(__file__), "--serve"]),
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("READY "):
        proc.kill()
        raise RuntimeError(f"moto server did not start (said {line!r})")
    return MotoServer(proc, int(line.split()[1]))


def s3_env(endpoint: str) -> dict[str, str]:
    """Environment that points every S3 client at ``endpoint`` with dummy credentials."""
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
        "WARP_S3_ENDPOINT": endpoint,
        "WARP_S3_PATH_STYLE": "1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }


@dataclass
class S3Env:
    server: MotoServer
    bucket: str
    client: object
    env: dict[str, str]

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    def url(self, prefix: str = "warp") -> str:
        return f"s3://{self.bucket}/{prefix}".rstrip("/")

    def requests(self, method: str | None = None, key_prefix: str | None = None) -> list[dict]:
        return [r for r in self.server.requests()
                if r["bucket"] == self.bucket
                and (method is None or r["method"] == method)
                and (key_prefix is None or r["key"].startswith(key_prefix))]

    def count(self, method: str | None = None, key_prefix: str | None = None) -> int:
        return len(self.requests(method, key_prefix))

    def reset_counts(self) -> None:
        self.server.reset()


@pytest.fixture(scope="session")
def moto_server():
    server = start_moto_server()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3(moto_server, monkeypatch):
    import boto3

    env = s3_env(moto_server.endpoint)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_PROFILE", "WARP_S3_PROFILE", "AWS_SESSION_TOKEN", "WARP_S3_REGION", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(k, raising=False)
    bucket = f"warp-test-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=moto_server.endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    client.create_bucket(Bucket=bucket)
    return S3Env(moto_server, bucket, client, env)


if __name__ == "__main__" and "--serve" in sys.argv:
    _serve()
