"""Snapshots, fork, rollback and filesystem-only pause through the unmodified
Python SDKs: e2b (sync and async) create_snapshot / list_snapshots /
delete_snapshot, Sandbox.create(snapshot_id), fork(count=...),
pause(keep_memory=False / mode="filesystem"), connect(on_resume="reboot") and
lifecycle on_timeout mode "filesystem"; e2b-code-interpreter kernel state
across a snapshot; cubesandbox create_snapshot / list_snapshots /
delete_snapshot / rollback / clone; and the API's answers to bad input.

On runc snapshots keep the filesystem only (sandboxes from them boot fresh);
on runsc they keep memory too (processes keep running). The expectations
follow the harness's runtime, as the JS suite's do. The module leaves no
snapshot behind: its last test (and its fixture's teardown) checks that
GET /snapshots is empty and the server's snapshot dir holds no files."""

from __future__ import annotations

import os
import re
import time

import pytest
import cubesandbox
from cubesandbox import SandboxNotFoundError, TemplateNotFoundError
from e2b import (
    AsyncSandbox,
    InvalidArgumentException,
    NotFoundException,
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
    SandboxState,
    Volume,
)
from e2b_code_interpreter import Sandbox as CodeSandbox

from harness import async_wait_for, uniq, wait_for

COUNTER = "i=0; while true; do i=$((i+1)); echo $i > /tmp/counter.tmp && mv /tmp/counter.tmp /tmp/counter; sleep 0.2; done"
SNAP_ID = re.compile(r"^snap_[0-9a-f]{16}$")


class Created:
    """What this module created, so its teardown (and its last test) can
    remove it even when a test failed midway."""

    def __init__(self, server) -> None:
        self.server = server
        self.sandboxes: list[str] = []
        self.snapshots: list[str] = []

    def sbx(self, s):
        self.server.track(s)
        self.sandboxes.append(s if isinstance(s, str) else s.sandbox_id)
        return s

    def snap(self, info):
        self.snapshots.append(info if isinstance(info, str) else info.snapshot_id)
        return info

    def kill_all(self) -> None:
        for sid in self.sandboxes:
            try:
                self.server.api("DELETE", f"/sandboxes/{sid}", timeout=30)
            except Exception:  # noqa: BLE001 - best effort; the leak check reports
                pass

    def delete_snapshots(self) -> None:
        for sid in self.snapshots:
            try:
                self.server.api("DELETE", f"/snapshots/{sid}", timeout=30)
            except Exception:  # noqa: BLE001
                pass


def _snapshot_rows(server) -> list:
    r = server.api("GET", "/snapshots")
    assert r.status_code == 200, r.text
    return r.json()


def _snapshot_files(server) -> list[str]:
    d = os.path.join(server.data_dir, "snapshots")
    try:
        return sorted(os.listdir(d))
    except FileNotFoundError:
        return []


def _assert_nothing_left(server, created: Created) -> None:
    created.kill_all()
    created.delete_snapshots()
    wait_for(
        lambda: _snapshot_rows(server) == [] and _snapshot_files(server) == [],
        timeout=60,
        interval=0.5,
        what=lambda: f"no snapshot rows ({_snapshot_rows(server)}) and no snapshot files ({_snapshot_files(server)})",
    )


@pytest.fixture(scope="module")
def created(server):
    c = Created(server)
    yield c
    if server.alive():
        _assert_nothing_left(server, c)


@pytest.fixture(scope="module")
def memory(server) -> bool:
    """runsc snapshots keep memory; runc ones the filesystem only."""
    return server.runtime == "runsc"


# ---- helpers -------------------------------------------------------------------


def _counter(sbx) -> int:
    return int(sbx.files.read("/tmp/counter").strip())


def _start_counter(sbx) -> None:
    """A background counter that lives only in memory: a reboot ends it."""
    bg = sbx.commands.run(COUNTER, background=True, timeout=0)
    wait_for(lambda: _counter(sbx) > 3, timeout=15, what="counter running")
    bg.disconnect()


