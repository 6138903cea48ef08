"""Test harness: starts a real `cubicle serve` (../../bin/cubicle, built by
`make build`) on a free loopback port with its own data dir, bridge, address
pool and cgroup parent, creates an API key, and points the unmodified SDKs (e2b,
e2b-code-interpreter, cubesandbox) at it through their documented env vars.
Everything it starts is stopped by PID and everything it creates is removed in
stop(), which fails if the sandboxes left anything on the host.

Server(netns=NAME, listen_addr=IP) runs serve inside an existing network
namespace (/run/netns/NAME, made by the test, e.g. a "host" whose firewall
drops forwarding) listening on IP (an address of that namespace this process
can reach); the SDK env then points there, and the leak checks look for links
and nft tables in it.

CUBICLE_CLUSTER=1 starts a cluster instead of one serve: ../../bin/cubicle-testcluster
(test/testcluster) runs a throwaway PostgreSQL, a pure control plane and two
`cubicle node run` on loopback, and prints the control plane's URL and an API
key; the SDKs talk to that URL as to a single serve. stop() kills the sandboxes
through the API as usual, then closes the helper's stdin: it stops every process,
removes every bridge, nft table, cgroup, mount and dir, and exits non-zero naming
whatever was left behind.

A port of test/e2b-js/tests/harness.js; keep the two in step.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

import httpx

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CUBICLE = os.environ.get("CUBICLE_BIN") or str(REPO / "bin" / "cubicle")
IMAGES_DIR = os.environ.get("CUBICLE_IMAGES_DIR") or "/var/lib/cubicle/images"
RUNTIME = os.environ.get("CUBICLE_RUNTIME") or "runc"
LOG_DIR = HERE / ".logs"
DOMAIN = "cubicle.local"
# The host's CA bundle: trusted inside sandboxes and builds when serve supports
# --ca-certificates, so HTTPS through a TLS-intercepting proxy works there too.
HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
CLUSTER = os.environ.get("CUBICLE_CLUSTER") == "1"
TESTCLUSTER = os.environ.get("CUBICLE_TESTCLUSTER_BIN") or str(REPO / "bin" / "cubicle-testcluster")


def wait_for(
    fn: Callable[[], Any], timeout: float = 10.0, interval: float = 0.1, what: str | Callable[[], str] = "condition"
) -> Any:
    """Polls fn until it returns a truthy value; raises after timeout seconds.
    what names the condition; a callable is called then, to show the state at the end."""
    deadline = time.monotonic() + timeout
    last: Optional[BaseException] = None
    while True:
        try:
            v = fn()
            if v:
                return v
        except Exception as e:  # noqa: BLE001 - the last error is reported on timeout
            last = e
        if time.monotonic() > deadline:
            raise TimeoutError(_timed_out(timeout, what, last))
        time.sleep(interval)


async def async_wait_for(
    fn: Callable[[], Any], timeout: float = 10.0, interval: float = 0.1, what: str | Callable[[], str] = "condition"
) -> Any:
    """wait_for for coroutine functions."""
    import asyncio

    deadline = time.monotonic() + timeout
    last: Optional[BaseException] = None
    while True:
        try:
            v = await fn()
            if v:
                return v
        except Exception as e:  # noqa: BLE001
            last = e
        if time.monotonic() > deadline:
            raise TimeoutError(_timed_out(timeout, what, last))
        await asyncio.sleep(interval)


def uniq(prefix: str) -> str:
    """A name no other test (or earlier run) used."""
    return f"{prefix}-{secrets.token_hex(5)}"


def _timed_out(timeout: float, what: Any, last: Optional[BaseException]) -> str:
    name = what() if callable(what) else what
    return f"timed out after {timeout} s waiting for {name}" + (f": {last!r}" if last else "")


def _can_listen(port: int) -> bool:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range: a port from that
    range (what bind(0) hands out) can be taken by any outgoing connection
    between this check and serve's own bind."""
    low = 32768
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]) or low
    except (OSError, ValueError, IndexError):
        pass
    start = max(1024, low - 12000)
    for _ in range(100):
        port = random.randrange(start, low)
        if _can_listen(port):
            return port
    raise RuntimeError(f"no free loopback port in {start}-{low - 1}")


