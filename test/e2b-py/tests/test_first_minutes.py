"""A new user's first five minutes with the Python SDKs, unchanged from e2b:
Sandbox.create() on the default (Debian) base, pip install as user, git
clone of a local repository (sbx.git), npm from the registry (HTTPS through
the server's --ca-certificates), then run_code with a plot on the code
interpreter."""

import base64

from e2b import Sandbox
from e2b_code_interpreter import Sandbox as CodeSandbox

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_first_five_minutes_on_the_base_image(server):
    sbx = server.track(Sandbox.create(timeout=600))
    try:
        r = sbx.commands.run("grep -E '^(ID|VERSION_ID)=' /etc/os-release; id -un")
        assert 'ID=debian' in r.stdout and 'VERSION_ID="12"' in r.stdout and r.stdout.strip().endswith("user")

        r = sbx.commands.run("pip install --quiet requests && python3 -c 'import requests; print(requests.__version__)'", timeout=300)
        assert r.exit_code == 0 and r.stdout.strip()

        sbx.commands.run(
            "git init -q /home/user/origin && cd /home/user/origin && echo hi > README && "
            "git add README && git -c user.email=u@e -c user.name=u commit -q -m first"
        )
        sbx.git.clone("file:///home/user/origin", path="/home/user/clone")
        assert sbx.files.read("/home/user/clone/README") == "hi\n"

        r = sbx.commands.run(
            "mkdir -p /home/user/app && cd /home/user/app && npm init -y >/dev/null && npm i --silent is-number && "
            "node -e \"console.log(require('is-number')(5))\"",
            timeout=300,
        )
        assert r.stdout.strip() == "true"
    finally:
        sbx.kill()


def test_first_plot_on_the_code_interpreter(server):
    sbx = server.track(CodeSandbox.create(timeout=300))
    try:
        ex = sbx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()")
        assert ex.error is None, ex.error
        pngs = [r.png for r in ex.results if r.png]
        assert pngs and base64.b64decode(pngs[0]).startswith(PNG_MAGIC)
    finally:
        sbx.kill()