def _counter_running(sbx) -> bool:
    try:
        a = _counter(sbx)
        time.sleep(0.8)
        return _counter(sbx) > a
    except Exception:  # noqa: BLE001 - no counter file: no counter either
        return False


def _forks(result) -> list:
    for f in result:
        assert isinstance(f, Sandbox), f"fork result {f!r}"
    return result


# ---- e2b, sync -----------------------------------------------------------------


@pytest.mark.timeout(240)
def test_snapshot_then_create_from_it_sees_the_snapshot_state_and_the_source_is_unchanged(server, created, memory):
    src = created.sbx(Sandbox.create("base", envs={"SNAP_ENV": "from-source"}, timeout=300))
    src.files.write("/home/user/state.txt", "one")
    _start_counter(src)

    snap = created.snap(src.create_snapshot())
    assert SNAP_ID.match(snap.snapshot_id), snap
    assert snap.names == [snap.snapshot_id]
    raw = server.api("GET", f"/snapshots/{snap.snapshot_id}")
    assert raw.status_code == 200, raw.text
    body = raw.json()
    assert body["kind"] == ("memory" if memory else "filesystem")
    assert body["sandboxID"] == src.sandbox_id
    assert body["templateID"] == "base"
    assert body["sizeBytes"] > 0
    assert body["createdAt"]

    # The source keeps running, and what it does next is not in the snapshot.
    assert src.get_info().state == SandboxState.RUNNING
    assert _counter_running(src), "the source's counter keeps counting"
    src.files.write("/home/user/state.txt", "two")
    src.files.write("/home/user/after.txt", "later")

    child = created.sbx(Sandbox.create(snap.snapshot_id, timeout=120))
    assert child.sandbox_id != src.sandbox_id
    assert child.files.read("/home/user/state.txt") == "one"
    assert child.files.exists("/home/user/after.txt") is False
    assert child.commands.run("echo $SNAP_ENV").stdout.strip() == "from-source"
    assert child.get_info().template_id == snap.snapshot_id
    if memory:
        assert _counter_running(child), "a memory snapshot keeps the counter process alive"
    else:
        assert not _counter_running(child), "a filesystem snapshot boots fresh: no counter process"

    # The child's writes do not reach the source, nor the source's the child.
    child.files.write("/home/user/state.txt", "child")
    assert src.files.read("/home/user/state.txt") == "two"
    assert _counter_running(src)

    assert Sandbox.delete_snapshot(snap.snapshot_id) is True
    assert Sandbox.delete_snapshot(snap.snapshot_id) is False
    assert server.api("GET", f"/snapshots/{snap.snapshot_id}").status_code == 404
    # A sandbox running from a deleted snapshot keeps working.
    assert child.files.read("/home/user/state.txt") == "child"
    with pytest.raises(SandboxException, match="(?i)not found"):
        Sandbox.create(snap.snapshot_id, timeout=60)


