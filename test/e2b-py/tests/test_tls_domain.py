"""E2B_DOMAIN alone, over TLS, with the Python SDK.

A server of this test's own runs `serve --tls-self-signed --listen-tls
ADDR:443`. The SDK runs as a child in a network namespace the test creates,
whose resolv.conf (iproute2 binds /etc/netns/<ns>/resolv.conf over it) points
at a wildcard DNS responder for *.<domain> → ADDR in that namespace, so
neither the machine's DNS nor its /etc/hosts is touched. The child has E2B_DOMAIN, E2B_API_KEY and
SSL_CERT_FILE (the server's local CA) only: no E2B_API_URL/E2B_SANDBOX_URL.
"""

import json
import os
import random
import secrets
import shutil
import subprocess
import sys

import pytest

from harness import DOMAIN, REPO, Server

CHILD = r"""
import base64, json, os, socket, ssl, time
import httpx
from e2b import Sandbox


def ws_echo(host, msg):
    ctx = ssl.create_default_context()
    ctx.set_alpn_protocols(["http/1.1"])
    with socket.create_connection((host, 443), timeout=5) as raw, ctx.wrap_socket(raw, server_hostname=host) as c:
        key = base64.b64encode(os.urandom(16))
        c.sendall(b"GET /echo HTTP/1.1\r\nHost: " + host.encode() + b"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  b"Sec-WebSocket-Key: " + key + b"\r\nSec-WebSocket-Version: 13\r\n\r\n")
        h = b""
        while b"\r\n\r\n" not in h:
            d = c.recv(4096)
            if not d:
                raise EOFError(h)
            h += d
        if not h.startswith(b"HTTP/1.1 101"):
            raise ValueError(h[:200])
        rest = h.split(b"\r\n\r\n", 1)[1]
        mask, p = os.urandom(4), msg.encode()
        c.sendall(bytes([0x81, 0x80 | len(p)]) + mask + bytes(x ^ mask[i % 4] for i, x in enumerate(p)))
        while len(rest) < 2 or len(rest) < 2 + (rest[1] & 127):
            d = c.recv(4096)
            if not d:
                raise EOFError(rest)
            rest += d
        return rest[2:2 + (rest[1] & 127)].decode()


out = {}
sbx = Sandbox.create("base", timeout=120, network={"mask_request_host": "app.local:${PORT}"})
try:
    out["echo"] = sbx.commands.run("echo over-tls").stdout.strip()
    sbx.files.write("/home/user/tls.txt", "written over tls")
    out["read"] = sbx.files.read("/home/user/tls.txt")
    sbx.commands.run(
        "python3 -c 'import http.server as h\n"
        "class H(h.BaseHTTPRequestHandler):\n"
        "    def do_GET(s):\n"
        "        b = s.headers.get(\"Host\", \"\").encode()\n"
        "        s.send_response(200); s.send_header(\"Content-Length\", str(len(b))); s.end_headers(); s.wfile.write(b)\n"
        "    def log_message(s, *a): pass\n"
        "h.HTTPServer((\"0.0.0.0\", 8000), H).serve_forever()'",
        background=True,
    )
    out["host"] = sbx.get_host(8000)
    # A WebSocket through wss://<port>-<id>.<domain>: a standard-library client
    # (TLS with the same trust as the SDK, HTTP/1.1 upgrade, one masked frame).
    sbx.files.write("/home/user/ws.py", os.environ["WS_SERVER_PY"])
    sbx.commands.run("python3 /home/user/ws.py", background=True)
    for _ in range(50):
        try:
            out["ws_echo"] = ws_echo(sbx.get_host(8001), "ping over wss")
            break
        except (OSError, ValueError, EOFError) as e:
            out["ws_err"] = repr(e)
        time.sleep(0.2)
    for _ in range(50):
        try:
            r = httpx.get("https://" + out["host"] + "/", timeout=5)
            if r.status_code == 200:
                out["served"] = r.text
                break
        except httpx.HTTPError as e:
            out["fetch_err"] = repr(e)
        time.sleep(0.2)
finally:
    out["killed"] = sbx.kill()
print(json.dumps(out))
"""


