"""PTY: create, send input, output, resize, kill, exit code, users. Sync and async."""

import asyncio
import re
import threading

import pytest
from e2b import AsyncSandbox, CommandExitException, PtySize, Sandbox

from harness import wait_for


@pytest.fixture(scope="module")
def sbx(server):
    s = server.track(Sandbox.create("base", timeout=300))
    yield s
    s.kill()


class Reader:
    """Drains a sync PTY handle in a thread: wait() blocks until the PTY ends."""

    def __init__(self, handle):
        self.chunks: list[bytes] = []
        self.result = None
        self.error = None
        self.t = threading.Thread(target=self._run, args=(handle,), daemon=True)
        self.t.start()

    def _run(self, handle):
        try:
            self.result = handle.wait(on_pty=self.chunks.append)
        except Exception as e:  # noqa: BLE001 - checked by the test
            self.error = e

    def text(self) -> str:
        return b"".join(self.chunks).decode("utf-8", "replace")

    def join(self, timeout=15):
        self.t.join(timeout)
        assert not self.t.is_alive(), "pty handle did not end"


def test_interactive_shell_echoes_input_reports_size_resizes_and_is_killed(sbx):
    term = sbx.pty.create(PtySize(rows=24, cols=80), timeout=0)
    assert term.pid > 0
    out = Reader(term)

    sbx.pty.send_stdin(term.pid, b'echo "hello-$((6*7))"\n')
    wait_for(lambda: "hello-42" in out.text(), timeout=10, what="pty output hello-42")

    # A real terminal: tty says /dev/pts/N and stty sees the size asked for.
    sbx.pty.send_stdin(term.pid, b'tty; stty size; echo "TERM=$TERM"\n')
    wait_for(lambda: "24 80" in out.text() and "TERM=xterm-256color" in out.text(), timeout=10, what="stty size 24 80")
    assert re.search(r"/dev/pts/\d+", out.text())

    sbx.pty.resize(term.pid, PtySize(rows=40, cols=120))
    sbx.pty.send_stdin(term.pid, b"stty size\n")
    wait_for(lambda: "40 120" in out.text(), timeout=10, what=lambda: f"stty size 40 120 after resize; got {out.text()!r}")

    assert term.pid in [p.pid for p in sbx.commands.list()]
    assert sbx.pty.kill(term.pid) is True
    out.join()
    assert isinstance(out.error, CommandExitException), f"got {out.error!r}"
    wait_for(lambda: term.pid not in [p.pid for p in sbx.commands.list()], timeout=10, what="pty gone from list")
    assert sbx.pty.kill(term.pid) is False


def test_exit_ends_the_session_with_its_code(sbx):
    term = sbx.pty.create(PtySize(rows=10, cols=40), timeout=30)
    out = Reader(term)
    sbx.pty.send_stdin(term.pid, b"exit 5\n")
    out.join()
    assert isinstance(out.error, CommandExitException) and out.error.exit_code == 5, f"got {out.error!r}"


def test_pty_as_root_with_cwd_and_envs(sbx):
    term = sbx.pty.create(PtySize(rows=24, cols=80), user="root", cwd="/tmp", envs={"PTY_VAR": "v"}, timeout=30)
    out = Reader(term)
    sbx.pty.send_stdin(term.pid, b'echo "uid=$(id -u) cwd=$(pwd) var=$PTY_VAR"; exit 0\n')
    out.join()
    assert out.error is None, f"got {out.error!r}"
    assert out.result.exit_code == 0
    assert "uid=0 cwd=/tmp var=v" in out.text()


async def test_async_pty_create_input_resize_kill(server):
    s = server.track(await AsyncSandbox.create("base", timeout=120))
    try:
        chunks: list[bytes] = []

        def text():
            return b"".join(chunks).decode("utf-8", "replace")

        term = await s.pty.create(PtySize(rows=24, cols=80), on_data=chunks.append, timeout=0)
        await s.pty.send_stdin(term.pid, b"stty size; echo marker-$((2+3))\n")
        await _until(lambda: "marker-5" in text() and "24 80" in text(), f"marker; got {text()!r}")
        await s.pty.resize(term.pid, PtySize(rows=30, cols=100))
        await s.pty.send_stdin(term.pid, b"stty size\n")
        await _until(lambda: "30 100" in text(), f"30 100 after resize; got {text()!r}")
        assert await s.pty.kill(term.pid) is True
        with pytest.raises(CommandExitException):
            await term.wait()
    finally:
        await s.kill()


async def _until(cond, what, timeout=10.0):
    for _ in range(int(timeout / 0.1)):
        if cond():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")
