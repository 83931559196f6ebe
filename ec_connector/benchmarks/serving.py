"""End-to-end serving benchmark: no connector, vLLM's ECCPUConnector and ours, side by side in one run.

    ec-connector bench serving run --shape 7b --mode eager --out OUT_DIR [options]
    ec-connector bench serving report OUT_DIR/serving-*.json [--png FILE]
    python bench/serving.py run ...     # the same, from a checkout with the package on PYTHONPATH

`run` starts one fresh engine per (round, arm), each in its own child process (GPU memory is
freed between arms), with the arms taken alternately: round r runs them rotated by r (none,
upstream, ours; then upstream, ours, none; ...). Every engine serves the same workloads with the
same images in the same order (serving_workload.py) through vLLM's async streaming path
(serving_engine.py), so each figure is per request (TTFT) and per pass (wall time, req/s,
output tokens/s, encoder items run, hit ratio = items served without running the encoder / items).

Arms:
- ``none``: no EC connector (vLLM's own GPU encoder cache only). It also serves ``limit``: the
  repeat workload with the encoder stubbed in the engine (serving_hook.py), the floor.
- ``upstream``: vLLM's in-tree ``ECCPUConnector`` (``ec_both``). It runs only in the V2 model
  runner (vLLM 0.33 on CUDA); elsewhere the arm is skipped with that reason.
- ``ours``: ``ECTierConnector`` (``ec_both``) loaded by ``ec_connector_module_path``, so the
  package only has to be importable (on PYTHONPATH), not installed.
Both connectors get the same region size (``ec_cpu_bytes``, the key both read).
``--workloads epd`` (a run of its own) makes each arm an E→PD pair instead (serving_epd.py):
``none`` = the consumer encoding locally, ``upstream`` / ``ours`` = an ``ec_producer`` and an
``ec_consumer`` engine with that connector and NIXL on, on the one device.
``--workloads fleet`` (a run of its own) serves repeat and pressure through replicas on the one
device behind a round-robin client (serving_fleet.py), arms ``upstream`` / ``local`` (two
replicas, a region each, vLLM's connector or ours), ``fleet`` (ours with fleet sharing) and
``single`` (one engine with both regions' bytes).

Prefix caching is off (a repeated prompt would otherwise skip the encoder). Each child has a
timeout: a hung engine is killed (its whole process group) and the arm marked failed; with
`--budget-s`, a child whose timeout the budget would clamp below its need (serving_budget.py) is
not started. The run's JSON is rewritten after every child, so a killed run keeps what finished;
its workload notes carry the pressure workloads' expected hit ratios (serving_expected.py).
`report` merges one or more run JSONs (serving_report.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from ec_connector.benchmarks import serving_expected, serving_report
from ec_connector.benchmarks.serving_budget import (
    arm_workloads,
    child_timeout,
    engine_need_s,
    estimate_s,
    mode_arms,
    run_mode,
)
from ec_connector.benchmarks.serving_children import PACKAGE_PARENT, Stopped, on_sigterm, run_child
from ec_connector.benchmarks.serving_engine import ARMS, MiB, connector_config
from ec_connector.benchmarks.serving_fleet import (
    FLEET_ARMS,
    cross_replica_repeats,
    fleet_extra,
    fleet_rule,
    fleet_spec,
)
from ec_connector.benchmarks.serving_workload import (
    FLEET_WORKLOADS,
    WORKLOADS,
    build,
    fleet_workloads,
    image_tokens,
    parse_size,
    resized,
)

# The folder that holds the ec_connector package: a source checkout's root or site-packages.


def rotated(arms: list[str], round_no: int) -> list[str]:
    k = round_no % len(arms)
    return arms[k:] + arms[:k]


def model_geometry(model_dir: Path) -> dict[str, int]:
    """Hidden size and pixel bounds from the model directory (config.json, preprocessor_config.json)."""
    config = json.loads((model_dir / "config.json").read_text())
    text = config.get("text_config") or config
    pre = json.loads((model_dir / "preprocessor_config.json").read_text())
    return {
        "hidden": int(text.get("hidden_size") or config["hidden_size"]),
        "min_pixels": int(pre["min_pixels"]),
        "max_pixels": int(pre["max_pixels"]),
    }


def prepare_model(args: argparse.Namespace, out: Path) -> Path:
    if args.model:
        return Path(args.model)
    tools = PACKAGE_PARENT / "tools"
    if not (tools / "tiny_vlm.py").is_file():
        raise SystemExit(
            "no --model given and no model writer here (tools/tiny_vlm.py ships with the source "
            "checkout): pass --model DIR, a Qwen2-VL model folder"
        )
    sys.path.insert(0, str(tools))
    from tiny_vlm import write_tiny_qwen2_vl

    return write_tiny_qwen2_vl(out / f"model-{args.shape}", random_weights=False, shape=args.shape)


def engine_args(args: argparse.Namespace, model: Path, max_pixels: int, profile_dir: Path) -> dict[str, Any]:
    kw: dict[str, Any] = {
        "model": str(model),
        "load_format": "dummy",
        "dtype": "bfloat16",
        "seed": 0,
        "max_model_len": args.max_model_len,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "enforce_eager": args.mode == "eager",
        "enable_prefix_caching": False,
        "limit_mm_per_prompt": {"image": 1, "video": 0},  # no video profiling either
        # vLLM sizes its own encoder cache from the largest item the preprocessor can make: capped
        # at the bench's largest image, it is max_num_batched_tokens, as on a server set up for them.
        "mm_processor_kwargs": {"max_pixels": max_pixels},
        "disable_log_stats": True,
    }
    if args.gpu_memory_utilization:
        kw["gpu_memory_utilization"] = args.gpu_memory_utilization
    if args.profile_pass:
        # no Python stacks: they multiply the profiler's cost on the step thread
        kw["profiler_config"] = {
            "profiler": "torch",
            "torch_profiler_dir": str(profile_dir.resolve()),
            "torch_profiler_with_stack": False,
        }
    return kw


def workloads(args: argparse.Namespace, geometry: dict[str, int]) -> list[dict[str, Any]]:
    out = []
    # what a tier arm's engine has served before each workload, in order (the limit is `none`'s)
    served: list[tuple[dict[str, Any], int]] = []
    for size_text in args.images.split(","):
        size = parse_size(size_text)
        rows = image_tokens(*size, min_pixels=geometry["min_pixels"], max_pixels=geometry["max_pixels"])
        item_bytes = rows * geometry["hidden"] * 2
        options: dict[str, Any] = {
            "requests": args.requests_per_pass,
            "passes": args.passes,
            "item_bytes": item_bytes,
            "repeat_pool": args.repeat_pool,
            "pressure_pool": args.pressure_pool,
            "pressure_fill": args.pressure_fill,
            "zipf": args.zipf,
            "seed": args.seed,
        }
        for name in args.workloads.split(","):
            # the fleet's pools come from its total region: both replicas' (= the single engine's)
            built = (
                fleet_workloads(size, region_bytes=2 * args.region_mib * MiB, name=name, **options)
                if name in FLEET_WORKLOADS
                else [build(name, size, region_bytes=args.region_mib * MiB, **options)]
            )
            for wl in built:
                wl.notes.update(image_tokens=rows, item_bytes=item_bytes)
                wd = wl.to_dict()
                if wl.name.endswith("pressure"):
                    replicas, rule = (2, fleet_rule(args)) if wl.name.startswith("fleet-") else (1, None)
                    region = replicas * args.region_mib * MiB
                    policy = args.ours_extra.get("ec_eviction")
                    wd["notes"].update(
                        serving_expected.expected(wd, item_bytes, region, replicas, rule, policy, served)
                    )
                out.append(wd)
                if not wl.stub_encoder:
                    served.append((wd, item_bytes))
    return out


def plan_fill(notes: dict[str, Any]) -> str:
    """The plan's line on a pressure workload: its fill and the replay's expected hit ratios."""
    exp = notes["expected_hit_ratio"]
    line = (
        f"fill {notes['fill_requests']} requests ({notes['fill_rule']}), "
        f"{notes['distinct_before_measured']} distinct images before the first measured pass; "
        "expected hit ratio on the measured passes (replay in our table, tier only): "
        + ", ".join(f"{k} {v:.3f}" for k, v in exp.items())
    )
    if notes.get("expected_after_requests"):
        line += f" (after the engine's {notes['expected_after_requests']} requests of the workloads before)"
    per = notes.get("expected_hit_ratio_per_replica")
    if per:
        line += "; a region per replica: " + ", ".join(f"{k} {v:.3f}" for k, v in per.items())
    pair = notes.get("expected_hit_ratio_fleet")
    if pair:
        line += "; the pair pulling from each other: " + ", ".join(f"{k} {v:.3f}" for k, v in pair.items())
    return line


def epd_spec(args: argparse.Namespace, spec: dict[str, Any], run_id: str, tag: str) -> dict[str, Any]:
    """E→PD: the consumer takes the arm's connector as ec_consumer; a producer engine is added."""
    arm, region = spec["arm"], args.region_mib * MiB
    base, extra = f"bench-{run_id}-{tag}", args.ours_extra
    spec["connector"] = connector_config(arm, region, f"{base}-pd", "ec_consumer", extra)
    spec["producer_connector"] = connector_config(arm, region, f"{base}-e", "ec_producer", extra)
    spec["producer_engine"] = {
        **spec["engine"],
        "gpu_memory_utilization": args.epd_producer_mem,
        "max_num_batched_tokens": args.max_num_batched_tokens,
    }
    spec["engine"]["gpu_memory_utilization"] = args.gpu_memory_utilization or args.epd_consumer_mem
    return spec


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_id = f"{stamp}-{uuid.uuid4().hex[:6]}"
    work = out / f"work-{run_id}"
    work.mkdir()
    model = prepare_model(args, out)
    geometry = model_geometry(model)
    # the pixels of the largest image after the model's own resize (capping below it would shrink it)
    max_pixels = max(
        rw * rh
        for rw, rh in (
            resized(*parse_size(s), min_pixels=geometry["min_pixels"], max_pixels=geometry["max_pixels"])
            for s in args.images.split(",")
        )
    )
    wls = workloads(args, geometry)
    mode = run_mode(wls)
    arms = args.arms.split(",") if args.arms else list(mode_arms(mode))
    for arm in arms:
        if arm not in mode_arms(mode):
            raise SystemExit(f"unknown arm {arm!r}: expected some of {','.join(mode_arms(mode))}")
    est = estimate_s(args, arms, wls)
    names = [f"{w['name']}@{w['size'][0]}x{w['size'][1]}" for w in wls]
    print(
        f"serving bench {run_id}: mode {args.mode}, {args.rounds} round(s) x arms {','.join(arms)}, "
        f"workloads {','.join(names)}; "
        f"estimate {est / 60:.1f} min (engine start {args.est_start_s or 'default'} s, "
        f"{args.est_req_s:g} req/s assumed)",
        flush=True,
    )
    if mode == "fleet":
        print(
            f"  fleet: replicas round-robin, {args.region_mib} MiB region each ({2 * args.region_mib} MiB "
            f"single), memory share {args.gpu_memory_utilization or args.fleet_mem} an engine, the fleet "
            f"arm's extra connector keys {fleet_extra(args)}",
            flush=True,
        )
    for w in wls:
        n = w["notes"]
        print(
            f"  {w['name']}@{w['size'][0]}x{w['size'][1]}: {n['image_tokens']} tokens/image "
            f"({n['item_bytes'] / MiB:.2f} MiB), pool {w['pool'] or 'all new'}, region holds "
            f"{n['region_images']} images, passes {[len(p['seeds']) for p in w['passes']]} "
            f"(first not measured)"
            + (
                f", {cross_replica_repeats([p['seeds'] for p in w['passes']], 2)} measured requests "
                "repeat an image only the other replica has seen"
                if mode == "fleet"
                else ""
            ),
            flush=True,
        )
        if "expected_hit_ratio" in n:
            print(f"    {plan_fill(n)}", flush=True)
    if args.dry_run:
        shutil.rmtree(work, ignore_errors=True)
        return 0
    result: dict[str, Any] = {
        "bench": "serving",
        "run_id": run_id,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "host": os.uname().nodename,
        "device_note": args.device_note,
        "mode": args.mode,
        "argv": sys.argv[1:],
        "config": {k: v for k, v in vars(args).items() if k not in ("func", "command", "kind")},
        "model": str(model),
        "geometry": geometry,
        "fleet_extra": fleet_extra(args) if mode == "fleet" else None,
        # each pass's image seeds, request i of a pass being its i-th: with the passes' per-request
        # TTFTs they say which requests repeated an image
        "workloads": [
            {**{k: w[k] for k in ("name", "size", "pool", "notes")}, "passes": w["passes"]} for w in wls
        ],
        "engines": [],
    }
    json_path = out / f"serving-{args.mode}-{run_id}.json"
    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        run_rounds(args, result, json_path, work, wls, arms, model, max_pixels, mode)
    except (Stopped, KeyboardInterrupt) as why:
        result["stopped"] = str(why) or "interrupted"
        print(f"stopped ({result['stopped']}): keeping what finished", flush=True)
    json_path.write_text(json.dumps(result, indent=1))
    if not args.keep_work:
        shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {json_path}", flush=True)
    serving_report.print_report([result])
    failed = [e for e in result["engines"] if not e["status"].startswith(("ok", "skipped"))]
    return 1 if failed or "stopped" in result else 0


