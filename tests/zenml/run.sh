#!/usr/bin/env bash
# Run the ZenML integration tests against real ZenML, in their own virtual environment
# (ZenML 0.95-0.96 and fairpool installed together, so pip resolves one consistent set).
#   tests/zenml/run.sh [pytest args]        ZENML_VENV=path (default .zenml-venv) to reuse one
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -n "${ZENML_PREPARED:-}" ] || bash tests/zenml/prepare.sh
source tests/zenml/venv.sh
# Nothing of ZenML's may land in the user's config: each test sets its own ZENML_CONFIG_PATH;
# this one only covers ZenML's import-time defaults.
export ZENML_CONFIG_PATH="${ZENML_CONFIG_PATH:-$(mktemp -d)}"
export ZENML_ANALYTICS_OPT_IN=false
# Three workers, a test file each at a time: the tests mostly wait on ZenML's processes (two
# workers kept the two CPUs half busy), and the server tests share one ZenML server per file.
# pyproject's 300 s per test is for the main suite: here the demo takes ~150 s and the first
# server test ~170 s (its ZenML server's start included) on an idle machine, twice that and
# more on a loaded one; their own waits (the demo's 400 s, a scenario's 300 s) bound a hang.
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider -o timeout=900 -n 3 --dist loadfile \
    tests/zenml "$@"
