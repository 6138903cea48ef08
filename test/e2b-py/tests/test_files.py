"""files.*: write/read (text, bytes, stream), write_files, list, exists,
get_info, make_dir, rename, remove, users, relative paths, missing files,
watch_dir through the polling watcher RPCs (sync) and the stream (async)."""

import asyncio
from datetime import datetime

import pytest
from e2b import (
    AsyncSandbox,
    FileNotFoundException,
    FilesystemEventType,
    FileType,
    NotFoundException,
    Sandbox,
    SandboxException,
)

from harness import wait_for


@pytest.fixture(scope="module")
def sbx(server):
    s = server.track(Sandbox.create("base", timeout=300))
    yield s
    s.kill()


def test_write_then_read_text_bytes_and_stream(sbx):
    info = sbx.files.write("/home/user/hello.txt", "hi there\n")
    assert info.path == "/home/user/hello.txt"
    assert info.name == "hello.txt"
    assert sbx.files.read("/home/user/hello.txt") == "hi there\n"
    assert sbx.files.read("/home/user/hello.txt", format="bytes") == bytearray(b"hi there\n")
    assert b"".join(sbx.files.read("/home/user/hello.txt", format="stream")) == b"hi there\n"
    # The command side sees the same file, owned by the default user.
    assert sbx.commands.run("cat /home/user/hello.txt; stat -c %u /home/user/hello.txt").stdout == "hi there\n1000\n"


def test_binary_content_round_trips_and_empty_files_work(sbx):
    data = bytes(range(256))
    sbx.files.write("/tmp/bin.dat", data)
    assert bytes(sbx.files.read("/tmp/bin.dat", format="bytes")) == data
    sbx.files.write("/tmp/empty", "")
    assert sbx.files.read("/tmp/empty") == ""
    assert sbx.commands.run("stat -c %s /tmp/empty").stdout == "0\n"


def test_relative_paths_resolve_against_home_and_parents_are_created(sbx):
    sbx.files.write("rel/deep/er/f.txt", "rel")
    assert sbx.commands.run("cat /home/user/rel/deep/er/f.txt").stdout == "rel"
    assert sbx.files.read("/home/user/rel/deep/er/f.txt") == "rel"


def test_write_files_writes_several_files(sbx):
    infos = sbx.files.write_files(
        [
            {"path": "/home/user/multi/a.txt", "data": "A"},
            {"path": "/home/user/multi/b.txt", "data": b"BB"},
            {"path": "multi/c.txt", "data": "CCC"},
        ]
    )
    assert sorted(i.path for i in infos) == ["/home/user/multi/a.txt", "/home/user/multi/b.txt", "/home/user/multi/c.txt"]
    assert sbx.commands.run("cat /home/user/multi/a.txt /home/user/multi/b.txt /home/user/multi/c.txt").stdout == "ABBCCC"


def test_write_as_root_and_read_permissions(sbx):
    sbx.files.write("/root/secret.txt", "root only", user="root")
    assert sbx.files.read("/root/secret.txt", user="root") == "root only"
    assert sbx.commands.run("stat -c %u /root/secret.txt", user="root").stdout == "0\n"
    with pytest.raises(SandboxException):
        sbx.files.read("/root/secret.txt")


def test_a_user_adds_files_to_a_directory_root_made(sbx):
    # envd writes as root: a user may add a file to a directory that root made
    # and the user may only search (e.g. make_dir as root first). The file is
    # the user's; root's own files there stay root's.
    assert sbx.files.make_dir("/tmp/rootmade/deep", user="root") is True
    sbx.files.write("/tmp/rootmade/deep/f.txt", "mine")
    sbx.files.write("/tmp/rootmade/g.txt", "nobody's", user="nobody")
    assert sbx.commands.run("stat -c %U /tmp/rootmade/deep /tmp/rootmade/deep/f.txt /tmp/rootmade/g.txt").stdout == "root\nuser\nnobody\n"
    assert [e.name for e in sbx.files.list("/tmp/rootmade/deep")] == ["f.txt"]
    sbx.files.write("/tmp/rootmade/r.txt", "root's", user="root")
    with pytest.raises(SandboxException):
        sbx.files.write("/tmp/rootmade/r.txt", "taken")
    assert sbx.files.read("/tmp/rootmade/r.txt") == "root's"
    sbx.files.remove("/tmp/rootmade", user="root")


