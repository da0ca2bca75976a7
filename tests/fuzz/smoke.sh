#!/usr/bin/env bash
# Short fuzz run of every target (about 30 s each, ~4 min in all plus the first build).
# Usage: tests/fuzz/smoke.sh [SECONDS_PER_TARGET] [TARGET...]
# Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`). New inputs go to a
# temporary directory, so the committed corpora stay unchanged; a crash stops the script with
# a non-zero status and leaves the input in tests/fuzz/artifacts/TARGET/.
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-30}"
shift || true
targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
    mapfile -t targets < <(cargo +nightly fuzz list)
fi
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
cargo +nightly fuzz build
for target in "${targets[@]}"; do
    mkdir -p "$scratch/$target" "corpus/$target"
    echo "== $target (${seconds}s)"
    status=0
    nice -n 19 cargo +nightly fuzz run "$target" "$scratch/$target" "corpus/$target" -- \
        -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1 \
        >"$scratch/$target.log" 2>&1 || status=$?
    grep -E '^(Done|stat::number_of_executed_units)' "$scratch/$target.log" || true
    if [ "$status" -ne 0 ]; then
        tail -n 60 "$scratch/$target.log" >&2
        echo "smoke: $target failed; the input is in tests/fuzz/artifacts/$target/" >&2
        exit 1
    fi
done
echo "smoke: all ${#targets[@]} targets ran ${seconds}s without a finding"