@pytest.mark.timeout(240)
def test_named_snapshots_resolve_by_name_and_list_pages_newest_first(server, created):
    src = created.sbx(Sandbox.create("base", timeout=300))
    name = uniq("snap-py")
    src.files.write("/home/user/n.txt", "named")
    named = created.snap(Sandbox.create_snapshot(src.sandbox_id, name=name))
    assert SNAP_ID.match(named.snapshot_id)
    assert named.names == [name]
    others = [created.snap(src.create_snapshot()) for _ in range(3)]

    from_name = created.sbx(Sandbox.create(name, timeout=60))
    assert from_name.files.read("/home/user/n.txt") == "named"
    assert from_name.get_info().template_id == named.snapshot_id

    by_name = Sandbox.list_snapshots(name=name).next_items()
    assert [(s.snapshot_id, s.names) for s in by_name] == [(named.snapshot_id, [name])]
    assert Sandbox.list_snapshots(name=uniq("no-such-snap")).next_items() == []

    newest_first = [s.snapshot_id for s in reversed([named, *others])]
    for pager in (Sandbox.list_snapshots(sandbox_id=src.sandbox_id, limit=2), src.list_snapshots(limit=2)):
        seen, pages = [], 0
        while pager.has_next and pages < 10:
            items = pager.next_items()
            assert len(items) == 2, items
            seen += [s.snapshot_id for s in items]
            pages += 1
        assert pages == 2
        assert seen == newest_first, "every snapshot once, newest first"
    # Another sandbox's snapshots are not in this one's list.
    assert Sandbox.list_snapshots(sandbox_id=from_name.sandbox_id).next_items() == []

    # A name a snapshot (or template) has already: 409 through the SDK too.
    with pytest.raises(SandboxException) as ei:
        src.create_snapshot(name=name)
    assert ei.value.status_code == 409, ei.value

    for s in [named, *others]:
        assert Sandbox.delete_snapshot(s.snapshot_id) is True
    assert Sandbox.list_snapshots(sandbox_id=src.sandbox_id).next_items() == []
    # The name is free again once its snapshot is gone.
    assert Sandbox.list_snapshots(name=name).next_items() == []
    with pytest.raises(SandboxException, match="(?i)not found"):
        Sandbox.create(name, timeout=60)


@pytest.mark.timeout(240)
def test_fork_count_3_gives_three_independent_sandboxes(server, created, memory):
    src = created.sbx(Sandbox.create("base", timeout=300))
    src.files.write("/home/user/fork.txt", "parent")
    _start_counter(src)

    forks = [created.sbx(f) for f in _forks(src.fork(count=3, timeout=120))]
    assert len(forks) == 3
    ids = {f.sandbox_id for f in forks}
    assert len(ids) == 3 and src.sandbox_id not in ids
    for f in forks:
        assert f.files.read("/home/user/fork.txt") == "parent"
        assert _counter_running(f) is memory, "a fork's processes follow the snapshot kind"
    assert _counter_running(src), "the source keeps running"

    # Independent: each fork's writes stay its own.
    forks[0].files.write("/home/user/fork.txt", "fork0")
    forks[1].files.write("/home/user/only1.txt", "fork1")
    assert forks[1].files.read("/home/user/fork.txt") == "parent"
    assert forks[2].files.read("/home/user/fork.txt") == "parent"
    assert forks[2].files.exists("/home/user/only1.txt") is False
    assert forks[0].files.exists("/home/user/only1.txt") is False
    assert src.files.read("/home/user/fork.txt") == "parent"
    assert src.files.exists("/home/user/only1.txt") is False
    # A fork's snapshot is internal: never listed.
    assert Sandbox.list_snapshots(sandbox_id=src.sandbox_id).next_items() == []

    # The SDK checks count itself (1..20); the API takes 1..100.
    with pytest.raises(InvalidArgumentException):
        src.fork(count=0)
    for bad in (0, 101):
        r = server.api("POST", f"/sandboxes/{src.sandbox_id}/fork", json={"count": bad})
        assert r.status_code == 400, r.text
    r = server.api("POST", "/sandboxes/aaaaaaaaaaaaaaaaaaaa/fork", json={"count": 1})
    assert r.status_code == 404, r.text
    with pytest.raises(SandboxNotFoundException):
        Sandbox.fork("aaaaaaaaaaaaaaaaaaaa", count=1)

    for f in forks:
        assert f.kill() is True


@pytest.mark.timeout(180)
def test_fork_of_a_paused_sandbox_leaves_it_paused(server, created):
    src = created.sbx(Sandbox.create("base", timeout=300))
    src.files.write("/home/user/p.txt", "paused-parent")
    assert src.pause() is True
    (f,) = _forks(Sandbox.fork(src.sandbox_id, count=1, timeout=60))
    created.sbx(f)
    assert f.files.read("/home/user/p.txt") == "paused-parent"
    assert Sandbox.get_info(src.sandbox_id).state == SandboxState.PAUSED
    assert f.kill() is True


