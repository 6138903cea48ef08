"""Secrets through the e2b Python SDK, sync and async: create, get_info,
update, list with pagination, exists, destroy, 404s, bad input, and another
team's key seeing nothing. Values are write-only: no response carries one."""

import subprocess
import time

import pytest
from e2b import AsyncSecret, Secret, SecretException, SecretNotFoundException

from harness import CUBICLE, uniq

VALUE = "sk-canary-py-5c0ffee"


def test_secret_lifecycle(server):
    name = uniq("db-password")
    s = Secret.create(name, VALUE, metadata={"env": "prod"})
    assert s.secret_id.startswith("sec_")
    assert (s.name, s.version, s.metadata) == (name, 1, {"env": "prod"})
    for ref in (s.secret_id, name):
        assert Secret.get_info(ref).secret_id == s.secret_id
    up = Secret.update(name, VALUE + "-2")
    assert (up.version, up.metadata) == (2, {"env": "prod"})
    up = Secret.update(s.secret_id, VALUE + "-3", metadata={"env": "staging"})
    assert (up.version, up.metadata) == (3, {"env": "staging"})
    assert up.updated_at >= up.created_at

    for path in ("/secrets", f"/secrets/{s.secret_id}"):
        r = server.api("GET", path)
        assert r.status_code == 200
        assert "sk-canary" not in r.text and '"value"' not in r.text

    assert Secret.create(uniq("plain"), "v").metadata == {}
    assert Secret.exists(name) is True
    assert Secret.destroy(name) is True
    assert Secret.destroy(name) is False
    assert Secret.exists(name) is False
    with pytest.raises(SecretNotFoundException):
        Secret.get_info(name)
    with pytest.raises(SecretNotFoundException):
        Secret.update(name, "x")


def test_secret_bad_input(server):
    name = uniq("dup")
    Secret.create(name, "v")
    with pytest.raises(SecretException, match="already exists"):
        Secret.create(name, "v")
    for body, field in [
        ({"name": "a{b}", "value": "v"}, "name"),
        ({"name": "", "value": "v"}, "name"),
        ({"name": "x" * 129, "value": "v"}, "name"),
        ({"value": "v"}, "name is required"),
        ({"name": "ok"}, "value is required"),
        ({"name": "ok", "value": ""}, "value"),
        ({"name": "ok", "value": "v" * (32 * 1024 + 1)}, "value"),
        ({"name": "ok", "value": "v", "metadata": {f"k{i}": "v" for i in range(33)}}, "metadata"),
        ({"name": "ok", "value": "v", "metadata": {"k": "v" * 1025}}, "metadata"),
        ({"name": "ok", "value": "v", "versions": 1}, "versions"),
    ]:
        r = server.api("POST", "/secrets", json=body)
        assert r.status_code == 400, (str(body)[:80], r.text)
        assert r.json()["code"] == 400 and field in r.json()["message"]
        assert "v" * 64 not in r.text
    assert server.api("GET", "/secrets?limit=101").status_code == 400
    assert Secret.destroy(name) is True


def test_secret_pagination(server):
    prefix = uniq("page") + "-"
    made = [Secret.create(f"{prefix}{i}", "v").secret_id for i in range(5)]
    p = Secret.list(limit=2)
    seen, pages = [], 0
    while p.has_next and pages < 20:
        pages += 1
        items = p.next_items()
        assert len(items) <= 2
        seen += [s.secret_id for s in items if s.name.startswith(prefix)]
    assert seen == made and pages >= 3
    for sid in made:
        assert Secret.destroy(sid) is True


def test_secret_other_team(server):
    name = uniq("shared")
    mine = Secret.create(name, "v")
    team = f"t-sec-py-{int(time.time() * 1000)}"

    def cli(*args):
        return subprocess.run([CUBICLE, *args, "--data-dir", server.data_dir], check=True, capture_output=True, text=True, timeout=30).stdout.strip()

    cli("team", "create", team)
    other = cli("apikey", "create", "--team", team, "--name", "other")
    assert Secret.exists(mine.secret_id, api_key=other) is False
    assert Secret.exists(name, api_key=other) is False
    assert Secret.destroy(mine.secret_id, api_key=other) is False
    with pytest.raises(SecretNotFoundException):
        Secret.update(mine.secret_id, "stolen", api_key=other)
    assert all(s.secret_id != mine.secret_id for s in Secret.list(api_key=other).next_items())
    twin = Secret.create(name, "v", api_key=other)
    assert twin.secret_id != mine.secret_id
    assert Secret.get_info(name).secret_id == mine.secret_id
    assert Secret.destroy(twin.secret_id, api_key=other) is True
    assert Secret.destroy(mine.secret_id) is True


async def test_async_secret_lifecycle(server):
    name = uniq("async")
    s = await AsyncSecret.create(name, VALUE, metadata={"a": "b"})
    assert s.version == 1
    assert (await AsyncSecret.update(name, VALUE + "-2")).version == 2
    assert (await AsyncSecret.get_info(s.secret_id)).metadata == {"a": "b"}
    items = await AsyncSecret.list(limit=100).next_items()
    assert any(i.secret_id == s.secret_id for i in items)
    assert await AsyncSecret.exists(name) is True
    assert await AsyncSecret.destroy(name) is True
    assert await AsyncSecret.destroy(name) is False
    with pytest.raises(SecretNotFoundException):
        await AsyncSecret.get_info(name)


def test_secret_names_lower_cased_and_reachable(server):
    # This SDK puts the ref into the path unencoded (f"/secrets/{secret_id}"):
    # names without '/', '\\', '?', '#' and '%' are reachable by name; those
    # with them by ID (docs/secrets.md).
    for name in (uniq("a b+c:d@e;f,g=h&i$"), uniq("ünï"), uniq("p|i^p`e[s]<a>\"q\"~!*()'")):
        s = Secret.create(name, "v")
        assert s.name == name
        assert Secret.get_info(name).secret_id == s.secret_id
        assert Secret.update(name, "v2").version == 2
        assert Secret.destroy(name) is True
        assert Secret.exists(name) is False
    slash = Secret.create(uniq("team/db"), "v")
    assert Secret.get_info(slash.secret_id).name == slash.name
    assert Secret.destroy(slash.secret_id) is True

    # e2b's schema: names are lower-cased before storage and returned so.
    mixed = uniq("Mixed-Case")
    m = Secret.create(mixed, "v")
    assert m.name == mixed.lower()
    for ref in (mixed, mixed.lower(), mixed.upper()):
        assert Secret.get_info(ref).secret_id == m.secret_id
    with pytest.raises(SecretException, match="^409"):
        Secret.create(mixed.upper(), "v")
    assert Secret.destroy(mixed.upper()) is True

    # The sec_ prefix is reserved for IDs; '.' and '..' cannot be a path segment.
    for name in (uniq("sec_"), uniq("SEC_"), ".", ".."):
        with pytest.raises(SecretException, match=r"^400: invalid secret: name must not"):
            Secret.create(name, "v")
