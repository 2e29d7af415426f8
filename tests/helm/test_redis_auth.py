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
from helm_render import CHART_DIR, FULLNAME, Release, all_containers, container, env_of, render

REDIS = f"{FULLNAME}-redis"
LOOKUP = '{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "windve.redisName" .) }}'


def secret_data(release: Release, name: str = REDIS) -> dict[str, str]:
    return {key: base64.b64decode(value).decode() for key, value in release.get("Secret", name)["data"].items()}


def kubelet_env(cont: dict[str, Any], secrets: dict[str, dict[str, str]]) -> dict[str, str]:
    """The container's env as the kubelet builds it: in order, secretKeyRefs read from `secrets`,
    and $(VAR) in a value expanded from the entries defined before it (left as is otherwise)."""
    values: dict[str, str] = {}
    for entry in cont.get("env", []):
        if "value" in entry:
            values[entry["name"]] = re.sub(
                r"\$\((\w+)\)", lambda match: values.get(match.group(1), match.group(0)), entry["value"]
            )
        else:
            ref = entry["valueFrom"]["secretKeyRef"]
            values[entry["name"]] = secrets[ref["name"]][ref["key"]]
    return values


def resolved_env(cont: dict[str, Any], release: Release) -> dict[str, str]:
    """`kubelet_env` with the secretKeyRefs read from the release's rendered Secrets."""
    rendered = {secret["metadata"]["name"]: secret_data(release, secret["metadata"]["name"])
                for secret in release.all("Secret") if "data" in secret}
    return kubelet_env(cont, rendered)


