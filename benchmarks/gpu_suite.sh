#!/usr/bin/env bash
# The GPU suite, as a change to the kernels or the evaluator must pass it (README, "Tests"):
#
#     bash benchmarks/gpu_suite.sh [LOG]        (default LOG: benchmarks/results/pytest_gpu_<card>.log: h200, h100)
#     PARTS=1 bash benchmarks/gpu_suite.sh LOG1; PARTS=2 bash benchmarks/gpu_suite.sh LOG2
#                                               (one part per call, where a call has a time limit)
#
# It is `pytest -m gpu`, in two parts that together select every GPU test exactly once:
#   1. the tests whose verdict rests on bits (real-shape plans, the library roots through the evaluator,
#      the jail, apply_tik), with pytest-xdist's workers side by side where it is installed (their
#      Triton compiles run on the host's cores at once; none of them reads a clock);
#   2. the tests marked gpu_timing (the timed evaluations, the planted timing cheats, the benchmark
#      harness's graph replay), alone on the device, one after another.
# The log holds both parts' output and their exit statuses; the script exits non-zero if either failed.
set -u
CARD=$(PYTHONPATH=${PYTHONPATH:-}:. "${PYTHON:-python3}" -c "from benchmarks.harness import card_tag; print(card_tag('cuda'))" 2>/dev/null || echo cpu)
LOG=${1:-benchmarks/results/pytest_gpu_${CARD}.log}
case ${PARTS:-12} in
    1 | 2 | 12) ;;
    *) echo "gpu_suite.sh: PARTS must be 1, 2 or 12 (got '$PARTS')" >&2; exit 2 ;;
esac
mkdir -p "$(dirname "$LOG")"
export PYTHONPATH=${PYTHONPATH:-}:. PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
workers=${WORKERS:-4}
# the folders that hold GPU tests: elsewhere (agent, store, tui) test modules import the UI's packages, which a
# GPU machine may lack, and a module that cannot be imported stops a plain pytest run at collection
where=(tests/kernels tests/evaluator tests/hf tests/benchmarks tests/e2e)
par=()
if "$py" -c "import xdist" 2>/dev/null; then par=(-n "$workers"); fi
{
    echo "== gpu suite: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    "$py" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
    t0=$SECONDS
    rc1=0 rc2=0
    if [[ ${PARTS:-12} == *1* ]]; then
        echo "== part 1: -m 'gpu and not gpu_timing' ${par[*]}"
        "$py" -m pytest -q -m "gpu and not gpu_timing" "${par[@]}" "${where[@]}"
        rc1=$?
        echo "== part 1: rc=$rc1 in $((SECONDS - t0)) s"
    fi
    t1=$SECONDS
    if [[ ${PARTS:-12} == *2* ]]; then
        echo "== part 2: -m gpu_timing (alone on the device)"
        "$py" -m pytest -q -m gpu_timing "${where[@]}"
        rc2=$?
        echo "== part 2: rc=$rc2 in $((SECONDS - t1)) s"
    fi
    echo "== gpu suite: rc=$((rc1 || rc2)) in $((SECONDS - t0)) s"
    exit $((rc1 || rc2))
} 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
