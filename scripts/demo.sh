#!/usr/bin/env bash
# Installs dependencies, builds, and runs `sala generate` on the built-in default model (a small
# checkpoint of RANDOM weights created on first use) — or on MODEL_DIR if given.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake --preset release
cmake --build --preset release -j "$(nproc)" --target sala
exec build/sala generate ${1:+"$1"} "${PROMPT:-Tell me about long-context language models.}" --max-tokens 64