@pytest.mark.timeout(240)
def test_filesystem_pause_reboots_and_keeps_files_and_connect_can_reboot(server, created):
    sbx = created.sbx(Sandbox.create("base", timeout=300))
    sbx.files.write("/home/user/keep.txt", "kept")
    _start_counter(sbx)

    # keep_memory=False (mode="filesystem" in newer SDK terms): files stay, processes end.
    assert sbx.pause(keep_memory=False) is True
    assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.PAUSED
    assert Sandbox.pause(sbx.sandbox_id, keep_memory=False) is False, "already paused"
    back = Sandbox.connect(sbx.sandbox_id, timeout=120)
    assert back.get_info().state == SandboxState.RUNNING
    assert back.files.read("/home/user/keep.txt") == "kept"
    assert back.commands.run("echo rebooted").stdout == "rebooted\n"
    assert not _counter_running(back), "a filesystem pause ends processes"

    # A memory pause resumed with on_resume="reboot" drops the memory too.
    _start_counter(back)
    assert back.pause() is True
    rebooted = Sandbox.connect(sbx.sandbox_id, timeout=120, on_resume="reboot")
    assert rebooted.files.read("/home/user/keep.txt") == "kept"
    assert not _counter_running(rebooted), 'on_resume="reboot" starts processes afresh'

    # mode="filesystem" is the same pause.
    rebooted.files.write("/home/user/keep.txt", "kept twice")
    _start_counter(rebooted)
    assert rebooted.pause(mode="filesystem") is True
    again = Sandbox.connect(sbx.sandbox_id, timeout=120)
    assert again.files.read("/home/user/keep.txt") == "kept twice"
    assert not _counter_running(again)
    assert again.kill() is True


@pytest.mark.timeout(120)
def test_lifecycle_on_timeout_filesystem_pause(server, created):
    sbx = created.sbx(
        Sandbox.create("base", timeout=8, lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}})
    )
    sbx.files.write("/home/user/t.txt", "timed")
    _start_counter(sbx)
    wait_for(
        lambda: Sandbox.get_info(sbx.sandbox_id).state == SandboxState.PAUSED, timeout=30, interval=0.5, what="timeout pause"
    )
    back = Sandbox.connect(sbx.sandbox_id, timeout=60)
    assert back.files.read("/home/user/t.txt") == "timed"
    assert not _counter_running(back), "a filesystem auto-pause ends processes"
    assert back.kill() is True


@pytest.mark.timeout(240)
def test_a_volume_is_shared_by_a_fork_and_a_deleted_volume_fails_a_create_from_the_snapshot(server, created):
    vol = Volume.create(uniq("snapvol-py"))
    destroyed = False
    try:
        src = created.sbx(Sandbox.create("base", volume_mounts={"/mnt/v": vol.name}, timeout=300))
        src.files.write("/mnt/v/shared.txt", "from-source")
        (f,) = _forks(src.fork(count=1, timeout=120))
        created.sbx(f)
        assert f.files.read("/mnt/v/shared.txt") == "from-source"
        assert f.get_info().volume_mounts == [{"name": vol.name, "path": "/mnt/v"}]
        f.files.write("/mnt/v/from-fork.txt", "fork wrote")
        # Shared, not copied: the source sees the fork's write, and the fork the source's.
        assert src.files.read("/mnt/v/from-fork.txt") == "fork wrote"
        src.files.write("/mnt/v/later.txt", "source wrote later")
        assert f.files.read("/mnt/v/later.txt") == "source wrote later"

        snap = created.snap(src.create_snapshot())
        assert f.kill() is True
        assert src.kill() is True
        assert Volume.destroy(vol.volume_id) is True
        destroyed = True

        r = server.api("POST", "/v2/sandboxes", json={"templateID": snap.snapshot_id, "timeout": 60})
        assert 400 <= r.status_code < 500, f"{r.status_code} {r.text}"
        assert vol.name in r.json()["message"], r.text
        with pytest.raises(SandboxException, match=re.escape(vol.name)) as ei:
            created.sbx(Sandbox.create(snap.snapshot_id, timeout=60))
        assert 400 <= ei.value.status_code < 500, ei.value
        left = [s for s in Sandbox.list().next_items() if s.template_id == snap.snapshot_id]
        assert left == [], "nothing left half-created"
        assert Sandbox.delete_snapshot(snap.snapshot_id) is True
    finally:
        if not destroyed:
            created.kill_all()
            try:
                Volume.destroy(vol.volume_id)
            except Exception:  # noqa: BLE001
                pass