def _unescape_mount(s: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def mounts_under(d: str) -> list[str]:
    """Mount points at or under d, deepest first (/proc/self/mountinfo field 5)."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        f = line.split(" ")
        if len(f) < 5:
            continue
        mp = _unescape_mount(f[4])
        if mp == d or mp.startswith(d + "/"):
            out.append(mp)
    return sorted(out, key=len, reverse=True)


def _quiet(*args: str) -> int:
    try:
        return subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=15).returncode
    except (OSError, subprocess.TimeoutExpired):
        return -1


def containers(binary: str, root_dir: str) -> list[str]:
    """Container IDs under an OCI runtime's state root. runsc rejects -q, so
    --quiet; a failing list is an error, never an empty list."""
    if not os.path.exists(root_dir):
        return []
    r = subprocess.run([binary, "--root", root_dir, "list", "--quiet"], capture_output=True, text=True, timeout=15)
    if r.returncode != 0:
        raise RuntimeError(f"{binary} --root {root_dir} list --quiet: status {r.returncode}: {r.stderr.strip()}")
    return [line for line in r.stdout.splitlines() if line]


def cgroup_hierarchies() -> list[str]:
    """Where a cgroup parent can live (v2: one mount; v1: one per controller)."""
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        return ["/sys/fs/cgroup"]
    try:
        return [e.path for e in os.scandir("/sys/fs/cgroup") if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def subdirs(d: str) -> list[str]:
    try:
        return [e.path for e in os.scandir(d) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def veth_of(sandbox_id: str) -> str:
    """The host veth of a sandbox: cbv + 8 hex of sha256(id)."""
    return "cbv" + hashlib.sha256(sandbox_id.encode()).hexdigest()[:8]


def in_netns(netns: Optional[str], *args: str) -> list[str]:
    """args run in network namespace netns (None: as they are). nsenter --net
    changes only the network namespace: `ip netns exec` also remounts /sys,
    which hides /sys/fs/cgroup from serve and its runtime."""
    return ["nsenter", f"--net=/run/netns/{netns}", *args] if netns else list(args)


def link_exists(name: str, netns: Optional[str] = None) -> bool:
    return _quiet(*in_netns(netns, "ip", "link", "show", name)) == 0


def nft_tables_of(bridge: str, netns: Optional[str] = None) -> list[tuple[str, str]]:
    try:
        out = subprocess.run(in_netns(netns, "nft", "list", "tables"), capture_output=True, text=True, timeout=15).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    tables = []
    for line in out.splitlines():
        m = re.fullmatch(r"table (\S+) (\S+)", line.strip())
        if m and m.group(2).endswith("_" + bridge):
            tables.append((m.group(1), m.group(2)))
    return tables


def serve_supports(flag: str) -> bool:
    """Whether `cubicle serve --help` lists flag (Go's flag package prints -name)."""
    r = subprocess.run([CUBICLE, "serve", "--help"], capture_output=True, text=True, timeout=30)
    return re.search(r"(^|\s)--?" + re.escape(flag) + r"\b", r.stdout + r.stderr, re.M) is not None


def prune_logs() -> None:
    """Removes logs (and cluster log dirs) older than a day."""
    for f in LOG_DIR.iterdir():
        try:
            if time.time() - f.stat().st_mtime > 24 * 3600:
                if f.is_dir() and not f.is_symlink():
                    shutil.rmtree(f, ignore_errors=True)
                else:
                    f.unlink()
        except OSError:
            pass


class Server:
    """One `cubicle serve` with everything it needs, and its clean-up."""

    def __init__(
        self, runtime: str = RUNTIME, images_dir: str = IMAGES_DIR, netns: Optional[str] = None, listen_addr: str = "127.0.0.1"
    ) -> None:
        if netns and listen_addr == "127.0.0.1":
            raise ValueError("Server(netns=...) needs a listen_addr of that namespace reachable from here")
        self.runtime = runtime
        self.images_dir = images_dir
        self.netns = netns
        self.listen_addr = listen_addr
        self.proc: Optional[subprocess.Popen] = None
        self.data_dir: Optional[str] = None
        self.log_path: Optional[Path] = None
        # Every sandbox ID this server had (tracked, or listed at stop), for the leak check.
        self.seen: set[str] = set()
        self.tracked: list[str] = []
        self.cluster: Optional[dict] = None
        self.cluster_report: list[str] = []

    # ---- lifecycle -------------------------------------------------------------

    def start(self, extra_args: Optional[list[str]] = None) -> "Server":
        if CLUSTER:
            return self.start_cluster(extra_args)
        if not os.path.exists(CUBICLE):
            raise RuntimeError(f"{CUBICLE} not found: run `make build` first")
        if not os.path.isdir(os.path.join(self.images_dir, "base", "rootfs")):
            raise RuntimeError(f"{self.images_dir}/base/rootfs not found: run `scripts/install` (or scripts/build-rootfs)")
        self.data_dir = tempfile.mkdtemp(prefix="cubicle-e2e-py-")
        self.port = free_port()
        # /metrics has a listener of its own (serve --metrics-listen), never the API's.
        self.metrics_port = free_port()
        while self.metrics_port == self.port:
            self.metrics_port = free_port()
        rand = secrets.token_hex(3)
        self.bridge = f"cbp{rand}"
        self.cgroup_parent = f"cubicle-e2e-py-{rand}"
        self.pool = f"10.213.{random.randrange(256)}.0/24"
        self.url = f"http://{self.listen_addr}:{self.port}"
        self.metrics_url = f"http://{self.listen_addr}:{self.metrics_port}"

        self.api_key = subprocess.run(
            [CUBICLE, "apikey", "create", "--data-dir", self.data_dir, "--name", "e2e-py"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
        if not re.fullmatch(r"e2b_[0-9a-f]+", self.api_key):
            raise RuntimeError(f"cubicle apikey create printed {self.api_key!r}, want e2b_<hex>")

        LOG_DIR.mkdir(parents=True, exist_ok=True)
        # One log per server; prune those older than a day.
        prune_logs()
        name = os.environ.get("CUBICLE_LOG_NAME") or "pytest"
        self.log_path = LOG_DIR / f"{name}.{self.runtime}.{os.getpid()}.log"
        args = [
            CUBICLE,
            "serve",
            "--data-dir",
            self.data_dir,
            "--listen",
            f"{self.listen_addr}:{self.port}",
            "--metrics-listen",
            f"{self.listen_addr}:{self.metrics_port}",
            "--images-dir",
            self.images_dir,
            "--runtime",
            self.runtime,
            "--domain",
            DOMAIN,
            "--bridge",
            self.bridge,
            "--pool",
            self.pool,
            "--cgroup-parent",
            self.cgroup_parent,
        ]
        if os.path.exists(HOST_CA_BUNDLE) and serve_supports("ca-certificates"):
            args += ["--ca-certificates", HOST_CA_BUNDLE]
        args += extra_args or []
        with open(self.log_path, "wb") as log:
            # nsenter execs serve in place, so self.proc.pid is serve's.
            self.proc = subprocess.Popen(in_netns(self.netns, *args), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

        def healthy() -> bool:
            if self.proc.poll() is not None:
                raise ServerDied(f"cubicle serve exited early (status {self.proc.returncode}):\n{self.tail()}")
            r = httpx.get(f"{self.url}/health", timeout=1)
            return r.status_code in (200, 204)

        deadline = time.monotonic() + 30
        while True:
            try:
                if healthy():
                    break
            except ServerDied:
                raise
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for GET {self.url}/health:\n{self.tail()}")
            time.sleep(0.1)

        env = {
            "E2B_API_URL": self.url,
            "E2B_SANDBOX_URL": self.url,
            "E2B_API_KEY": self.api_key,
            "E2B_DOMAIN": DOMAIN,
            # The volume-content API is served by the same listener.
            "E2B_VOLUME_API_URL": self.url,
            # cubesandbox: control plane at the API URL; the data plane goes to
            # <port>-<id>.<domain> hosts, sent to the same listener by IP.
            "CUBE_API_URL": self.url,
            "CUBE_API_KEY": self.api_key,
            "CUBE_TEMPLATE_ID": "base",
            "CUBE_PROXY_NODE_IP": self.listen_addr,
            "CUBE_PROXY_PORT_HTTP": str(self.port),
            "CUBE_SANDBOX_DOMAIN": DOMAIN,
        }
        os.environ.update(env)
        os.environ.pop("E2B_DEBUG", None)
        return self

    def start_cluster(self, extra_args: Optional[list[str]]) -> "Server":
        """Starts cubicle-testcluster and points the SDK env at its control plane."""
        if extra_args or self.netns:
            raise RuntimeError(
                f"CUBICLE_CLUSTER=1: this test starts serve with its own flags ({extra_args!r}, netns {self.netns!r}),"
                " which the cluster harness does not take: run it without CUBICLE_CLUSTER"
            )
        if not os.path.exists(TESTCLUSTER):
            raise RuntimeError(f"{TESTCLUSTER} not found: run `make build` first")
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        prune_logs()
        name = os.environ.get("CUBICLE_LOG_NAME") or "pytest"
        log_dir = LOG_DIR / f"cluster.{name}.{self.runtime}.{os.getpid()}"
        self.log_path = log_dir / "testcluster.log"
        log_dir.mkdir(parents=True, exist_ok=True)
        args = [TESTCLUSTER, "--cubicle", CUBICLE, "--images-dir", self.images_dir, "--runtime", self.runtime]
        args += ["--domain", DOMAIN, "--log-dir", str(log_dir)]
        if os.path.exists(HOST_CA_BUNDLE):
            args += ["--ca-certificates", HOST_CA_BUNDLE]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
        # The helper bounds its own start (--ready-timeout) and exits on failure, closing stdout.
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(30)
            raise ServerDied(f"cubicle-testcluster exited early (status {self.proc.returncode}):\n{self.tail()}")
        self.cluster = json.loads(line)
        self.url = self.cluster["url"]
        self.api_key = self.cluster["apiKey"]
        host, port = self.url.removeprefix("http://").rsplit(":", 1)
        os.environ.update(
            {
                "E2B_API_URL": self.url,
                "E2B_SANDBOX_URL": self.url,
                "E2B_API_KEY": self.api_key,
                "E2B_DOMAIN": DOMAIN,
                "E2B_VOLUME_API_URL": self.url,
                "CUBE_API_URL": self.url,
                "CUBE_API_KEY": self.api_key,
                "CUBE_TEMPLATE_ID": "base",
                "CUBE_PROXY_NODE_IP": host,
                "CUBE_PROXY_PORT_HTTP": port,
                "CUBE_SANDBOX_DOMAIN": DOMAIN,
            }
        )
        os.environ.pop("E2B_DEBUG", None)
        return self

    def stop_cluster(self) -> None:
        """Kills every sandbox through the API, then has cubicle-testcluster tear
        the cluster down and check the nodes for leftovers."""
        if self.alive():
            self.kill_all()
            self.proc.stdin.close()
        try:
            self.proc.wait(90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise RuntimeError(f"cubicle-testcluster did not stop within 90 s:\n{self.tail()}")
        self.proc.stdout.close()
        # Start and stop times and where the sandboxes ran, for the terminal summary.
        self.cluster_report = re.findall(r"^cubicle-testcluster: ((?:ready in|sandboxes per node|stopped in).*)$", self.tail(), re.M)
        if self.proc.returncode != 0:
            raise RuntimeError(f"cubicle-testcluster ({self.runtime}) status {self.proc.returncode}; logs in {self.log_path.parent}:\n{self.tail()}")

    def kill_all(self) -> None:
        """Kills tracked sandboxes, then whatever the server still lists."""
        for sid in self.tracked:
            try:
                self.api("DELETE", f"/sandboxes/{sid}", timeout=20)
            except httpx.HTTPError:
                pass
        # Sandboxes a test created without track() (or whose kill failed), paused ones too.
        for _ in range(20):
            try:
                r = self.api("GET", "/v2/sandboxes?limit=100")
            except httpx.HTTPError:
                break
            items = r.json() if r.status_code == 200 else None
            if not isinstance(items, list) or not items:
                break
            for sb in items:
                self.seen.add(sb["sandboxID"])
                try:
                    self.api("DELETE", f"/sandboxes/{sb['sandboxID']}", timeout=20)
                except httpx.HTTPError:
                    pass

    def tail(self, n: int = 4000) -> str:
        if not self.log_path or not self.log_path.exists():
            return ""
        data = self.log_path.read_bytes()
        return data[-n:].decode("utf-8", "replace")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # ---- helpers for tests -----------------------------------------------------

    def track(self, sbx: Any) -> Any:
        """Registers a sandbox (any SDK's object, or an ID) so stop() kills it
        even when a test failed midway."""
        sid = sbx if isinstance(sbx, str) else sbx.sandbox_id
        self.tracked.append(sid)
        self.seen.add(sid)
        return sbx

    def api(self, method: str, path: str, *, json: Any = None, api_key: Any = ..., timeout: float = 60) -> httpx.Response:
        """A raw request to the control plane, with the server's key unless told otherwise."""
        headers = {}
        key = self.api_key if api_key is ... else api_key
        if key is not None:
            headers["X-API-KEY"] = key
        return httpx.request(method, self.url + path, json=json, headers=headers, timeout=timeout)

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """Runs the cubicle CLI against this server."""
        env = {**os.environ, "CUBICLE_API_URL": self.url, "CUBICLE_API_KEY": self.api_key}
        r = subprocess.run([CUBICLE, *args], env=env, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"cubicle {' '.join(args)}: status {r.returncode}\n{r.stdout}{r.stderr}")
        return r

    # ---- leak checks -----------------------------------------------------------

    def state_root(self) -> str:
        return os.path.join(self.data_dir, "run", self.runtime)

    def sandbox_leftovers(self) -> list[str]:
        """What the sandboxes left on the host once all were killed and the
        server stopped: containers, netns files, veths, cgroups, sandbox dirs, mounts."""
        left = []
        try:
            ids = containers(self.runtime, self.state_root())
            if ids:
                left.append(f"containers in {self.state_root()}: {' '.join(ids)}")
        except Exception as e:  # noqa: BLE001
            left.append(str(e))
        ns_dir = os.path.join("/run/cubicle", self.bridge, "netns")
        try:
            for e in os.scandir(ns_dir):
                if e.is_file():
                    left.append(f"netns file {e.path}")
        except OSError:
            pass
        try:
            for f in os.listdir(os.path.join(ns_dir, ".addr")):
                left.append(f"netns address record {f}")
        except OSError:
            pass
        links = subprocess.run(
            in_netns(self.netns, "ip", "-o", "link", "show", "master", self.bridge), capture_output=True, text=True, timeout=15
        )
        for line in links.stdout.splitlines():
            if line:
                left.append(f"link on bridge {self.bridge}: {line}")
        for sid in self.seen:
            if link_exists(veth_of(sid), self.netns):
                left.append(f"host veth {veth_of(sid)} of sandbox {sid}")
        for h in cgroup_hierarchies():
            for d in subdirs(os.path.join(h, self.cgroup_parent)):
                left.append(f"cgroup {d}")
        # Each sandbox's own dir, its root-only state dir (sandboxes/.private/<id>) and its
        # disk image in the reflink disk store (disk-store/disks/<id>.img).
        for d in (
            os.path.join(self.data_dir, "sandboxes"),
            os.path.join(self.data_dir, "sandboxes", ".private"),
            os.path.join(self.data_dir, "disk-store", "disks"),
        ):
            try:
                for f in os.listdir(d):
                    if f != ".private":
                        left.append(f"sandbox dir {os.path.basename(d)}/{f}")
            except OSError:
                pass
        # runsc keeps one null-netns bind mount per state root; it is the runtime's. The
        # disk store stays mounted after serve stops, as the data dir's filesystem would, and
        # so does a kept snapshot's layer that is a clone of a disk.
        run_root = os.path.join(self.data_dir, "run")
        store = os.path.join(self.data_dir, "disk-store")
        for mp in mounts_under(os.path.join("/run/cubicle", self.bridge)) + mounts_under(self.data_dir):
            if not mp.startswith(run_root + "/") and mp != store and not self._snapshot_layer_mount(mp):
                left.append(f"mount {mp}")
        return left

    def _snapshot_layer_mount(self, mp: str) -> bool:
        """mp is snapshots/<id>/rootfs of a kept snapshot whose layer is a clone of a disk
        (marked by snapshots/<id>/layer-disk)."""
        snap = os.path.dirname(mp)
        return (
            os.path.basename(mp) == "rootfs"
            and os.path.dirname(snap) == os.path.join(self.data_dir, "snapshots")
            and os.path.exists(os.path.join(snap, "layer-disk"))
        )

    def infra_leftovers(self) -> list[str]:
        """What survived the clean-up: bridge, nft tables, cgroup parent, dirs."""
        left = []
        if link_exists(self.bridge, self.netns):
            left.append(f"bridge {self.bridge}")
        for fam, name in nft_tables_of(self.bridge, self.netns):
            left.append(f"nft table {fam} {name}")
        for h in cgroup_hierarchies():
            p = os.path.join(h, self.cgroup_parent)
            if os.path.exists(p):
                left.append(f"cgroup parent {p}")
        for d in (os.path.join("/run/cubicle", self.bridge), self.data_dir):
            if os.path.exists(d):
                left.append(f"dir {d}")
        return left

    def stop(self) -> None:
        """Kills every sandbox (tracked ones, then whatever the server still
        lists), stops the server, removes everything it created, and raises if
        the sandboxes left anything behind or the clean-up missed anything."""
        if CLUSTER and self.proc is not None:
            return self.stop_cluster()
        leaks: list[str] = []
        was_alive = self.alive()
        if was_alive:
            self.kill_all()
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                try:
                    self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    pass
        if not self.data_dir:
            return
        if was_alive:
            leaks = self.sandbox_leftovers()
        # Remove whatever is left: containers first, by the runtime with the
        # server's own state roots, so no sandbox keeps running once its state
        # dir is gone; then veths, the bridge, cgroups, mounts, nft tables, dirs.
        for drv in ("runc", "runsc"):
            root_dir = os.path.join(self.data_dir, "run", drv)
            try:
                ids = containers(drv, root_dir)
            except Exception as e:  # noqa: BLE001
                leaks.append(str(e))
                ids = []
            for cid in ids:
                _quiet(drv, "--root", root_dir, "kill", cid, "KILL")
                _quiet(drv, "--root", root_dir, "delete", "--force", cid)
            try:
                still = containers(drv, root_dir)
                if still:
                    leaks.append(f"containers survived delete --force in {root_dir}: {' '.join(still)}")
            except Exception:  # noqa: BLE001
                pass
        for sid in self.seen:
            _quiet(*in_netns(self.netns, "ip", "link", "del", veth_of(sid)))
        _quiet(*in_netns(self.netns, "ip", "link", "del", self.bridge))
        for h in cgroup_hierarchies():
            for d in subdirs(os.path.join(h, self.cgroup_parent)):
                try:
                    os.rmdir(d)
                except OSError:
                    pass
            try:
                os.rmdir(os.path.join(h, self.cgroup_parent))
            except OSError:
                pass
        run_dir = os.path.join("/run/cubicle", self.bridge)
        for mp in mounts_under(run_dir) + mounts_under(self.data_dir):
            _quiet("umount", "-l", mp)
        shutil.rmtree(run_dir, ignore_errors=True)
        for fam, name in nft_tables_of(self.bridge, self.netns):
            _quiet(*in_netns(self.netns, "nft", "delete", "table", fam, name))
        for _ in range(3):
            shutil.rmtree(self.data_dir, ignore_errors=True)
            if not os.path.exists(self.data_dir):
                break
            time.sleep(0.2)
        leaks += self.infra_leftovers()
        self.data_dir = None
        if leaks:
            raise RuntimeError(f"cubicle server {self.bridge} ({self.runtime}) left host state behind:\n  " + "\n  ".join(leaks))


class ServerDied(RuntimeError):
    pass
