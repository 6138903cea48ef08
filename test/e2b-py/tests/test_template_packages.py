"""Template.build with pip_install and apt_install: these fetch packages from
PyPI and Debian's mirrors, so they need the real Debian base image and network
(through the host's CA bundle when serve has --ca-certificates)."""

import pytest
from e2b import Sandbox, Template

from harness import uniq


@pytest.mark.timeout(600)
def test_pip_install_and_apt_install_steps_install_packages(server, base_image):
    name = uniq("py-packages")
    logs = []
    t = (
        Template()
        .from_image(base_image)
        # Small, pure-Python and dependency-free: the test is about the step, not the package.
        .pip_install("six==1.17.0")
        .apt_install("jq", no_install_recommends=True)
    )
    try:
        Template.build(t, name, on_build_logs=logs.append)
    except Exception as e:
        tail = "\n".join(str(getattr(entry, "message", entry)) for entry in logs[-30:])
        raise AssertionError(f"build failed: {e}\nlast build logs:\n{tail}") from e
    sbx = server.track(Sandbox.create(name))
    try:
        r = sbx.commands.run('python3 -c "import six; print(six.__version__)"; echo \'{"a": 41}\' | jq ".a + 1"')
        assert r.stdout == "1.17.0\n42\n"
        # pip ran as root (a global install), so every user sees the package.
        owner = sbx.commands.run("stat -c %U \"$(python3 -c 'import six; print(six.__file__)')\"")
        assert owner.stdout == "root\n"
    finally:
        sbx.kill()