@pytest.mark.timeout(120)
def test_bad_input_answers(server, created):
    dead = Sandbox.create("base", timeout=60)
    assert dead.kill() is True
    r = server.api("POST", f"/sandboxes/{dead.sandbox_id}/snapshots", json={})
    assert r.status_code == 404, r.text
    with pytest.raises(SandboxNotFoundException):
        Sandbox.create_snapshot(dead.sandbox_id)

    sbx = created.sbx(Sandbox.create("base", timeout=120))
    taken = server.api("POST", f"/sandboxes/{sbx.sandbox_id}/snapshots", json={"name": "base"})
    assert taken.status_code == 409, taken.text
    assert "base" in taken.json()["message"]
    bad = server.api("POST", f"/sandboxes/{sbx.sandbox_id}/snapshots", json={"name": "Not A Name"})
    assert bad.status_code == 400, bad.text
    for count in (0, 101):
        r = server.api("POST", f"/sandboxes/{sbx.sandbox_id}/fork", json={"count": count})
        assert r.status_code == 400, r.text
        assert r.json()["code"] == 400
    r = server.api("POST", f"/sandboxes/{sbx.sandbox_id}/rollback", json={})
    assert r.status_code == 400, r.text
    r = server.api("POST", f"/sandboxes/{sbx.sandbox_id}/rollback", json={"snapshotID": "snap_0000000000000000"})
    assert r.status_code == 404, r.text
    for q in ("limit=0", "limit=101", "limit=x", "nextToken=!!"):
        r = server.api("GET", f"/snapshots?{q}")
        assert r.status_code == 400, f"{q}: {r.status_code} {r.text}"
    assert server.api("GET", "/snapshots/snap_0000000000000000").status_code == 404
    assert server.api("DELETE", "/snapshots/snap_0000000000000000").status_code == 404
    assert server.api("DELETE", "/templates/snap_0000000000000000").status_code == 404
    assert Sandbox.delete_snapshot("snap_0000000000000000") is False
    # Without a key: 401, not a leak of who has what.
    assert server.api("GET", "/snapshots", api_key=None).status_code == 401
    # Nothing was created by the refused requests.
    assert Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id).next_items() == []
    assert sbx.kill() is True


# ---- e2b, async ----------------------------------------------------------------


@pytest.mark.timeout(240)
async def test_async_create_snapshot_fork_and_delete_snapshot(server, created):
    src = created.sbx(await AsyncSandbox.create("base", timeout=300))
    await src.files.write("/home/user/a.txt", "async-one")
    snap = created.snap(await src.create_snapshot())
    assert SNAP_ID.match(snap.snapshot_id)
    await src.files.write("/home/user/a.txt", "async-two")

    listed = await AsyncSandbox.list_snapshots(sandbox_id=src.sandbox_id).next_items()
    assert [s.snapshot_id for s in listed] == [snap.snapshot_id]

    child = created.sbx(await AsyncSandbox.create(snap.snapshot_id, timeout=120))
    assert await child.files.read("/home/user/a.txt") == "async-one"

    forks = await src.fork(count=2, timeout=120)
    for f in forks:
        assert isinstance(f, AsyncSandbox), f"fork result {f!r}"
        created.sbx(f)
    assert len({f.sandbox_id for f in forks}) == 2
    for f in forks:
        assert await f.files.read("/home/user/a.txt") == "async-two"
    await forks[0].files.write("/home/user/a.txt", "fork0")
    assert await forks[1].files.read("/home/user/a.txt") == "async-two"
    assert await src.files.read("/home/user/a.txt") == "async-two"

    assert await AsyncSandbox.delete_snapshot(snap.snapshot_id) is True
    assert await AsyncSandbox.delete_snapshot(snap.snapshot_id) is False
    assert await src.list_snapshots().next_items() == []
    for s in (child, *forks):
        assert await s.kill() is True


