"""The cubesandbox Python SDK (CubeSandbox's own client) against Cubicle: its
control plane at CUBE_API_URL, its data plane through <port>-<id>.<domain>
hosts sent to the same listener (CUBE_PROXY_NODE_IP/CUBE_PROXY_PORT_HTTP).
Sandbox lifecycle, commands, files, PTY, Volume.create/connect/list/get_info/
destroy, volume_mounts with VolumeMount(read_only=True), and run_code."""

import os
import threading
import time

import pytest
from cubesandbox import (
    ApiError,
    CubeSandboxError,
    FilesystemNotFoundError,
    PtySize,
    Sandbox,
    SandboxNotFoundError,
    Volume,
    VolumeMount,
    VolumeNotFoundError,
)

from harness import wait_for


def _name(prefix):
    return f"{prefix}-cube-{time.time_ns()}"


@pytest.fixture(scope="module")
def sb(server):
    s = server.track(Sandbox.create(template="base", timeout=300, envs={"CUBE_ENV": "set"}, metadata={"sdk": "cube"}))
    yield s
    s.kill()


def test_create_get_info_list_and_connect(server, sb):
    info = sb.get_info()
    assert info.sandbox_id == sb.sandbox_id
    assert info.state == "running"
    assert info.metadata == {"sdk": "cube"}
    assert info.cpu_count and info.cpu_count >= 1
    assert info.memory_mb and info.memory_mb >= 128
    assert info.started_at and info.end_at
    assert 250 < (info.end_at - info.started_at).total_seconds() < 350

    assert sb.sandbox_id in [s["sandboxID"] for s in Sandbox.list()]
    assert sb.sandbox_id in [s["sandboxID"] for s in Sandbox.list_v2()]

    same = Sandbox.connect(sb.sandbox_id, timeout=120)
    assert same.sandbox_id == sb.sandbox_id
    assert same.commands.run("echo via-connect").stdout == "via-connect\n"
    assert Sandbox.health()["status"] == "ok"


def test_connect_without_a_timeout_keeps_the_current_one(sb):
    """cubesandbox sends {} when connect() gets no timeout: "keep the current timeout"."""
    end = sb.get_info().end_at
    same = Sandbox.connect(sb.sandbox_id)
    assert same.commands.run("echo kept").stdout == "kept\n"
    assert abs((sb.get_info().end_at - end).total_seconds()) < 2


def test_commands_run_with_envs_cwd_user_and_exit_codes(sb):
    r = sb.commands.run('echo "$CUBE_ENV|$CMD"; echo err >&2', envs={"CMD": "cmd"})
    assert (r.stdout, r.stderr, r.exit_code) == ("set|cmd\n", "err\n", 0)
    # The SDK's default user is root; user= picks another.
    assert sb.commands.run("id -un").stdout == "root\n"
    assert sb.commands.run("id -un; pwd", user="user", cwd="/tmp").stdout == "user\n/tmp\n"
    # A non-zero exit is a result, not an exception, in this SDK.
    r = sb.commands.run("echo partial; exit 7")
    assert (r.stdout, r.exit_code) == ("partial\n", 7)


def test_commands_timeout_ends_the_command_with_deadline_exceeded(sb):
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="deadline_exceeded"):
        sb.commands.run("sleep 30", timeout=1)
    assert time.monotonic() - t0 < 15
    assert sb.commands.run("echo alive").stdout == "alive\n"


