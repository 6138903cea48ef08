"""Request transforms (network rules) with Secret placeholders, dns_servers,
a SOCKS5 egress proxy, and CubeSandbox's rule list (through its own SDK), through the unmodified SDKs: a real sandbox, the node's egress
proxy, and test/testnet (bin/cubicle-testnet: a netns on 198.18.128.0/17
answering every *.test name, echo servers, and a SOCKS5 server that needs
alice/pw and can be stopped) standing in for the internet. The server needs
the fixture's DNS and CA on its command line, so this test runs one of its
own and restores the session server's environment after."""

import hashlib
import json
import os
import secrets
import subprocess
from pathlib import Path

import cubesandbox
import pytest
from e2b import ALL_TRAFFIC, Sandbox, Secret

from harness import Server, uniq

TESTNET = Path(__file__).resolve().parents[3] / "bin" / "cubicle-testnet"


def _curl(sbx, args: str) -> str:
    return sbx.commands.run(f"curl -sS -m 5 {args} || true").stdout.strip()


def _status(sbx, url: str) -> str:
    return _curl(sbx, f"-o /dev/null -w '%{{http_code}}' {url}")


def _sha256(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


def test_rules_secret_placeholder_and_socks5_upstream(server):
    saved = dict(os.environ)
    fixture = subprocess.Popen(
        [str(TESTNET), "--socks-user", "alice", "--socks-pass", "pw"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )

    def control(line: str) -> str:
        fixture.stdin.write(line + "\n")
        fixture.stdin.flush()
        return fixture.stdout.readline().strip()

    srv = None
    name = uniq("py-api-key")
    value = "sv-" + secrets.token_hex(12)
    try:
        net = json.loads(fixture.stdout.readline())
        srv = Server().start(["--dns", net["dns"], "--ca-certificates", net["caBundle"]])
        Secret.create(name, value)

        # A header from a rule, with the secret filled in by the proxy; the
        # echo answers only its hash, so the value never reaches the sandbox.
        sbx = srv.track(
            Sandbox.create(
                "base",
                network={
                    "allow_out": ["api.test", "plain.test"],
                    "deny_out": [ALL_TRAFFIC],
                    "rules": {"api.test": [{"transform": {"headers": {"X-Api-Key": Secret.fill(name), "X-Team": "cubicle"}}}]},
                },
            )
        )
        out = json.loads(_curl(sbx, "'https://api.test/?sha256=X-Api-Key' -H 'X-Api-Key: from-the-sandbox'"))
        assert out["sha256"] == _sha256(value)
        seen = json.loads(_curl(sbx, "https://api.test/"))
        assert seen["headers"]["X-Team"] == ["cubicle"]
        assert "X-Team" not in json.loads(_curl(sbx, "https://plain.test/"))["headers"]

        # Nowhere in the sandbox: env, /proc environ and cmdline, files. The
        # command carries the value in two halves and greps through a pipe.
        half = len(value) // 2
        r = sbx.commands.run(
            f"a='{value[:half]}'; b='{value[half:]}'; v=\"$a$b\"; "
            "env | grep -cF -f <(printf %s \"$v\"); "
            "cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | grep -acF -f <(printf %s \"$v\"); "
            "grep -rlsaF --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev -f <(printf %s \"$v\") / | head -5; true",
            user="root",
            timeout=120,
        )
        assert r.stdout.strip() == "0\n0", f"found the secret in the sandbox: {r.stdout}"

        # update_network replaces the rules; a rotated secret applies next time.
        Secret.update(name, value + "-rotated")
        sbx.update_network(
            {
                "allow_out": ["api.test"],
                "deny_out": [ALL_TRAFFIC],
                "rules": {"api.test": [{"transform": {"headers": {"X-Api-Key": "v2 " + Secret.fill(name)}}}]},
            }
        )
        out = json.loads(_curl(sbx, "'https://api.test/?sha256=X-Api-Key'"))
        assert out["sha256"] == _sha256(f"v2 {value}-rotated")
        sbx.kill()

        # dns_servers=[]: the node's resolver is not opened under deny-all;
        # allowed names still work by name (from /etc/hosts).
        sbx = srv.track(Sandbox.create("base", network={"allow_out": ["allowed.test"], "deny_out": [ALL_TRAFFIC], "dns_servers": []}))
        assert sbx.commands.run("getent hosts a.test || echo unresolved").stdout.strip() == "unresolved"
        sbx.commands.run(f"echo '{net['addr']} allowed.test' >> /etc/hosts", user="root")
        assert _status(sbx, "https://allowed.test/") == "200"
        assert sbx.get_info().network["dns_servers"] == []
        sbx.update_network({"allow_out": ["allowed.test"], "deny_out": [ALL_TRAFFIC]})
        assert sbx.commands.run("getent hosts a.test || echo unresolved").stdout.strip() != "unresolved"
        sbx.kill()

        # CubeSandbox's rule list, through its own SDK (which sends every rule
        # set as a list): an allow rule allows its host and injects its header
        # (format filled with the secret), hosts it does not name stay blocked
        # without internet access, and a deny rule blocks its host.
        cube = srv.track(
            cubesandbox.Sandbox.create(
                template="base",
                timeout=300,
                allow_internet_access=False,
                network={
                    "rules": [
                        {"name": "key", "match": {"host": "api.test"},
                         "action": {"allow": True, "inject": [{"header": "X-Api-Key", "secret": value, "format": "Bearer ${SECRET}"}]}},
                        {"name": "open", "match": {"host": "open.test", "scheme": "https", "port": 443}, "action": {"allow": True}},
                        {"name": "http", "match": {"host": "http.test", "scheme": "http", "port": 80},
                         "action": {"allow": True, "inject": [{"header": "X-Plain", "secret": "plain-value"}]}},
                        # A custom L7 port: the node redirects it too.
                        {"name": "custom", "match": {"host": "http.test", "scheme": "http", "port": 8080},
                         "action": {"allow": True, "inject": [{"header": "X-Port", "secret": "on-8080"}]}},
                    ]
                },
            )
        )
        curl = lambda args: cube.commands.run(f"curl -sS -m 5 {args} || true").stdout.strip()
        assert json.loads(curl("'https://api.test/?sha256=X-Api-Key'"))["sha256"] == _sha256(f"Bearer {value}")
        # No scheme is CubeSandbox's default set, so plain HTTP gets it too;
        # scheme http only plain HTTP.
        assert json.loads(curl("'http://api.test/?sha256=X-Api-Key'"))["sha256"] == _sha256(f"Bearer {value}")
        assert json.loads(curl("http://http.test/"))["headers"]["X-Plain"] == ["plain-value"]
        assert "X-Plain" not in json.loads(curl("https://http.test/"))["headers"]
        assert "X-Api-Key" not in json.loads(curl("https://open.test/"))["headers"]
        on8080 = json.loads(curl("http://http.test:8080/"))["headers"]
        assert on8080["X-Port"] == ["on-8080"] and "X-Plain" not in on8080
        assert "X-Port" not in json.loads(curl("http://http.test/"))["headers"]
        assert curl("-o /dev/null -w '%{http_code}' https://plain.test/") == "000"
        cube.update_network({"rules": [{"name": "no", "match": {"host": "api.test"}, "action": {"allow": False}}]})
        assert curl("-o /dev/null -w '%{http_code}' https://api.test/") == "000"
        # An IP host for plain HTTP on a custom port, added by an update (it
        # allows the address, so it comes last: every *.test name is there).
        cube.update_network({"rules": [{"name": "by-ip", "match": {"host": net["addr"], "scheme": "http", "port": 8080},
                                        "action": {"allow": True, "inject": [{"header": "X-Cube-L7", "secret": "marker-by-ip"}]}}]})
        assert json.loads(curl(f"http://{net['addr']}:8080/"))["headers"]["X-Cube-L7"] == ["marker-by-ip"]
        assert "X-Cube-L7" not in json.loads(curl(f"http://{net['addr']}/"))["headers"]
        cube.kill()
        # An IP host for HTTPS is refused (HTTPS rules match the TLS name).
        with pytest.raises(cubesandbox.ApiError, match="needs scheme http"):
            cubesandbox.Sandbox.create(template="base", network={"rules": [
                {"name": "ip", "match": {"host": net["addr"], "scheme": "https", "port": 8443}, "action": {"allow": True}}]})
        # A subnet is refused by the server, naming the rule.
        with pytest.raises(cubesandbox.ApiError, match="subnet CIDR not supported"):
            cubesandbox.Sandbox.create(template="base", network={"rules": [
                {"name": "net", "match": {"host": "10.0.0.0/24", "scheme": "https"}, "action": {"allow": True}}]})

        # SOCKS5: all TCP through the proxy (the echo sees the fixture's own
        # address), the password never shown, fail closed when it stops.
        sbx = srv.track(Sandbox.create("base", network={"egress_proxy": {"address": net["socks"], "username": "alice", "password": "pw"}}))
        for url in ["http://a.test/", "https://a.test/", "http://a.test:8080/"]:
            remote = json.loads(_curl(sbx, url))["remote"]
            assert remote.startswith(net["addr"] + ":"), f"{url} came from {remote}"
        info = sbx.get_info()
        assert info.network["egress_proxy"] == {"address": net["socks"], "username": "alice"}
        assert control("socks stop") == "ok"
        for url in ["http://a.test/", "https://a.test/", "http://a.test:8080/"]:
            assert _status(sbx, url) == "000", url
        assert control("socks start") == "ok"
        assert _status(sbx, "http://a.test/") == "200"
        sbx.kill()
    finally:
        try:
            Secret.destroy(name)
        except Exception:
            pass
        if srv is not None:
            srv.stop()
        os.environ.clear()
        os.environ.update(saved)
        fixture.stdin.close()  # it removes its netns, veth and files
        fixture.wait(timeout=30)
