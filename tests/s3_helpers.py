"""A real S3 API on 127.0.0.1 for the object-storage tests and benchmarks, and a TCP proxy that makes its
network worse.

`S3Server`: moto's ThreadedMotoServer (a dev dependency; the tests skip with the reason where it cannot be
imported) on 127.0.0.1, on a free port, in this process; it stops with `stop()` (or the `with` block). It
sets the standard environment s3fs and boto3 read (dummy AWS credentials, a region, AWS_ENDPOINT_URL), so
child processes (torchrun, `fastfeed` subprocesses) reach it too, and puts the old values back at the end.

`ObjectServer`: the objects of some buckets, copied out of an S3 server once, served read-only (GET and HEAD, one
byte range or whole, 404 NoSuchKey; a bucket lists empty) by a plain threaded HTTP server: what reading a store asks of S3, at a fraction
of moto's CPU (the benchmarks read through it, so that the server's work on this machine's cores stays small, as a
real S3's costs the node nothing).

`FaultProxy`: a TCP proxy on 127.0.0.1 in front of it: each request delayed by `latency` (plus up to
`jitter`, uniformly, either way; a round trip: the response's bytes are not delayed again), a new connection's
first request by one more `latency` (TCP's handshake; no TLS), responses through one shared token bucket of `bandwidth` bytes/s (the
node's link), and with probability `drop` per request the connection reset part-way through the response (within
its first `cut_within` bytes: a response shorter than the point drawn is not cut). Every socket has Nagle's
algorithm off, as a real store's chunks are not held for a delayed ACK (40 ms on a reused connection here).
`requests`, `connections`, `dropped`, `bytes_down`: what it saw. Every thread is a daemon; `stop()` closes every socket and joins them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import select
import socket
import struct
import threading
import time
import uuid

ENV_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL",
            "AWS_SESSION_TOKEN", "AWS_PROFILE")


def moto_missing() -> str | None:
    """Why the S3 server cannot run here, or None."""
    try:
        import moto.server  # noqa: F401
        import s3fs  # noqa: F401
    except ImportError as e:
        return f"moto[server] and s3fs are needed for the object-storage tests (pip install -e '.[dev]'): {e}"
    return None


class S3Server:
    def __init__(self):
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)   # one line per request otherwise
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, self.port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{self.port}"
        self._saved = {k: os.environ.get(k) for k in ENV_KEYS}
        self.use(self.endpoint)

    def use(self, endpoint: str) -> None:
        """Point the environment (this process and its children) at `endpoint` (the server, or a proxy)."""
        os.environ.update(AWS_ACCESS_KEY_ID="fastfeed-test", AWS_SECRET_ACCESS_KEY="fastfeed-test-secret",
                          AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL=endpoint)
        for k in ("AWS_SESSION_TOKEN", "AWS_PROFILE"):
            os.environ.pop(k, None)
        _forget_filesystems()

    def bucket(self, prefix: str = "ff") -> str:
        """A new, empty bucket; its name."""
        import boto3

        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=self.endpoint).create_bucket(Bucket=name)
        return name

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint)

    def stop(self) -> None:
        self._server.stop()
        for k, v in self._saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _forget_filesystems()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class ObjectServer:
    """See the module docstring. `objects`: {"bucket/key": bytes}; `port`, `endpoint`; `stop()`."""

    def __init__(self, objects: dict):
        import http.server

        data = dict(objects)
        buckets = {k.split("/", 1)[0] for k in data}

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"   # keep-alive, as S3
            disable_nagle_algorithm = True   # headers and body are two writes: Nagle held the body for a delayed ACK

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self.do_GET(body=False)

            def do_GET(self, body=True):
                name = self.path.split("?", 1)[0].strip("/")
                blob = data.get(name)
                if blob is None and name in buckets:   # a bucket (asked whether it exists): listed empty
                    blob = b"<?xml version='1.0'?><ListBucketResult><KeyCount>0</KeyCount></ListBucketResult>"
                if blob is None:
                    err = b"<?xml version='1.0'?><Error><Code>NoSuchKey</Code><Message>not found</Message></Error>"
                    return self._send(404, err if body else b"", {"Content-Type": "application/xml"}, len(err))
                a, b, headers = 0, len(blob), {"ETag": '"0"', "Accept-Ranges": "bytes"}
                rng = self.headers.get("Range", "")
                if rng.startswith("bytes="):
                    lo, _, hi = rng[6:].partition("-")
                    a, b = int(lo), min(int(hi) + 1 if hi else len(blob), len(blob))
                    if a >= len(blob):
                        err = b"<?xml version='1.0'?><Error><Code>InvalidRange</Code><Message>range</Message></Error>"
                        return self._send(416, err if body else b"", {"Content-Type": "application/xml"}, len(err))
                    headers["Content-Range"] = f"bytes {a}-{b - 1}/{len(blob)}"
                self._send(206 if "Content-Range" in headers else 200, blob[a:b] if body else b"", headers, b - a)

            def _send(self, code, payload, headers, length):
                self.send_response(code)
                for k, v in (headers | {"Content-Length": str(length)}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(payload)

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 128   # socketserver's 5 drops a burst of new connections (a second's SYN retry)

            def handle_error(self, request, client_address):   # a connection the proxy reset: nothing to say
                pass

        self._server = Server(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="object-server", daemon=True)
        self._thread.start()

    @classmethod
    def copy_of(cls, endpoint: str, buckets) -> ObjectServer:
        """A server of every object in `buckets` of the S3 server at `endpoint`."""
        import boto3

        client, objects = boto3.client("s3", endpoint_url=endpoint), {}
        for bucket in buckets:
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                for o in page.get("Contents", []):
                    objects[f"{bucket}/{o['Key']}"] = client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
        return cls(objects)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _forget_filesystems() -> None:
    """fsspec keeps file system instances (with their endpoint) per process: new ones see the new environment."""
    with contextlib.suppress(ImportError):
        import fsspec

        for cls in list(fsspec.registry.values()):
            with contextlib.suppress(Exception):
                cls.clear_instance_cache()
        with contextlib.suppress(ImportError):
            import s3fs

            s3fs.S3FileSystem.clear_instance_cache()


class FaultProxy:
    """See the module docstring. `url`: what to give AWS_ENDPOINT_URL."""

    def __init__(self, target_port: int, *, latency: float = 0.0, jitter: float = 0.0, bandwidth: float | None = None,
                 drop: float = 0.0, seed: int = 0, cut_within: int = 256 << 10):
        self.target = ("127.0.0.1", target_port)
        self.cut_within = cut_within
        self.latency, self.jitter, self.bandwidth, self.drop = latency, jitter, bandwidth, drop
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self._bucket_lock = threading.Lock()
        self._next_free = 0.0
        self.requests = self.dropped = self.bytes_down = self.connections = 0
        self._stats = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._socks: set = set()
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._accept = threading.Thread(target=self._serve, name="fault-proxy", daemon=True)
        self._accept.start()

    def _draw(self):
        with self._rng_lock:
            delay = self.latency + (self._rng.uniform(-self.jitter, self.jitter) if self.jitter else 0.0)
            cut = self._rng.random() < self.drop
            after = self._rng.randint(0, self.cut_within)
        return max(0.0, delay), cut, after

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._stats:
                self.connections += 1
            for sock in (client, server):   # each chunk out when it is due (Nagle: a delayed ACK's 40 ms on reuse)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._socks.update((client, server))
            state = {"cut_after": None, "fresh": True}
            for a, b, up in ((client, server, True), (server, client, False)):
                t = threading.Thread(target=self._pipe, args=(a, b, up, state), daemon=True)
                t.start()
                self._threads.append(t)

    def _throttle(self, n: int) -> None:
        if not self.bandwidth:
            return
        with self._bucket_lock:   # the link is busy until _next_free: this chunk goes out then, and takes n / bw
            now = time.monotonic()
            start = max(now, self._next_free)
            self._next_free = start + n / self.bandwidth
        if start - now > 0.002:   # small debts are paid with the next chunk's (sleep is not that fine)
            time.sleep(start - now)

    def _pipe(self, src: socket.socket, dst: socket.socket, upstream: bool, state: dict) -> None:
        poll = select.poll()   # not select(): a long run's sockets pass fd 1024
        poll.register(src, select.POLLIN)
        try:
            while not self._stopping.is_set():
                if not poll.poll(200):
                    continue
                data = src.recv(256 << 10)
                if not data:
                    break
                if upstream:   # a request (or part of one)
                    delay, cut, after = self._draw()
                    with self._stats:
                        self.requests += 1
                    if cut:
                        state["cut_after"] = after
                    if state.pop("fresh", False):   # the connection's handshake: one more round trip
                        delay += self.latency
                    if delay:
                        time.sleep(delay)
                    dst.sendall(data)
                    continue
                limit = state["cut_after"]
                if limit is not None and len(data) >= limit:
                    dst.sendall(data[:limit])
                    with self._stats:
                        self.dropped += 1
                    _reset(src)
                    _reset(dst)
                    return
                if limit is not None:
                    state["cut_after"] = limit - len(data)
                self._throttle(len(data))
                dst.sendall(data)
                with self._stats:
                    self.bytes_down += len(data)
        except (OSError, ValueError):   # ValueError: the other direction closed the socket meanwhile
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            with self._stats:   # the second direction to end closes the pair (else every connection kept its fds)
                state["ended"] = state.get("ended", 0) + 1
                last = state["ended"] == 2
            if last:
                for s in (src, dst):
                    self._socks.discard(s)
                    s.close()

    def stop(self) -> None:
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)   # wakes the accept() in _serve (a close alone does not)
        with contextlib.suppress(OSError):
            self._listener.close()
        for s in list(self._socks):
            with contextlib.suppress(OSError):
                s.close()
        self._accept.join(timeout=5)
        for t in self._threads:
            t.join(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _reset(s: socket.socket) -> None:
    """Close with a TCP reset (what a dropped connection looks like to the client)."""
    with contextlib.suppress(OSError):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()


def upload_dir(local, url: str) -> int:
    """Upload every file under `local` to `url` (s3://bucket/prefix), keeping relative names; returns the count."""
    from pathlib import Path

    import boto3

    bucket, _, prefix = url[len("s3://"):].partition("/")
    client = boto3.client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL"))
    n = 0
    for p in sorted(Path(local).rglob("*")):
        if p.is_file():
            client.upload_file(str(p), bucket, "/".join(filter(None, [prefix, str(p.relative_to(local))])))
            n += 1
    return n