def test_files_write_read_list_stat_exists_make_dir_rename_remove(sb):
    # The SDK writes and reads as root by default; its filesystem RPCs send no
    # user unless asked, so they run as the sandbox's default user.
    sb.files.write("/tmp/cube/a.txt", "alpha")
    assert sb.files.read("/tmp/cube/a.txt") == "alpha"
    sb.files.write("/tmp/cube/bin", bytes(range(256)))
    assert sb.commands.run("sha256sum < /tmp/cube/bin | cut -c1-16").stdout.strip() == "40aff2e9d2d8922e"
    assert sb.files.write_files([("/tmp/cube/m1", "1"), ("/tmp/cube/m2", b"2")]) == 2
    assert sb.files.read("/tmp/cube/m2", user="user") == "2"

    assert sorted(e["name"] for e in sb.files.list("/tmp/cube")) == ["a.txt", "bin", "m1", "m2"]
    st = sb.files.stat("/tmp/cube/a.txt")
    assert st["name"] == "a.txt" and int(st["size"]) == 5 and st["owner"] == "root"
    assert sb.files.exists("/tmp/cube/a.txt") is True
    assert sb.files.exists("/tmp/cube/nope") is False
    with pytest.raises(FilesystemNotFoundError):
        sb.files.stat("/tmp/cube/nope")
    # The default user may not move root's file out of root's directory.
    with pytest.raises(IOError, match="permission"):
        sb.files.rename("/tmp/cube/a.txt", "/tmp/cube/stolen.txt")

    d = sb.files.make_dir("/tmp/cube/sub", user="root")
    assert d["name"] == "sub"
    moved = sb.files.rename("/tmp/cube/a.txt", "/tmp/cube/sub/b.txt", user="root")
    assert moved["path"] == "/tmp/cube/sub/b.txt"
    assert sb.files.read("/tmp/cube/sub/b.txt") == "alpha"
    sb.files.remove("/tmp/cube", user="root")
    assert sb.files.exists("/tmp/cube") is False
    with pytest.raises(IOError):
        sb.files.read("/tmp/cube/sub/b.txt")


def test_files_watch_dir_streams_events(sb):
    sb.files.make_dir("/tmp/cw")
    events = []
    with sb.files.watch_dir("/tmp/cw") as w:

        def collect():
            for e in w:
                events.append(e)
                if e.name == "f.txt" and e.type.lower().endswith("create"):
                    return

        t = threading.Thread(target=collect, daemon=True)
        t.start()
        time.sleep(0.3)
        sb.files.write("/tmp/cw/f.txt", "x")
        t.join(10)
    assert any(e.name == "f.txt" for e in events), events


def test_pty_create_input_resize_kill(sb):
    h = sb.pty.create(PtySize(rows=24, cols=80), user="user", timeout=0)
    chunks = []
    t = threading.Thread(target=lambda: _drain(h, chunks), daemon=True)
    t.start()

    def out():
        return b"".join(chunks).decode("utf-8", "replace")

    h.send_stdin(b"stty size; id -un\n")
    wait_for(lambda: "24 80" in out() and "user" in out(), timeout=10, what=lambda: f"pty output; got {out()!r}")
    h.resize(PtySize(rows=33, cols=101))
    h.send_stdin(b"stty size\n")
    wait_for(lambda: "33 101" in out(), timeout=10, what=lambda: f"resized; got {out()!r}")
    assert h.kill() is True
    t.join(10)
    assert not t.is_alive()


def _drain(h, chunks):
    try:
        h.wait(on_data=chunks.append)
    except CubeSandboxError:
        pass


def test_volume_create_connect_list_get_info_destroy(server):
    name = _name("vol")
    vol = Volume.create(name)
    assert (vol.volume_id, vol.name) == (name, name)
    assert vol.token
    listed = [v for v in Volume.list() if v.volume_id == name]
    assert len(listed) == 1 and listed[0].name == name
    info = Volume.get_info(name)
    assert info.volume_id == name and info.token == vol.token
    assert Volume.connect(name) == vol
    with pytest.raises(VolumeNotFoundError):
        Volume.get_info("no-such-volume")
    with pytest.raises(ApiError) as ei:
        Volume.create(name)
    assert ei.value.status_code == 409
    assert Volume.destroy(name) is True
    assert Volume.destroy(name) is False
    assert name not in [v.volume_id for v in Volume.list()]


