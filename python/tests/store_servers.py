"""Real store servers for the Python tests of the remote tier, started by the tests themselves:
redis-server, a 3-master Redis Cluster (redis-cli --cluster create) and memcached, each on a free
loopback port in its own temporary directory, killed (SIGKILL, then reaped) when the test ends,
even when it fails. kill9(), freeze() / thaw() (SIGSTOP / SIGCONT) and restart() (same port,
empty) drive the failure tests. The same servers and flags as tests/support/remote_servers.hpp.

The binaries are Debian's redis-server, redis-tools and memcached, installed by
tools/setup/install-deps.sh; a missing one is an error naming the package, not a skip: CI must
run these tests.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

_PACKAGES = {"redis-server": "redis-server", "redis-cli": "redis-tools", "memcached": "memcached"}


def binary(name: str) -> str:
    path = shutil.which(name, path="/usr/bin:/usr/local/bin:/usr/sbin:/bin")
    if path is None:
        raise RuntimeError(f"{name} is not installed: install Debian's {_PACKAGES[name]} "
                           "(tools/setup/install-deps.sh installs it)")
    return path


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_cluster_port() -> int:
    """A cluster node listens on port and port + 10000 (its bus): both free, below 65536, picked
    from 20000..29999 (below the kernel's ephemeral range)."""
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(1000):
        p = rng.randrange(20000, 30000)
        if _bindable(p) and _bindable(p + 10000):
            return p
    raise RuntimeError("no free port pair for a cluster node")


def _accepts(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Server:
    """One redis-server or memcached child process."""

    def __init__(self, kind: str, extra: list[str] | None = None, port: int = 0):
        assert kind in ("redis", "memcached")
        self.kind = kind
        self.extra = list(extra or [])
        self.dir = Path(tempfile.mkdtemp(prefix="kvo-store-"))
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None
        try:
            self._start()
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{'redis' if self.kind == 'redis' else 'memcached'}://{self.endpoint}"

    def _argv(self) -> list[str]:
        if self.kind == "redis":
            return [binary("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1",
                    "--save", "", "--appendonly", "no", "--dir", str(self.dir), "--daemonize",
                    "no", "--protected-mode", "no", "--logfile", str(self.dir / "server.log"),
                    *self.extra]
        argv = [binary("memcached"), "-p", str(self.port), "-l", "127.0.0.1", "-U", "0", "-m",
                "64", "-I", "4m", "-t", "2"]
        if os.getuid() == 0:
            argv += ["-u", "root"]
        return argv + self.extra

    def _start(self) -> None:
        log = open(self.dir / "stdout.log", "ab")
        try:
            self.proc = subprocess.Popen(self._argv(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        finally:
            log.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if _accepts(self.port):
                return
            if self.proc.poll() is not None:
                out = (self.dir / "stdout.log").read_text(errors="replace")
                self.proc = None
                raise RuntimeError(f"{self.kind} exited at start: {out[-2000:]}")
            time.sleep(0.01)
        self.kill9()
        raise RuntimeError(f"{self.kind} did not listen on port {self.port}")

    def kill9(self) -> None:
        if self.proc is None:
            return
        try:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.proc = None

    def freeze(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def restart(self) -> None:
        """The same port, empty (no persistence is configured)."""
        self.kill9()
        self._start()

    def cli(self, *args: str | bytes) -> bytes:
        """redis-cli against this server (raw output)."""
        out = subprocess.run([binary("redis-cli"), "-h", "127.0.0.1", "-p", str(self.port),
                              *args], capture_output=True, check=True, timeout=30)
        return out.stdout.strip()

    def command(self, *args: bytes) -> bytes:
        """One RESP command over a socket; the reply's raw bytes (for binary values)."""
        req = b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
            s.sendall(req)
            return _read_reply(s.makefile("rb"))

    def close(self) -> None:
        self.kill9()
        shutil.rmtree(self.dir, ignore_errors=True)


def _read_reply(f):
    line = f.readline()
    kind, rest = line[:1], line[1:-2]
    if kind in (b"+", b":"):
        return rest
    if kind == b"-":
        raise RuntimeError(rest.decode())
    if kind == b"$":
        n = int(rest)
        if n < 0:
            return None
        data = f.read(n + 2)
        return data[:-2]
    if kind == b"*":
        return [_read_reply(f) for _ in range(int(rest))]
    raise RuntimeError(f"unexpected RESP reply {line!r}")


class Cluster:
    """Three cluster-enabled redis-servers joined by `redis-cli --cluster create`."""

    def __init__(self, masters: int = 3):
        self.nodes: list[Server] = []
        try:
            for _ in range(masters):
                self.nodes.append(Server("redis", ["--cluster-enabled", "yes",
                                                   "--cluster-config-file", "nodes.conf",
                                                   "--cluster-node-timeout", "5000"],
                                         port=free_cluster_port()))
            out = subprocess.run([binary("redis-cli"), "--cluster", "create",
                                  *(n.endpoint for n in self.nodes), "--cluster-replicas", "0",
                                  "--cluster-yes"], capture_output=True, text=True, timeout=60)
            if out.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create: {out.stdout}{out.stderr}")
            deadline = time.monotonic() + 20
            while not all(b"cluster_state:ok" in n.cli("CLUSTER", "INFO") for n in self.nodes):
                if time.monotonic() > deadline:
                    raise RuntimeError("the cluster did not reach cluster_state:ok")
                time.sleep(0.02)
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        return "redis-cluster://" + ",".join(n.endpoint for n in self.nodes)

    def close(self) -> None:
        for n in self.nodes:
            n.close()