# ---- e2b-code-interpreter -----------------------------------------------------


@pytest.mark.timeout(300)
def test_code_interpreter_kernel_state_follows_the_snapshot_kind(server, created, memory):
    src = created.sbx(CodeSandbox.create("code-interpreter-v1", timeout=300))
    ex = src.run_code("answer = 41\nwith open('/home/user/ci.txt', 'w') as f:\n    f.write('from-kernel')\nanswer")
    assert ex.error is None, ex.error
    assert ex.text == "41"
    snap = created.snap(src.create_snapshot())

    child = created.sbx(CodeSandbox.create(snap.snapshot_id, timeout=180))
    assert child.files.read("/home/user/ci.txt") == "from-kernel", "files written by code persist"
    ex = child.run_code("answer + 1")
    if memory:
        assert ex.error is None, ex.error
        assert ex.text == "42", "a memory snapshot keeps the kernel's variables"
    else:
        assert ex.error is not None and ex.error.name == "NameError", f"a filesystem snapshot starts a fresh kernel: {ex}"
    ex = child.run_code("open('/home/user/ci.txt').read()")
    assert ex.error is None, ex.error
    assert ex.text == "from-kernel"
    # The source's kernel is untouched.
    assert src.run_code("answer + 2").text == "43"

    assert CodeSandbox.delete_snapshot(snap.snapshot_id) is True
    assert child.kill() is True
    assert src.kill() is True


# ---- cubesandbox ---------------------------------------------------------------


@pytest.mark.timeout(300)
def test_cubesandbox_snapshots_list_delete_and_rollback(server, created, memory):
    sb = created.sbx(cubesandbox.Sandbox.create(template="code-interpreter-v1", timeout=300))
    sb.files.write("/home/user/r.txt", "v1")
    ex = sb.run_code("kept_var = 7")
    assert ex.error is None, ex.error

    plain = created.snap(sb.create_snapshot())
    assert SNAP_ID.match(plain.snapshot_id) and plain.names == [plain.snapshot_id]
    name = uniq("cube-snap")
    named = created.snap(sb.create_snapshot(name=name))
    assert named.names == [name]

    items, token = cubesandbox.Sandbox.list_snapshots(sandbox_id=sb.sandbox_id)
    assert [s.snapshot_id for s in items] == [named.snapshot_id, plain.snapshot_id]
    assert token is None
    first, token = cubesandbox.Sandbox.list_snapshots(sandbox_id=sb.sandbox_id, limit=1)
    assert [s.snapshot_id for s in first] == [named.snapshot_id] and token
    second, token = cubesandbox.Sandbox.list_snapshots(sandbox_id=sb.sandbox_id, limit=1, next_token=token)
    assert [s.snapshot_id for s in second] == [plain.snapshot_id] and token is None

    sb.files.write("/home/user/r.txt", "v2")
    sb.files.write("/home/user/extra.txt", "x")
    assert sb.run_code("kept_var = 8").error is None
    before = sb.sandbox_id
    res = sb.rollback(plain.snapshot_id)
    # kind says what came back: memory (runsc) or the files only (runc, which
    # cannot checkpoint memory on this kernel), so the client can tell.
    assert res == {"sandboxID": before, "snapshotID": plain.snapshot_id, "status": "success", "kind": "memory" if memory else "filesystem"}
    assert sb.sandbox_id == before
    assert sb.get_info().state == "running"
    # Same sandbox, same token: the SDK object keeps working.
    assert sb.files.read("/home/user/r.txt") == "v1"
    assert sb.files.exists("/home/user/extra.txt") is False
    assert sb.commands.run("echo ok").stdout == "ok\n"
    ex = sb.run_code("kept_var")
    if memory:
        assert ex.error is None, ex.error
        assert ex.text == "7", "a memory rollback brings the kernel back as it was"
    else:
        assert ex.error is not None and ex.error.name == "NameError", f"a filesystem rollback reboots: {ex}"
    assert sb.run_code("1+1").text == "2"

    # Rolling back to the named one works by ID too, and again after that.
    sb.files.write("/home/user/r.txt", "v3")
    assert sb.rollback(named.snapshot_id)["status"] == "success"
    assert sb.files.read("/home/user/r.txt") == "v1"

    with pytest.raises((SandboxNotFoundError, TemplateNotFoundError)) as ei:
        sb.rollback("snap_0000000000000000")
    assert ei.value.status_code == 404
    assert sb.commands.run("echo still-ok").stdout == "still-ok\n"

    cubesandbox.Sandbox.delete_snapshot(plain.snapshot_id)
    cubesandbox.Sandbox.delete_snapshot(named.snapshot_id)
    # As its docstring promises: deleting a gone snapshot is a template 404.
    with pytest.raises(TemplateNotFoundError) as ei:
        cubesandbox.Sandbox.delete_snapshot(plain.snapshot_id)
    assert ei.value.status_code == 404
    assert cubesandbox.Sandbox.list_snapshots(sandbox_id=sb.sandbox_id) == ([], None)
    sb.kill()


