"""Template builds through the e2b Python SDK: a copy/run_cmd/set_envs/
set_user/set_workdir recipe with sizes, Sandbox.create(name), build logs and
IDs, Template.exists, tags (assign, list, remove, sync and async); a failing RUN reported as BuildException, and a failed
rebuild keeping the previous image. Each build costs tens of seconds, so the
module builds one template and rebuilds it once."""

import re
import uuid

import pytest
from e2b import AsyncTemplate, BuildException, Sandbox, Template

from harness import uniq


@pytest.fixture(scope="module")
def recipe(server, base_image, tmp_path_factory):
    ctx = tmp_path_factory.mktemp("tplctx")
    (ctx / "app").mkdir()
    (ctx / "app" / "hello.txt").write_text("hello from the context\n")
    (ctx / "req.txt").write_text("requests\n")
    name = uniq("py-recipe")
    t = (
        Template(file_context_path=str(ctx))
        .from_image(base_image)
        .copy("app", "/opt/app")
        .copy("req.txt", "/opt/req.txt")
        .set_envs({"GREETING": "it's built"})
        .run_cmd('echo "$GREETING" > /opt/greeting && cat /opt/app/hello.txt > /opt/copied')
        .run_cmd("mkdir -p /srv/work && chown 1000:1000 /srv/work")
        .set_user("user")
        .run_cmd("id -u > /srv/work/built-as")
        .set_workdir("/srv/work")
    )
    logs = []
    info = Template.build(t, name, cpu_count=1, memory_mb=256, on_build_logs=logs.append)
    return name, info, logs


EXPECTED = "it's built\nhello from the context\nrequests\n1000\nruntime GREETING=unset\n/srv/work\nuser\n"
SHOW = 'cat /opt/greeting /opt/copied /opt/req.txt /srv/work/built-as; echo "runtime GREETING=${GREETING:-unset}"; pwd; id -un'


@pytest.mark.timeout(600)
async def test_copy_run_cmd_set_envs_set_user_set_workdir_and_sizes(server, recipe):
    name, info, logs = recipe
    assert re.fullmatch(r"tpl_[0-9a-f]{8}", info.template_id)
    assert str(uuid.UUID(info.build_id)) == info.build_id, "build IDs are UUIDs, as the SDK's models parse them"
    assert info.name == name
    assert logs, "build logs streamed"
    assert any("RUN" in str(getattr(entry, "message", entry)) for entry in logs), "the RUN steps are in the logs"
    assert Template.exists(name) is True
    assert Template.exists(uniq("nope")) is False
    assert await AsyncTemplate.exists(name) is True

    sbx = server.track(Sandbox.create(name))
    try:
        # Build-time envs stay build-time; the user and workdir carry over.
        assert sbx.commands.run(SHOW).stdout == EXPECTED
        si = sbx.get_info()
        assert si.cpu_count == 1
        assert si.memory_mb == 256
        assert si.template_id == info.template_id
    finally:
        sbx.kill()


async def test_tags_through_the_sdk(server, recipe):
    # The SDK parses the build IDs of tag answers as UUIDs; bld_-style IDs
    # failed here with "badly formed hexadecimal UUID string".
    name, info, _ = recipe
    got = Template.assign_tags(f"{name}:default", ["prod", "stable"])
    assert str(got.build_id) == info.build_id
    assert sorted(got.tags) == ["prod", "stable"]
    tags = {t.tag: str(t.build_id) for t in await AsyncTemplate.get_tags(info.template_id)}
    assert tags.get("prod") == info.build_id and tags.get("default") == info.build_id, tags
    await AsyncTemplate.remove_tags(name, "stable")
    assert "stable" not in {t.tag for t in Template.get_tags(name)}


@pytest.mark.timeout(600)
def test_a_failing_run_is_a_build_exception_and_a_failed_rebuild_keeps_the_old_image(server, base_image, recipe):
    name, info, _ = recipe
    with pytest.raises(BuildException, match="exit code: 3|exit status 3|did not complete successfully"):
        Template.build(Template().from_image(base_image).run_cmd("echo v2 > /opt/greeting").run_cmd("echo failing; exit 3"), name)
    sbx = server.track(Sandbox.create(name))
    try:
        assert sbx.commands.run(SHOW).stdout == EXPECTED
        assert sbx.get_info().template_id == info.template_id
    finally:
        sbx.kill()