def expand(arg: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in args."""
    return re.sub(r"\$\((\w+)\)", lambda match: env[match.group(1)], arg)


def start_rendered_redis(tmp_path: Path, redis_container: dict[str, Any], env: dict[str, str]):
    """redis-server with the chart's arguments, `env` expanded in them, on a free loopback port: the
    fixture gives its own --dir, port and bind."""
    from tests.redis_server import require_redis_server, start_on_free_port

    require_redis_server()
    args = [expand(arg, env) for arg in redis_container["args"]]
    assert args[0] == "redis-server"
    dir_at = args.index("--dir")
    return start_on_free_port(tmp_path, args[1:dir_at] + args[dir_at + 2 :])


def on_port(url: str, port: int) -> str:
    """The chart's Redis URL, pointed at the local server."""
    parts = urlsplit(url)
    return parts._replace(netloc=parts.netloc.replace(f"{REDIS}:6379", f"127.0.0.1:{port}")).geturl()


def ping(target: str) -> bool:
    """PING with windve's own client."""
    from windve.redis_client import create_async_redis

    async def once() -> bool:
        client = create_async_redis(target, 2.0)
        try:
            return await client.ping()
        finally:
            await client.aclose()

    return asyncio.run(once())


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

    release = releases["default"]
    redis_container = container(release.get("Deployment", REDIS))
    env = resolved_env(redis_container, release)
    server = start_rendered_redis(tmp_path, redis_container, env)
    try:
        assert ping(on_port(resolved_env(container(release.server()), release)["WINDVE_REDIS_URL"], server.port))
        with pytest.raises(redis.AuthenticationError):
            ping(f"redis://127.0.0.1:{server.port}/0")
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


# redis.auth.existingSecret: the password lives in a Secret the operator manages (GitOps, External
# Secrets, Vault); the chart makes none and never sees the password.
USER_SECRET, USER_KEY = "windve-redis-auth", "password"  # the "redis-existing-secret" scenario
USER_PASSWORD = "from-the-vault.42"


def test_existing_secret_replaces_the_generated_one(releases: dict[str, Release]) -> None:
    release = releases["redis-existing-secret"]
    assert release.has("Deployment", REDIS) and release.has("Service", REDIS)  # still the chart's Redis
    assert not release.has("Secret", REDIS)
    assert not [s for s in release.all("Secret") if {"redis-password", "redis-url"} & set(s.get("data", {}))]
    for workload in release.all("Deployment") + release.all("Job"):
        for cont in all_containers(workload):
            for entry in cont.get("env", []):
                ref = entry.get("valueFrom", {}).get("secretKeyRef")
                assert ref is None or ref["name"] != REDIS, (workload["metadata"]["name"], entry)


def test_redis_reads_the_password_from_the_existing_secret(releases: dict[str, Release]) -> None:
    redis_deployment = releases["redis-existing-secret"].get("Deployment", REDIS)
    redis_container = container(redis_deployment)
    assert env_of(redis_container)["REDISCLI_AUTH"]["valueFrom"]["secretKeyRef"] == {
        "name": USER_SECRET, "key": USER_KEY,
    }  # fmt: skip
    args = redis_container["args"]
    assert args[args.index("--requirepass") + 1] == "$(REDISCLI_AUTH)"
    # No given password to digest: a change in the operator's Secret needs a rollout restart.
    assert "checksum/redis-auth" not in redis_deployment["spec"]["template"]["metadata"].get("annotations", {})


def test_servers_build_the_url_from_the_existing_secret(releases: dict[str, Release]) -> None:
    import redis.connection

    release = releases["redis-existing-secret"]
    server = container(release.server())
    names = [entry["name"] for entry in server["env"]]
    # Kubernetes expands $(VAR) only from entries defined earlier in the list.
    assert names.index("WINDVE_REDIS_PASSWORD") < names.index("WINDVE_REDIS_URL")
    env = env_of(server)
    assert env["WINDVE_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": USER_SECRET, "key": USER_KEY}
    assert env["WINDVE_REDIS_URL"] == {
        "name": "WINDVE_REDIS_URL", "value": f"redis://:$(WINDVE_REDIS_PASSWORD)@{REDIS}:6379/0",
    }  # fmt: skip
    assert server["args"] == ["serve"]  # the password (or its reference) is in no argument
    for cont in all_containers(release.server()):
        assert not [arg for arg in cont.get("args", []) + cont.get("command", []) if "REDIS" in arg or "://" in arg]

    url = kubelet_env(server, {USER_SECRET: {USER_KEY: USER_PASSWORD}})["WINDVE_REDIS_URL"]
    parsed = redis.connection.parse_url(url)  # as redis-py reads it
    service = release.get("Service", REDIS)
    assert parsed["password"] == USER_PASSWORD
    assert (parsed["host"], parsed["port"]) == (service["metadata"]["name"], service["spec"]["ports"][0]["port"])


def test_windve_reaches_redis_with_the_password_of_the_existing_secret(
    releases: dict[str, Release], tmp_path: Path
) -> None:
    """Redis started with the rendered arguments and the operator's Secret; windve's own client
    with the URL the kubelet builds for the serving pod."""
    import redis

    release = releases["redis-existing-secret"]
    secrets = {USER_SECRET: {USER_KEY: USER_PASSWORD}}
    redis_container = container(release.get("Deployment", REDIS))
    server = start_rendered_redis(tmp_path, redis_container, kubelet_env(redis_container, secrets))
    try:
        assert ping(on_port(kubelet_env(container(release.server()), secrets)["WINDVE_REDIS_URL"], server.port))
        with pytest.raises(redis.AuthenticationError):
            ping(f"redis://:not-{USER_PASSWORD}@127.0.0.1:{server.port}/0")
    finally:
        server.stop()


def test_existing_secret_and_password_together_are_refused(chart: Any, helm: Any) -> None:
    values = {"redis": {"auth": {"password": "correct-horse", "existingSecret": USER_SECRET}}}
    with pytest.raises(helm.HelmRenderError, match="redis.auth.password and redis.auth.existingSecret are both set"):
        render(chart, values)


def test_existing_secret_does_not_make_the_charts_redis_usable_by_calibration(chart: Any, helm: Any) -> None:
    """The calibration Job (a pre-install hook) still runs before the chart's Redis exists."""
    values = {"redis": {"auth": {"existingSecret": USER_SECRET}}, "calibration": {"enabled": True}}
    with pytest.raises(helm.HelmRenderError, match="calibration.enabled runs the calibration Job before"):
        render(chart, values)


@pytest.mark.parametrize(
    ("auth", "complaint"),
    [
        ({"existingSecret": "Not_A_Name"}, "/redis/auth/existingSecret"),
        ({"existingSecret": USER_SECRET, "existingSecretPasswordKey": ""}, "/redis/auth/existingSecretPasswordKey"),
    ],
)
def test_existing_secret_values_are_checked(chart: Any, helm: Any, auth: dict[str, str], complaint: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=complaint):
        render(chart, {"redis": {"auth": auth}})