def run_rounds(
    args: argparse.Namespace,
    result: dict[str, Any],
    json_path: Path,
    work: Path,
    wls: list[dict[str, Any]],
    arms: list[str],
    model: Path,
    max_pixels: int,
    mode: str,
) -> None:
    """The alternating rounds; the JSON is rewritten after each engine, so a stop loses nothing done."""
    run_id = result["run_id"]
    t_start = time.monotonic()
    skipped: dict[str, str] = {}
    for r in range(args.first_round, args.first_round + args.rounds):
        for arm in rotated(arms, r):
            tag = f"r{r}-{arm}"
            if arm in skipped:
                result["engines"].append(
                    {"round": r, "arm": arm, "status": "skipped", "reason": skipped[arm]}
                )
                continue
            one = estimate_s(argparse.Namespace(**{**vars(args), "rounds": 1}), [arm], wls)
            need = engine_need_s(arm, one, result["engines"])
            left = args.budget_s - (time.monotonic() - t_start) if args.budget_s else float("inf")
            timeout = child_timeout(need, args.child_timeout_s, left)
            if timeout is None:
                print(f"round {r} arm {arm}: not run ({left:.0f} s of --budget-s left, ~{need:.0f} s needed)")
                result["engines"].append(
                    {"round": r, "arm": arm, "status": "not run (budget)", "need_s": round(need, 1)}
                )
                json_path.write_text(json.dumps(result, indent=1))
                continue
            mine = arm_workloads(arm, wls)
            spec = {
                "arm": arm,
                "tag": tag,
                "round": r,
                "results": str(work / f"{tag}.jsonl"),
                # fleet arms name their replicas' connectors instead (fleet_spec)
                "connector": None
                if mode == "fleet"
                else connector_config(
                    arm, args.region_mib * MiB, f"bench-{run_id}-{tag}", ours_extra=args.ours_extra
                ),
                "engine": engine_args(args, model, max_pixels, work / f"profile-{tag}"),
                "workloads": mine,
                "arrival": {"rate": args.rate} if args.rate else {"concurrency": args.concurrency},
                "max_tokens": args.max_tokens,
                "profile_pass": args.profile_pass,
            }
            if mode == "epd":
                spec = epd_spec(args, spec, run_id, tag)
            elif mode == "fleet":
                spec = fleet_spec(args, spec, run_id, tag)
            print(
                f"round {r} arm {arm}: starting engine (timeout {timeout:.0f} s, ~{need:.0f} s needed)",
                flush=True,
            )
            record = run_child(spec, work, json_path.parent / f"{run_id}-{tag}.log", timeout)
            record.update(round=r, arm=arm, estimate_s=round(one, 1), need_s=round(need, 1))
            result["engines"].append(record)
            if record["status"] == "skipped":
                skipped[arm] = record.get("reason", "skipped")
            print(f"round {r} arm {arm}: {record['status']} in {record['seconds']:.0f} s", flush=True)
            json_path.write_text(json.dumps(result, indent=1))


