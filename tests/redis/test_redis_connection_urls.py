"""redis-py URL conventions: a password in the URL, TLS with rediss://, and wrong credentials."""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.redis.redis_test_support import cache_settings, random_vectors
from tests.redis_server import free_port, require_redis_server, start_on_free_port
from windve.cache import cache_keys, create_cache
from windve.redis_client import describe_url

KEYS = cache_keys("m", "r", True, True, ["one", "two"])
VECTORS = random_vectors(2, seed=4)
TOKENS = [3, 70_000]  # counts past 16 bits round-trip too


async def round_trip(url: str) -> tuple[list, dict]:
    writer = create_cache(cache_settings(url), l1_entries=0)
    await writer.put_many(KEYS, VECTORS, TOKENS)
    await writer.close()
    reader = create_cache(cache_settings(url), l1_entries=0)
    found = await reader.get_many(KEYS)
    stats = reader.stats()
    await reader.close()
    return found, stats


def make_tls_files(folder: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1, made with the openssl CLI."""
    ca_key, ca_cert = folder / "ca.key", folder / "ca.pem"
    key, csr, cert = folder / "server.key", folder / "server.csr", folder / "server.pem"
    commands = [
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca_cert,
         "-days", "1", "-subj", "/CN=windve test CA"],
        ["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1"],
        ["openssl", "x509", "-req", "-in", csr, "-CA", ca_cert, "-CAkey", ca_key, "-CAcreateserial",
         "-out", cert, "-days", "1", "-extfile", "/dev/stdin"],
    ]  # fmt: skip
    for command in commands:
        extension = b"subjectAltName=IP:127.0.0.1\n" if "-extfile" in command else None
        subprocess.run([str(part) for part in command], input=extension, check=True, capture_output=True)
    return ca_cert, cert, key


def test_password_in_the_url_a_wrong_one_and_none(tmp_path: Path, caplog) -> None:
    require_redis_server()
    server = start_on_free_port(tmp_path, ["--requirepass", "s3cret"])
    try:
        found, _ = asyncio.run(round_trip(f"redis://:s3cret@127.0.0.1:{server.port}/0"))
        assert [entry.vector.tobytes() for entry in found] == [row.tobytes() for row in VECTORS]
        assert [entry.tokens for entry in found] == TOKENS

        # wrong credentials behave like an outage: no exception, misses, an error counted
        found, stats = asyncio.run(round_trip(f"redis://:wrong@127.0.0.1:{server.port}/0"))
        assert found == [None, None]
        assert stats["errors"] == {"redis": 1}
        # none at all: the warning says so, where Redis's own words name a protocol step (HELLO)
        with caplog.at_level(logging.WARNING, logger="windve.redis"):
            found, stats = asyncio.run(round_trip(f"redis://127.0.0.1:{server.port}/0"))
        assert found == [None, None] and "this Redis requires a password, and the URL has none" in caplog.text
    finally:
        server.stop()


@pytest.mark.skipif(
    shutil.which("openssl") is None, reason="needs the openssl CLI to make a test certificate"
)
def test_tls_with_rediss_url_and_a_password(tmp_path: Path) -> None:
    require_redis_server()
    ca_cert, cert, key = make_tls_files(tmp_path)
    tls_port = free_port()
    server = start_on_free_port(
        tmp_path,
        ["--requirepass", "s3cret", "--tls-port", str(tls_port), "--tls-cert-file", str(cert),
         "--tls-key-file", str(key), "--tls-ca-cert-file", str(ca_cert), "--tls-auth-clients", "no"],
    )  # fmt: skip
    try:
        url = f"rediss://:s3cret@127.0.0.1:{tls_port}/0?ssl_ca_certs={ca_cert}"
        found, stats = asyncio.run(round_trip(url))
        assert stats["errors"] == {}
        assert [entry.vector.tobytes() for entry in found] == [row.tobytes() for row in VECTORS]
        assert describe_url(url) == f"rediss://127.0.0.1:{tls_port}/0"  # no password in logs
    finally:
        server.stop()
