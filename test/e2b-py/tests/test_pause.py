"""pause -> paused in list/get_info -> connect resumes -> files and running
processes survive; a paused sandbox can be killed. Sync and async clients."""

import time

import pytest
from e2b import AsyncSandbox, NotFoundException, Sandbox, SandboxQuery, SandboxState

from harness import wait_for


def _counter(sbx) -> int:
    return int(sbx.files.read("/tmp/counter").strip())


def test_pause_and_resume_keep_files_and_running_processes(server):
    tag = f"p{time.time_ns()}"
    sbx = server.track(Sandbox.create("base", metadata={"grp": tag}, timeout=300))
    sbx.files.write("/home/user/before-pause.txt", "still here")
    # A background counter; written by rename so a reader never sees it truncated.
    bg = sbx.commands.run(
        "i=0; while true; do i=$((i+1)); echo $i > /tmp/counter.tmp && mv /tmp/counter.tmp /tmp/counter; sleep 0.2; done",
        background=True,
        timeout=0,
    )
    wait_for(lambda: _counter(sbx) > 2, timeout=10, what="counter running")
    bg.disconnect()

    assert sbx.pause() is True
    assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.PAUSED
    listed = Sandbox.list(query=SandboxQuery(metadata={"grp": tag})).next_items()
    assert [(s.sandbox_id, s.state) for s in listed] == [(sbx.sandbox_id, SandboxState.PAUSED)]
    paused = Sandbox.list(query=SandboxQuery(metadata={"grp": tag}, state=[SandboxState.PAUSED])).next_items()
    assert len(paused) == 1
    running = Sandbox.list(query=SandboxQuery(metadata={"grp": tag}, state=[SandboxState.RUNNING])).next_items()
    assert running == []
    # Pausing again: False (409).
    assert Sandbox.pause(sbx.sandbox_id) is False

    same = Sandbox.connect(sbx.sandbox_id, timeout=300)
    assert same.sandbox_id == sbx.sandbox_id
    assert same.get_info().state == SandboxState.RUNNING
    assert same.is_running() is True
    assert same.files.read("/home/user/before-pause.txt") == "still here"
    assert same.commands.run("echo resumed; whoami").stdout == "resumed\nuser\n"

    # The process started before the pause still runs and still counts.
    c1 = _counter(same)
    time.sleep(1)
    c2 = _counter(same)
    assert c2 > c1, f"counter advanced after resume ({c1} -> {c2})"
    assert bg.pid in [p.pid for p in same.commands.list()]

    # The original handle keeps working against the resumed sandbox.
    assert sbx.commands.run("echo old-handle").stdout == "old-handle\n"
    assert same.kill() is True


def test_a_paused_sandbox_can_be_killed(server):
    sbx = server.track(Sandbox.create("base", timeout=300))
    assert sbx.pause() is True
    assert sbx.kill() is True
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sbx.sandbox_id)
    with pytest.raises(NotFoundException):
        Sandbox.connect(sbx.sandbox_id)


async def test_async_pause_and_connect_resume(server):
    sbx = server.track(await AsyncSandbox.create("base", timeout=300))
    await sbx.files.write("/tmp/state", "kept")
    assert await sbx.pause() is True
    assert (await AsyncSandbox.get_info(sbx.sandbox_id)).state == SandboxState.PAUSED
    assert await AsyncSandbox.pause(sbx.sandbox_id) is False

    resumed = await AsyncSandbox.connect(sbx.sandbox_id)
    assert (await resumed.get_info()).state == SandboxState.RUNNING
    assert await resumed.files.read("/tmp/state") == "kept"
    assert (await resumed.commands.run("echo back")).stdout == "back\n"
    assert await resumed.kill() is True
