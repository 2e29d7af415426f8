"""The chart's Redis: a password in a Secret (kept across upgrades), protected mode on, and a
URL holding the password for windve. The last test runs a real redis-server with the
rendered arguments and reaches it through windve's own Redis client with the Secret's URL."""

from __future__ import annotations

import asyncio
import base64
import re
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from helm_render import CHART_DIR, FULLNAME, Release, container, env_of, render

REDIS = f"{FULLNAME}-redis"
LOOKUP = '{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "windve.redisName" .) }}'


def secret_data(release: Release, name: str = REDIS) -> dict[str, str]:
    return {key: base64.b64decode(value).decode() for key, value in release.get("Secret", name)["data"].items()}


def resolved_env(cont: dict[str, Any], release: Release) -> dict[str, str]:
    """The container's env as the kubelet gives it: secretKeyRefs read from the rendered Secrets."""
    values = {}
    for name, entry in env_of(cont).items():
        if "value" in entry:
            values[name] = entry["value"]
        else:
            ref = entry["valueFrom"]["secretKeyRef"]
            values[name] = secret_data(release, ref["name"])[ref["key"]]
    return values


def expand(arg: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in args."""
    return re.sub(r"\$\((\w+)\)", lambda match: env[match.group(1)], arg)


def test_password_is_generated_per_install_and_is_in_the_url(chart: Any) -> None:
    first, second = secret_data(render(chart)), secret_data(render(chart))
    assert re.fullmatch(r"[A-Za-z0-9]{32}", first["redis-password"])
    assert first["redis-password"] != second["redis-password"]  # generated, not a constant in the chart
    url = urlsplit(first["redis-url"])
    assert (url.scheme, url.password, url.hostname, url.port, url.path) == (
        "redis", first["redis-password"], REDIS, 6379, "/0"
    )


def test_url_reaches_the_redis_service(releases: dict[str, Release]) -> None:
    import redis.connection

    release = releases["default"]
    parsed = redis.connection.parse_url(secret_data(release)["redis-url"])  # as redis-py reads it
    service = release.get("Service", REDIS)
    assert parsed["host"] == service["metadata"]["name"]
    assert parsed["port"] == service["spec"]["ports"][0]["port"]
    assert parsed["password"] == secret_data(release)["redis-password"]


def test_given_password_is_used(chart: Any) -> None:
    data = secret_data(render(chart, {"redis": {"auth": {"password": "correct-horse.battery"}}}))
    assert data["redis-password"] == "correct-horse.battery"
    assert urlsplit(data["redis-url"]).password == "correct-horse.battery"


def test_password_with_url_breaking_characters_is_refused(chart: Any, helm: Any) -> None:
    with pytest.raises(helm.HelmValuesError, match="/redis/auth/password"):
        render(chart, {"redis": {"auth": {"password": "p@ss/word"}}})


def test_upgrade_keeps_the_password_of_the_existing_secret(helm: Any, tmp_path: Path) -> None:
    """`lookup` answers empty offline, so the chart is rendered with the lookup answered as the
    cluster would: by the Secret the previous install left."""
    copy = tmp_path / "windve"
    shutil.copytree(CHART_DIR, copy)
    helpers = copy / "templates" / "_helpers.tpl"
    text = helpers.read_text()
    assert text.count(LOOKUP) == 1
    existing = base64.b64encode(b"kept-across-upgrades").decode()
    stub = f'{{{{- $existing := dict "data" (dict "redis-password" "{existing}") }}}}'
    helpers.write_text(text.replace(LOOKUP, stub))
    upgraded = helm.Chart.load(copy)
    try:
        data = secret_data(render(upgraded, revision=2))
    finally:
        upgraded.close()
    assert data["redis-password"] == "kept-across-upgrades"
    assert urlsplit(data["redis-url"]).password == "kept-across-upgrades"


def test_windve_and_redis_read_the_same_secret(releases: dict[str, Release]) -> None:
    release = releases["default"]
    redis_container = container(release.get("Deployment", REDIS))
    args = redis_container["args"]
    assert args[args.index("--protected-mode") + 1] == "yes"
    assert args[args.index("--requirepass") + 1] == "$(REDISCLI_AUTH)"  # the password never in the spec
    assert env_of(redis_container)["REDISCLI_AUTH"]["valueFrom"]["secretKeyRef"] == {
        "name": REDIS, "key": "redis-password",
    }  # fmt: skip
    assert redis_container["readinessProbe"]["exec"]["command"] == ["redis-cli", "ping"]  # reads REDISCLI_AUTH
    assert env_of(container(release.server()))["WINDVE_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": REDIS, "key": "redis-url",
    }  # fmt: skip
    assert "namespace" not in release.get("Secret", REDIS)["metadata"]  # the release's, as the pods


def test_windve_reaches_the_rendered_redis_only_with_the_secret_url(
    releases: dict[str, Release], tmp_path: Path
) -> None:
    import redis

    from tests.redis_server import require_redis_server, start_on_free_port
    from windve.redis_client import create_async_redis

    require_redis_server()
    release = releases["default"]
    redis_container = container(release.get("Deployment", REDIS))
    env = resolved_env(redis_container, release)
    args = [expand(arg, env) for arg in redis_container["args"]]
    assert args[0] == "redis-server"
    dir_at = args.index("--dir")
    local_args = args[1:dir_at] + args[dir_at + 2 :]  # the fixture gives its own --dir, port and bind
    server = start_on_free_port(tmp_path, local_args)
    try:
        url = urlsplit(resolved_env(container(release.server()), release)["WINDVE_REDIS_URL"])
        local_url = url._replace(netloc=url.netloc.replace(f"{REDIS}:6379", f"127.0.0.1:{server.port}")).geturl()

        async def ping(target: str) -> bool:
            client = create_async_redis(target, 2.0)
            try:
                return await client.ping()
            finally:
                await client.aclose()

        assert asyncio.run(ping(local_url)) is True
        with pytest.raises(redis.AuthenticationError):
            asyncio.run(ping(f"redis://127.0.0.1:{server.port}/0"))
        client = redis.Redis(host="127.0.0.1", port=server.port, password=env["REDISCLI_AUTH"])
        try:
            assert client.config_get("protected-mode") == {"protected-mode": "yes"}
            assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "volatile-lru"}
        finally:
            client.close()
    finally:
        server.stop()


def test_a_new_given_password_rolls_redis_and_the_servers(chart: Any) -> None:
    def checksums(password: str) -> list[str | None]:
        release = render(chart, {"redis": {"auth": {"password": password}}})
        pods = [release.get("Deployment", REDIS), release.server()]
        return [pod["spec"]["template"]["metadata"].get("annotations", {}).get("checksum/redis-auth") for pod in pods]

    first, second = checksums("first-password"), checksums("second-password")
    assert None not in first and first[0] == first[1]  # both pods roll together
    assert first != second
    assert "first-password" not in str(first)  # a digest, not the password
