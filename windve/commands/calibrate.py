"""`windve calibrate`: profile each pool, fit p99 latency against concurrency, write queue depths.

By default it measures the path that serves. For each pool it starts `windve serve` itself (a
subprocess on a free 127.0.0.1 port, with this command's settings, static depth control and queue
depths too large to refuse anything) with only that pool planned, profiles it over HTTP (POST
/embed), and stops it. One pool per server because over HTTP a request goes to the accelerator pool
first: the accelerator pool is profiled with heterogeneous off, the cpu pool with no accelerator (on
the cores the full plan gives it). On a CPU-only machine that is the one cpu pool.

--url profiles a server that is already running, as one pool named "server". --in-process profiles
each pool through the service runtime in this process, without HTTP (to study a device).

Writes the calibration JSON (--out) and the fit picture (--plot), prints a table like the WindVE
paper's Table III, and publishes to Redis when a Redis URL is configured. The depths seed the
service's queue depths; with adaptive depth control the dispatcher moves them at run time.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import json
import logging
import math
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from estimator.calibration import Calibration, LayoutRecord, save_calibration, to_dict
from estimator.fit import DEFAULT_DEPTH_CAP, DEFAULT_HEADROOM, depth_for_slo
from estimator.layouts import choose_layout
from estimator.pipeline import CalibrationOptions, CalibrationRunError, calibrate_pool, calibration_of, fit_profile
from estimator.profile import ProfileOptions, profile_pool
from estimator.rounds import MakeQuery, Progress, ProgressHook, Submit, timed_request
from estimator.stress import DEFAULT_STEP
from windve.gc_tuning import tune_gc_for_serving
from windve.open_files import raise_open_files
from windve.output_files import check_writable

if TYPE_CHECKING:  # the command's module is imported for every `windve` command: keep it light
    from devices import Hardware, Plan
    from estimator.http_pool import ExactLengthTexts
    from windve.model import ModelSpec
    from windve.settings import Settings

log = logging.getLogger("windve.calibrate")

POOL_CHOICES = ("accelerator", "cpu")
PROG = "windve calibrate"
# Queue depths of a server started for profiling: deep enough never to refuse a level.
PROFILING_DEPTH = 1_000_000

OpenPool = Callable[["Settings"], AbstractAsyncContextManager[Submit]]  # settings with one pool planned -> its submit


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
    parser.add_argument("--slo", type=_positive(float, "--slo"), action="append", metavar="SECONDS",
                        help="p99 latency SLO in seconds; repeat for several (default: 1.0)")
    parser.add_argument("--query-tokens", type=_positive(int, "--query-tokens"), default=75,
                        help="tokens per profiling query, special tokens included "
                             "(default: %(default)s, as in the paper)")
    add_profile_arguments(parser)
    parser.add_argument("--stress-test", action="store_true",
                        help="also run a stress test to check the estimate: raise C by --step until two levels in a "
                             "row miss the SLO; the depth is read off a monotone fit of every level, so one "
                             "slow level does not decide")
    parser.add_argument("--lengths", type=_length_list, metavar="L1,L2,...",
                        help="also profile these query lengths for a length-aware fit and a token budget")
    parser.add_argument("--choose-cpu-layout", action="store_true",
                        help="profile the CPU layouts the topology allows and keep the deepest")
    parser.add_argument("--pools", type=_pool_list, metavar="POOL,...",
                        help=f"pools to calibrate, from {', '.join(POOL_CHOICES)} (default: all in the plan). Each "
                             "is profiled alone, with a server (or runtime) that plans only it: over HTTP a "
                             "request goes to the accelerator pool first, so the accelerator pool is served with "
                             "heterogeneous off and the cpu pool with no accelerator")
    parser.add_argument("--headroom", type=_fraction, default=DEFAULT_HEADROOM,
                        help="aim every depth at SLO*(1 - HEADROOM), so that noise does not push the tail over "
                             f"(default: {DEFAULT_HEADROOM:g}; 0.2 on a machine that shares its cores or caches)")
    parser.add_argument("--recheck", action="store_true",
                        help="measure the settled level again at the end, to tell whether the machine's "
                             "speed changed during calibration (a shared machine's does)")
    parser.add_argument("--request-timeout", type=_positive(float, "--request-timeout"),
                        help="seconds before a profiling request counts as failed "
                        "(default: 10x the largest SLO, at least 30)")
    parser.add_argument("--out", type=Path, default=Path("calibration.json"),
                        help="calibration JSON to write (default: %(default)s)")
    parser.add_argument("--plot", type=Path,
                        help="fit picture (PNG) to write (default: beside --out, its name ending .png)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--url", help="profile the server already running at this URL (POST URL/embed) as one pool, "
                                     "instead of starting one per pool")
    where.add_argument("--in-process", action="store_true",
                       help="profile each pool through the service runtime in this process, without HTTP "
                            "(to study a device; the served path adds the front end)")
    parser.add_argument("--redis-url", help="also publish the calibration to this Redis (default: WINDVE_REDIS_URL)")
    parser.add_argument("--config", type=Path, help="YAML/JSON settings file (env WINDVE_CONFIG)")


def add_profile_arguments(parser: argparse.ArgumentParser) -> None:
    """How each level is measured and how far the profile goes: shared with bench/estimator.py,
    which overrides the defaults it wants with `parser.set_defaults`."""
    parser.add_argument("--rounds", type=_positive(int, "--rounds"), default=5,
                        help="closed-loop rounds per level (default: %(default)s)")
    parser.add_argument("--max-concurrency", type=_positive(int, "--max-concurrency"), default=DEFAULT_DEPTH_CAP,
                        help="highest concurrency profiled; also caps every depth (default: %(default)s, the cap "
                             "of the depth windve serve probes without a calibration)")
    parser.add_argument("--step", type=_positive(int, "--step"), default=DEFAULT_STEP,
                        help="stress-test step (default: %(default)s)")


def profile_options(args: argparse.Namespace, query_tokens: int, request_timeout: float | None) -> ProfileOptions:
    """The ProfileOptions that add_profile_arguments' flags set."""
    return ProfileOptions(
        query_tokens=query_tokens, rounds=args.rounds, max_concurrency=args.max_concurrency,
        request_timeout=request_timeout,
    )


