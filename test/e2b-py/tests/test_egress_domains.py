"""Domain egress rules through the unmodified SDK: a real sandbox, the node's
egress proxy, and test/testnet (bin/cubicle-testnet, a netns on
198.18.128.0/17 answering every *.test name) standing in for the internet.
The server needs the fixture's DNS and CA on its command line, so this test
runs one of its own and restores the session server's environment after."""

import json
import os
import subprocess
from pathlib import Path

from e2b import ALL_TRAFFIC, Sandbox

from harness import Server

TESTNET = Path(__file__).resolve().parents[3] / "bin" / "cubicle-testnet"


def _get(sbx, url: str) -> str:
    r = sbx.commands.run(f"curl -sS -m 5 -o /dev/null -w '%{{http_code}}' {url} || true")
    return r.stdout.strip()


def test_domain_allow_list_with_deny_all_and_runtime_update(server):
    saved = dict(os.environ)
    fixture = subprocess.Popen([str(TESTNET)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    srv = None
    try:
        net = json.loads(fixture.stdout.readline())
        srv = Server().start(["--dns", net["dns"], "--ca-certificates", net["caBundle"]])
        sbx = srv.track(Sandbox.create("base", network={"allow_out": ["allowed.test"], "deny_out": [ALL_TRAFFIC]}))
        assert _get(sbx, "https://allowed.test/") == "200"
        assert _get(sbx, "http://allowed.test/") == "200"
        assert _get(sbx, "https://other.test/") == "000"
        assert _get(sbx, f"http://{net['addr']}/") == "000"

        sbx.update_network({"allow_out": ["*.w.test"], "deny_out": [ALL_TRAFFIC]})
        assert _get(sbx, "https://a.w.test/") == "200"
        assert _get(sbx, "https://w.test/") == "000"
        assert _get(sbx, "https://allowed.test/") == "000"
        sbx.kill()
    finally:
        if srv is not None:
            srv.stop()
        os.environ.clear()
        os.environ.update(saved)
        fixture.stdin.close()  # it removes its netns, veth and files
        fixture.wait(timeout=30)
