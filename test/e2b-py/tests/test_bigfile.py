"""A 100 MB upload and download, streamed both ways (neither side holds the file
in memory), compared by sha256; plus a gzip round trip."""

import hashlib
import os
import time

import pytest
from e2b import AsyncSandbox, Sandbox

SIZE = 100 * 1024 * 1024
CHUNK = 1 << 20


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    """Pseudo-random, incompressible data on disk, written and hashed in 1 MiB chunks."""
    path = tmp_path_factory.mktemp("big") / "src.bin"
    h = hashlib.sha256()
    with open(path, "wb") as f:
        for _ in range(SIZE // CHUNK):
            chunk = os.urandom(CHUNK)
            h.update(chunk)
            f.write(chunk)
    yield path, h.hexdigest()
    path.unlink()


@pytest.mark.timeout(300)
def test_upload_100mb_as_a_stream_verify_inside_download_as_a_stream(server, src):
    path, digest = src
    sbx = server.track(Sandbox.create("base", timeout=600))
    try:
        t0 = time.monotonic()
        with open(path, "rb") as f:
            info = sbx.files.write("/home/user/big.bin", f, request_timeout=240)
        t_up = time.monotonic() - t0
        assert info.path == "/home/user/big.bin"

        r = sbx.commands.run("stat -c %s /home/user/big.bin; sha256sum /home/user/big.bin", timeout=120)
        size, line = r.stdout.strip().split("\n")
        assert int(size) == SIZE
        assert line.split()[0] == digest, "sha256 inside the sandbox"

        t1 = time.monotonic()
        h = hashlib.sha256()
        n = 0
        biggest = 0
        with sbx.files.read("/home/user/big.bin", format="stream", request_timeout=240) as stream:
            for chunk in stream:
                h.update(chunk)
                n += len(chunk)
                biggest = max(biggest, len(chunk))
        t_down = time.monotonic() - t1
        assert n == SIZE
        assert h.hexdigest() == digest, "sha256 of the download"
        assert biggest < SIZE // 4, f"download arrived in a {biggest}-byte chunk: not streamed"
        print(f"100 MB upload {t_up:.1f} s, download {t_down:.1f} s")
    finally:
        sbx.kill()


async def test_async_gzip_upload_and_download_round_trip(server):
    sbx = server.track(await AsyncSandbox.create("base", timeout=120))
    try:
        data = os.urandom(5 * CHUNK) + b"a" * (5 * CHUNK)
        await sbx.files.write("/tmp/ten.bin", data, gzip=True)
        back = await sbx.files.read("/tmp/ten.bin", format="bytes", gzip=True)
        assert hashlib.sha256(back).hexdigest() == hashlib.sha256(data).hexdigest()
        r = await sbx.commands.run("sha256sum /tmp/ten.bin")
        assert r.stdout.split()[0] == hashlib.sha256(data).hexdigest()
    finally:
        await sbx.kill()
