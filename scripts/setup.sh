#!/usr/bin/env bash
# Installs every build and test dependency of sala from Debian packages. Non-interactive and
# idempotent: packages already present are left alone, so running it twice is safe.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config git
  nlohmann-json3-dev libfmt-dev libspdlog-dev libcli11-dev libcpp-httplib-dev libcurl4-openssl-dev
  libopenblas-dev libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-numpy python3-torch python3-matplotlib
  curl jq bsdutils  # tests/cli/test_server.sh, test_models.sh (bsdutils: script(1), a terminal for the progress bar)
)
# The server test's official openai client needs node + npm. Debian's are installed only when no
# node is on the PATH: a NodeSource (or nvm) node brings its own npm, which Debian's npm conflicts with.
command -v node >/dev/null 2>&1 || packages+=(nodejs npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "setup: all dependencies present"