def test_read_of_a_missing_file_is_file_not_found(sbx):
    with pytest.raises(FileNotFoundException):
        sbx.files.read("/home/user/does-not-exist")


def test_exists_get_info_list_make_dir_rename_remove(sbx):
    assert sbx.files.make_dir("/home/user/d1/sub") is True
    assert sbx.files.make_dir("/home/user/d1/sub") is False, "make_dir on an existing dir returns False"
    assert sbx.files.exists("/home/user/d1/sub") is True
    assert sbx.files.exists("/home/user/d1/nope") is False

    sbx.files.write("/home/user/d1/x.txt", "12345")
    st = sbx.files.get_info("/home/user/d1/x.txt")
    assert st.type == FileType.FILE
    assert st.size == 5
    assert st.name == "x.txt"
    assert st.path == "/home/user/d1/x.txt"
    assert st.owner == "user"
    assert isinstance(st.modified_time, datetime)
    assert sbx.files.get_info("/home/user/d1/sub").type == FileType.DIR

    entries = sbx.files.list("/home/user/d1")
    assert sorted((e.name, e.type) for e in entries) == [("sub", FileType.DIR), ("x.txt", FileType.FILE)]
    sbx.files.write("/home/user/d1/sub/deep.txt", "d")
    deep = sbx.files.list("/home/user/d1", depth=2)
    assert "/home/user/d1/sub/deep.txt" in [e.path for e in deep]

    moved = sbx.files.rename("/home/user/d1/x.txt", "/home/user/d1/sub/y.txt")
    assert moved.path == "/home/user/d1/sub/y.txt"
    assert sbx.files.exists("/home/user/d1/x.txt") is False
    assert sbx.files.read("/home/user/d1/sub/y.txt") == "12345"
    with pytest.raises(NotFoundException):
        sbx.files.rename("/home/user/d1/nope", "/home/user/d1/z")

    sbx.files.remove("/home/user/d1/sub/y.txt")
    assert sbx.files.exists("/home/user/d1/sub/y.txt") is False
    sbx.files.remove("/home/user/d1")
    assert sbx.files.exists("/home/user/d1") is False
    with pytest.raises(NotFoundException):
        sbx.files.list("/home/user/d1")


def test_get_info_and_list_of_symlinks(sbx):
    # This SDK reads is_symlink: a link is "symlink" with its absolute target,
    # whatever it points at (a file, a directory, nothing).
    sbx.commands.run(
        "mkdir -p /home/user/ln/dir && echo hi > /home/user/ln/f.txt && cd /home/user/ln"
        " && ln -s f.txt to-file && ln -s dir to-dir && ln -s missing dangling"
    )
    for name, target in (("to-file", "f.txt"), ("to-dir", "dir"), ("dangling", "missing")):
        st = sbx.files.get_info(f"/home/user/ln/{name}")
        assert st.type == FileType.SYMLINK, (name, st)
        assert st.symlink_target == f"/home/user/ln/{target}", (name, st)
    assert sbx.files.get_info("/home/user/ln/f.txt").symlink_target is None
    # A dangling link's type is unspecified (it has no target), and the SDK's
    # list() leaves such entries out, as against e2b.
    listed = {e.name: e.type for e in sbx.files.list("/home/user/ln")}
    assert listed == {"f.txt": FileType.FILE, "dir": FileType.DIR, "to-file": FileType.SYMLINK,
                      "to-dir": FileType.SYMLINK}, listed
    sbx.files.remove("/home/user/ln")