def options_from_args(args: argparse.Namespace) -> CalibrationOptions:
    slos = tuple(dict.fromkeys(args.slo or [1.0]))
    timeout = args.request_timeout or max(30.0, 10 * max(slos))
    return CalibrationOptions(
        slos=slos,
        profile=profile_options(args, args.query_tokens, timeout),
        stress_step=args.step if args.stress_test else None,
        lengths=tuple(args.lengths or ()),
        headroom=args.headroom,
        recheck=args.recheck,
    )


def _check_writable(path: Path, flag: str) -> None:
    try:
        check_writable(path, flag)
    except ValueError as error:
        raise UsageError(str(error)) from None


# The shared calibration of a model on a hardware holds per-pool depths, which services read; one
# of a whole server would replace it with a pool no service has.
URL_NOT_PUBLISHED = (
    "--url profiles the whole server as one pool (`server`), which no service reads from Redis; "
    "it is not published, and its depth is for cpu_depth or accelerator_depth"
)


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
    if args.url:
        if not args.url.startswith(("http://", "https://")):
            raise UsageError(f"--url must start with http:// or https://, got {args.url!r}")
        if args.pools or args.choose_cpu_layout:
            raise UsageError("--pools and --choose-cpu-layout choose which servers to start: drop --url")
        if args.redis_url:
            raise UsageError(URL_NOT_PUBLISHED + ": drop --redis-url")
    if args.redis_url:
        from windve.settings import check_redis_url

        try:  # before the profile, not after it, as serve checks it at start
            check_redis_url(args.redis_url)
        except ValueError as error:
            raise UsageError(f"--redis-url: {error}") from None


