#!/usr/bin/env bash
# One entry point for a fresh machine: installs what is missing, then runs a job.
#   bash run.sh demo   the main job (a demo comparison on bundled data)
#   bash run.sh test   the whole test suite, formatting and lints (what CI runs), the
#                      Python package's and the notebooks' included
#
# A new machine needs: the Rust toolchain (cargo, rustfmt, clippy) and Debian's apt.
# run.sh installs, when missing: cmake and a C++ compiler (HiGHS is built from source by
# highs-sys) and libclang (bindgen, which generates highs-sys's bindings, loads it).
set -euo pipefail
cd "$(dirname "$0")"

# The shared library bindgen (clang-sys) loads: libclang.so, libclang-<N>.so[.*] or
# libclang.so.<N>. Not libclang-cpp*, the C++ interface, which Debian images ship alone.
find_libclang() {
  local d f
  for d in ${LIBCLANG_PATH:+"$LIBCLANG_PATH"} /usr/lib/llvm-*/lib /usr/lib/x86_64-linux-gnu \
    /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib /usr/local/lib; do
    [ -d "$d" ] || continue
    for f in "$d"/libclang*.so*; do
      [ -e "$f" ] || continue
      if [[ "$(basename "$f")" =~ ^libclang(-[0-9][0-9.]*)?\.so(\.[0-9][0-9.]*)?$ ]]; then
        echo "$d"
        return 0
      fi
    done
  done
  return 1
}

need_apt=()
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
command -v c++ >/dev/null 2>&1 || need_apt+=(g++)
find_libclang >/dev/null || need_apt+=(libclang-dev)
# The Python package's tests (run.sh test) need Python 3.9+ with venv and pip.
if [ "${1:-}" = test ]; then
  command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
  python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need_apt+=(python3-venv)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      SUDO=(sudo -n)
    else
      echo "run.sh: missing system packages: ${need_apt[*]}" >&2
      echo "run.sh: cannot install them (not root, no password-less sudo). Run:" >&2
      echo "    sudo apt-get update && sudo apt-get install -y ${need_apt[*]}" >&2
      exit 1
    fi
  fi
  echo "run.sh: installing system packages: ${need_apt[*]}" >&2
  "${SUDO[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
if ! LIBCLANG_DIR="$(find_libclang)"; then
  echo "run.sh: libclang (libclang.so or libclang-<N>.so) is still missing after installing" >&2
  echo "run.sh: libclang-dev; install it and set LIBCLANG_PATH to its directory." >&2
  exit 1
fi
export LIBCLANG_PATH="$LIBCLANG_DIR"

# The Python package (python/, a workspace member: formatted and linted above): built by
# pip (maturin) into a virtual environment under target/ with the profile and --target of
# the tests above, so it reuses the library they compiled; then its tests (byte-for-byte
# parity with the command `cargo test` built) and the notebooks.
python_package_tests() {
  local host="$1" venv="target/python-venv"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    pytest pandas matplotlib nbclient nbformat ipykernel
  MATURIN_PEP517_ARGS="--profile dev --target $host" \
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check ./python
  INFERSCHED_BIN="$PWD/target/$host/debug/infersched" "$venv/bin/python" -m pytest -q \
    -p no:cacheprovider --rootdir python python/tests
}

case "${1:-}" in
  demo)
    cargo build --release --quiet --bin infersched
    exec bash notebooks-data/examples/demo.sh target/release/infersched
    ;;
  test)
    # An explicit --target (the host's own) keeps build scripts and their dependencies
    # apart from the code under test in both commands, so clippy's check and the test
    # build share them: HiGHS's C++ build (highs-sys's build script) and bindgen run once
    # instead of twice. CI builds from scratch, where incremental compilation only costs.
    host="$(rustc -vV | sed -n 's/^host: //p')"
    [ -n "${CI:-}" ] && export CARGO_INCREMENTAL=0
    cargo fmt --all -- --check
    cargo clippy --workspace --all-targets --target "$host" --quiet -- -D warnings
    # The library without the CLI's dependencies (resvg, toml, indicatif, ctrlc) builds too.
    cargo clippy --lib --no-default-features --target "$host" --quiet -- -D warnings
    cargo test --workspace --exclude infersched-python --target "$host" --quiet
    python_package_tests "$host"
    ;;
  *)
    echo "usage: bash run.sh demo|test" >&2
    exit 2
    ;;
esac
