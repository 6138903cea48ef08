"""CubeSandbox's host mounts (metadata["host-mount"]) through its own SDK, on a
server started with --host-mount-prefix: every refusal names its entry (the
shapes CubeSandbox's sdk_compat pins), a read-write mount is the host's
directory (another sandbox and the host see the writes, owned as in the
sandbox), a read-only one refuses writes, mounts are nosuid and nodev, a
symlink planted under the prefix is never followed, only admin keys (and
--host-mount-team teams) may ask, and get_info reports the mounts."""

import json
import os
import shutil
import subprocess
import tempfile
import uuid

import pytest
from cubesandbox import ApiError, Sandbox
from cubesandbox._exceptions import AuthenticationError

from harness import CUBICLE, Server

KEY = "host-mount"


def _meta(*entries):
    return {KEY: json.dumps([{"hostPath": h, "mountPath": m, "readOnly": ro} for h, m, ro in entries])}


@pytest.fixture(scope="module")
def hm():
    saved = dict(os.environ)
    root = tempfile.mkdtemp(prefix="cubicle-hostmount-")
    prefix = os.path.join(root, "shared")
    os.makedirs(os.path.join(prefix, "data"))
    os.chmod(os.path.join(prefix, "data"), 0o777)  # host permissions apply: user may write here
    os.makedirs(os.path.join(root, "secret"))
    with open(os.path.join(root, "secret", "token"), "w") as f:
        f.write("host secret\n")
    srv = None
    try:
        srv = Server().start(["--host-mount-prefix", prefix, "--host-mount-team", "mounters"])
        yield srv, prefix, root
    finally:
        if srv is not None:
            srv.stop()
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(root, ignore_errors=True)


def _refused(metadata, status=400):
    with pytest.raises((ApiError, AuthenticationError)) as ei:
        Sandbox.create(template="base", timeout=60, metadata=metadata)
    assert ei.value.status_code == status, ei.value
    return str(ei.value).lower()


def test_each_bad_request_is_refused_naming_its_entry(hm):
    _, prefix, root = hm
    for host_path, mount_path, phrase in [
        (prefix + "/../secret", "/mnt/x", "is not within an allowed mount prefix"),
        (prefix + "_evil/data", "/mnt/x", "is not within an allowed mount prefix"),
        ("data/shared/foo", "/mnt/x", "hostpath must be an absolute path"),
        ("/var/run", "/mnt/x", "is not within an allowed mount prefix"),
        ("/", "/mnt/x", "is not within an allowed mount prefix"),
        ("", "/mnt/x", "hostpath must be an absolute path"),
        (prefix + "/data", "mnt/rel", "mountpath must be an absolute path"),
        (prefix + "/data", "", "mountpath must be an absolute path"),
        (prefix + "/data", "/proc/x", "reserved"),
        (prefix + "/missing", "/mnt/x", "bind mount"),
    ]:
        msg = _refused(_meta((host_path, mount_path, False)))
        assert phrase in msg and "entry[0]" in msg, (host_path, mount_path, msg)
    mixed = _refused(_meta((prefix + "/data", "/mnt/ok", False), (root + "/secret", "/mnt/s", True)))
    assert "entry[1]" in mixed and "is not within an allowed mount prefix" in mixed
    for raw in ["this-is-not-json", json.dumps({"hostPath": prefix, "mountPath": "/mnt/x"}), '"just-a-string"']:
        msg = _refused({KEY: raw})
        assert "invalid" in msg and KEY in msg, msg
    with open(os.path.join(prefix, "a-file"), "w") as f:
        f.write("x")
    assert "bind mount" in _refused(_meta((prefix + "/a-file", "/mnt/f", False)))


