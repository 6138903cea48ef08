"""One real `cubicle serve` for the whole session (see harness.py).

The fixture is autouse so the SDKs' env vars are set before any test builds a
client; its teardown fails the run if the server left host state behind.
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import Server  # noqa: E402

BASE_IMAGE = "cubicle/pybase:1"


def pytest_collection_modifyitems(session, config, items):
    config._cubicle_wants_image = any("base_image" in getattr(i, "fixturenames", ()) for i in items)


_servers: list[Server] = []


@pytest.fixture(scope="session", autouse=True)
def server(request):
    srv = Server()
    _servers.append(srv)
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        srv.start()
        # Importing the base rootfs takes most of a minute: when the session
        # builds templates, it runs while the tests before them do.
        if getattr(request.config, "_cubicle_wants_image", False):
            srv.image_import = pool.submit(
                srv.cli, "image", "import", BASE_IMAGE, os.path.join(srv.images_dir, "base", "rootfs"), timeout=600
            )
        yield srv
    finally:
        f: Future | None = getattr(srv, "image_import", None)
        if f is not None:
            f.cancel()
            try:
                f.result()
            except Exception:  # noqa: BLE001 - reported by base_image where it matters
                pass
        pool.shutdown()
        srv.stop()


@pytest.fixture(scope="session")
def base_image(server):
    """An OCI image in the server's image store for Template.build: there is no
    registry to pull from here, so the base rootfs is imported."""
    f: Future | None = getattr(server, "image_import", None)
    if f is None:
        server.cli("image", "import", BASE_IMAGE, os.path.join(server.images_dir, "base", "rootfs"), timeout=600)
    else:
        f.result()
    return BASE_IMAGE


def pytest_report_header(config):
    return f"cubicle runtime: {os.environ.get('CUBICLE_RUNTIME') or 'runc'}"


def pytest_terminal_summary(terminalreporter):
    """With CUBICLE_CLUSTER=1: the cluster's start and stop times and where the sandboxes ran."""
    for srv in _servers:
        for line in srv.cluster_report:
            terminalreporter.write_line(f"cluster: {line}")
