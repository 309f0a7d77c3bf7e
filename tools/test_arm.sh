#!/usr/bin/env bash
# The aarch64 levels (neon, dotprod, i8mm), proven under emulation: cross-compiles the C++ core
# and tests/arm/check.cpp for aarch64 (no Python: CMake with -DLOWBIT_PYTHON=OFF), then runs the
# checker under qemu-aarch64 once per level, each time on an emulated CPU whose features stop
# at that level (so the probe must find exactly it and nothing above it may run), and once per
# level with LOWBIT_MAX_ISA capping a CPU that has everything. Every ARM kernel is compared
# bitwise with the scalar reference (tests/arm/check.cpp says what exactly).
#   needs: g++-aarch64-linux-gnu qemu-user (binutils-aarch64-linux-gnu comes with it) cmake ninja python3 (Debian: apt-get install -y g++-aarch64-linux-gnu qemu-user)
# Ends with "N passed, M failed" over all runs; exits nonzero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
CXX=${LOWBIT_ARM_CXX:-aarch64-linux-gnu-g++}
QEMU=${LOWBIT_QEMU:-qemu-aarch64}
SYSROOT=${LOWBIT_ARM_SYSROOT:-/usr/aarch64-linux-gnu}
B=build/arm
for tool in "$CXX" "$QEMU" cmake ninja; do
  command -v "$tool" >/dev/null || { echo "test_arm.sh: $tool not found (apt-get install -y g++-aarch64-linux-gnu qemu-user)" >&2; exit 2; }
done
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOWBIT_PYTHON=OFF \
  -DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64 -DCMAKE_CXX_COMPILER="$CXX" >/dev/null
cmake --build "$B" --target lowbit_check -j "${LOWBIT_JOBS:-2}"

export QEMU_LD_PREFIX="$SYSROOT"
passed=0 failed=0
run() {  # run <what> <env...> -- <qemu cpu> <expected best>
  local what=$1 cpu=$2 best=$3; shift 3
  echo "== $what (qemu -cpu $cpu)"
  local log; log=$(mktemp)
  if env "$@" "$QEMU" -cpu "$cpu" "$B/lowbit_check" --expect-best "$best" >"$log" 2>&1; then :; fi
  grep -E '^(FAIL|level |lowbit_check)' "$log" | head -40
  local line; line=$(tail -1 "$log")
  if [[ "$line" =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
    passed=$((passed + BASH_REMATCH[1])); failed=$((failed + BASH_REMATCH[2]))
  else
    echo "   the checker did not finish: $(tail -3 "$log")"; failed=$((failed + 1))
  fi
  rm -f "$log"
}
# CPUs whose features stop at each level: a Cortex-A53 (armv8.0: no dotprod), a Cortex-A76
# (dotprod, no i8mm), qemu's max (everything).
run "neon on a CPU without dotprod" cortex-a53 neon
run "dotprod on a CPU without i8mm" cortex-a76 dotprod
run "every level on a CPU with all of them" max i8mm
# LOWBIT_MAX_ISA on the CPU with everything: nothing above the cap may be chosen.
run "LOWBIT_MAX_ISA=neon" max i8mm LOWBIT_MAX_ISA=neon
run "LOWBIT_MAX_ISA=dotprod" max i8mm LOWBIT_MAX_ISA=dotprod
# I7: no vector spills in the arm row kernels (aarch64 objdump of the objects just built).
echo "== I7: stack vector moves in the arm row kernels"
if python3 tools/check_spills.py "$B" | grep -E 'row-kernel|stack vector moves in'; then :; fi
if python3 tools/check_spills.py "$B" >/dev/null 2>&1; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL I7"; fi
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
