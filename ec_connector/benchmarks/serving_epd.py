"""One arm of the serving benchmark's E→PD workload: encoder-only producer + consumer, one process.

    python -m ec_connector.benchmarks.serving_epd SPEC_JSON   (started by the serving bench, --workloads epd)

Two `AsyncLLM` engines in this process, each with its own EngineCore process, on the one device
(SPEC["producer_engine"] and SPEC["engine"] split its memory):
- arm ``none``: no producer; the consumer engine has no connector and encodes every image itself;
- arms ``upstream`` / ``ours``: an ``ec_producer`` engine (vLLM's ECCPUConnector or
  ECTierConnector, NIXL on) serves each request first (encoder only, 1 token); its
  `ec_transfer_params` go to the ``ec_consumer`` engine in
  ``SamplingParams.extra_args["ec_transfer_params"]``, as an orchestrator forwards them, and the
  consumer pulls the encoder output from the producer's region instead of encoding.
Each request keeps its image for the consumer too (a consumer that cannot pull encodes locally).
The figure is the consumer's: its TTFT from its own submission, its wall time and encoder items
(the hook counts each engine's processes apart through EC_BENCH_ENGINE); the producer's time per
request and the end-to-end TTFT (producer + consumer) are recorded beside it, and, for ours, each
pull's time from its XferReq to the item ready in the consumer's tier (`pull_p50_ms`,
`pull_p99_ms`: the connector's `peer_fetch_seconds`, read through a stat logger that every arm's
consumer gets alike).

Output and exit codes as serving_engine.py.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ec_connector.benchmarks.ports import free_port
from ec_connector.benchmarks.serving_engine import (
    Results,
    child_main,
    counter_logger,
    drive,
    encoder_items,
    exit_child,
    make_image,
    prompt_for,
    pull_figures,
    sampling,
    say,
    start,
    stream,
    summarize,
    write_workload,
)
from ec_connector.benchmarks.serving_workload import Workload


async def epd_pass(spec: dict, producer: Any, consumer: Any, wl: Workload, seeds: tuple[int, ...], tag: str):
    """One pass: per request the producer first (if any), then the consumer with its params.

    Returns the consumer's (ttft_s, latency_s, tokens) rows, the wall time, the end-to-end TTFTs,
    the producer's latencies and how many producer answers carried `ec_transfer_params`.
    """
    images = [make_image(s, wl.size) for s in seeds]
    rows: list[tuple[float, float, int] | None] = [None] * len(images)
    e2e: list[float] = []
    prod: list[float] = []
    published = [0]

    async def one(i: int) -> None:
        extra = None
        t0 = time.perf_counter()
        if producer is not None:
            _, p_lat, _, last = await stream(producer, prompt_for(*images[i]), sampling(1), f"{tag}-{i}-e")
            prod.append(p_lat)
            params = getattr(last, "ec_transfer_params", None) if last is not None else None
            if params:
                published[0] += 1
                extra = {"ec_transfer_params": params}
        ttft, lat, tokens, _ = await stream(
            consumer, prompt_for(*images[i]), sampling(spec["max_tokens"], extra), f"{tag}-{i}"
        )
        rows[i] = (ttft, lat, tokens)
        e2e.append(time.perf_counter() - t0 - lat + ttft)  # producer + consumer up to its first token

    wall = await drive(len(images), spec["arrival"], one)
    return [r for r in rows if r is not None], wall, e2e, prod, published[0]


async def serve(spec: dict, out: Results, hook_dir: str) -> None:
    import vllm

    arm = spec["arm"]
    producer = None
    started = time.perf_counter()
    if spec.get("producer_connector"):
        env = {"VLLM_EC_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_EC_SIDE_CHANNEL_PORT": str(free_port())}
        producer = start(
            {**spec["producer_engine"], "ec_transfer_config": spec["producer_connector"]}, "producer", env
        )
    consumer_kwargs = dict(spec["engine"])
    if spec.get("connector"):
        consumer_kwargs["ec_transfer_config"] = spec["connector"]
    fetches: list[float] = []  # the consumer's pull durations, in the order its stats arrive
    consumer = start(consumer_kwargs, "consumer", {}, stat_loggers=[counter_logger({}, fetches)])
    start_s = time.perf_counter() - started
    runner = "v2" if getattr(consumer.vllm_config, "use_v2_model_runner", False) else "v1"
    out.write("engine", start_s=start_s, vllm=vllm.__version__, runner=runner, pid=os.getpid())
    say(f"{arm} E->PD engines up in {start_s:.1f} s (vLLM {vllm.__version__}, {runner} runner)")
    try:
        for wd in spec["workloads"]:
            wl = Workload.from_dict(wd)
            passes: list[dict[str, Any]] = []
            rows_all: list[tuple[float, float, int]] = []
            wall_all, items_all, enc_all, e2e_all, prod_all, published_all = 0.0, 0, 0, [], [], 0
            pulls_all: list[float] = []
            for p in wl.passes:
                before = encoder_items(hook_dir, "consumer")
                pulled_before = len(fetches)
                done, wall, e2e, prod, published = await epd_pass(
                    spec, producer, consumer, wl, p.seeds, f"{spec['tag']}-{wl.key}-{p.label}"
                )
                encoded = encoder_items(hook_dir, "consumer") - before
                figures = summarize(done, wall, len(p.seeds), encoded, per_request=p.measured)
                figures["published"] = published
                pulls = fetches[pulled_before:]
                figures.update(pull_figures(pulls))
                passes.append({"label": p.label, "measured": p.measured, **figures})
                say(
                    f"{arm} {wl.key} {p.label}: {len(done)} req in {wall:.2f} s, consumer encoder items "
                    f"{encoded}, {published} published, TTFT p50 {figures['ttft_p50_ms'] or 0:.0f} ms, "
                    f"pull p50 {figures.get('pull_p50_ms', '-')} ms"
                )
                if p.measured:
                    rows_all += done
                    wall_all += wall
                    items_all += len(p.seeds)
                    enc_all += encoded
                    e2e_all += e2e
                    prod_all += prod
                    published_all += published
                    pulls_all += pulls
            measured = summarize(rows_all, wall_all, items_all, enc_all)
            e2e_ms = sorted(x * 1e3 for x in e2e_all)
            measured.update(
                published=published_all,
                e2e_ttft_p50_ms=e2e_ms[len(e2e_ms) // 2] if e2e_ms else None,
                producer_p50_ms=sorted(prod_all)[len(prod_all) // 2] * 1e3 if prod_all else None,
                **pull_figures(pulls_all),
            )
            write_workload(out, wl, measured, passes)
    finally:
        consumer.shutdown()
        if producer is not None:
            producer.shutdown()


def main() -> int:
    return child_main(serve, lambda spec: {**spec["engine"], "ec_transfer_config": spec["connector"]})


if __name__ == "__main__":
    exit_child(main)
