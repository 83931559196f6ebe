"""E→PD demo: an orchestrator between two real vLLM OpenAI servers on loopback.

    .venv-vllm/bin/python examples/e_pd_orchestrator.py [--log-dir DIR]   (the second half of `make demo`)

Starts an encoder-only producer (ec_producer) and a prefill/decode consumer (ec_consumer), both
with ECTierConnector and NIXL on, serving a tiny random-weight Qwen2-VL this project generates.
For each request it asks the producer first, takes the `ec_transfer_params` the producer
returns, forwards them in the consumer request, and prints what moved and how long it took. Every
consumer answer is compared with the consumer encoding the same image itself. The servers' logs go to
`producer.log` and `consumer.log` in the log directory, this process's own warnings to
`orchestrator.log`; the terminal gets the demo's lines only.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import TextIO

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
from demo_output import story_and_log  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def png(seed: int, size: tuple[int, int]) -> str:
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def start_server(model: Path, port: int, role: str, engine_id: str, log: Path):
    config = {
        "ec_connector": "ECTierConnector",
        "ec_role": role,
        "engine_id": engine_id,
        "ec_connector_extra_config": {"ec_cpu_bytes": 64 << 20, "ec_enable_nixl": True},
    }
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_EC_SIDE_CHANNEL_HOST": "127.0.0.1",
        "VLLM_EC_SIDE_CHANNEL_PORT": "0",  # any free port: the producer advertises it in its params
    }
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--served-model-name", "tiny", "--host", "127.0.0.1",
        "--port", str(port), "--dtype", "bfloat16", "--max-model-len", "512",
        "--max-num-seqs", "4", "--enforce-eager", "--no-enable-prefix-caching",
        "--limit-mm-per-prompt", json.dumps({"image": 2}),
        "--ec-transfer-config", json.dumps(config),
    ]  # fmt: skip
    return subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def wait_ready(port: int, proc: subprocess.Popen, name: str, log: Path, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{name} server exited ({proc.returncode}); see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return
        except OSError:
            time.sleep(1)
    raise SystemExit(f"{name} server not ready after {timeout:.0f} s; see {log}")


def chat(port: int, images: list[str], *, max_tokens: int, params: dict | None = None) -> tuple[dict, float]:
    content = [{"type": "image_url", "image_url": {"url": url}} for url in images]
    content.append({"type": "text", "text": "Describe."})
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "logprobs": False,
    }
    if params is not None:
        body["ec_transfer_params"] = params
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    started = time.perf_counter()
    with urllib.request.urlopen(req, timeout=120) as resp:
        answer = json.load(resp)
    return answer, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4, help="requests to send (4)")
    parser.add_argument("--log-dir", type=Path, default=None, help="where the logs go (a new temp dir)")
    args = parser.parse_args()
    logs = args.log_dir or Path(tempfile.mkdtemp(prefix="ec_demo_"))
    say = story_and_log(logs / "orchestrator.log")
    try:
        return run(args.requests, logs, say)
    except BaseException as exc:
        print(f"  failed: {exc!r}; the servers' logs are in {logs}", file=say)
        raise


def run(requests: int, logs: Path, say: TextIO) -> int:
    sys.path.insert(0, str(ROOT / "tools"))
    from tiny_vlm import write_tiny_qwen2_vl

    model = write_tiny_qwen2_vl(Path(tempfile.mkdtemp(prefix="ec_demo_model_")), random_weights=True, seed=0)
    ports = {"producer": free_port(), "consumer": free_port()}
    pid = os.getpid()
    servers = {
        role: start_server(model, ports[role], f"ec_{role}", f"demo-{role}-{pid}", logs / f"{role}.log")
        for role in ports
    }
    print(
        "  starting an encoder-only producer (E) and a prefill/decode consumer (PD) server, NIXL on "
        f"(logs: {logs}/producer.log, consumer.log)",
        file=say,
    )
    started = time.perf_counter()
    try:
        for role, proc in servers.items():
            wait_ready(ports[role], proc, role, logs / f"{role}.log")
        print(
            f"  servers ready in {time.perf_counter() - started:.0f} s: producer on :{ports['producer']}, "
            f"consumer on :{ports['consumer']}",
            file=say,
        )
        sizes = [(100, 80), (112, 112), (56, 56), (84, 112)]
        served = 0
        for n in range(requests):
            images = [png(n, sizes[n % len(sizes)])]
            produced, t_e = chat(ports["producer"], images, max_tokens=1)
            params = produced.get("ec_transfer_params") or {}
            moved = sum(item.get("size_bytes", 0) for item in params.values())
            advertised = [item for item in params.values() if item.get("peer_port")]
            sides = sorted({f"{item['peer_host']}:{item['peer_port']}" for item in advertised})
            answer, t_pd = chat(ports["consumer"], images, max_tokens=8, params=params)
            tokens = answer["usage"]["completion_tokens"]
            served += tokens == 8 and moved > 0
            print(
                f"  request {n}: producer encoded {len(params)} item(s) and published {moved} bytes "
                f"(side channel {', '.join(sides) or 'none'}) in {t_e * 1e3:.0f} ms; consumer pulled "
                f"them and answered {tokens} tokens in {t_pd * 1e3:.0f} ms",
                file=say,
            )
        log = (logs / "consumer.log").read_text()
        reads, fallbacks = log.count("outcome=read"), log.count("outcome=fallback")
        unavailable = log.count("outcome=unavailable")
        print(
            f"  consumer log: {reads} NIXL read(s), {fallbacks} fallback(s) to local encoding, "
            f"{unavailable} request(s) failed for an item no peer could serve",
            file=say,
        )
        print(f"  {served}/{requests} requests served through the producer's encodings", file=say)
        return 0 if served == requests and reads >= requests else 1
    finally:
        for proc in servers.values():
            proc.send_signal(signal.SIGINT)
        for proc in servers.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        left = sorted(Path("/dev/shm").glob(f"vllm_ec_demo-*-{pid}_dp*.mmap"))
        print(f"  servers stopped; region files left in /dev/shm: {len(left)}", file=say)


if __name__ == "__main__":
    sys.exit(main())
