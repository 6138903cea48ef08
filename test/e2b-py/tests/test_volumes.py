"""Persistent volumes through the e2b Python SDK: Volume.create/list/get_info/
connect/destroy, volume_mounts on create, sharing between sandboxes, data
outliving every sandbox, the delete guard, and the volume-content API."""

import time

import pytest
from e2b import (
    AuthenticationException,
    Sandbox,
    SandboxException,
    Volume,
    VolumeException,
    VolumeNotFoundException,
    VolumePathNotFoundException,
)


def _name(prefix):
    return f"{prefix}-py-{time.time_ns()}"


def test_volume_create_list_get_info_connect_destroy(server):
    name = _name("vol")
    vol = Volume.create(name)
    assert vol.name == name
    assert vol.volume_id == name
    assert vol.token, "a token for the volume-content API"

    mine = [v for v in Volume.list() if v.volume_id == name]
    assert [(v.volume_id, v.name) for v in mine] == [(name, name)]

    info = Volume.get_info(name)
    assert info.volume_id == name
    assert info.token == vol.token
    assert Volume.connect(name).token == vol.token

    with pytest.raises(VolumeNotFoundException):
        Volume.get_info("no-such-volume")
    with pytest.raises(VolumeException, match="409|exists"):
        Volume.create(name)
    with pytest.raises(VolumeException, match="400|invalid|name"):
        Volume.create("not a valid name")

    assert Volume.destroy(name) is True
    assert Volume.destroy(name) is False, "second destroy reports not found"
    assert name not in [v.volume_id for v in Volume.list()]


@pytest.mark.timeout(180)
def test_volume_mounts_share_data_that_outlives_sandboxes_and_guard_delete(server):
    vol = Volume.create(_name("shared"))
    a = server.track(Sandbox.create("base", volume_mounts={"/workspace": vol}))
    # A name works as well as a Volume instance.
    b = server.track(Sandbox.create("base", volume_mounts={"/mnt/data": vol.name}))

    a.files.write("/workspace/hello.txt", "from A\n")
    assert b.files.read("/mnt/data/hello.txt") == "from A\n"
    r = b.commands.run("echo from B >> /mnt/data/hello.txt && id -un")
    assert r.stdout.strip() == "user", "the default user writes to the volume"
    assert a.files.read("/workspace/hello.txt") == "from A\nfrom B\n"
    assert a.get_info().volume_mounts == [{"name": vol.name, "path": "/workspace"}]

    # Destroy while mounted: 409, and the volume stays.
    with pytest.raises(VolumeException, match="409|in use|mounted"):
        Volume.destroy(vol.volume_id)
    a.kill()
    with pytest.raises(VolumeException, match="409|in use|mounted"):
        Volume.destroy(vol.volume_id)
    b.kill()

    c = server.track(Sandbox.create("base", volume_mounts={"/data": vol}))
    assert c.files.read("/data/hello.txt") == "from A\nfrom B\n"
    # A paused sandbox keeps its attachment; after resume it sees current data.
    assert c.pause() is True
    with pytest.raises(VolumeException, match="409|in use|mounted"):
        Volume.destroy(vol.volume_id)
    vol.write_file("/while-paused.txt", "written while paused")
    resumed = Sandbox.connect(c.sandbox_id)
    assert resumed.files.read("/data/while-paused.txt") == "written while paused"
    resumed.kill()

    assert Volume.destroy(vol.volume_id) is True
    assert Volume.destroy(vol.volume_id) is False
    with pytest.raises(SandboxException, match="400|not found"):
        Sandbox.create("base", volume_mounts={"/data": vol})


def test_volume_content_api_on_an_unmounted_volume(server):
    vol = Volume.create(_name("files"))
    try:
        st = vol.write_file("/docs/readme.md", "# hi", force=True)
        assert str(st.type) == "file"
        assert st.size == 4
        assert st.path == "/docs/readme.md"
        assert vol.read_file("/docs/readme.md") == "# hi"
        assert bytes(vol.read_file("/docs/readme.md", format="bytes")) == b"# hi"
        assert str(vol.make_dir("/docs/sub").type) == "directory"
        assert sorted(e.name for e in vol.list("/docs")) == ["readme.md", "sub"]
        assert vol.get_info("/docs/readme.md").mtime is not None
        assert vol.exists("/docs/readme.md") is True
        assert vol.exists("/docs/nope") is False
        upd = vol.update_metadata("/docs/readme.md", mode=0o600, uid=1000, gid=1000)
        assert upd.mode == 0o600
        assert upd.uid == 1000
        with pytest.raises(VolumePathNotFoundException):
            vol.read_file("/missing")

        # A sandbox sees the files, and the API sees what the sandbox writes.
        sbx = server.track(Sandbox.create("base", volume_mounts={"/v": vol}))
        assert sbx.files.read("/v/docs/readme.md", user="root") == "# hi"
        sbx.files.write("/v/out.txt", "written in the sandbox")
        assert vol.read_file("/out.txt") == "written in the sandbox"
        sbx.kill()

        vol.remove("/docs")
        assert vol.exists("/docs") is False
        wrong = Volume(vol.volume_id, vol.name, "not-the-token")
        with pytest.raises(AuthenticationException):
            wrong.read_file("/out.txt")
    finally:
        Volume.destroy(vol.volume_id)
