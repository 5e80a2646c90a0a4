# Shared preamble of the CLI end-to-end scripts (sourced, not a test: CMake runs tests/cli/test_*.sh).
# Sets SALA (required), SALA_ROOT, a scratch dir $tmp removed on exit, SALA_HOME inside it (so a
# test never touches the user's model cache), strict mode, and fail MESSAGE.
set -euo pipefail
SALA=${SALA:?set SALA to the sala binary}
SALA_ROOT=${SALA_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export SALA_HOME=$tmp/home

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