def report(args: argparse.Namespace) -> int:
    runs = [json.loads(Path(p).read_text()) for p in args.files]
    serving_report.print_report(runs)
    if args.png:
        serving_report.plot(runs, Path(args.png))
        print(f"wrote {args.png}")
    return 0


def json_object(text: str) -> dict[str, Any]:
    """`--ours-extra`'s value: a JSON object, else argparse's error naming what it got."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not JSON ({err})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {type(value).__name__}")
    return value


def workload_list(text: str) -> str:
    """`--workloads`: a comma list of known workload names, refused at parse time naming the unknown."""
    unknown = [name for name in text.split(",") if name not in WORKLOADS]
    if unknown:
        expected = ",".join(WORKLOADS)
        raise argparse.ArgumentTypeError(f"unknown workload(s) {','.join(unknown)}: expected {expected}")
    return text


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_commands(p)
    return p


def add_commands(p: argparse.ArgumentParser) -> None:
    """The `run` and `report` subcommands and their options, on `p` (this script's parser or the
    `ec-connector bench serving` one); each sets `func`, which takes the parsed arguments."""
    sub = p.add_subparsers(dest="serving_command", required=True, metavar="{run,report}")
    r = sub.add_parser("run", help="run the arms alternately and write one JSON")
    r.add_argument("--out", required=True, help="folder for the run's JSON, logs and model")
    r.add_argument("--model", help="a model folder (default: write tools/tiny_vlm.py --shape SHAPE)")
    r.add_argument(
        "--shape",
        choices=("tiny", "2b", "7b"),
        default="7b",
        help="model written when --model is absent (2b: the 7b's encoder, a 1.5B language model)",
    )
    r.add_argument("--mode", choices=("eager", "compiled"), default="eager", help="enforce_eager or not")
    r.add_argument(
        "--arms",
        default="",
        help=f"comma list of {','.join(ARMS)} (fleet: {','.join(FLEET_ARMS)}); default all of the run's",
    )
    r.add_argument(
        "--workloads",
        type=workload_list,
        default="unique,repeat,pressure,limit",
        help=f"comma list of {','.join(WORKLOADS)}",
    )
    r.add_argument("--images", default="896x672", help="comma list of image sizes, e.g. 896x672,448x336")
    r.add_argument("--rounds", type=int, default=3, help="alternating rounds (3)")
    r.add_argument("--first-round", type=int, default=0, help="first round's number (rotation continues)")
    r.add_argument("--requests-per-pass", type=int, default=96, help="unique and pressure pass size (96)")
    r.add_argument("--passes", type=int, default=2, help="measured passes per workload (2)")
    r.add_argument(
        "--repeat-pool", type=int, default=0, help="repeat pool (0: min(requests, 80%% of region))"
    )
    r.add_argument("--pressure-pool", type=int, default=0, help="pressure pool (0: 4x the region's images)")
    r.add_argument(
        "--pressure-fill",
        type=int,
        default=0,
        help="pressure's unmeasured fill, requests (0: until the distinct images drawn reach 3x the "
        "region's, at most 3/4 of the pool)",
    )
    r.add_argument("--zipf", type=float, default=0.8, help="pressure's Zipf exponent (0.8)")
    r.add_argument("--region-mib", type=int, default=512, help="ec_cpu_bytes of both connectors, MiB (512)")
    r.add_argument(
        "--ours-extra",
        type=json_object,
        default={},
        help='JSON object added to ours\' extra config, e.g. \'{"ec_eviction": "lecar"}\'',
    )
    load = r.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=int, default=32, help="closed loop: requests in flight (32)")
    load.add_argument("--rate", type=float, default=0.0, help="open loop: fixed arrival rate, req/s")
    r.add_argument("--max-tokens", type=int, default=8, help="output tokens per request (8, ignore_eos)")
    r.add_argument("--max-model-len", type=int, default=2048)
    r.add_argument("--max-num-seqs", type=int, default=64)
    r.add_argument("--max-num-batched-tokens", type=int, default=8192)
    r.add_argument("--gpu-memory-utilization", type=float, default=0.0, help="(0: vLLM's default)")
    r.add_argument("--epd-producer-mem", type=float, default=0.3, help="E->PD producer's GPU memory share")
    r.add_argument("--epd-consumer-mem", type=float, default=0.55, help="E->PD consumer's share (0.55)")
    r.add_argument(
        "--fleet-mem", type=float, default=0.42, help="fleet arms: every engine's GPU memory share"
    )
    r.add_argument(
        "--fleet-extra",
        default="",
        help="fleet arm: extra connector keys, JSON (default none; tiny shape: fleet_encode_us_per_row 1e5)",
    )
    r.add_argument("--seed", type=int, default=0, help="workload seed")
    r.add_argument(
        "--profile-pass",
        default="",
        help="profile this pass of every workload (e.g. pass2) with the torch profiler and keep a "
        "summary of its trace in the pass's record (a diagnostic run: the profiled pass is slower)",
    )
    r.add_argument("--child-timeout-s", type=float, default=0.0, help="per engine (0: 2x its need + 120)")
    r.add_argument("--est-start-s", type=float, default=0.0, help="engine start for the estimate")
    r.add_argument("--est-req-s", type=float, default=25.0, help="req/s for the estimate (25)")
    r.add_argument("--device-note", default="", help="what ran it (recorded in the JSON)")
    r.add_argument("--keep-work", action="store_true", help="keep the per-child specs and JSON lines")
    r.add_argument(
        "--budget-s", type=float, default=0.0, help="stop starting engines that would end past this (0: none)"
    )
    r.add_argument("--dry-run", action="store_true", help="print the plan and the estimate, start nothing")
    r.set_defaults(func=run)
    rep = sub.add_parser("report", help="merge run JSONs: ratios against upstream and none, spread")
    rep.add_argument("files", nargs="+")
    rep.add_argument("--png", help="write a PNG (needs matplotlib)")
    rep.set_defaults(func=report)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
