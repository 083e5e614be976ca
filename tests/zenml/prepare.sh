#!/usr/bin/env bash
# The ZenML stage's set-up, apart from its tests: its virtual environment (made once), a check
# of its requirements, and a type check of the integration against the real ZenML (the main
# mypy run excludes it, so pyproject's mypy settings are not read here: --config-file "").
# `make test` runs this while the main suite runs (35 s, mostly one CPU's); run.sh runs it
# first unless told it was (ZENML_PREPARED=1).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/zenml/venv.sh
"$VENV/bin/pip" check
"$VENV/bin/mypy" --config-file "" --strict --python-version 3.11 fairpool/integrations/zenml
