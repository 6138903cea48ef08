"""Sandbox networking on a host whose iptables FORWARD policy is DROP (what
Docker, ufw and firewalld leave behind), through the unmodified SDK. The
machine's own firewall is never touched: a network namespace of the test's
plays the host. It gets a veth to the root namespace (a /30 from
198.18.128.0/17; the SDK reaches serve's listen address on it), FORWARD
policy DROP (and, parametrized, Docker's DOCKER-USER layout), and
test/testnet attached to it (--attach-netns) as the internet. `cubicle serve`
runs inside it (harness Server(netns=..., listen_addr=...)); its
--host-firewall=auto adds accept rules tagged cubicle:<bridge>
(internal/network/hostfw_linux.go) and removes them at exit. The session
server's environment is restored after."""

import ipaddress
import json
import os
import re
import secrets
import subprocess
from pathlib import Path

import pytest
from e2b import ALL_TRAFFIC, Sandbox

from harness import Server

TESTNET = Path(__file__).resolve().parents[3] / "bin" / "cubicle-testnet"


def _run(*args: str) -> str:
    r = subprocess.run(args, capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: status {r.returncode}: {r.stderr}")
    return r.stdout


def _ipt(ns: str, *args: str) -> str:
    return _run("ip", "netns", "exec", ns, "iptables", "-w", "10", *args)


def _free_slash30() -> tuple[str, str]:
    """A /30 in 198.18.128.0/17 overlapping no address of the root namespace."""
    used = [ipaddress.ip_interface(m).network for m in re.findall(r"inet (\S+)", _run("ip", "-4", "-o", "addr", "show"))]
    for _ in range(64):
        base = ipaddress.ip_address("198.18.128.0") + secrets.randbelow(2**15 // 4) * 4
        net = ipaddress.ip_network(f"{base}/30")
        if not any(net.overlaps(u) for u in used):
            return str(base + 1), str(base + 2)
    raise RuntimeError("no free /30 in 198.18.128.0/17")


def _get(sbx, url: str) -> str:
    r = sbx.commands.run(f"curl -sS -m 5 -o /dev/null -w '%{{http_code}}' {url} || true")
    return r.stdout.strip()


@pytest.mark.parametrize("layout", ["FORWARD", "DOCKER-USER"])
def test_forward_drop_host(server, layout):
    """DNS and HTTP(S) egress work and denyOut still blocks with the host's
    FORWARD policy DROP; the accept rules sit in DOCKER-USER when that chain
    exists, else at the top of FORWARD, and are gone once serve stopped."""
    docker = layout == "DOCKER-USER"
    saved = dict(os.environ)
    ns = f"cbfd{secrets.token_hex(3)}"
    root_addr, ns_addr = _free_slash30()
    fixture = None
    srv = None
    try:
        _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", ns, "type", "veth", "peer", "name", "up0", "netns", ns)
        _run("ip", "addr", "add", f"{root_addr}/30", "dev", ns)
        _run("ip", "link", "set", ns, "up")
        _run("ip", "-n", ns, "addr", "add", f"{ns_addr}/30", "dev", "up0")
        _run("ip", "-n", ns, "link", "set", "up0", "up")
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        _ipt(ns, "-P", "FORWARD", "DROP")
        if docker:
            # Docker's layout: FORWARD jumps to DOCKER-USER first, which returns.
            _ipt(ns, "-N", "DOCKER-USER")
            _ipt(ns, "-A", "DOCKER-USER", "-j", "RETURN")
            _ipt(ns, "-I", "FORWARD", "-j", "DOCKER-USER")

        fixture = subprocess.Popen([str(TESTNET), "--attach-netns", ns], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = fixture.stdout.readline()
        assert line, "cubicle-testnet exited before it was ready"
        net = json.loads(line)
        assert net["attachNetns"] == ns

        srv = Server(netns=ns, listen_addr=ns_addr).start(["--dns", net["dns"], "--ca-certificates", net["caBundle"]])
        tag = f"cubicle:{srv.bridge}"
        rules = _ipt(ns, "-S", layout)
        assert rules.count(tag) == 2, f"want two rules tagged {tag} in {layout}:\n{rules}"
        if docker:
            fwd = _ipt(ns, "-S", "FORWARD")
            assert "cubicle:" not in fwd, f"rules in FORWARD too:\n{fwd}"
        else:
            assert tag in rules.splitlines()[1], f"the first FORWARD rule is not ours:\n{rules}"

        sbx = srv.track(Sandbox.create("base"))
        hosts = sbx.commands.run("getent hosts a.test || true").stdout
        assert re.match(rf"{re.escape(net['addr'])}\s+a\.test", hosts), hosts
        assert _get(sbx, "http://a.test/") == "200"
        assert _get(sbx, "https://a.test/") == "200"
        assert _get(sbx, f"http://{net['addr']}:8080/") == "200"

        denied = srv.track(Sandbox.create("base", network={"deny_out": [ALL_TRAFFIC]}))
        assert _get(denied, "http://a.test/") == "000"
        assert _get(denied, f"http://{net['addr']}/") == "000"
        assert _get(sbx, "http://a.test/") == "200"  # ... while the first still gets out

        srv.stop()
        saved_rules = _run("ip", "netns", "exec", ns, "iptables-save")
        assert "cubicle:" not in saved_rules, f"rules left after serve stopped:\n{saved_rules}"
        assert re.search(r"^:FORWARD DROP", saved_rules, re.M), f"FORWARD policy changed:\n{saved_rules}"
        if docker:
            assert re.search(r"^-A DOCKER-USER -j RETURN$", saved_rules, re.M), f"Docker's own rule removed:\n{saved_rules}"
    finally:
        try:
            if srv is not None:
                srv.stop()  # a no-op when it already stopped
        finally:
            os.environ.clear()
            os.environ.update(saved)
            if fixture is not None:
                fixture.stdin.close()  # it removes its netns, veth and files
                try:
                    fixture.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    fixture.kill()
                    fixture.wait()
                fixture.stdout.close()
            subprocess.run(["ip", "link", "del", ns], capture_output=True, timeout=15)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=15)
    assert subprocess.run(["ip", "link", "show", ns], capture_output=True).returncode != 0, f"veth {ns} left"
    assert ns not in _run("ip", "netns", "list").split(), f"netns {ns} left"
