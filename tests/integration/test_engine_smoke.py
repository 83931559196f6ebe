"""A real vLLM engine (CPU build, V1 runner, single process) serves the tiny random-weight Qwen2-VL.

Checks the test environment itself: the engine starts, generates greedily for a chat prompt with an
image, the output depends on the image (its embedding reaches the language model), and repeating a
request with the same image gives the same tokens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

IMAGE_TOKEN_ID = 6  # <|image_pad|> in tools/tiny_vlm.py
IMAGE_TOKENS = 12  # a 100x80 image: 6x8 patches of 14 px, merged 2x2


def engine_env() -> dict[str, str]:
    """A single-process CPU engine (no engine-core or worker subprocesses), offline."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        VLLM_CPU_KVCACHE_SPACE="1",  # GiB of KV cache
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        TOKENIZERS_PARALLELISM="false",
        # Load no general plugin: this checks the engine alone, not our connector plugin.
        VLLM_PLUGINS="",
    )
    return env


ENGINE_SCRIPT = r"""
import json
import resource
import sys
import time


def images():
    import numpy as np
    from PIL import Image

    y, x = np.mgrid[0:80, 0:100]
    gradient = np.stack([x * 2, y * 3, (x + y) % 256], axis=-1).astype(np.uint8)
    noise = np.random.default_rng(1).integers(0, 256, size=(80, 100, 3), dtype=np.uint8)
    return Image.fromarray(gradient), Image.fromarray(noise)


def main():
    model_dir, out_path = sys.argv[1], sys.argv[2]
    t0 = time.perf_counter()
    from vllm import LLM, SamplingParams

    t_import = time.perf_counter() - t0
    t0 = time.perf_counter()
    llm = LLM(
        model=model_dir,
        distributed_executor_backend="uni",
        dtype="bfloat16",
        max_model_len=512,
        max_num_seqs=4,
        seed=0,
        enforce_eager=True,  # no torch.compile: ~4 s engine start instead of ~35 s (cold) / ~18 s (cached)
        enable_prefix_caching=False,
        mm_processor_cache_gb=0,
        limit_mm_per_prompt={"image": 1},
    )
    t_start = time.perf_counter() - t0

    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    img_a, img_b = images()

    def chat(img):
        messages = [
            {
                "role": "user",
                "content": [
                    {"type": "image_pil", "image_pil": img},
                    {"type": "text", "text": "Describe this image."},
                ],
            }
        ]
        t = time.perf_counter()
        (out,) = llm.chat(messages, params, use_tqdm=False)
        dt = time.perf_counter() - t
        comp = out.outputs[0]
        return {
            "token_ids": list(comp.token_ids),
            "text": comp.text,
            "finish_reason": comp.finish_reason,
            "finished": out.finished,
            "prompt_token_ids": list(out.prompt_token_ids),
            "seconds": dt,
        }

    runs = {"a": chat(img_a), "b": chat(img_b), "a_again": chat(images()[0])}
    result = {
        "import_s": t_import,
        "engine_start_s": t_start,
        "runs": runs,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
"""


@pytest.fixture(scope="module")
def smoke_result(vllm_python: Path, tiny_vlm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("engine_smoke")
    script = work / "engine_smoke.py"
    script.write_text(ENGINE_SCRIPT)
    out = work / "result.json"
    proc = subprocess.run(
        [str(vllm_python), str(script), str(tiny_vlm_dir), str(out)],
        env=engine_env(),
        cwd=work,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-20000:] + proc.stderr[-20000:])
        pytest.fail(f"engine script exited with {proc.returncode} (its output is in the captured stderr)")
    result = json.loads(out.read_text())
    print(
        f"engine start {result['engine_start_s']:.1f} s (vllm import {result['import_s']:.1f} s), "
        f"generation {[round(r['seconds'], 3) for r in result['runs'].values()]} s, "
        f"peak RSS {result['peak_rss_mb']:.0f} MB"
    )
    return result


def test_generation_finishes_with_tokens(smoke_result: dict) -> None:
    for name, run in smoke_result["runs"].items():
        assert run["finished"], name
        assert run["finish_reason"] == "length", name
        assert len(run["token_ids"]) == 8, name
        assert run["prompt_token_ids"].count(IMAGE_TOKEN_ID) == IMAGE_TOKENS, name


def test_tokens_depend_on_the_image(smoke_result: dict) -> None:
    runs = smoke_result["runs"]
    assert runs["a"]["prompt_token_ids"] == runs["b"]["prompt_token_ids"]
    assert runs["a"]["token_ids"] != runs["b"]["token_ids"]


def test_same_image_same_tokens(smoke_result: dict) -> None:
    runs = smoke_result["runs"]
    assert runs["a"]["token_ids"] == runs["a_again"]["token_ids"]
