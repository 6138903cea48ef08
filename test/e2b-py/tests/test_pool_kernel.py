"""A warm-pool standby of code-interpreter-v1 has its default kernel running
before it is claimed: the claimer's first run_code finds a kernel that was
started when the standby booted, not after the create."""

import time

from e2b_code_interpreter import Sandbox

from harness import wait_for


def test_a_claimed_standby_already_runs_its_kernel(server):
    tpl = "code-interpreter-v1"
    r = server.api("PUT", f"/templates/{tpl}/pool", json={"size": 1})
    assert r.status_code == 200, r.text
    try:
        wait_for(lambda: server.api("GET", f"/templates/{tpl}/pool").json().get("ready", 0) >= 1,
                 timeout=120, what="a ready standby")
        # The standby is ready only with its kernel up (the template's ready
        # command waits for /health): let that kernel age before the claim.
        time.sleep(3)
        t0 = time.monotonic()
        sbx = server.track(Sandbox.create(timeout=120))
        try:
            # The agent writes each kernel's connection file as it starts it.
            ex = sbx.run_code(
                "import glob, os, time\n"
                "print(int(time.time() - min(os.stat(f).st_mtime for f in glob.glob('/run/cubicle-kernels/*'))))"
            )
            claimed_for = time.monotonic() - t0
            assert ex.error is None, ex.error
            kernel_age = int(ex.logs.stdout[0].strip())
            # The kernel is older than the claim: it was started by the standby.
            assert kernel_age >= claimed_for + 2, (kernel_age, claimed_for)
        finally:
            sbx.kill()
    finally:
        server.api("PUT", f"/templates/{tpl}/pool", json={"size": 0})
        wait_for(lambda: server.api("GET", f"/templates/{tpl}/pool").json().get("ready", 1) == 0,
                 timeout=120, what="the pool drained")
