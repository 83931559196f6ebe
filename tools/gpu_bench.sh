#!/usr/bin/env bash
# The serving bench's H200 calls (docs/serving-bench.md), one named call per 10-minute command.
#
#   bash tools/gpu_bench.sh CALL [BUDGET_S] [EXTRA ARGS...]
#   bash tools/gpu_bench.sh --print CALL [BUDGET_S] [EXTRA ARGS...]   # the bench's arguments only
#
# Run from the repository root once vLLM 0.33 is unpacked to /tmp/site and the project's wheels are
# in /tmp/deps (the E->PD and fleet calls need nixl there too). EXTRA ARGS go to the bench after the
# call's own (e.g. --first-round 3, or --ours-extra '{"ec_eviction": "lecar"}'); a later option of
# the same name wins.
# CALL (BUDGET_S: the bench's --budget-s, default 470; the command's timeout is 45 s more):
#   eager             unique, repeat, limit; 3 rounds, 64 requests a pass
#   pressure          pressure at steady state: a 600-request fill, 3 passes of 64; 2 rounds
#   epd               E->PD, producer + consumer on the one GPU; 3 rounds, 48 a pass
#   fleet             two replicas behind a round-robin client; 1 round (more with --first-round)
#   fleet-pressure    the fleet's pressure shape alone; 1 round (more with --first-round)
#   fleet-large       fleet-pressure at 1344x1008 (1728 tokens an image: the encoder a larger share); 1 round
#   fleet-2b          the fleet's two shapes with the 2b model (the 7b's encoder, a 1.5B language model) and
#                     a 219 MiB region per replica (97 of its 2.4 MB items, as 512 MiB holds of the 7b's); 1 round
#   fleet-2b-large    fleet-2b at 1344x1008 (43 of its 5.3 MB items a region, as fleet-large's); 1 round
#   fleet-2b-xl       fleet-pressure with the 2b model at 1792x1344 (3072 tokens, 9.4 MB an item: the encoder
#                     most of a request), each replica's region a quarter of the pool (48 of 195); 1 round
#   pressure-2b-xl    pressure with the 2b model at 1792x1344, arms none, upstream, ours, a 219 MiB region
#                     (24 of 195 images, 12%); 2 rounds
#   compiled          unique, repeat, limit in compiled mode; 1 round, 48 a pass
#   compiled-pressure pressure in compiled mode; 1 round
#   compiled-epd      E->PD in compiled mode; 1 round
#   small-images      unique, repeat, limit at 448x336; 3 rounds, 64 a pass
#   small-profile     unique at 448x336, its second pass under the torch profiler (a diagnostic:
#                     the summaries are in the JSON's pass records); 1 round
#
# Writes to $OUT (default ./gpu-out): serving-CALL.txt (the bench's output), the run's JSON, and
# CALL-logs.tgz (the engines' logs, without the model). The device returns few, shallow files, so
# the run itself writes under /tmp/bench-CALL.
set -uo pipefail

PRINT=0
if [ "${1:-}" = "--print" ]; then PRINT=1; shift; fi
CALL=${1:-}
[ -n "$CALL" ] || { awk 'NR == 1 { next } /^#/ { print; next } { exit }' "$0"; exit 2; }
shift
BUDGET=470
if [ $# -gt 0 ] && [[ $1 =~ ^[0-9]+$ ]]; then BUDGET=$1; shift; fi

case "$CALL" in
  eager) ARGS=(--mode eager --workloads unique,repeat,limit --rounds 3 --requests-per-pass 64) ;;
  pressure) ARGS=(--mode eager --workloads pressure --rounds 2 --requests-per-pass 64 --passes 3
                  --pressure-fill 600 --est-req-s 17) ;;
  epd) ARGS=(--mode eager --workloads epd --rounds 3 --requests-per-pass 48 --est-start-s 25 --est-req-s 15) ;;
  fleet|fleet-pressure) ARGS=(--mode eager --workloads "$CALL" --rounds 1 --requests-per-pass 64 --passes 3
                              --pressure-fill 1200) ;;
  fleet-large) ARGS=(--mode eager --images 1344x1008 --workloads fleet-pressure --rounds 1 --requests-per-pass 64
                     --passes 3 --pressure-fill 600 --est-req-s 12) ;;
  fleet-2b) ARGS=(--shape 2b --region-mib 219 --mode eager --workloads fleet --rounds 1 --requests-per-pass 64
                  --passes 3 --pressure-fill 1200 --est-req-s 40) ;;
  fleet-2b-large) ARGS=(--shape 2b --region-mib 219 --mode eager --images 1344x1008 --workloads fleet --rounds 1
                        --requests-per-pass 64 --passes 3 --pressure-fill 600 --est-req-s 20) ;;
  fleet-2b-xl) ARGS=(--shape 2b --region-mib 440 --pressure-pool 195 --mode eager --images 1792x1344
                     --max-model-len 4096 --workloads fleet-pressure --rounds 1 --requests-per-pass 64 --passes 3
                     --pressure-fill 600 --est-req-s 15) ;;
  pressure-2b-xl) ARGS=(--shape 2b --region-mib 219 --pressure-pool 195 --mode eager --images 1792x1344
                        --max-model-len 4096 --workloads pressure --arms none,upstream,ours --rounds 2
                        --requests-per-pass 64 --passes 3 --pressure-fill 600 --est-req-s 15) ;;
  compiled) ARGS=(--mode compiled --workloads unique,repeat,limit --rounds 1 --requests-per-pass 48) ;;
  compiled-pressure) ARGS=(--mode compiled --workloads pressure --rounds 1 --requests-per-pass 64 --passes 3
                           --pressure-fill 600 --est-req-s 17) ;;
  compiled-epd) ARGS=(--mode compiled --workloads epd --rounds 1 --requests-per-pass 48 --est-req-s 15) ;;
  small-images) ARGS=(--mode eager --images 448x336 --workloads unique,repeat,limit --rounds 3
                      --requests-per-pass 64) ;;
  small-profile) ARGS=(--mode eager --images 448x336 --workloads unique --rounds 1 --requests-per-pass 64
                       --profile-pass pass2) ;;
  *) echo "gpu_bench.sh: unknown call $CALL (see the header)" >&2; exit 2 ;;
esac
ARGS=(--shape 7b "${ARGS[@]}" --budget-s "$BUDGET" --out "/tmp/bench-$CALL"
      --device-note "H200, vLLM 0.33, $CALL" "$@")

if [ $PRINT = 1 ]; then
  printf '%q ' "${ARGS[@]}"
  echo
  exit 0
fi

[ -f pyproject.toml ] && [ -f bench/serving.py ] || { echo "gpu_bench.sh: run it from the repository root" >&2; exit 2; }
OUT=${OUT:-./gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:$PWD:/tmp/deps${PYTHONPATH:+:$PYTHONPATH}
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
started=$(mktemp)  # only this run's JSON goes to $OUT, not those of earlier calls on a warm machine
timeout $((BUDGET + 45)) python3 bench/serving.py run "${ARGS[@]}" > "$OUT/serving-$CALL.txt" 2>&1
rc=$?
find "/tmp/bench-$CALL" -maxdepth 1 -name 'serving-*.json' -newer "$started" -exec cp {} "$OUT/" \; 2>/dev/null
rm -f "$started"
tar -czf "$OUT/$CALL-logs.tgz" -C "/tmp/bench-$CALL" --exclude='*.safetensors' --exclude=model \
  --exclude='*.pt.trace.json*' . 2>/dev/null
tail -40 "$OUT/serving-$CALL.txt"
exit $rc
