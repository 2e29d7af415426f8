"""`windve calibrate`: profile each pool, fit latency against concurrency, write queue depths.

In-process (default): starts the service runtime with the same settings `windve serve`
uses and profiles each pool through the real dispatch and batching path. With `--url`:
profiles a running server over HTTP (POST /embed) as one pool named "server".
Writes the calibration JSON (`--out`), the fit picture (`--plot`), prints a table like the
WindVE paper's Table III, and publishes to Redis when a Redis URL is configured.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import logging
import math
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from estimator.calibration import Calibration, LayoutRecord, save_calibration, to_dict
from estimator.fit import DEFAULT_DEPTH_CAP, DEFAULT_HEADROOM, depth_for_slo
from estimator.layouts import choose_layout
from estimator.pipeline import (
    CalibrationOptions,
    CalibrationRunError,
    calibrate_pools,
    fit_profile,
    profile_with_options,
)
from estimator.profile import FULL_AIMS_MIN_DEPTH
from estimator.rounds import Progress, ProgressHook, timed_request
from estimator.stress import DEFAULT_STEP
from windve.gc_tuning import tune_gc_for_serving

log = logging.getLogger("windve.calibrate")

POOL_CHOICES = ("accelerator", "cpu")
PROG = "windve calibrate"


class UsageError(ValueError):
    """A bad argument found after parsing (exit code 2, like argparse's own errors)."""


# ---- arguments -----------------------------------------------------------------------


def _positive(kind: Callable[[str], Any], what: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be a number, got {text!r}") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"{what} must be > 0, got {text!r}")
        return value

    return parse


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--headroom must be a number, got {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"--headroom must be in [0, 1), got {text!r}")
    return value


def _length_list(text: str) -> tuple[int, ...]:
    parse = _positive(int, "each length")
    lengths = tuple(sorted({parse(part.strip()) for part in text.split(",") if part.strip()}))
    if len(lengths) < 2:
        raise argparse.ArgumentTypeError(f"--lengths needs two or more token counts, e.g. 16,75,256 (got {text!r})")
    return lengths


def _pool_list(text: str) -> tuple[str, ...]:
    pools = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = [pool for pool in pools if pool not in POOL_CHOICES]
    if unknown or not pools:
        named = ", ".join(unknown) or repr(text)
        raise argparse.ArgumentTypeError(f"unknown pool {named}: choose from {', '.join(POOL_CHOICES)}")
    return pools


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        help="profile the pools and write SLO-derived queue depths",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(run=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    seconds = _positive(float, "--slo")
    parser.add_argument("--slo", type=seconds, action="append", metavar="SECONDS",
                        help="latency SLO in seconds; repeat for several (default: 1.0)")
    parser.add_argument("--query-tokens", type=_positive(int, "--query-tokens"), default=75,
                        help="tokens per profiling query, special tokens included "
                             "(default: %(default)s, as in the paper)")
    add_profile_arguments(parser)
    parser.add_argument("--stress-test", action="store_true",
                        help="also run the stress-test baseline (raise C by --step until the SLO breaks)")
    parser.add_argument("--fine-tune", action="store_true",
                        help="adjust each depth around the estimate with all pools loaded together")
    parser.add_argument("--lengths", type=_length_list, metavar="L1,L2,...",
                        help="also profile these query lengths for a length-aware fit and a token budget")
    parser.add_argument("--choose-cpu-layout", action="store_true",
                        help="profile the CPU layouts the topology allows and keep the deepest")
    parser.add_argument("--pools", type=_pool_list, metavar="POOL,...",
                        help=f"pools to calibrate, from {', '.join(POOL_CHOICES)} (default: all in the plan)")
    parser.add_argument("--headroom", type=_fraction, default=DEFAULT_HEADROOM,
                        help="aim every depth at SLO*(1 - HEADROOM), so that noise does not push the tail over "
                             f"(default: {DEFAULT_HEADROOM:g}; 0.2 on a machine that shares its cores or caches)")
    parser.add_argument("--recheck", action="store_true",
                        help="measure a profiled level again at the end, to tell whether the machine's "
                             "speed changed during calibration (a shared machine's does)")
    parser.add_argument("--request-timeout", type=_positive(float, "--request-timeout"),
                        help="seconds before a profiling request counts as failed "
                        "(default: 10x the largest SLO, at least 30)")
    parser.add_argument("--out", type=Path, default=Path("calibration.json"),
                        help="calibration JSON to write (default: %(default)s)")
    parser.add_argument("--plot", type=Path,
                        help="fit picture (PNG) to write (default: beside --out, its name ending .png)")
    parser.add_argument("--url", help="profile the server running at this URL (POST URL/embed) instead of in-process")
    parser.add_argument("--redis-url", help="also publish the calibration to this Redis (default: WINDVE_REDIS_URL)")
    parser.add_argument("--config", type=Path, help="YAML/JSON settings file (env WINDVE_CONFIG)")


def add_profile_arguments(parser: argparse.ArgumentParser) -> None:
    """How each level is measured and how far the profile goes: shared with bench/estimator.py,
    which overrides the defaults it wants with `parser.set_defaults`."""
    parser.add_argument("--rounds", type=_positive(int, "--rounds"), default=5,
                        help="closed-loop rounds per level (default: %(default)s)")
    parser.add_argument("--scout-rounds", type=_positive(int, "--scout-rounds"), default=1,
                        help="rounds of the levels profiled on the way up, far below the SLO (they grow 4x); "
                             "the last of them and the levels aimed at the SLO get all ROUNDS. As many as "
                             "ROUNDS: every level in full, doubling, ~50%% slower (default: %(default)s)")
    parser.add_argument("--no-settle", dest="settle", action="store_false",
                        help="do not measure the level the fit says crosses the SLO once the profile has passed "
                             "it (saves one level, about ROUNDS x SLO seconds; the depth is then read off levels "
                             "far from it)")
    aims = parser.add_mutually_exclusive_group()
    aims.add_argument("--scout-aims", dest="scout_aims", action="store_true", default=None,
                      help="scout the levels aimed at the SLO too, and do not measure the last scout again: only "
                           "C=1 and the settled crossing get all ROUNDS. About half the time; the depth rests on "
                           "one level in full near the crossing, so it moves more with a noisy machine (default: "
                           f"when the fit with the first aim, scouted, puts the crossing below {FULL_AIMS_MIN_DEPTH})")
    aims.add_argument("--full-aims", dest="scout_aims", action="store_false", default=None,
                      help="measure the aimed levels in full however shallow the crossing")
    parser.add_argument("--max-concurrency", type=_positive(int, "--max-concurrency"), default=DEFAULT_DEPTH_CAP,
                        help="highest concurrency profiled; also caps every depth (default: %(default)s, the cap "
                             "of the depth windve serve probes without a calibration)")
    parser.add_argument("--step", type=_positive(int, "--step"), default=DEFAULT_STEP,
                        help="stress-test step (default: %(default)s)")


def profile_options(args: argparse.Namespace) -> dict[str, Any]:
    """The CalibrationOptions fields that add_profile_arguments' flags set, --step aside (the
    stress test runs only when asked for)."""
    return {
        "rounds": args.rounds,
        "scout_rounds": args.scout_rounds,
        "max_concurrency": args.max_concurrency,
        "settle": args.settle,
        "scout_aims": args.scout_aims,
    }


def options_from_args(args: argparse.Namespace) -> CalibrationOptions:
    slos = tuple(dict.fromkeys(args.slo or [1.0]))
    timeout = args.request_timeout or max(30.0, 10 * max(slos))
    return CalibrationOptions(
        slos=slos,
        query_tokens=args.query_tokens,
        stress_step=args.step if args.stress_test else None,
        fine_tune=args.fine_tune,
        lengths=tuple(args.lengths or ()),
        request_timeout=timeout,
        headroom=args.headroom,
        recheck=args.recheck,
        **profile_options(args),
    )


def _check_writable(path: Path, flag: str) -> None:
    """Fail before minutes of profiling, not after: really open the file (or one beside it)."""
    if path.is_dir():
        raise UsageError(f"{flag} {path} is a directory")
    parent = path.parent
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: folder {parent} does not exist")
    try:
        if path.exists():
            with path.open("a"):
                pass
        else:
            with tempfile.TemporaryFile(dir=parent):
                pass
    except OSError as error:
        raise UsageError(f"{flag} {path} is not writable ({error.strerror or error})") from None


def check_args(args: argparse.Namespace, max_tokens: int, min_tokens: int = 3) -> None:
    if args.plot is None:  # a picture that lands beside its JSON, not in whatever directory the command ran in
        args.plot = args.out.with_suffix(".png")
    _check_writable(args.out, "--out")
    _check_writable(args.plot, "--plot")
    if args.out.resolve() == args.plot.resolve():
        raise UsageError("--out and --plot name the same file")
    for tokens in (args.query_tokens, *(args.lengths or ())):
        if not min_tokens <= tokens <= max_tokens:
            raise UsageError(f"query length {tokens} is outside {min_tokens}..{max_tokens} tokens (the model's limit)")
    if args.scout_rounds is not None and args.scout_rounds > args.rounds:
        raise UsageError(
            f"--scout-rounds {args.scout_rounds} is more than --rounds {args.rounds}: scouting is the cheap look"
        )
    if args.scout_aims is True and not args.settle:
        raise UsageError("--scout-aims needs the settled crossing: drop --no-settle")
    if args.url:
        if not args.url.startswith(("http://", "https://")):
            raise UsageError(f"--url must start with http:// or https://, got {args.url!r}")
        if args.pools or args.choose_cpu_layout:
            raise UsageError("--pools and --choose-cpu-layout need the in-process mode; drop --url")


# ---- running -------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    """0 on success; 2 on bad arguments or settings; 1 when profiling or publishing fails."""
    from windve.model import ModelError, load_model_spec
    from windve.settings import SettingsError, load_settings

    try:
        options = options_from_args(args)
        settings = load_settings(config_file=args.config)
        spec = load_model_spec(settings.model, settings.revision, settings.trust_remote_code)
        check_args(args, min(spec.max_seq_length, settings.max_input_tokens or spec.max_seq_length))
    except (UsageError, SettingsError, ModelError) as error:
        return _fail(error, 2)
    bar = _ProgressBar()
    try:
        if args.url:
            calibration = asyncio.run(_over_http(args, settings, spec, options, bar.hook))
        else:
            calibration = asyncio.run(_in_process(args, settings, options, bar.hook))
    except UsageError as error:
        return _fail(error, 2)
    except (RuntimeError, OSError, ValueError) as error:  # CalibrationRunError, DeviceError, ModelError, ...
        return _fail(error, 1)
    finally:
        bar.close()
    return _write_outputs(args, calibration, args.redis_url or settings.redis_url)


def _fail(error: Exception, code: int) -> int:
    print(f"{PROG}: error: {error}", file=sys.stderr)
    return code


class _ProgressBar:
    """tqdm over rounds on a terminal; one log line per finished level otherwise (e.g. a Job's log)."""

    def __init__(self) -> None:
        from tqdm import tqdm

        self._bar = tqdm(unit=" rounds", desc="calibrating", file=sys.stderr, dynamic_ncols=True, disable=None)

    def hook(self, event: Progress) -> None:
        where = f"{event.stage} {event.pool} C={event.concurrency}"
        if self._bar.disable:
            if event.sample is not None:
                log.info("%s: p95 %.3f s, max %.3f s", where, event.sample.p95, event.sample.max)
            return
        self._bar.set_description_str(where, refresh=False)
        if event.sample is not None:
            self._bar.set_postfix_str(f"p95 {event.sample.p95:.3f} s", refresh=False)
        self._bar.update(1)

    def close(self) -> None:
        self._bar.close()


def _write_outputs(args: argparse.Namespace, calibration: Calibration, redis_url: str | None) -> int:
    from estimator.plot import plot_calibration
    from estimator.report import format_report

    try:
        save_calibration(calibration, args.out)
        plot_calibration(calibration, args.plot)
    except OSError as error:
        return _fail(error, 1)
    print(format_report(calibration))
    print(f"\nwrote {args.out} and {args.plot}")
    if calibration.cpu_layout is not None and calibration.cpu_layout.chosen:
        import yaml

        print("serve with the chosen CPU layout: put this in the settings file (--config):")
        print(yaml.safe_dump(calibration.cpu_layout.settings, sort_keys=False).rstrip())
    if redis_url:
        return _publish(calibration, redis_url)
    return 0


def _publish(calibration: Calibration, redis_url: str) -> int:
    if importlib.util.find_spec("windve.calibration_store") is None:
        return _fail(RuntimeError("cannot publish: this build has no windve.calibration_store; the file is written"), 1)
    from windve.calibration_store import publish_sync

    try:
        key = publish_sync(to_dict(calibration), redis_url)
    except Exception as error:  # redis errors, a newer calibration already stored, ...
        return _fail(RuntimeError(f"publishing to Redis failed ({error}); the file is written"), 1)
    print(f"published to Redis under {key}")
    return 0


async def _in_process(
    args: argparse.Namespace, settings: Any, options: CalibrationOptions, progress: ProgressHook
) -> Calibration:
    try:
        from windve.service import Runtime
    except ImportError as error:
        raise CalibrationRunError(f"in-process calibration needs windve.service ({error}); use --url") from None
    layout: LayoutRecord | None = None
    if args.choose_cpu_layout:
        settings, layout = await _choose_cpu_layout(Runtime, settings, options, progress)
    runtime = await _started(Runtime, settings)
    try:
        names = list(args.pools or runtime.pool_names)
        missing = [name for name in names if name not in runtime.pool_names]
        if missing:
            raise UsageError(
                f"--pools {','.join(missing)}: not in this machine's plan (pools: {', '.join(runtime.pool_names)})"
            )
        calibration = await calibrate_pools(
            {name: runtime.pool_submitter(name) for name in names},
            runtime.make_query,
            options,
            model_name=runtime.spec.name,
            model_revision=runtime.spec.revision,
            hardware_fingerprint=runtime.hardware_fingerprint,
            progress=progress,
        )
    finally:
        await runtime.close()
    return dataclasses.replace(calibration, cpu_layout=layout)


async def _started(runtime_class: Any, settings: Any) -> Any:
    """The runtime, in a process set up as `windve serve` sets up its own once ready.

    Without it a full collection walks the ~250k objects torch, transformers and the tokenizer
    leave: here one took 128 ms in the middle of a stress test's level, timed as latency.
    """
    runtime = await runtime_class.start(settings)
    tune_gc_for_serving()
    return runtime


# What the process holds open besides its connections: the interpreter, the tokenizer, the terminal.
_FILES_BESIDE_CONNECTIONS = 64


def allow_open_files(wanted: int) -> str | None:
    """Raise this process's soft open-file limit to `wanted` (at most the hard limit).

    Profiling a server holds one connection per query in flight, and the soft limit is often 1024
    while the hard one is far higher: without this, a deep level would fail with "Too many open
    files" and be read as a miss. Returns what still falls short, or None.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return None
    raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
    if raised >= wanted:
        return None
    return (
        f"open files are limited to {raised} (ulimit -n, hard limit), so levels beyond "
        f"~{raised - _FILES_BESIDE_CONNECTIONS} queries in flight will fail; raise the limit or lower --max-concurrency"
    )


async def _over_http(
    args: argparse.Namespace, settings: Any, spec: Any, options: CalibrationOptions, progress: ProgressHook
) -> Calibration:
    from estimator.http_pool import ClientPerRequest, ExactLengthTexts, http_submitter, server_info
    from windve.tokenizer import load_fast_tokenizer

    texts = ExactLengthTexts(load_fast_tokenizer(spec.path))
    short = allow_open_files(options.max_concurrency + _FILES_BESIDE_CONNECTIONS)
    if short:
        print(f"{PROG}: warning: {short}", file=sys.stderr)
    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    # No client-side connection cap: queuing in the client would be timed as server latency.
    async with ClientPerRequest(timeout=options.request_timeout, headers=headers) as clients:
        info = await server_info(clients, args.url)
        submit = http_submitter(clients, args.url, texts.text_of)
        _, error = await timed_request(submit, [texts.make_query(options.query_tokens)], options.request_timeout)
        if error is not None:
            raise CalibrationRunError(f"{args.url.rstrip('/')}/embed does not answer: {error}")
        # This process times the server: a full collection here would be timed as its latency.
        tune_gc_for_serving()
        model = info.get("model") if isinstance(info.get("model"), dict) else {}
        return await calibrate_pools(
            {"server": submit},
            texts.make_query,
            options,
            model_name=str(model.get("id") or spec.name),
            model_revision=str(model.get("revision") or spec.revision),
            hardware_fingerprint=str(info.get("hardware_fingerprint") or f"unknown (server at {args.url})"),
            progress=progress,
        )


# ---- CPU layout choice -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Layout:
    name: str
    overrides: dict[str, Any]  # settings that select it


def cpu_layout_candidates(settings: Any) -> list[_Layout]:
    """per-node; tp when there are several NUMA nodes; per-node with each instance split in two."""
    import devices
    from windve.service import make_plan
    from windve.settings import InstanceConfig

    hardware = devices.detect_hardware(settings.sysfs_root)
    per_node = make_plan(settings.model_copy(update={"cpu_layout": "per-node", "plan": None}), hardware)
    candidates = [_Layout("per-node", {"cpu_layout": "per-node"})]
    if len(hardware.topology.cpu_nodes) > 1:
        candidates.append(_Layout("tp", {"cpu_layout": "tp"}))
    split: list[InstanceConfig] = []
    for inst in per_node.instances:
        physical = hardware.topology.physical_cores(inst.cores) if inst.on_cpu else []
        if len(physical) < 2:
            split.append(InstanceConfig(pool=inst.pool, device=inst.device, cores=list(inst.cores), tp=inst.tp,
                                        engine=inst.engine, threads=inst.threads))
            continue
        half = len(physical) // 2
        for group in (physical[:half], physical[half:]):
            split.append(InstanceConfig(pool="cpu", device="cpu", cores=[cpu for core in group for cpu in core],
                                        engine=inst.engine, threads=len(group)))
    if len(split) > len(per_node.instances):
        candidates.append(_Layout("per-node-split", {"cpu_layout": "explicit", "plan": split}))
    return candidates


async def _choose_cpu_layout(
    runtime_class: Any, settings: Any, options: CalibrationOptions, progress: ProgressHook
) -> tuple[Any, LayoutRecord]:
    """Profile the CPU pool of each candidate layout at the first SLO; keep the deepest."""
    slo = options.slos[0]

    async def evaluate(layout: _Layout) -> int | None:
        runtime = await _started(runtime_class, settings.model_copy(update=layout.overrides))
        try:
            if "cpu" not in runtime.pool_names:
                raise UsageError("--choose-cpu-layout: the plan has no cpu pool")
            profile = await profile_with_options(
                options, runtime.pool_submitter("cpu"), runtime.make_query, slo,
                pool=f"cpu[{layout.name}]", stage="layout", progress=progress,
            )
            fit = fit_profile("cpu", profile.samples)
            return depth_for_slo(fit, slo, cap=options.max_concurrency, headroom=options.headroom)
        finally:
            await runtime.close()

    choice = await choose_layout(cpu_layout_candidates(settings), evaluate)
    if choice.best is None:
        errors = "; ".join(f"{t.name}: {t.error or 'unusable at the SLO'}" for t in choice.trials)
        raise CalibrationRunError(f"no CPU layout could be profiled ({errors})")
    chosen = _jsonable(choice.best.overrides)
    return settings.model_copy(update=choice.best.overrides), LayoutRecord(choice.best.name, choice.trials, chosen)


def _jsonable(overrides: dict[str, Any]) -> dict[str, Any]:
    return {
        key: [item.model_dump() for item in value] if key == "plan" else value for key, value in overrides.items()
    }
