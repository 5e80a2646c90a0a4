#!/usr/bin/env bash
# Installs dependencies, builds everything (CUDA code too when nvcc is present), runs every test.
# This is the README's test command and what CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake --preset release
cmake --build --preset release -j "$(nproc)"
ctest --preset release -j "$(nproc)" --timeout 1200