# A WebSocket echo server for the sandbox (standard library only): text and
# binary frames under 126 bytes are echoed, close answers close.
WS_SERVER = r"""
import base64, hashlib, socket, threading
def rd(c, n):
    b = b""
    while len(b) < n:
        d = c.recv(n - len(b))
        if not d:
            raise EOFError
        b += d
    return b
def serve(c):
    h = b""
    while b"\r\n\r\n" not in h:
        d = c.recv(4096)
        if not d:
            return
        h += d
    key = [l.split(b":", 1)[1].strip() for l in h.split(b"\r\n") if l.lower().startswith(b"sec-websocket-key:")][0]
    acc = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + acc + b"\r\n\r\n")
    while True:
        b0, b1 = rd(c, 2)
        n = b1 & 127
        if n == 126:
            n = int.from_bytes(rd(c, 2), "big")
        elif n == 127:
            n = int.from_bytes(rd(c, 8), "big")
        m = rd(c, 4) if b1 & 128 else bytes(4)
        p = bytes(x ^ m[i % 4] for i, x in enumerate(rd(c, n)))
        op = b0 & 15
        if op == 8:
            c.sendall(b"\x88\x00")
            return
        if op in (1, 2) and len(p) < 126:
            c.sendall(bytes([0x80 | op, len(p)]) + p)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8001))
s.listen(8)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""


# A wildcard DNS record for the domain, as an operator would publish:
# scripts/wildcard-dns in the namespace answers A queries for *.<domain> with
# the server's address (the SDK's Rust transport resolves through DNS, not
# /etc/hosts), NXDOMAIN for other names.
DNS = str(REPO / "scripts" / "wildcard-dns")


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=15)


@pytest.fixture
def tls_netns():
    tag = secrets.token_hex(3)
    ns, veth = f"cbtlp{tag}", f"cbtq{tag}"
    second, third = random.randrange(256), random.randrange(64) * 4
    host_addr, ns_addr = f"198.19.{second}.{third + 1}", f"198.19.{second}.{third + 2}"
    etc = f"/etc/netns/{ns}"
    dns = None
    try:
        ip("netns", "add", ns)
        ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        ip("addr", "add", f"{host_addr}/30", "dev", veth)
        ip("link", "set", veth, "up")
        ip("-n", ns, "addr", "add", f"{ns_addr}/30", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")
        ip("-n", ns, "link", "set", "lo", "up")
        os.makedirs(etc, exist_ok=True)
        with open(os.path.join(etc, "resolv.conf"), "w") as f:
            f.write("nameserver 127.0.0.1\n")
        dns = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, DNS, DOMAIN, host_addr],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert dns.stdout.readline().strip() == "ready"
        yield ns, host_addr
    finally:
        if dns is not None:
            dns.kill()
            dns.wait(10)
        subprocess.run(["ip", "link", "del", veth], capture_output=True, timeout=15)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=15)
        shutil.rmtree(etc, ignore_errors=True)


@pytest.mark.timeout(240)
def test_e2b_domain_only_over_tls(tls_netns):
    ns, host_addr = tls_netns
    saved = dict(os.environ)  # Server.start points the SDK env at itself; the session's server keeps it
    srv = Server()
    try:
        srv.start(["--tls-self-signed", "--listen-tls", f"{host_addr}:443"])
        os.environ.clear()
        os.environ.update(saved)
        ca = os.path.join(srv.data_dir, "tls", "ca.pem")
        assert os.path.exists(ca), "serve made its local CA"
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/root"),
            "E2B_DOMAIN": DOMAIN,
            "E2B_API_KEY": srv.api_key,
            "SSL_CERT_FILE": ca,
            "WS_SERVER_PY": WS_SERVER,
        }
        r = subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, "-c", CHILD],
            env=env,
            capture_output=True,
            text=True,
            timeout=200,
        )
        assert r.returncode == 0, f"child failed ({r.returncode}):\n{r.stderr}\n{r.stdout}"
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["echo"] == "over-tls"
        assert out["read"] == "written over tls"
        assert out["host"].startswith("8000-") and out["host"].endswith("." + DOMAIN), out
        # The service behind get_host(8000) answered over https and saw the masked Host.
        assert out.get("served") == "app.local:8000", out
        assert out.get("ws_echo") == "ping over wss", out
        assert out["killed"] is True
    finally:
        os.environ.clear()
        os.environ.update(saved)
        srv.stop()