def test_sync_watch_dir_polls_create_write_remove_events(sbx):
    sbx.files.make_dir("/home/user/watched")
    h = sbx.files.watch_dir("/home/user/watched")
    events = []
    try:
        sbx.files.write("/home/user/watched/new.txt", "v1")
        sbx.commands.run("echo more >> /home/user/watched/new.txt; rm /home/user/watched/new.txt")

        def removed():
            events.extend(h.get_new_events())
            return any(e.name == "new.txt" and e.type == FilesystemEventType.REMOVE for e in events)

        wait_for(removed, timeout=10, interval=0.2, what=lambda: f"remove event; got {events}")
        types = {e.type for e in events if e.name == "new.txt"}
        assert FilesystemEventType.CREATE in types, events
        assert FilesystemEventType.WRITE in types, events
        # Events are handed out once.
        assert h.get_new_events() == []
    finally:
        h.stop()
    with pytest.raises(SandboxException):
        h.get_new_events()


def test_watch_sees_an_upload_as_create_chmod_write(sbx):
    # As envd's upload (which chowns the file it opened): e2b's own watch
    # tests count exactly these three, flat and recursive.
    sbx.files.make_dir("/home/user/wc/nested")
    for recursive, path, name in ((False, "/home/user/wc/f.txt", "f.txt"), (True, "/home/user/wc/nested/f.txt", "nested/f.txt")):
        h = sbx.files.watch_dir("/home/user/wc", recursive=recursive)
        try:
            sbx.files.write(path, "content")
            events = []

            def three():
                events.extend(e for e in h.get_new_events() if e.name == name)
                return len(events) >= 3

            wait_for(three, timeout=10, interval=0.1, what=lambda: f"three events; got {events}")
            assert [e.type for e in events] == [FilesystemEventType.CREATE, FilesystemEventType.CHMOD, FilesystemEventType.WRITE], events
        finally:
            h.stop()
    sbx.files.remove("/home/user/wc")


def test_sync_watch_dir_recursive_reports_relative_names(sbx):
    sbx.files.make_dir("/home/user/rw/a/b")
    h = sbx.files.watch_dir("/home/user/rw", recursive=True)
    events = []
    try:
        sbx.commands.run("echo x > /home/user/rw/a/b/n.txt")

        def nested():
            events.extend(h.get_new_events())
            return any(e.name.endswith("n.txt") for e in events)

        wait_for(nested, timeout=10, interval=0.2, what=lambda: f"nested event; got {events}")
        assert "a/b/n.txt" in [e.name for e in events], events
    finally:
        h.stop()


def test_watch_dir_on_a_missing_dir_fails(sbx):
    with pytest.raises(SandboxException):
        sbx.files.watch_dir("/home/user/no-such-dir")


async def test_async_files_and_watch_dir_stream(server):
    s = server.track(await AsyncSandbox.create("base", timeout=120))
    try:
        await s.files.write("/tmp/a.txt", "async")
        assert await s.files.read("/tmp/a.txt") == "async"
        assert await s.files.exists("/tmp/a.txt") is True
        assert (await s.files.get_info("/tmp/a.txt")).size == 5
        assert "a.txt" in [e.name for e in await s.files.list("/tmp")]
        await s.files.rename("/tmp/a.txt", "/tmp/b.txt")
        assert await s.files.exists("/tmp/a.txt") is False
        await s.files.remove("/tmp/b.txt")
        assert await s.files.exists("/tmp/b.txt") is False
        with pytest.raises(FileNotFoundException):
            await s.files.read("/tmp/b.txt")

        assert await s.files.make_dir("/home/user/aw") is True
        events = []
        h = await s.files.watch_dir("/home/user/aw", on_event=events.append, timeout=30)
        try:
            await asyncio.sleep(0.2)
            await s.files.write("/home/user/aw/f.txt", "1")
            await s.commands.run("rm /home/user/aw/f.txt")
            for _ in range(100):
                if any(e.name == "f.txt" and e.type == FilesystemEventType.REMOVE for e in events):
                    break
                await asyncio.sleep(0.1)
            types = {e.type for e in events if e.name == "f.txt"}
            assert {FilesystemEventType.CREATE, FilesystemEventType.REMOVE} <= types, events
        finally:
            await h.stop()
    finally:
        await s.kill()
