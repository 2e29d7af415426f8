"""The calibration result, its JSON file, and the checks `windve serve` runs when loading it.

The file holds what was measured (samples, their tail the p99 of end-to-end latency), what was fitted,
the depths derived per SLO (the estimate, and the stress test's depth when it ran), the time each method
took, and what it was measured on (model name + revision, a hardware fingerprint), so that a file from
another model or machine is noticed. A failed request's latency is infinite; JSON has no infinity, so it
is written as the string "Infinity".

Schema 2 measures the p99 tail. Files of schema 1 (written before, with a p95 tail and depths read off
it) are refused with a message that says so: their depths aim at another tail.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from estimator.fit import LengthFit, LinearFit
from estimator.layouts import LayoutTrial
from estimator.recheck import CrossingCheck, SpeedCheck, crossing_check
from estimator.rounds import LevelSample
from estimator.stress import StressResult

SCHEMA_VERSION = 2


class CalibrationError(ValueError):
    """The calibration file cannot be used; the message says what is wrong with it."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class SloDepth:
    """Depths of one pool at one SLO, by each method (None = not run / unusable)."""

    slo: float
    estimate: int | None  # from the fit, what the service uses; None = a single query misses the SLO (eq. 11)
    reason: str
    token_budget: int | None = None  # tokens in flight, from the length-aware fit
    stress_test: int | None = None
    capped: bool = False  # the estimate is --max-concurrency: the pool may hold the SLO deeper
    bounded: bool = False  # a measured level overruled the formula (estimator.profile.decide_profile_depth)


@dataclass(frozen=True)
class PoolCalibration:
    samples: tuple[LevelSample, ...]
    fit: LinearFit
    profile_seconds: float
    depths: tuple[SloDepth, ...]
    profile_stop: str = ""
    length_fit: LengthFit | None = None
    length_samples: tuple[LevelSample, ...] = ()
    length_seconds: float = 0.0
    stress: StressResult | None = None
    recheck: SpeedCheck | None = None  # with --recheck: the machine's speed at the end
    settled: int | None = None  # the profile's fitted crossing, measured last (None: not settled)

    def at(self, slo: float) -> SloDepth:
        for entry in self.depths:
            if math.isclose(entry.slo, slo):
                return entry
        raise KeyError(f"no depth for SLO {slo:g} s (calibrated: {', '.join(f'{d.slo:g}' for d in self.depths)})")


@dataclass(frozen=True)
class LayoutRecord:
    chosen: str | None
    trials: tuple[LayoutTrial, ...]
    settings: dict[str, Any] = field(default_factory=dict)  # what selects the chosen layout in serve


@dataclass(frozen=True)
class ModelIdentity:
    name: str
    revision: str  # content hash of the weights


@dataclass(frozen=True)
class Calibration:
    model: ModelIdentity
    hardware_fingerprint: str
    slos: tuple[float, ...]
    query_tokens: int
    rounds: int
    pools: dict[str, PoolCalibration]
    headroom: float = 0.0  # depths aim at SLO*(1 - headroom)
    cpu_layout: LayoutRecord | None = None
    created: str = field(default_factory=_now)
    schema_version: int = SCHEMA_VERSION

    def crossing_check(self, pool: str) -> CrossingCheck | None:
        """The pool's settled crossing against the tail it was profiled for (the largest SLO less the headroom)."""
        measured = self.pools[pool]
        return crossing_check(measured.samples, measured.settled, max(self.slos) * (1 - self.headroom))

    def crossing_moved(self, pool: str) -> CrossingCheck | None:
        """The settled crossing's check when it ran off the speed the fit expected, else None:
        what the report and `windve serve` warn about."""
        check = self.crossing_check(pool)
        return check if check is not None and not check.steady else None


_ADAPTER = TypeAdapter(Calibration)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(item) for item in value]
    return value


def to_dict(calibration: Calibration) -> dict[str, Any]:
    return _json_safe(dataclasses.asdict(calibration))


def to_json(calibration: Calibration) -> str:
    return json.dumps(to_dict(calibration), indent=2) + "\n"


