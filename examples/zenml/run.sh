#!/usr/bin/env bash
# make zenml-demo: a real ZenML dynamic pipeline whose GPU steps fairpool queues and grants.
#
# In the ZenML virtual environment (made on first use, as for the tests; ZENML_VENV=path to
# use another), with a throw-away ZENML_CONFIG_PATH (nothing lands in ~/.config/zenml):
#   1. a local ZenML server on 127.0.0.1 that loads fairpool as its resource-pool
#      implementation (ZENML_SERVER_RESOURCE_POOL_IMPLEMENTATION_SOURCE);
#   2. the fairpool_local orchestrator flavor (stoppable isolated steps), a stack on it;
#   3. a 2-GPU pool and a policy for that orchestrator, with the stock `zenml resource-pool`;
#   4. the pipeline: three 1-GPU steps at once -- two run, one is queued, then granted.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/zenml/venv.sh
case "$VENV" in /*) ;; *) VENV="$PWD/$VENV" ;; esac
export PATH="$VENV/bin:$PATH"

ZENML_CONFIG_PATH="$(mktemp -d)"
WATCH_CONFIG_PATH="$(mktemp -d)"
export ZENML_CONFIG_PATH
export ZENML_ANALYTICS_OPT_IN=false ZENML_AUTO_OPEN_DASHBOARD=false
export ZENML_LOGGING_COLORS_DISABLED=true ZENML_ENABLE_RICH_TRACEBACK=false COLUMNS=160
export ZENML_SERVER_RESOURCE_POOL_IMPLEMENTATION_SOURCE=fairpool.integrations.zenml.store.FairpoolResourcePools
PIPELINE_PID=
cleanup() {
    [ -n "$PIPELINE_PID" ] && kill "$PIPELINE_PID" 2>/dev/null || true
    zenml logout --local >/dev/null 2>&1 || true
    rm -rf "$ZENML_CONFIG_PATH" "$WATCH_CONFIG_PATH"
}
trap cleanup EXIT

run() { echo "\$ $*"; "$@"; }
PORT=$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

# The server inherits ZENML_SERVER_RESOURCE_POOL_IMPLEMENTATION_SOURCE from this shell.
run zenml login --local --ip-address 127.0.0.1 --port "$PORT"
run zenml orchestrator flavor register fairpool.integrations.zenml.orchestrator.FairpoolLocalOrchestratorFlavor
run zenml orchestrator register fairpool -f fairpool_local
run zenml stack register fairpool-demo -o fairpool -a default --set
run zenml resource-pool create training-gpus --capacity '{"gpu": 2}'
run zenml resource-pool attach-policy training-gpus fairpool -p 10 -r '{"gpu": 2}' -l '{"gpu": 2}'

# watch.py gets a client config of its own, copied now that it names the server and stack:
# ZenML rewrites config.yaml in place (no atomic rename), so a process starting while the
# pipeline's writes it can read it empty and fall back to a local SQLite store, for good.
cp "$ZENML_CONFIG_PATH"/*.yaml "$WATCH_CONFIG_PATH"/
LOG="$ZENML_CONFIG_PATH/pipeline.log"
echo "\$ python examples/zenml/pipeline.py --models small,medium,large --seconds 10   (log: below)"
python examples/zenml/pipeline.py --models small,medium,large --seconds 10 >"$LOG" 2>&1 &
PIPELINE_PID=$!
ZENML_CONFIG_PATH="$WATCH_CONFIG_PATH" python examples/zenml/watch.py training-gpus --timeout 300
status=0
wait "$PIPELINE_PID" || status=$?
PIPELINE_PID=
echo
echo "--- the pipeline's output (ZenML's log)"
grep -E "Step|step|Waiting for resource|approved|trained for|Pipeline" "$LOG" || true
echo
run zenml resource-request list --columns id,status,status_reason,requested_resources
exit "$status"
