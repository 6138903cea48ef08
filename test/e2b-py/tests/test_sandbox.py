"""Sandbox lifecycle through the e2b Python SDK, sync and async clients:
create + get_info, connect, list with metadata/state filters and pagination,
set_timeout (shorten and extend), kill."""

import re
import time
from datetime import datetime, timezone

import pytest
from e2b import (
    AsyncSandbox,
    NotFoundException,
    Sandbox,
    SandboxQuery,
    SandboxState,
)

from harness import async_wait_for, wait_for


def test_create_returns_running_sandbox_and_get_info_reports_its_fields(server):
    before = datetime.now(timezone.utc)
    sbx = server.track(Sandbox.create("base", metadata={"suite": "py-sandbox", "n": "1"}, timeout=120))
    assert re.fullmatch(r"[a-z0-9]{20}", sbx.sandbox_id)
    assert sbx.is_running() is True

    info = sbx.get_info()
    assert info.sandbox_id == sbx.sandbox_id
    assert info.state == SandboxState.RUNNING
    assert info.metadata == {"suite": "py-sandbox", "n": "1"}
    assert info.template_id
    assert abs((info.started_at - before).total_seconds()) < 10
    ttl = (info.end_at - info.started_at).total_seconds()
    assert 100 < ttl < 140, f"end_at - started_at = {ttl} s, want ~120"
    assert info.cpu_count >= 1
    assert info.memory_mb >= 128
    assert re.match(r"\d+\.\d+\.\d+", info.envd_version)

    r = sbx.commands.run("echo ready")
    assert r.stdout == "ready\n"

    # connect by ID to a running sandbox gives a working handle to the same one.
    same = Sandbox.connect(sbx.sandbox_id)
    assert same.sandbox_id == sbx.sandbox_id
    sbx.files.write("/tmp/written-by-first-handle", "same sandbox")
    assert same.files.read("/tmp/written-by-first-handle") == "same sandbox"
    assert Sandbox.get_info(sbx.sandbox_id).sandbox_id == sbx.sandbox_id
    assert sbx.kill() is True


def test_list_filters_by_metadata_and_state_and_paginates(server):
    tag = f"t{time.time_ns()}"
    md = {"user id": "a&b=c", "ünï/cödé?": "100% sure", "grp": tag}
    a = server.track(Sandbox.create("base", metadata=md, timeout=120))
    b = server.track(Sandbox.create("base", metadata=dict(md), timeout=120))
    other = server.track(Sandbox.create("base", metadata={"grp": tag, "user id": "someone else"}, timeout=120))

    p = Sandbox.list(query=SandboxQuery(metadata={"user id": "a&b=c", "grp": tag}))
    items = p.next_items()
    assert sorted(s.sandbox_id for s in items) == sorted([a.sandbox_id, b.sandbox_id])
    for it in items:
        assert it.metadata == md
        assert it.state == SandboxState.RUNNING
        assert isinstance(it.started_at, datetime) and isinstance(it.end_at, datetime)
    assert p.has_next is False

    p2 = Sandbox.list(query=SandboxQuery(metadata={"ünï/cödé?": "100% sure"}))
    assert sorted(s.sandbox_id for s in p2.next_items()) == sorted([a.sandbox_id, b.sandbox_id])

    pg = Sandbox.list(query=SandboxQuery(metadata={"grp": tag}), limit=1)
    seen = []
    pages = 0
    while pg.has_next and pages < 10:
        page = pg.next_items()
        pages += 1
        assert len(page) <= 1, f"page of {len(page)} with limit 1"
        seen += [s.sandbox_id for s in page]
    assert pg.has_next is False, "paginator terminates"
    assert sorted(seen) == sorted([a.sandbox_id, b.sandbox_id, other.sandbox_id])
    assert len(set(seen)) == 3, "no duplicates across pages"

    paused = Sandbox.list(query=SandboxQuery(metadata={"grp": tag}, state=[SandboxState.PAUSED])).next_items()
    assert paused == []

    for s in (a, b, other):
        assert s.kill() is True
    assert Sandbox.list(query=SandboxQuery(metadata={"grp": tag})).next_items() == []


def test_set_timeout_shortens_the_lifetime_and_the_sandbox_is_gone_after_it(server):
    sbx = server.track(Sandbox.create("base", timeout=300))
    sbx.set_timeout(3)
    left = (sbx.get_info().end_at - datetime.now(timezone.utc)).total_seconds()
    assert left < 10, f"end_at is {left} s away after set_timeout(3)"
    wait_for(lambda: not sbx.is_running(request_timeout=5), timeout=30, interval=0.5, what="sandbox to expire")
    with pytest.raises(NotFoundException):
        sbx.get_info()


def test_set_timeout_extends_the_lifetime(server):
    sbx = server.track(Sandbox.create("base", timeout=30))
    Sandbox.set_timeout(sbx.sandbox_id, 600)
    left = (sbx.get_info().end_at - datetime.now(timezone.utc)).total_seconds()
    assert left > 500, f"end_at only {left} s away after set_timeout(600)"
    assert sbx.kill() is True


def test_kill_then_is_running_false_get_info_not_found_second_kill_false(server):
    sbx = server.track(Sandbox.create("base", timeout=60))
    assert sbx.kill() is True
    assert sbx.is_running() is False
    with pytest.raises(NotFoundException):
        sbx.get_info()
    assert Sandbox.kill(sbx.sandbox_id) is False
    listed = Sandbox.list().next_items()
    assert sbx.sandbox_id not in [s.sandbox_id for s in listed]


async def test_async_client_create_connect_info_list_timeout_kill(server):
    tag = f"a{time.time_ns()}"
    sbx = server.track(await AsyncSandbox.create("base", metadata={"grp": tag}, timeout=120, envs={"FROM": "async"}))
    assert await sbx.is_running() is True
    info = await sbx.get_info()
    assert info.state == SandboxState.RUNNING
    assert info.metadata == {"grp": tag}

    r = await sbx.commands.run('echo "hi $FROM"')
    assert r.stdout == "hi async\n"

    listed = await AsyncSandbox.list(query=SandboxQuery(metadata={"grp": tag})).next_items()
    assert [s.sandbox_id for s in listed] == [sbx.sandbox_id]

    same = await AsyncSandbox.connect(sbx.sandbox_id)
    assert (await same.commands.run("echo via-connect")).stdout == "via-connect\n"

    await sbx.set_timeout(600)
    left = ((await sbx.get_info()).end_at - datetime.now(timezone.utc)).total_seconds()
    assert left > 500

    assert await sbx.kill() is True
    assert await sbx.is_running() is False
    with pytest.raises(NotFoundException):
        await AsyncSandbox.get_info(sbx.sandbox_id)
    assert await AsyncSandbox.kill(sbx.sandbox_id) is False


async def test_async_set_timeout_shortens_the_lifetime(server):
    sbx = server.track(await AsyncSandbox.create("base", timeout=300))
    await AsyncSandbox.set_timeout(sbx.sandbox_id, 2)
    await async_wait_for(lambda: _not_running(sbx), timeout=30, interval=0.5, what="sandbox to expire")
    with pytest.raises(NotFoundException):
        await sbx.get_info()


async def _not_running(sbx):
    return not await sbx.is_running(request_timeout=5)