# ---- running -------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    """0 on success; 2 on bad arguments or settings; 1 when profiling or publishing fails."""
    from devices import PlanError
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
        calibration = asyncio.run(_until_terminated(_calibrate(args, settings, spec, options, bar.hook)))
    except Stopped as stopped:
        said = "interrupted" if stopped.signum == signal.SIGINT else "stopped by SIGTERM"
        print(f"{PROG}: {said}; the services it started are stopped", file=sys.stderr)
        return 128 + stopped.signum
    except KeyboardInterrupt:  # Ctrl-C before the work began: asyncio.run's own handler
        print(f"{PROG}: interrupted; the services it started are stopped", file=sys.stderr)
        return 128 + signal.SIGINT
    except (UsageError, PlanError) as error:  # a plan that cannot work is a setting to change, as in serve
        return _fail(error, 2)
    except (RuntimeError, OSError, ValueError) as error:  # CalibrationRunError, ServerStartError, DeviceError, ...
        return _fail(error, 1)
    finally:
        bar.close()
    redis_url = args.redis_url or settings.redis_url
    if args.url and redis_url:
        print(f"{PROG}: {URL_NOT_PUBLISHED} (redis_url is set)", file=sys.stderr)
        redis_url = None
    return _write_outputs(args, calibration, redis_url)


RECANCEL_SECONDS = 2.0  # between cancellations of a calibration that a SIGTERM has not ended yet


class Stopped(Exception):
    """SIGTERM or SIGINT (Ctrl-C) stopped the calibration; its servers are stopped."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


async def _until_terminated(work: Awaitable[Calibration]) -> Calibration:
    """`work`, cancelled by SIGTERM or Ctrl-C (raising Stopped): the `windve serve` it started for a
    pool is stopped on the way out, not left running without its parent (a Job's pod deleted, a
    `kill`).

    A cancellation can be lost on its way: one that met the health check's HTTP request just as it
    was answered was swallowed, and the whole profile then ran on after the signal (a loaded
    machine, once in six tries; for Ctrl-C, which asyncio.run cancels once, in the suite beside a
    CPU hog). So the work is cancelled again every RECANCEL_SECONDS until it ends; the servers'
    stop finishes whatever cancels it (estimator.local_server)."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(work)
    received: list[int] = []
    stop = asyncio.Event()

    def on_signal(signum: int) -> None:
        received.append(signum)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    signalled = asyncio.ensure_future(stop.wait())
    try:
        try:
            await asyncio.wait({task, signalled}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # cancelled from outside: the work goes with it
            task.cancel()
            raise
        finally:
            signalled.cancel()
        if not stop.is_set():
            return task.result()
        while not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=RECANCEL_SECONDS)
        raise Stopped(received[0])
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


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
                log.info("%s: p99 %.3f s, max %.3f s", where, event.sample.p99, event.sample.max)
            return
        self._bar.set_description_str(where, refresh=False)
        if event.sample is not None:
            self._bar.set_postfix_str(f"p99 {event.sample.p99:.3f} s", refresh=False)
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


async def _calibrate(
    args: argparse.Namespace, settings: Settings, spec: ModelSpec, options: CalibrationOptions, progress: ProgressHook
) -> Calibration:
    import devices
    from estimator.http_pool import ExactLengthTexts
    from windve.service import hardware_fingerprint, make_plan
    from windve.tokenizer import load_fast_tokenizer

    texts = ExactLengthTexts(load_fast_tokenizer(spec.path))
    if not args.in_process:
        short = allow_open_files(options.profile.max_concurrency + _FILES_BESIDE_CONNECTIONS)
        if short:
            print(f"{PROG}: warning: {short}", file=sys.stderr)
    if args.url:
        return await _calibrate_url(args.url, settings, spec, texts, options, progress)
    open_pool: OpenPool = in_process_pool if args.in_process else served_pool_opener(texts)
    hardware = devices.detect_hardware(settings.sysfs_root)
    layout: LayoutRecord | None = None
    if args.choose_cpu_layout:
        settings, layout = await _choose_cpu_layout(settings, hardware, open_pool, texts.make_query, options, progress)
    plan = make_plan(settings, hardware)
    planned = [pool.name for pool in plan.pools]
    missing = [name for name in args.pools or () if name not in planned]
    if missing:
        raise UsageError(f"--pools {','.join(missing)}: not in this machine's plan (pools: {', '.join(planned)})")
    results = {}
    for name in args.pools or planned:
        async with open_pool(pool_settings(settings, plan, name)) as submit:
            # This process times the pool: a full collection here would be timed as its latency.
            tune_gc_for_serving()
            results[name] = await calibrate_pool(name, submit, texts.make_query, options, progress)
    calibration = calibration_of(
        results, options, model_name=spec.name, model_revision=spec.revision,
        hardware_fingerprint=hardware_fingerprint(hardware, plan, settings),
    )
    return dataclasses.replace(calibration, cpu_layout=layout)


