"""commands.*: foreground runs, output callbacks, exit codes, envs, cwd, users,
timeouts, background processes with list/connect/kill, stdin. Sync and async."""

import threading
import time

import pytest
from e2b import AsyncSandbox, CommandExitException, Sandbox, TimeoutException

from harness import wait_for


@pytest.fixture(scope="module")
def sbx(server):
    s = server.track(Sandbox.create("base", envs={"SBX_ENV": "from-create", "SHARED": "create"}, timeout=300))
    yield s
    s.kill()


def test_stdout_stderr_and_exit_code_zero(sbx):
    r = sbx.commands.run('echo out; echo err >&2; printf "x%.0s" 1 2 3')
    assert r.exit_code == 0
    assert r.stdout == "out\nxxx"
    assert r.stderr == "err\n"
    assert r.error is None or r.error == ""


def test_streaming_callbacks_see_the_output(sbx):
    out, err = [], []
    r = sbx.commands.run(
        "for i in 1 2 3; do echo o$i; echo e$i >&2; sleep 0.1; done",
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert "".join(out) == "o1\no2\no3\n"
    assert "".join(err) == "e1\ne2\ne3\n"
    assert r.stdout == "o1\no2\no3\n"


def test_non_zero_exit_raises_command_exit_exception_with_exit_code_and_stderr(sbx):
    with pytest.raises(CommandExitException) as ei:
        sbx.commands.run("echo partial; echo bad >&2; exit 7")
    assert ei.value.exit_code == 7
    assert ei.value.stdout == "partial\n"
    assert ei.value.stderr == "bad\n"


def test_envs_sandbox_level_and_per_command_the_command_wins(sbx):
    r = sbx.commands.run('echo "$SBX_ENV|$SHARED|$CMD_ENV"', envs={"CMD_ENV": "cmd", "SHARED": "command"})
    assert r.stdout == "from-create|command|cmd\n"


def test_cwd(sbx):
    assert sbx.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
    assert sbx.commands.run("pwd").stdout == "/home/user\n"


def test_default_user_is_user_1000_and_root_on_request(sbx):
    assert sbx.commands.run("whoami; id -u; echo $HOME").stdout == "user\n1000\n/home/user\n"
    assert sbx.commands.run("whoami; id -u; echo $HOME", user="root").stdout == "root\n0\n/root\n"
    assert sbx.commands.run("id -u", user="user").stdout == "1000\n"


def test_timeout_ends_a_long_command_with_timeout_exception(sbx):
    t0 = time.monotonic()
    with pytest.raises(TimeoutException):
        sbx.commands.run("sleep 30", timeout=1.5)
    assert time.monotonic() - t0 < 15


def test_background_process_list_connect_kill(sbx):
    h = sbx.commands.run("echo started; touch /tmp/bg-started; sleep 300", background=True, timeout=0)
    assert h.pid > 0
    # A sync handle reads its stream only in wait(): the marker file says the echo ran.
    wait_for(lambda: sbx.files.exists("/tmp/bg-started"), timeout=10, what="background command to start")
    mine = wait_for(lambda: next((p for p in sbx.commands.list() if p.pid == h.pid), None), timeout=10, what="pid in list")
    assert mine.cmd == "/bin/bash"
    assert "echo started; touch /tmp/bg-started; sleep 300" in mine.args

    c = sbx.commands.connect(h.pid, timeout=0)
    assert c.pid == h.pid
    assert sbx.commands.kill(h.pid) is True
    with pytest.raises(CommandExitException) as ei:
        h.wait()
    assert ei.value.exit_code != 0
    assert ei.value.stdout.startswith("started\n")
    with pytest.raises(CommandExitException):
        c.wait()
    wait_for(lambda: h.pid not in [p.pid for p in sbx.commands.list()], timeout=10, what="killed process to leave the list")
    assert sbx.commands.kill(h.pid) is False, "killing an unknown pid returns False"


def test_connect_to_a_background_process_streams_later_output(sbx):
    h = sbx.commands.run("sleep 1; echo late; sleep 0.5; exit 3", background=True)
    seen = []
    c = sbx.commands.connect(h.pid)
    with pytest.raises(CommandExitException) as ei:
        c.wait(on_stdout=seen.append)
    assert ei.value.exit_code == 3
    assert "late" in "".join(seen)


def test_send_stdin_feeds_a_process_started_with_stdin(sbx):
    h = sbx.commands.run('read a; read b; echo "got:$a:$b"', background=True, stdin=True)
    sbx.commands.send_stdin(h.pid, "one\n")
    h.send_stdin("two\n")
    assert h.wait().stdout == "got:one:two\n"


def test_close_stdin_ends_input(sbx):
    h = sbx.commands.run("cat; echo eof", background=True, stdin=True)
    h.send_stdin("abc\n")
    h.close_stdin()
    assert h.wait().stdout == "abc\neof\n"


def test_a_large_output_arrives_intact(sbx):
    r = sbx.commands.run('head -c 3000000 /dev/zero | tr "\\0" a')
    assert len(r.stdout) == 3000000
    assert r.stdout.strip("a") == ""


def test_kill_from_another_thread_ends_a_foreground_wait(sbx):
    h = sbx.commands.run("sleep 300", background=True)
    threading.Timer(0.5, lambda: h.kill()).start()
    with pytest.raises(CommandExitException) as ei:
        h.wait()
    assert ei.value.exit_code != 0


async def test_async_commands_run_background_callbacks_stdin_kill(server):
    s = server.track(await AsyncSandbox.create("base", timeout=120))
    try:
        out = []
        r = await s.commands.run("echo a; echo b >&2; echo c", on_stdout=out.append, envs={"X": "1"})
        assert r.stdout == "a\nc\n" and r.stderr == "b\n"
        assert "".join(out) == "a\nc\n"

        with pytest.raises(CommandExitException) as ei:
            await s.commands.run("echo nope >&2; exit 4", user="root", cwd="/")
        assert ei.value.exit_code == 4 and ei.value.stderr == "nope\n"

        seen = []
        h = await s.commands.run("echo started; sleep 300", background=True, on_stdout=seen.append, timeout=0)
        import asyncio

        for _ in range(100):
            if "started" in "".join(seen):
                break
            await asyncio.sleep(0.1)
        assert "started" in "".join(seen)
        assert h.pid in [p.pid for p in await s.commands.list()]
        assert await s.commands.kill(h.pid) is True
        with pytest.raises(CommandExitException):
            await h.wait()

        ih = await s.commands.run('read a; echo "in:$a"', background=True, stdin=True)
        await s.commands.send_stdin(ih.pid, "fed\n")
        assert (await ih.wait()).stdout == "in:fed\n"

        with pytest.raises(TimeoutException):
            await s.commands.run("sleep 30", timeout=1)
    finally:
        await s.kill()
