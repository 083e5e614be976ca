#!/usr/bin/env bash
# Run the ZenML integration tests against real ZenML, in their own virtual environment
# (ZenML 0.95-0.96 and fairpool installed together, so pip resolves one consistent set).
#   tests/zenml/run.sh [pytest args]        ZENML_VENV=path (default .zenml-venv) to reuse one
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
VENV=${ZENML_VENV:-.zenml-venv}
if [ ! -x "$VENV/bin/zenml" ]; then
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --upgrade pip
    # One resolver run for both: installed one after the other, fairpool's fastapi pulls an
    # opentelemetry-api that ZenML's opentelemetry-sdk pin refuses.
    "$VENV/bin/pip" install --quiet -e . 'zenml[local,server]>=0.95,<0.97' 'pytest>=8,<10' \
        'mypy>=1.10' types-PyYAML
fi
"$VENV/bin/pip" check
# The integration type-checks against the real ZenML (the main mypy run excludes it, so
# pyproject's mypy settings are not read here: --config-file "").
"$VENV/bin/mypy" --config-file "" --strict --python-version 3.11 fairpool/integrations/zenml
# Nothing of ZenML's may land in the user's config: each test sets its own ZENML_CONFIG_PATH;
# this one only covers ZenML's import-time defaults.
export ZENML_CONFIG_PATH="${ZENML_CONFIG_PATH:-$(mktemp -d)}"
export ZENML_ANALYTICS_OPT_IN=false
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/zenml "$@"