def pool_settings(settings: Settings, plan: Plan, pool: str) -> Settings:
    """`settings` with only `pool` planned, on the cores the full `plan` gives it, set up for profiling:
    static depth control, depths that refuse nothing, no calibration file."""
    if pool == "accelerator":
        only: dict[str, Any] = {"heterogeneous": False}
    elif settings.plan:
        only = {"plan": [instance for instance in settings.plan if instance.pool == "cpu"]}
    else:
        only = {"device": "cpu"}
    return settings.model_copy(update=only | {
        "reserved_cores": list(plan.reserved_cores),
        "depth_control": "static",
        "cpu_depth": PROFILING_DEPTH,
        "accelerator_depth": PROFILING_DEPTH,
        "calibration_file": None,
    })


def serve_env(settings: Settings) -> dict[str, str]:
    """The environment of a `windve serve` that runs with exactly `settings` (host and port aside, which
    are its flags): this process's environment without its WINDVE_ variables, and every setting as one."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("WINDVE_")}
    for name, value in settings.model_dump(mode="json", exclude={"host", "port"}).items():
        if value is not None:  # every setting that may be None has None as its default
            env[f"WINDVE_{name.upper()}"] = value if isinstance(value, str) else json.dumps(value)
    return env


def serve_command(port: int) -> list[str]:
    return [sys.executable, "-m", "windve.commands.serve", "--host", "127.0.0.1", "--port", str(port)]


def _headers(settings: Settings) -> dict[str, str]:
    return {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}


def served_pool_opener(texts: ExactLengthTexts) -> OpenPool:
    """Opens a pool by starting `windve serve` with its settings; its submit POSTs `texts` to /embed."""
    from estimator.http_pool import HttpSubmit
    from estimator.local_server import local_server
    from estimator.raw_http import ConnectionPool, Target

    @asynccontextmanager
    async def open_pool(settings: Settings) -> AsyncIterator[Submit]:
        async with local_server(serve_command, serve_env(settings)) as url:
            connections = ConnectionPool(Target.from_url(url))
            try:
                yield HttpSubmit(connections, texts.text_of, _headers(settings))
            finally:
                connections.close()

    return open_pool


@asynccontextmanager
async def in_process_pool(settings: Settings) -> AsyncIterator[Submit]:
    """Opens a pool by starting the service runtime in this process; its submit goes to the pool's queue."""
    try:
        from windve.service import Runtime
    except ImportError as error:
        raise CalibrationRunError(f"in-process calibration needs windve.service ({error})") from None
    runtime = await Runtime.start(settings)
    try:
        yield runtime.pool_submitter(runtime.pool_names[0])
    finally:
        await runtime.close()


# What the process holds open besides its connections: the interpreter, the tokenizer, the terminal.
_FILES_BESIDE_CONNECTIONS = 64


def allow_open_files(wanted: int) -> str | None:
    """Raise this process's soft open-file limit to `wanted` (at most the hard limit).

    Profiling over HTTP holds one connection per query in flight, in this process and in the server,
    which inherits the limit when this process starts it; without this, a deep level would fail with
    "Too many open files" and be read as a miss. Returns what still falls short, or None.
    """
    raised = raise_open_files(wanted)
    if raised is None or raised >= wanted:
        return None
    return (
        f"open files are limited to {raised} (ulimit -n, hard limit), so levels beyond "
        f"~{raised - _FILES_BESIDE_CONNECTIONS} queries in flight will fail; raise the limit or lower --max-concurrency"
    )


