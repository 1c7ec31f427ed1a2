#!/usr/bin/env bash
# One entry point for a fresh machine: installs what is missing, then runs a job.
#   bash run.sh demo   the main job (replay and workload summary on bundled data)
#   bash run.sh test   the whole test suite, formatting and lints (what CI runs)
set -euo pipefail
cd "$(dirname "$0")"

need_apt=()
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
# highs-sys generates its bindings with bindgen, which loads libclang at build time.
if ! ls /usr/lib/llvm-*/lib/libclang*.so* /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1; then
  need_apt+=(libclang1-14 libclang-14-dev)
fi
command -v c++ >/dev/null 2>&1 || need_apt+=(g++)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "run.sh: installing system packages: ${need_apt[*]}" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
if [ -z "${LIBCLANG_PATH:-}" ]; then
  for d in /usr/lib/llvm-*/lib; do [ -e "$d/libclang.so" ] || [ -e "$d/libclang.so.1" ] && export LIBCLANG_PATH="$d"; done
fi

case "${1:-}" in
  demo)
    cargo build --release --quiet --bin infersched
    exec bash notebooks-data/examples/demo.sh target/release/infersched
    ;;
  test)
    cargo fmt --all -- --check
    cargo clippy --workspace --all-targets --quiet -- -D warnings
    cargo test --workspace --quiet
    ;;
  *)
    echo "usage: bash run.sh demo|test" >&2
    exit 2
    ;;
esac
