# Sourced by tests/zenml/run.sh and examples/zenml/run.sh, from the repository's root:
# makes (once) the virtual environment with ZenML 0.95-0.96 and fairpool installed together,
# and sets VENV to it.   ZENML_VENV=path (default .zenml-venv) to use another one.
PYTHON=${PYTHON:-python3}
VENV=${ZENML_VENV:-.zenml-venv}
# pytest-timeout too: pyproject's pytest settings name its option (an unknown one is an error);
# pytest-xdist for tests/zenml/run.sh's two workers. Made again when fairpool's API does not
# import there: a dependency added since (orjson, 2026-11-25; fastapi_offline, whose files are
# read only when the app is made, 2026-11-27) is then installed.
if [ ! -x "$VENV/bin/zenml" ] || ! "$VENV/bin/python" -c "import pytest_timeout, xdist, fairpool.api.app, fastapi_offline" 2>/dev/null; then
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet uv   # as the Makefile's venv: uv, bytecode compiled
    # One resolver run for both: installed one after the other, fairpool's fastapi pulls an
    # opentelemetry-api that ZenML's opentelemetry-sdk pin refuses.
    "$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" --compile-bytecode \
        -e . 'zenml[local,server]>=0.95,<0.97' 'pytest>=8,<10' \
        'pytest-timeout>=2.3,<3' 'pytest-xdist>=3.5,<4' 'mypy>=1.10' types-PyYAML
fi