async def _calibrate_url(
    url: str, settings: Settings, spec: ModelSpec, texts: ExactLengthTexts, options: CalibrationOptions,
    progress: ProgressHook,
) -> Calibration:
    from estimator.http_pool import HttpSubmit, server_info
    from estimator.raw_http import ConnectionPool, Target

    timeout = options.profile.request_timeout
    try:
        connections = ConnectionPool(Target.from_url(url))
    except ValueError as error:
        raise CalibrationRunError(str(error)) from None
    try:
        # /embed first: a server that never answers is told after one timeout, not one for /info as well.
        submit = HttpSubmit(connections, texts.text_of, _headers(settings))
        _, error = await timed_request(submit, [texts.make_query(options.profile.query_tokens)], timeout)
        if error is not None:
            if error.startswith("TimeoutError"):
                error = f"no answer within {timeout:g} s (--request-timeout)"
            raise CalibrationRunError(f"{url.rstrip('/')}/embed does not answer: {error}")
        info = await server_info(connections, _headers(settings), timeout)
        tune_gc_for_serving()  # as in _calibrate
        result = await calibrate_pool("server", submit, texts.make_query, options, progress)
    finally:
        connections.close()
    model = info.get("model") if isinstance(info.get("model"), dict) else {}
    return calibration_of(
        {"server": result}, options,
        model_name=str(model.get("id") or spec.name),
        model_revision=str(model.get("revision") or spec.revision),
        hardware_fingerprint=str(info.get("hardware_fingerprint") or f"unknown (server at {url})"),
    )


# ---- CPU layout choice -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Layout:
    name: str
    overrides: dict[str, Any]  # settings that select it


def cpu_layout_candidates(settings: Settings, hardware: Hardware) -> list[_Layout]:
    """per-node; tp when there are several NUMA nodes; per-node with each instance split in two."""
    from windve.service import make_plan
    from windve.settings import InstanceConfig

    per_node = make_plan(settings.model_copy(update={"cpu_layout": "per-node", "plan": None}), hardware)
    candidates = [_Layout("per-node", {"cpu_layout": "per-node", "plan": None})]
    if len(hardware.topology.cpu_nodes) > 1:
        candidates.append(_Layout("tp", {"cpu_layout": "tp", "plan": None}))
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
    settings: Settings, hardware: Hardware, open_pool: OpenPool, make_query: MakeQuery, options: CalibrationOptions,
    progress: ProgressHook,
) -> tuple[Settings, LayoutRecord]:
    """Profile the cpu pool of each candidate layout at the first SLO, as the pools are; keep the deepest."""
    from windve.service import make_plan

    slo = options.slos[0]

    async def evaluate(layout: _Layout) -> int | None:
        candidate = settings.model_copy(update=layout.overrides)
        plan = make_plan(candidate, hardware)
        if plan.pool("cpu") is None:
            raise UsageError("--choose-cpu-layout: the plan has no cpu pool")
        async with open_pool(pool_settings(candidate, plan, "cpu")) as submit:
            tune_gc_for_serving()
            profile = await profile_pool(
                submit, make_query, slo, options.profile, pool=f"cpu[{layout.name}]", stage="layout", progress=progress
            )
        fit = fit_profile("cpu", profile.samples)
        return depth_for_slo(fit, slo, cap=options.profile.max_concurrency, headroom=options.headroom)

    choice = await choose_layout(cpu_layout_candidates(settings, hardware), evaluate)
    if choice.best is None:
        errors = "; ".join(f"{t.name}: {t.error or 'unusable at the SLO'}" for t in choice.trials)
        raise CalibrationRunError(f"no CPU layout could be profiled ({errors})")
    chosen = {
        key: [item.model_dump() for item in value] if key == "plan" and value else value
        for key, value in choice.best.overrides.items()
    }
    return settings.model_copy(update=choice.best.overrides), LayoutRecord(choice.best.name, choice.trials, chosen)
