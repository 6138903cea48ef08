"""CubeSandbox's template API through its own SDK (cubesandbox.Template):
create from an image with CubeAPI's options, the alias that moves to the
newest ready template, PUT alias (set, steal, clear), the alias lookup
route's 400s, rebuild, delete by alias, refusals of what Cubicle cannot
honour, and another team's view. Each build is seconds (no steps: the
image is unpacked), so the module builds four templates."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
import requests
from cubesandbox import Config, Sandbox, Template
from cubesandbox._exceptions import ApiError, TemplateNotFoundError

from harness import CUBICLE, uniq


def _cfg():
    return Config(api_url=os.environ["CUBE_API_URL"])


def _headers():
    return {"X-API-Key": os.environ["CUBE_API_KEY"]}


def _ready(template_id, timeout=300):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = Template.get(template_id, config=_cfg())
        if last.status == "READY":
            return last
        assert last.status != "FAILED", f"build failed: {last.last_error}"
        time.sleep(0.5)
    pytest.fail(f"template {template_id} not READY: {last and last.status}")


@pytest.fixture(scope="module")
def served(server, base_image):
    """A template from the image with every option CubeAPI's create takes
    that Cubicle honours: a start command serving HTTP, its probe, env,
    sizes and the writable layer."""
    alias = uniq("cube-web")
    job = Template.build(
        name=alias,
        image=base_image,
        writable_layer_size="1G",
        exposed_ports=[8080, 49983],
        probe_port=8080,
        probe_path="/",
        cpu_count=1500,
        memory_mb=384,
        envs={"SDK_TEMPLATE_E2E": "advanced", "WITH_EQ": "a=b"},
        command=["python3", "-m", "http.server", "8080"],
        args=["--bind", "127.0.0.1", "--directory", "/tmp"],
        config=_cfg(),
    )
    assert job.template_id.startswith("tpl-") and len(job.template_id) == 28
    assert job.job_id and job.build_id == job.job_id
    _ready(job.template_id)
    yield alias, job
    try:
        Template.delete(job.template_id, config=_cfg())
    except (ApiError, TemplateNotFoundError):
        pass


@pytest.mark.timeout(600)
def test_create_from_image_honours_its_options(server, served):
    alias, job = served
    detail = Template.get(alias, config=_cfg())
    assert detail.template_id == job.template_id and detail.name == alias and detail.status == "READY"
    assert detail.image_info == "cubicle/pybase:1"
    assert detail.cpu_count == 2 and detail.memory_mb == 384  # 1500 millicores round up to whole CPUs
    req = detail.create_request
    assert req["annotations"] == {"com.exposed_ports": "8080:49983", "cube.master.rootfs.writable_layer_size": "1G"}, req
    (container,) = req["containers"]
    assert container["envs"] == [{"key": "SDK_TEMPLATE_E2E", "value": "advanced"}, {"key": "WITH_EQ", "value": "a=b"}]
    assert container["probe"]["probe_handler"]["http_get"] == {"port": 8080, "path": "/"}
    assert req["volumes"][0]["volume_source"]["empty_dir"]["size_limit"] == "1G"
    assert any(t.template_id == job.template_id for t in Template.list(config=_cfg()))

    raw = requests.get(f"{os.environ['CUBE_API_URL']}/templates/aliases/{alias}", headers=_headers())
    assert raw.status_code == 200 and raw.json()["templateID"] == job.template_id

    # A sandbox of it: the template's env under the create's own, its start
    # command serving (the probe held the create until it answered), its
    # disk and sizes.
    sbx = server.track(Sandbox.create(template=alias, timeout=120, envs={"WITH_EQ": "mine"}, config=_cfg()))
    try:
        out = sbx.commands.run('echo "$SDK_TEMPLATE_E2E $WITH_EQ"; nproc').stdout.split()
        assert out[:2] == ["advanced", "mine"] and out[2] == "2", out
        got = sbx.commands.run(
            "python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:8080/').status)\""
        )
        assert got.stdout.strip() == "200", got
    finally:
        sbx.kill()


def test_alias_lookup_refuses_names_no_template_can_have(server):
    base = os.environ["CUBE_API_URL"]
    for invalid in ["UPPER", "tpl-hijack", "snap-hijack", "a" * 65]:
        assert requests.get(f"{base}/templates/aliases/{invalid}", headers=_headers()).status_code == 400, invalid
    assert requests.get(f"{base}/templates/aliases/{uniq('nothing')}", headers=_headers()).status_code == 404


@pytest.mark.timeout(900)
def test_alias_moves_to_the_newest_ready_template_and_put_alias(server, base_image):
    cfg = _cfg()
    alias = uniq("cube-alias")
    a = Template.build(name=alias, image=base_image, config=cfg)
    _ready(a.template_id)
    assert Template.get(alias, config=cfg).template_id == a.template_id
    # The same alias again: a new template, which takes it once ready.
    b = Template.build(name=alias, image=base_image, config=cfg)
    assert b.template_id != a.template_id
    _ready(b.template_id)
    assert Template.get(alias, config=cfg).template_id == b.template_id
    assert Template.get(a.template_id, config=cfg).name == ""
    # An unnamed one; PUT alias: CubeAPI's rule, then set, steal, clear.
    c = Template.build(image=base_image, config=cfg)
    _ready(c.template_id)
    assert Template.get(c.template_id, config=cfg).name == ""
    for bad in ["My-Alias", "tpl-x", "a" * 65]:
        with pytest.raises(ApiError) as e:
            Template.set_alias(c.template_id, bad, config=cfg)
        assert e.value.status_code == 400
    updated = Template.set_alias(c.template_id, alias, config=cfg)
    assert updated.template_id == c.template_id and updated.name == alias
    assert Template.get(alias, config=cfg).template_id == c.template_id
    assert not Template.get(b.template_id, config=cfg).name
    cleared = Template.set_alias(c.template_id, None, config=cfg)
    assert cleared.template_id == c.template_id and cleared.name == ""
    with pytest.raises(TemplateNotFoundError):
        Template.get(alias, config=cfg)
    # Rebuild: a new build of the same template, from the stored request.
    r = Template.rebuild(b.template_id, config=cfg)
    assert r.template_id == b.template_id and r.build_id and r.build_id != b.build_id
    _ready(b.template_id)
    with pytest.raises(ApiError) as e:
        Template.rebuild(b.template_id, config=cfg, image="other:1")
    assert e.value.status_code == 400
    # Delete by alias, then the alias is gone.
    Template.set_alias(b.template_id, alias, config=cfg)
    Template.delete(alias, config=cfg)
    with pytest.raises(TemplateNotFoundError):
        Template.get(alias, config=cfg)
    for t in (a, c):
        Template.delete(t.template_id, config=cfg)


def test_options_cubicle_cannot_honour_are_refused(server, base_image):
    cfg = _cfg()
    before = {t.template_id for t in Template.list(config=cfg)}
    for kwargs, word in [
        ({"nodes": ["node-1"]}, "nodes"),
        ({"instance_type": "cubebox"}, "instanceType"),
        ({"allow_internet_access": False, "deny_out": ["0.0.0.0/0"]}, "allowInternetAccess=false"),
        ({"dns": ["1.1.1.1"]}, "dns"),
        ({"args": ["-v"]}, "args need a command"),
        ({"probe_path": "/health"}, "probePath needs probePort"),
        ({"name": "base"}, "built-in"),
        ({"qos": {"network": {"bandwidthMbps": 100}}}, "qos"),
        ({"unknownOption": 1}, 'unknown field "unknownOption"'),
    ]:
        with pytest.raises(ApiError) as e:
            Template.build(image=base_image, config=cfg, **kwargs)
        assert e.value.status_code in (400, 409) and word in str(e.value), (kwargs, e.value)
    assert {t.template_id for t in Template.list(config=cfg)} == before, "a refused create left a template"


def test_another_team_neither_sees_nor_renames(server, served):
    alias, job = served
    team = uniq("cubetpl")
    def cli(*args):
        return subprocess.run([CUBICLE, *args, "--data-dir", server.data_dir], check=True, capture_output=True, text=True, timeout=30).stdout.strip()

    cli("team", "create", team)
    key = cli("apikey", "create", "--team", team)
    other = Config(api_url=os.environ["CUBE_API_URL"], api_key=key)
    with pytest.raises(TemplateNotFoundError):
        Template.get(job.template_id, config=other)
    with pytest.raises(TemplateNotFoundError):
        Template.set_alias(job.template_id, "stolen", config=other)
    with pytest.raises(TemplateNotFoundError):
        Template.rebuild(job.template_id, config=other)
    # Its own template may take the same alias: names are per team.
    assert all(t.template_id != job.template_id for t in Template.list(config=other))
