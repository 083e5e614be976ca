#!/usr/bin/env bash
# A tour of fairpool on the embedded SQLite store: pools, policies, borrowing, queueing with
# reasons, hard rejections, preemption with retry, release. Uses a fresh FAIRPOOL_HOME unless
# one is given, so it never touches your own pools.
set -euo pipefail
export FAIRPOOL_HOME="${FAIRPOOL_HOME:-$(mktemp -d -t fairpool-tour-XXXXXX)}"
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }
# A create rejected at once exits 1: shown, and the tour goes on.
rejected() { printf '$ %s\n' "$*"; "$@" && exit 1 || printf '(exit %s)\n' "$?"; }
field() { python3 -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }

say "A pool of 8 GPUs and 32 step slots (store: $FAIRPOOL_HOME)"
run fairpool resource-pool create training-gpus --capacity '{"gpu": 8, "step_run": 32}' \
    --description "Shared training GPUs"

say "Two teams: sandbox (priority 10) and prod (priority 100), 2 GPUs reserved each"
run fairpool resource-pool attach-policy training-gpus sandbox-orch --priority 10 \
    --reserved '{"gpu": 2}' --limit '{"gpu": 8}'
run fairpool resource-pool attach-policy training-gpus prod-orch --priority 100 \
    --reserved '{"gpu": 2}' --limit '{"gpu": 6}'
run fairpool resource-pool list-policies training-gpus

say "Sandbox bursts: 6 GPUs, 2 within its reserved share and 4 borrowed (preemptible)"
run fairpool resource-request create --component sandbox-orch --gpu-count 2 --cpu-count 4 --memory 16GiB --max-retries 1
run fairpool resource-request create --component sandbox-orch --gpu-count 2 --max-retries 1
run fairpool resource-request create --component sandbox-orch --gpu-count 2 --max-retries 1

say "Hard rejections never queue, and say why"
rejected fairpool resource-request create --component prod-orch --gpu-count 10
rejected fairpool resource-request create --component prod-orch --gpu-count 4 --non-preemptible

say "Prod needs 4 GPUs; only 2 are free: sandbox's newest borrowed run is preempted and retried"
prod=$(fairpool resource-request create --component prod-orch --gpu-count 4 -o json | field id)
run fairpool resource-request describe "${prod:0:8}"
run fairpool resource-pool requests training-gpus --view all

say "The retried sandbox step waits, with its position and reason"
run fairpool resource-request list --status queued
queued=$(fairpool resource-request list --status queued -o json | python3 -c "import json,sys; print(json.load(sys.stdin)['items'][0]['id'])")
run fairpool resource-request describe "${queued:0:8}"

say "Prod finishes: its units go back and the retry is granted"
run fairpool resource-request release "$prod"
run fairpool resource-request describe "${queued:0:8}" -o yaml
run fairpool resource-pool list

here="$(cd "$(dirname "$0")" && pwd)"
say "The declarative scheduler config (seed 004): m5.2xlarge capped at three instances"
run fairpool config apply -f "$here/scheduler/m5-cap.yaml" --yes
for i in 1 2 3 4; do
    printf '$ fairpool workload submit --instance-type m5.2xlarge --cpu 8 --memory-gb 32  -> '
    fairpool workload submit --instance-type m5.2xlarge --cpu 8 --memory-gb 32 -o json | field reason
done
run fairpool queue describe q-m5-2xlarge-cap3

say "Pool trees (seed 003): a guaranteed pool and a weighted one share two nodes"
run fairpool node add gpu-01 --tags gpu --resources '{"cpu": 64, "memory": "512GiB", "gpu": 8}'
run fairpool node add gpu-02 --tags gpu --resources '{"cpu": 64, "memory": "512GiB", "gpu": 8}'
run fairpool pool-tree create physical --node-tag-filter gpu --main-resource cpu
run fairpool pool create research --tree physical --strong-guarantee '{"cpu": 96}'
run fairpool pool create batch --tree physical --weight 3
run fairpool operation start --tree physical --pool batch --user alice \
    --job-resources '{"cpu": 1, "memory": "4GiB"}' --job-count 200
run fairpool operation start --tree physical --pool research --user bob \
    --job-resources '{"cpu": 4, "memory": "16GiB"}' --job-count 20
run fairpool pool-tree show physical

say "Research is below its fair share; once starving (timeout set to 0 here) it preempts batch's newest jobs"
run fairpool pool-tree set physical fair_share_starvation_timeout 0
run fairpool pool-tree reconcile physical
run fairpool pool-tree show physical
