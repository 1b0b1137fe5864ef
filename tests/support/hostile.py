"""A hostile web host on 127.0.0.1 for the request-policy tests (tests/conformance/stores.py).

``HostileHost(mode, body=..., tls=None)`` answers every request (any method, any path) the same
hostile way, over plain TCP or, with ``tls=(certfile, keyfile)``, over TLS:

================= ===========================================================================
``endless``       ``200`` (``206`` to a range), ``Transfer-Encoding: chunked``, 64 KiB chunks until the
                  client leaves
``trickle``       ``200`` (``206`` to a range) announcing ``len(body)`` bytes, then one byte a second
``slow-headers``  ``200`` then one header byte a second, never ending the headers
``oversize``      ``206`` with a matching ``Content-Range`` but 64 MiB of body announced and sent
``bad-range``     ``206`` whose ``Content-Range`` starts 5 bytes after the range asked for
``redirect``      ``301`` to ``location`` (an http:// URL: the downgrade test)
``no-range``      ``200`` and the whole ``body`` whatever ``Range`` asks (``python -m http.server``)
================= ===========================================================================

``requests`` counts the requests it read; ``sent`` the body bytes it managed to send.
:func:`self_signed` makes a certificate for 127.0.0.1 (with ``cryptography``).
"""

from __future__ import annotations

import re
import socket
import socketserver
import ssl
import threading
import time
from pathlib import Path

_RANGE = re.compile(rb"^range:\s*bytes=(\d+)-(\d+)\s*$", re.I | re.M)


def self_signed(folder: Path) -> tuple[str, str]:
    """(certfile, keyfile) of a fresh self-signed certificate for 127.0.0.1, made with
    ``cryptography`` (in the dev lock, through moto): no system ``openssl`` command needed."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    cert, key = folder / "host.pem", folder / "host.key"
    pk = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    crt = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(pk.public_key())
           .serial_number(x509.random_serial_number())
           .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
           .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                          critical=False)
           .sign(pk, hashes.SHA256()))
    key.write_bytes(pk.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()))
    cert.write_bytes(crt.public_bytes(serialization.Encoding.PEM))
    return str(cert), str(key)


class HostileHost:
    def __init__(self, mode: str, *, body: bytes = b"x" * 100, location: str = "",
                 tls: tuple[str, str] | None = None) -> None:
        self.mode, self.body, self.location = mode, body, location
        self.requests = 0
        self.sent = 0
        self._mu = threading.Lock()
        outer = self
        ctx = None
        if tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                sock = self.request
                if ctx is not None:
                    try:
                        sock = ctx.wrap_socket(sock, server_side=True)
                    except (ssl.SSLError, OSError):
                        return
                sock.settimeout(30)
                try:
                    while outer._serve_one(sock):
                        pass
                except OSError:
                    pass

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.scheme = "https" if tls else "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.server.server_address[1]}"

    def _send(self, sock, data: bytes) -> None:
        sock.sendall(data)
        with self._mu:
            self.sent += len(data)

    def _serve_one(self, sock) -> bool:
        head = b""
        while b"\r\n\r\n" not in head:
            got = sock.recv(65536)
            if not got:
                return False
            head += got
            if not head[:1].isalpha():  # a TLS ClientHello to this plain host: answered as a web server would
                sock.sendall(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
                return False
        with self._mu:
            self.requests += 1
        m = _RANGE.search(head)
        start, end = (int(m.group(1)), int(m.group(2))) if m else (0, len(self.body) - 1)
        if self.mode == "endless":
            extra = f"Content-Range: bytes {start}-{end}/*\r\n" if m else ""
            sock.sendall(f"HTTP/1.1 {'206 Partial Content' if m else '200 OK'}\r\nTransfer-Encoding: chunked\r\n"
                         f"{extra}\r\n".encode())
            chunk = b"10000\r\n" + b"z" * 0x10000 + b"\r\n"
            while True:
                self._send(sock, chunk)
        if self.mode == "trickle":
            status = "206 Partial Content" if m else "200 OK"
            n = end - start + 1
            extra = f"Content-Range: bytes {start}-{end}/{len(self.body)}\r\n" if m else ""
            sock.sendall(f"HTTP/1.1 {status}\r\nContent-Length: {n}\r\n{extra}\r\n".encode())
            for i in range(n):
                self._send(sock, self.body[start + i:start + i + 1])
                time.sleep(1.0)
            return True
        if self.mode == "slow-headers":
            self._send(sock, b"HTTP/1.1 200 OK\r\nX-Slow: ")
            while True:
                self._send(sock, b"a")
                time.sleep(1.0)
        if self.mode == "oversize":
            n = 64 << 20
            sock.sendall(f"HTTP/1.1 206 Partial Content\r\nContent-Length: {n}\r\n"
                         f"Content-Range: bytes {start}-{end}/{n}\r\n\r\n".encode())
            block = b"o" * (1 << 20)
            for _ in range(64):
                self._send(sock, block)
            return True
        if self.mode == "bad-range":
            n = end - start + 1
            data = (self.body * (1 + (end + 6) // max(1, len(self.body))))[start + 5:start + 5 + n]
            sock.sendall(f"HTTP/1.1 206 Partial Content\r\nContent-Length: {n}\r\n"
                         f"Content-Range: bytes {start + 5}-{end + 5}/{len(self.body) + 5}\r\n\r\n".encode())
            self._send(sock, data)
            return True
        if self.mode == "redirect":
            sock.sendall(f"HTTP/1.1 301 Moved Permanently\r\nLocation: {self.location}\r\n"
                         "Content-Length: 0\r\n\r\n".encode())
            return True
        if self.mode == "no-range":
            sock.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {len(self.body)}\r\n\r\n".encode())
            self._send(sock, self.body)
            return True
        raise ValueError(self.mode)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> HostileHost:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port
