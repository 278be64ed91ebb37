#!/usr/bin/env bash
# A profile-guided (PGO) build of `animal-store`, faster than `cargo build --release` on the
# request path (bench/README.md, "Profile-guided build", has the measurements), and of the
# benchmark's pass-through, so that the gateway is measured against a floor built the same way:
#
#   bash bench/pgo.sh            # writes target/pgo/<host>/release/{animal-store,passthrough}
#
# Builds instrumented binaries, trains them on loopback with bench/pgo_train.py (`serve` with the
# shipped configuration over HTTP/1.1, HTTPS and HTTP/2, the gateway alone and on Redis, the
# pass-through; about a minute), merges the profiles with llvm-profdata, and builds again with
# them. Needs the benchmark's tools (bench/README.md) and llvm-profdata of rustc's own LLVM major
# version (`rustup component add llvm-tools`, or Debian's `llvm-N` package). Two release builds
# of both binaries: 13-16 minutes on two cores from scratch. Each binary takes the same command
# line as its plain build.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
host=$(rustc -vV | sed -n 's/^host: //p')
llvm=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')

# A profile is read by the LLVM that rustc is built on, so the tool must be of that version.
profdata=""
for tool in "$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata" "llvm-profdata-$llvm" \
  llvm-profdata; do
  if command -v "$tool" >/dev/null &&
    [[ "$("$tool" --version 2>/dev/null)" == *"LLVM version $llvm."* ]]; then
    profdata=$tool
    break
  fi
done
if [ -z "$profdata" ]; then
  echo "bench/pgo.sh needs llvm-profdata of LLVM $llvm, rustc's: rustup component add" \
    "llvm-tools, or apt-get install -y llvm-$llvm" >&2
  exit 1
fi

# The training's tools, checked before the first build rather than after it.
for tool in wrk h2load nginx redis-server openssl taskset python3; do
  command -v "$tool" >/dev/null ||
    { echo "bench/pgo.sh needs $tool for its training: see bench/README.md" >&2; exit 1; }
done

profiles=$root/target/pgo-profiles
rm -rf "$profiles"
mkdir -p "$profiles"
echo "== instrumented build"
RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-generate=$profiles" \
  cargo build --release --locked -p animal-store -p animal-store-passthrough --target "$host" \
  --target-dir target/pgo-generate
echo "== training"
TRAIN_BIN=$root/target/pgo-generate/$host/release/animal-store \
  TRAIN_PASS=$root/target/pgo-generate/$host/release/passthrough python3 bench/pgo_train.py
"$profdata" merge -o "$profiles/merged.profdata" "$profiles"/*.profraw
echo "== optimised build"
RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-use=$profiles/merged.profdata" \
  cargo build --release --locked -p animal-store -p animal-store-passthrough --target "$host" \
  --target-dir target/pgo
built=target/pgo/$host/release
echo "$built/animal-store and $built/passthrough; to measure them:"
echo "  GATEWAY_BIN=$built/animal-store PASSTHROUGH_BIN=$built/passthrough bash bench/run.sh"