def _semantic_problems(calibration: Calibration) -> list[str]:
    """What types alone cannot say: ranges and consistency."""
    problems: list[str] = []
    try:
        datetime.fromisoformat(calibration.created)
    except ValueError:
        problems.append(f"created must be an ISO 8601 time (got {calibration.created!r})")
    if not calibration.slos or any(not (slo > 0 and math.isfinite(slo)) for slo in calibration.slos):
        problems.append(f"slos must be a non-empty list of positive seconds (got {list(calibration.slos)})")
    if calibration.query_tokens < 1 or calibration.rounds < 1:
        problems.append("query_tokens and rounds must be >= 1")
    if not 0 <= calibration.headroom < 1:
        problems.append(f"headroom must be in [0, 1) (got {calibration.headroom})")
    if not calibration.pools:
        problems.append("pools is empty")
    for name, pool in calibration.pools.items():
        problems.extend(f"pools.{name}.{problem}" for problem in _pool_problems(pool, calibration.slos))
    return problems


def _pool_problems(pool: PoolCalibration, slos: tuple[float, ...]) -> list[str]:
    problems: list[str] = []
    if not pool.samples:
        problems.append("samples is empty")
    for index, sample in enumerate(pool.samples + pool.length_samples):
        if sample.concurrency < 1 or sample.tokens < 1 or sample.rounds < 1 or sample.failures < 0:
            problems.append(f"samples[{index}]: concurrency, tokens and rounds must be >= 1, failures >= 0")
        if not (0 <= sample.p99 <= sample.max) or math.isnan(sample.max):
            problems.append(f"samples[{index}]: need 0 <= p99 <= max (got p99={sample.p99}, max={sample.max})")
    fit = pool.fit
    if not (fit.alpha >= 0 and fit.beta >= 0 and math.isfinite(fit.alpha) and math.isfinite(fit.beta)):
        problems.append(f"fit: alpha and beta must be finite and >= 0 (got alpha={fit.alpha}, beta={fit.beta})")
    if not fit.r2 <= 1:
        problems.append(f"fit.r2 must be <= 1 (got {fit.r2})")
    calibrated = [entry.slo for entry in pool.depths]
    missing = [slo for slo in slos if not any(math.isclose(slo, have) for have in calibrated)]
    if missing:
        problems.append(f"depths: no entry for SLO {', '.join(f'{slo:g}' for slo in missing)}")
    for entry in pool.depths:
        for method in ("estimate", "token_budget", "stress_test"):
            value = getattr(entry, method)
            if value is not None and value < 0:
                problems.append(f"depths[slo={entry.slo:g}].{method} must be >= 0 (got {value})")
    return problems


def _location(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(top level)"


def from_dict(data: Any, source: str = "calibration") -> Calibration:
    """Validate and build; CalibrationError lists every problem with its location."""
    if not isinstance(data, dict):
        raise CalibrationError(f"{source}: expected a JSON object at the top level")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        old = " (an older windve's, whose depths aim at the p95 tail; this one aims at the p99)" if version == 1 else ""
        raise CalibrationError(
            f"{source}: schema_version is {version!r}{old}, this windve reads {SCHEMA_VERSION}: "
            "re-run `windve calibrate`"
        )
    try:
        calibration = _ADAPTER.validate_python(data)
    except ValidationError as exc:
        lines = [f"{_location(err['loc'])}: {err['msg']}" for err in exc.errors()]
        raise CalibrationError(f"{source} is invalid:\n  - " + "\n  - ".join(lines)) from None
    problems = _semantic_problems(calibration)
    if problems:
        raise CalibrationError(f"{source} is invalid:\n  - " + "\n  - ".join(problems))
    return calibration


def load_calibration(path: Path | str) -> Calibration:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise CalibrationError(f"calibration file {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CalibrationError(
            f"calibration file {path} is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    return from_dict(data, f"calibration file {path}")


def save_calibration(calibration: Calibration, path: Path | str) -> Path:
    """Write atomically (a reader never sees half a file)."""
    path = Path(path)
    text = to_json(calibration)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as stream:
            stream.write(text)
        os.chmod(temporary, 0o644)  # mkstemp makes it private; the service may run as another user
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def fingerprint_mismatch(calibration: Calibration, model_revision: str, hardware_fp: str) -> list[str]:
    """Warnings for `windve serve`: the depths were measured on another model or machine."""
    warnings = []
    if calibration.model.revision != model_revision:
        warnings.append(
            f"calibration was measured with model {calibration.model.name} revision "
            f"{calibration.model.revision}, but the service runs revision {model_revision}: "
            "its depths may not hold; re-run `windve calibrate`"
        )
    if calibration.hardware_fingerprint != hardware_fp:
        warnings.append(
            f"calibration was measured on hardware or a set-up {calibration.hardware_fingerprint!r} "
            f"(engine, dtype, batch limits), this service is {hardware_fp!r}: its depths may not hold; "
            "re-run `windve calibrate`"
        )
    return warnings
