#!/usr/bin/env bash
# CI, the platforms this machine is not (called by .ci/run; runs alone too). Installs what it
# needs (rustup targets, Debian's aarch64 cross gcc, qemu-user, clang), then:
# - Linux aarch64: clippy -D warnings, and the core's tests (no `python` feature) under
#   qemu-user, on a CPU model with dotprod (-cpu max: tier neon-dotprod) and one without
#   (-cpu cortex-a57: tier neon); each run asserts which tier run-time detection picked.
# - macOS aarch64 / x86_64: cargo check and clippy -D warnings of the library, the Python
#   binding and all targets (type-checked only: no macOS linker, SDK or machine here).
# Nothing here measures speed: timings under qemu are not speeds.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
start=$(date +%s)
step() { echo; echo "=== cross: $* ($(( $(date +%s) - start ))s)"; }

A64=aarch64-unknown-linux-gnu
MACS="aarch64-apple-darwin x86_64-apple-darwin"
# qemu CPU model and the kernel tier the core must pick on it
CPUS="max:neon-dotprod cortex-a57:neon"

step "install"
rustup target add "$A64" $MACS
pkgs="gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user clang llvm"
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $missing
fi
qemu-aarch64 --version | head -n 1
aarch64-linux-gnu-gcc --version | head -n 1

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc

step "clippy $A64"
cargo clippy --release --all-targets --target "$A64" -- -D warnings
cargo clippy --release --lib --features python --target "$A64" -- -D warnings

step "build the core's tests for $A64"
cargo test --release --target "$A64" --no-run

for pair in $CPUS; do
  cpu=${pair%%:*}
  tier=${pair#*:}
  step "core tests under qemu-aarch64 -cpu $cpu (tier $tier)"
  log="${CARGO_TARGET_DIR:-target}/cross-$A64-$cpu.log"
  # --show-output: the tests' own lines (which tier ran, what was skipped and why) go to
  # the log, and are summarised below
  if ! CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -cpu $cpu -L /usr/aarch64-linux-gnu" \
    V4FLASH_EXPECT_BEST_TIER="$tier" \
    cargo test --release --target "$A64" -- --test-threads=2 --show-output >"$log" 2>&1; then
    tail -n 150 "$log"
    echo "core tests failed under qemu-aarch64 -cpu $cpu (full log: $log)"
    exit 1
  fi
  grep -E '^test result:' "$log"
  grep -E '^(SKIP|active kernel tier|exact mode)' "$log" | sort | uniq -c
done

for t in $MACS; do
  step "macOS $t: check and clippy (library, binding, all targets)"
  cargo check --release --lib --target "$t"
  cargo clippy --release --lib --target "$t" -- -D warnings
  cargo clippy --release --lib --features python --target "$t" -- -D warnings
  # The dev-dependencies compile one C file (alloca, through criterion): clang makes a
  # Mach-O object of it; nothing is linked.
  tt=${t//-/_}
  env "CC_$tt=clang" "AR_$tt=llvm-ar" "CFLAGS_$tt=-ffreestanding" \
    cargo clippy --release --all-targets --target "$t" -- -D warnings
done

step "done in $(( $(date +%s) - start ))s"
