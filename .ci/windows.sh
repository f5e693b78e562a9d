#!/usr/bin/env bash
# Windows x86_64 (x86_64-pc-windows-gnu, cross-built with Debian's mingw-w64): clippy for the
# target, and the core's tests (no `python` feature) run under Debian's wine; clippy for the
# MSVC targets the release workflow builds. Installs what it
# needs. Called by .ci/run; runs alone too. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
start=$(date +%s)
step() { echo; echo "=== windows: $* ($(( $(date +%s) - start ))s)"; }
T=x86_64-pc-windows-gnu
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')

step "install (rustup target, mingw-w64, wine)"
rustup target add "$T" x86_64-pc-windows-msvc aarch64-pc-windows-msvc
if ! command -v x86_64-w64-mingw32-gcc >/dev/null || ! command -v wine >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mingw-w64 wine wine64
fi
wine --version

# wine's own state lives in the target dir (a fresh one per clean clone); no mono/gecko
# prompts, no debug chatter.
export WINEPREFIX="$target_dir/wine-prefix" WINEDEBUG=-all WINEDLLOVERRIDES="mscoree,mshtml="
export CARGO_TARGET_X86_64_PC_WINDOWS_GNU_RUNNER=wine

step "bcryptprimitives.dll stub (wine 8.0 lacks ProcessPrng, which Rust's std needs)"
deps="$target_dir/$T/release/deps"
mkdir -p "$deps"
x86_64-w64-mingw32-gcc -shared -O2 -o "$deps/bcryptprimitives.dll" .ci/wine/bcryptprimitives.c -ladvapi32

step "cargo clippy --target $T"
cargo clippy --release --all-targets --target "$T" -- -D warnings

# The release workflow builds with MSVC on GitHub's runners (x86_64 and aarch64): here those
# targets are type-checked and linted (the library with the binding), not linked (no MSVC
# linker or Windows SDK here).
for t in x86_64-pc-windows-msvc aarch64-pc-windows-msvc; do
  step "cargo clippy --lib --features python --target $t"
  cargo clippy --release --lib --features python --target "$t" -- -D warnings
done

step "cargo test --target $T (under wine)"
# One wineserver for every test binary. Left to itself it exits as each binary ends (its
# default persistence is 0 s), and a binary that connects just then can lose its connection
# ("wine client error:0: recvmsg: Connection reset by peer": one run in about twenty here).
mkdir -p "$WINEPREFIX"
wineserver -p
trap 'wineserver -k 2>/dev/null || true' EXIT
cargo test --release --target "$T" -- --test-threads=2

step "windows done in $(( $(date +%s) - start ))s"