@pytest.mark.timeout(180)
def test_volume_mounts_read_write_and_read_only_and_the_delete_guard(server):
    vol = Volume.create(_name("data"))
    writer = server.track(Sandbox.create(template="base", volume_mounts={"/workspace": vol}))
    reader = server.track(Sandbox.create(template="base", volume_mounts={"/dataset": VolumeMount(vol, read_only=True)}))
    try:
        writer.files.write("/workspace/note.txt", "persisted!")
        assert reader.files.read("/dataset/note.txt") == "persisted!"
        # The read-only attachment refuses writes, even as root, and sees later writes.
        r = reader.commands.run("echo x > /dataset/other.txt", user="root")
        assert r.exit_code != 0 and "Read-only file system" in r.stderr
        with pytest.raises(IOError):
            reader.files.write("/dataset/via-api.txt", "no")
        writer.files.write("/workspace/later.txt", "later")
        assert reader.files.read("/dataset/later.txt") == "later"
        assert writer.get_info().get("volumeMounts") == [{"name": vol.volume_id, "path": "/workspace"}]
        assert reader.get_info().get("volumeMounts") == [{"name": vol.volume_id, "path": "/dataset", "readOnly": True}]

        with pytest.raises(ApiError) as ei:
            Volume.destroy(vol.volume_id)
        assert ei.value.status_code == 409
    finally:
        writer.kill()
        reader.kill()

    # The data outlives both sandboxes; a plain volume-ID string mounts it too.
    again = server.track(Sandbox.create(template="base", volume_mounts={"/w": vol.volume_id}))
    try:
        assert again.files.read("/w/note.txt") == "persisted!"
    finally:
        again.kill()
    assert Volume.destroy(vol.volume_id) is True
    with pytest.raises(ApiError):
        Sandbox.create(template="base", volume_mounts={"/w": vol.volume_id})


def test_pause_connect_resume_set_timeout_kill(server):
    s = server.track(Sandbox.create(template="base", timeout=300))
    s.files.write("/tmp/kept", "yes")
    s.pause()
    assert s.get_info().state == "paused"
    with pytest.raises(ApiError) as ei:
        s.pause(wait=False)
    assert ei.value.status_code == 409
    s.resume()
    assert s.get_info().state == "running"
    assert s.files.read("/tmp/kept") == "yes"
    s.pause()
    resumed = Sandbox.connect(s.sandbox_id, timeout=300)
    assert resumed.get_info().state == "running"
    assert resumed.files.read("/tmp/kept") == "yes"

    s.set_timeout(600)
    left = s.get_info().end_at.timestamp() - time.time()
    assert left > 500
    s.kill()
    with pytest.raises(SandboxNotFoundError):
        s.get_info()
    with pytest.raises(SandboxNotFoundError):
        s.kill()


def test_run_code_on_the_code_interpreter_template(server):
    s = server.track(Sandbox.create(template="code-interpreter-v1", timeout=300))
    try:
        out = []
        ex = s.run_code("print('hello')\n1+1", on_stdout=out.append)
        assert ex.error is None, ex.error
        assert ex.text == "2"
        assert ex.logs.stdout == ["hello\n"]
        assert [m.line for m in out] == ["hello\n"]
        err = s.run_code("1/0").error
        assert err is not None and err.name == "ZeroDivisionError"
    finally:
        s.kill()


def test_template_list_and_get_carry_cubeapi_status(server):
    """cubesandbox's Template.list/get read templateID and status (CubeAPI's
    casing); an alias lookup that can name no template is a 400, not a 404."""
    import requests
    from cubesandbox import Template

    listed = {t.template_id: t for t in Template.list()}
    assert "base" in listed and listed["base"].status == "READY"
    detail = Template.get("base")
    assert detail.template_id == "base" and detail.status == "READY"
    headers = {"X-API-Key": os.environ["CUBE_API_KEY"]}
    assert requests.get(f"{os.environ['CUBE_API_URL']}/templates/aliases/UPPER", headers=headers).status_code == 400
    assert requests.get(f"{os.environ['CUBE_API_URL']}/templates/aliases/base", headers=headers).status_code == 200
    assert requests.get(f"{os.environ['CUBE_API_URL']}/templates/aliases/no-such-template", headers=headers).status_code == 404