@pytest.mark.timeout(240)
def test_cubesandbox_clone_and_its_snapshot_cleanup(server, created, memory):
    sb = created.sbx(cubesandbox.Sandbox.create(template="base", timeout=300))
    sb.files.write("/home/user/c.txt", "cloned")
    # cubesandbox's run() has no background mode: detach it.
    sb.commands.run("(setsid bash -c 'exec -a kept-proc sleep 1000' </dev/null >/dev/null 2>&1 &)", timeout=30)
    clones = sb.clone(n=2)
    for c in clones:
        created.sbx(c)
    assert len(clones) == 2
    assert len({c.sandbox_id for c in clones} | {sb.sandbox_id}) == 3
    for c in clones:
        assert c.files.read("/home/user/c.txt") == "cloned"
        # runsc clones memory (the process runs on in each clone); runc boots
        # each clone on the files.
        running = c.commands.run("pgrep -f kept-pro[c] >/dev/null && echo yes || echo no").stdout.strip()
        assert running == ("yes" if memory else "no"), running
    clones[0].files.write("/home/user/c.txt", "clone0")
    assert clones[1].files.read("/home/user/c.txt") == "cloned"
    assert sb.files.read("/home/user/c.txt") == "cloned"

    # clone() takes an ordinary (listed) snapshot, and deletes it with its last clone.
    items, _ = cubesandbox.Sandbox.list_snapshots(sandbox_id=sb.sandbox_id)
    assert len(items) == 1, items
    snap_id = items[0].snapshot_id
    created.snap(snap_id)
    assert all(c.get_info()["templateID"] == snap_id for c in clones)
    clones[0].kill()
    assert [s.snapshot_id for s in cubesandbox.Sandbox.list_snapshots(sandbox_id=sb.sandbox_id)[0]] == [snap_id]
    clones[1].kill()
    assert cubesandbox.Sandbox.list_snapshots(sandbox_id=sb.sandbox_id) == ([], None)
    assert snap_id not in [s["snapshotID"] for s in _snapshot_rows(server)]
    assert server.api("GET", f"/snapshots/{snap_id}").status_code == 404
    with pytest.raises(SandboxNotFoundError):
        clones[1].get_info()
    # The source is untouched.
    assert sb.commands.run("cat /home/user/c.txt").stdout == "cloned"
    sb.kill()


# ---- last: nothing left --------------------------------------------------------


@pytest.mark.timeout(120)
def test_nothing_left_no_snapshot_rows_and_no_snapshot_files(server, created):
    _assert_nothing_left(server, created)
