"""The image (Dockerfile) starts what the CLI and the chart expect.

There is no Docker engine here, so the image is not built; these checks tie the
Dockerfile to the real CLI parser, the chart and the torch build the tests run on.
"""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from pathlib import PurePosixPath

from helm_render import REPO, Release, container, pod_spec

DOCKERFILE = REPO / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comments dropped."""
    parsed: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, rest = pending.strip().partition(" ")
        parsed.append((keyword.upper(), rest.strip()))
        pending = ""
    return parsed


def last(keyword: str) -> str:
    found = [rest for key, rest in instructions() if key == keyword]
    assert found, f"Dockerfile has no {keyword}"
    return found[-1]


def exec_form(keyword: str) -> list[str]:
    value = json.loads(last(keyword))  # shell form would not parse: signals must reach windve
    assert isinstance(value, list) and all(isinstance(part, str) for part in value)
    return value


def test_entrypoint_is_the_console_script() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert exec_form("ENTRYPOINT") == ["windve"]
    assert "windve" in scripts


def test_default_command_parses_with_the_real_cli() -> None:
    from windve.cli import build_parser

    args = build_parser().parse_args(exec_form("CMD"))
    assert args.command == "serve"
    # The host is the image's WINDVE_HOST: a --host here would override `docker run -e WINDVE_HOST=::`.
    assert args.host is None
    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(rest for key, rest in instructions() if key == "ENV")))
    assert env["WINDVE_HOST"] == "0.0.0.0"


def test_chart_commands_parse_with_the_real_cli(releases: dict[str, Release]) -> None:
    from windve.cli import build_parser

    parser = build_parser()
    release = releases["default"]
    assert parser.parse_args(container(release.server())["args"]).command == "serve"
    job_args = container(releases["calibration-job"].job(), "calibrate")["args"]
    calibrate = [arg.replace("$(WINDVE_REDIS_URL)", "redis://r:6379/0") for arg in job_args]
    assert parser.parse_args(calibrate).command == "calibrate"


def test_image_port_user_and_offline_mode_match_the_chart(releases: dict[str, Release]) -> None:
    server = releases["default"].server()
    (port,) = container(server)["ports"]
    assert last("EXPOSE") == str(port["containerPort"])
    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(rest for key, rest in instructions() if key == "ENV")))
    assert env["WINDVE_PORT"] == last("EXPOSE")
    assert env["HF_HUB_OFFLINE"] == "1"
    user = last("USER").split(":")[0]
    assert user == str(pod_spec(server)["securityContext"]["runAsUser"]) != "0"


def test_image_pins_the_tested_torch_and_onnxruntime() -> None:
    from importlib.metadata import version

    declared = "\n".join(rest for key, rest in instructions() if key == "ARG")
    args = dict(re.findall(r"^(\w+)=(\S+)$", declared, re.M))
    assert args["TORCH_VERSION"] == version("torch").split("+")[0]
    # The onnx engine's runtime comes from the project's extras, each pinned to the version tested.
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert f"onnxruntime=={version('onnxruntime')}" in extras["onnx"]
    assert f"onnxruntime-gpu=={version('onnxruntime')}" in extras["onnx-gpu"]
    assert "windve[onnx]" in extras["test"]


def test_each_variant_installs_one_onnxruntime_build() -> None:
    # Both builds install into one package folder: a GPU image with the CPU one beside the CUDA one
    # (which `pip check` flagged when the CPU one was a base requirement) may run the onnx engine on
    # the CPU. No base requirement may pull either.
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.startswith("onnxruntime")]
    install = next(rest for key, rest in instructions() if key == "RUN" and "pip install \".[" in rest)
    arms = {variant: command.strip() for variant, command in re.findall(r"\b(cpu|cuda)\)\s+([^;]*);;", install)}
    assert arms == {"cpu": 'pip install ".[onnx]"', "cuda": 'pip install ".[onnx-gpu]"'}
    assert "uninstall" not in " ".join(rest for key, rest in instructions() if key == "RUN")


def test_cpu_variant_takes_the_cpu_wheel_and_cuda_the_pypi_one() -> None:
    build_step = next(rest for key, rest in instructions() if key == "RUN" and 'case "$VARIANT"' in rest)
    arms = dict(re.findall(r"\b(cpu|cuda)\)\s+([^;]*);;", build_step))
    # Without the CPU index, pip would pull the CUDA build and its ~3 GB of nvidia wheels.
    pinned = ["pip", "install", '"torch==${TORCH_VERSION}"']
    assert arms["cpu"].split() == pinned + ["--index-url", "https://download.pytorch.org/whl/cpu"]
    assert arms["cuda"].split() == pinned


def docker_ignored(path: str) -> bool:
    """Whether .dockerignore keeps `path` (relative to the context) out of the build context.
    Docker matches each pattern against the path and every folder above it."""
    patterns = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()]
    patterns = [pattern for pattern in patterns if pattern and not pattern.startswith("#")]
    assert not any(pattern.startswith("!") for pattern in patterns), "exceptions are not modelled here"
    parts = PurePosixPath(path).parts
    candidates = ["/".join(parts[: end + 1]) for end in range(len(parts))]
    return any(fnmatch.fnmatchcase(candidate, pattern) for candidate in candidates for pattern in patterns)


def test_build_context_holds_what_pip_install_needs() -> None:
    """`COPY . .` then `pip install .`: every package pyproject names (loadtest too: `windve
    loadtest` runs in the image), its data files and the readme must reach the build."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    needed = ["pyproject.toml", project["project"]["readme"]]
    for pattern in project["tool"]["setuptools"]["packages"]["find"]["include"]:
        needed.append(pattern.rstrip("*"))
    for package, globs in project["tool"]["setuptools"]["package-data"].items():
        needed += [str(path.relative_to(REPO)) for glob in globs for path in (REPO / package).glob(glob)]
    assert len(needed) > 7
    for path in needed:
        assert (REPO / path).exists(), path
        assert not docker_ignored(path), f".dockerignore drops {path}, which `pip install .` needs"
    for path in ("tests", "helm", ".venv", ".git", "docs", "windve/__pycache__"):
        assert docker_ignored(path), path