def test_a_read_write_mount_is_the_hosts_directory(hm):
    srv, prefix, _ = hm
    meta = _meta((prefix + "/data", "/mnt/rw", False), (prefix, "/mnt/ro", True))
    a = srv.track(Sandbox.create(template="base", timeout=120, metadata=meta))
    b = srv.track(Sandbox.create(template="base", timeout=120, metadata=_meta((prefix + "/data", "/mnt/shared", False))))
    try:
        token = uuid.uuid4().hex
        r = a.commands.run(f"echo {token} > /mnt/rw/by-user.txt", user="user")
        assert r.exit_code == 0, r.stderr
        r = a.commands.run("echo root > /mnt/rw/by-root.txt", user="root")
        assert r.exit_code == 0, r.stderr
        assert b.commands.run("cat /mnt/shared/by-user.txt").stdout.strip() == token
        host = os.path.join(prefix, "data")
        with open(os.path.join(host, "by-user.txt")) as f:
            assert f.read().strip() == token
        # Idmapped: the sandbox's user and root are the host's 1000 and 0.
        assert os.stat(os.path.join(host, "by-user.txt")).st_uid == 1000
        assert os.stat(os.path.join(host, "by-root.txt")).st_uid == 0
        # The read-only mount (the prefix itself) shows the child and refuses writes.
        assert a.commands.run("cat /mnt/ro/data/by-user.txt").stdout.strip() == token
        ro = a.commands.run("touch /mnt/ro/nope 2>&1; echo rc=$?", user="root")
        assert "Read-only file system" in ro.stdout and "rc=1" in ro.stdout, ro.stdout
        assert not os.path.exists(os.path.join(prefix, "nope"))
        opts = a.commands.run("grep -E ' /mnt/(rw|ro) ' /proc/mounts").stdout
        for line in opts.strip().splitlines():
            assert "nosuid" in line, opts
            # gVisor serves the mount through its gofer, which opens no host
            # device node whatever the flags; it does not list nodev.
            assert "nodev" in line or os.environ.get("CUBICLE_RUNTIME") == "runsc", opts
        info = a.get_info()
        assert json.loads(info.metadata[KEY])[0]["hostPath"] == prefix + "/data"
    finally:
        a.kill()
        b.kill()


def test_a_symlink_under_the_prefix_is_never_followed(hm):
    srv, prefix, root = hm
    planter = srv.track(Sandbox.create(template="base", timeout=120, metadata=_meta((prefix, "/mnt/plant", False))))
    try:
        link = f"escape-{uuid.uuid4().hex[:8]}"
        r = planter.commands.run(f"ln -sfn {root}/secret /mnt/plant/{link} && readlink /mnt/plant/{link}", user="root")
        assert r.exit_code == 0, r.stderr
        msg = _refused(_meta((f"{prefix}/{link}", "/mnt/escaped", True)))
        assert "symlink" in msg, msg
        # A link further up the path is refused the same way.
        planter.commands.run(f"mkdir -p /mnt/plant/real && ln -sfn real /mnt/plant/{link}-dir", user="root")
        assert "symlink" in _refused(_meta((f"{prefix}/{link}-dir", "/mnt/x", True)))
    finally:
        planter.kill()


def test_only_admin_keys_and_named_teams_may_ask(hm):
    srv, prefix, _ = hm
    data = srv.data_dir
    subprocess.run([CUBICLE, "team", "create", "tenant", "--data-dir", data], check=True, capture_output=True)
    subprocess.run([CUBICLE, "team", "create", "mounters", "--data-dir", data], check=True, capture_output=True)
    tenant = subprocess.run([CUBICLE, "apikey", "create", "--data-dir", data, "--team", "tenant"], check=True, capture_output=True, text=True).stdout.strip()
    mounter = subprocess.run([CUBICLE, "apikey", "create", "--data-dir", data, "--team", "mounters"], check=True, capture_output=True, text=True).stdout.strip()
    saved = os.environ["CUBE_API_KEY"], os.environ["E2B_API_KEY"]
    try:
        os.environ["CUBE_API_KEY"] = os.environ["E2B_API_KEY"] = tenant
        assert "admin api key" in _refused(_meta((prefix + "/data", "/mnt/x", True)), status=403)
        # Nothing about the server's prefixes or host paths reaches such a key.
        msg = _refused(_meta(("/etc", "/mnt/x", True)), status=403)
        assert prefix.lower() not in msg and "prefix" not in msg.replace("--host-mount-team", ""), msg
        # An empty list asks for nothing.
        s = Sandbox.create(template="base", timeout=60, metadata={KEY: "[]"})
        s.kill()
        os.environ["CUBE_API_KEY"] = os.environ["E2B_API_KEY"] = mounter
        s = Sandbox.create(template="base", timeout=60, metadata=_meta((prefix + "/data", "/mnt/x", True)))
        try:
            assert s.commands.run("test -d /mnt/x && echo mounted").stdout.strip() == "mounted"
        finally:
            s.kill()
    finally:
        os.environ["CUBE_API_KEY"], os.environ["E2B_API_KEY"] = saved
