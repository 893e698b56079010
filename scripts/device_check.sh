#!/usr/bin/env bash
# The GPU check in one command (issue 27 item 5): backbone prefill / decode against transformers in bfloat16
# (SmolLM2-135M's architecture and the llama-3.2-1b preset, random weights), one PPO update's model FLOP
# utilisation, one Trigger and one Planner decision beside the paper's Figure 10; one table at the end.
#
#   bash scripts/device_check.sh            # on a machine with a GPU; stops after 8 minutes
#   bash scripts/device_check.sh --smoke    # toy sizes on any backend (what the test suite runs on CPU)
#
# It needs jax with the GPU plugin, torch with CUDA and transformers, plus this project's pure-Python
# dependencies. Wheels in .whl/ (e.g. qwix, gguf, ml-collections, or a whole jax 0.10 stack when the machine's
# flax does not run on its jax) are installed into /tmp/site first, without touching the machine's packages.
set -euo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # JAX and torch share the GPU
export PYTHONUNBUFFERED=1
exec timeout "${DEVICE_CHECK_TIMEOUT_S:-480}" python3 scripts/device_check.py "$@"
