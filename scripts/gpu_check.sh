#!/usr/bin/env bash
# One prepared run of every GPU check, for a lent GPU machine: under 10 minutes in all.
#
#   scripts/gpu_check.sh OUTDIR            # from the repository root or anywhere
#   PYTHON=/path/to/python scripts/gpu_check.sh OUTDIR
#   scripts/gpu_check.sh --list-cuda-tests # the test files the pytest step passes, one a line; needs no GPU
#
# Runs, each under its own time limit, writing into OUTDIR:
#   env.json               GPU name, driver, torch / transformers / triton versions
#   pytest-cuda.xml + .log the tests marked `cuda` (pytest -m cuda over the files that hold a `cuda` mark)
#   sampling.json          benchmarks/sampling.py --device cuda
#   noise.json             benchmarks/noise.py --device cuda (the exponential race against one uniform and the inverse
#                          CDF: whether unseeded rows off the CPU should draw as they do on it)
#   attention.json         benchmarks/attention.py --device cuda (Triton kernel against the torch reference)
#   serving.json           benchmarks/serving.py --device cuda
#   roofline.json          benchmarks/roofline.py --device cuda (bandwidth, matmul peak, decode/prefill points)
#   profile_step.json      benchmarks/profile_step.py --device cuda (GPU kernel time against the wall, per decode step)
#   summary.json           exit status and seconds of every step
# Each step's stdout/stderr go to OUTDIR/<step>.log. A failed step does not stop the others; the script exits 1 if
# any step failed, 2 (at once, before anything runs) if torch sees no CUDA GPU.
# Taught in: README.md (Performance); the figures go to chapters/06-prefill-decode-kv-cache.ipynb and 07.
set -uo pipefail

if [ $# -ne 1 ] || [ -z "$1" ]; then
    echo "usage: scripts/gpu_check.sh OUTDIR | --list-cuda-tests" >&2
    exit 64
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# The GPU image has torch, transformers, triton, pytest, numpy, safetensors, httpx and prometheus-client, not the
# course's other packages (fastapi, pydantic, openai, llguidance, hypothesis, matplotlib, the widgets), so pytest
# over all of tests/ stops at collection on the first module that imports one. The pytest step passes only the files
# that hold a `cuda` mark; tests/repo/test_gpu_check_imports.py checks that they (and the benchmarks) import without
# those packages and that no `cuda` test lives elsewhere.
cuda_test_files() { (cd "$ROOT" && grep -rlE --include='test_*.py' '\bmark\.cuda\b' tests | LC_ALL=C sort); }
if [ "$1" = "--list-cuda-tests" ]; then
    cuda_test_files
    exit 0
fi
mkdir -p "$1" || { echo "gpu_check: cannot create output folder $1" >&2; exit 64; }
OUT="$(cd "$1" && pwd)"
cd "$ROOT"

# The project's venv is CPU-only on the course machine; on a GPU machine use whatever python has CUDA torch.
if [ -n "${PYTHON:-}" ]; then
    PY="$PYTHON"
elif [ -x .venv/bin/python ] && .venv/bin/python -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    PY=.venv/bin/python
else
    PY=python3
fi
export PYTHONPATH="$ROOT/lib${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1

if ! "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    echo "gpu_check: no CUDA GPU: torch.cuda.is_available() is False for $PY" \
         "($("$PY" -c 'import torch; print("torch", torch.__version__)' 2>/dev/null || echo 'torch not importable'))." \
         "Run this on a machine with an NVIDIA GPU and a CUDA build of torch (set PYTHON=... to choose the interpreter)." >&2
    exit 2
fi

"$PY" - "$OUT/env.json" <<'EOF'
import datetime, json, platform, subprocess, sys
import torch
info = {"gpu": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        "date": datetime.date.today().isoformat()}
for name in ("transformers", "triton"):
    try:
        info[name] = __import__(name).__version__
    except ImportError:
        info[name] = None
try:
    info["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                         "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
except OSError:
    info["nvidia_smi"] = None
open(sys.argv[1], "w").write(json.dumps(info, indent=1) + "\n")
print(json.dumps(info))
EOF

declare -a SUMMARY=()
FAILED=0
step() {  # step NAME SECONDS COMMAND...: run under `timeout`, log to OUT/NAME.log, record status and time
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    echo "== $name (limit ${limit}s): $*"
    timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    local took=$((SECONDS - start))
    [ $rc -eq 0 ] || FAILED=1
    [ $rc -eq 124 ] && echo "   $name ran past ${limit}s and was stopped"
    echo "   rc=$rc in ${took}s; last lines:"
    tail -n 5 "$OUT/$name.log" | sed 's/^/   | /'
    SUMMARY+=("{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $took}")
}

# limits add up to 490 s (560 s with each step's 10 s grace before a kill), under the 10 minutes one command may
# run on a lent machine (tests/repo/test_benchmarks.py checks the sum); the stored run took 26, 13, 16, 43 and 27 s for
# pytest-cuda, sampling, attention, serving and roofline. serving has since gained two runs of the 64 requests one at
# a time (about 1,900 steps each, best of 2), so its limit took 30 s from sampling's and attention's
mapfile -t CUDA_TESTS < <(cuda_test_files)
if [ ${#CUDA_TESTS[@]} -eq 0 ]; then  # pytest without paths would collect all of testpaths
    echo "gpu_check: no test file under tests/ holds a cuda mark" >&2
    exit 1
fi
step pytest-cuda 100 "$PY" -m pytest -m cuda -p no:cacheprovider -q --junitxml "$OUT/pytest-cuda.xml" "${CUDA_TESTS[@]}"
step sampling 45 "$PY" benchmarks/sampling.py --device cuda --repeats 3 --out "$OUT/sampling.json"
step noise 30 "$PY" benchmarks/noise.py --device cuda --repeats 3 --out "$OUT/noise.json"
step attention 35 "$PY" benchmarks/attention.py --device cuda --repeats 20 --out "$OUT/attention.json"
step serving 130 "$PY" benchmarks/serving.py --device cuda --repeats 2 --out "$OUT/serving.json"
step roofline 60 "$PY" benchmarks/roofline.py --device cuda --out "$OUT/roofline.json"
step profile 90 "$PY" benchmarks/profile_step.py --device cuda --out "$OUT/profile_step.json"

{
    echo "["
    for i in "${!SUMMARY[@]}"; do
        [ "$i" -gt 0 ] && echo ","
        printf ' %s' "${SUMMARY[$i]}"
    done
    echo ""
    echo "]"
} >"$OUT/summary.json"
echo "wrote $OUT (summary.json: exit status of every step)"
exit $FAILED
