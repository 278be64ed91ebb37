#!/usr/bin/env bash
# The benchmarks of Animal Store, each against peers measured in the same run, on loopback only:
#
#   bash bench/run.sh            # writes bench/results.md and bench/latency.svg
#
# Builds the release binaries once, then runs bench/run.py (its docstring says what each part
# measures). Environment: DUR (seconds per run, 8), ROUNDS (3), CONN (64), IDLE (10000),
# PARTS (get,open,idle,creates,tls,redis,instr), INSTR_N (2000), TARGET_ROUNDS (6), PAIR_ROUNDS
# (12), MAX_SPREAD (unset; 0.10 stops a noisy run after its closed-loop rounds), GATEWAY_BIN and
# PASSTHROUGH_BIN (unset: the plain builds; bench/pgo.sh's binaries to measure the profile-guided
# builds). Tools: see bench/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p animal-store -p animal-store-passthrough
exec python3 bench/run.py
