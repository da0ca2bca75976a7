#!/usr/bin/env bash
# Replays the README's CI audit job (the "Tests under workspace-write" step of its YAML, taken
# from README.md) on a fresh `cargo new` project: it must pass, and once the project has a test
# that writes outside the workspace it must fail (exit 3) with a GitHub annotation naming the
# path. Needs root (the kernel audit log). Run by tests/readme/replay.sh.
#
# Substitutions: `sandbox-run` is this checkout's build (first on PATH); when running as root
# without sudo installed, `sudo --preserve-env=...` is a pass-through shim.
set -uo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
target_dir="$(cd "$repo" && cargo metadata --format-version 1 --no-deps |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
scratch="$(mktemp -d /tmp/execward-audit-job.XXXXXX)"
trap 'rm -rf "$scratch"' EXIT
fail() {
  echo "audit job replay: FAIL: $*" >&2
  exit 1
}

# The step's `run: |` script, unindented.
step="$(awk '
  /^```yaml/ { yaml = 1; next }
  yaml && /^```/ { yaml = 0 }
  yaml && /- name: Tests under workspace-write/ { found = 1; next }
  found && /run: \|/ { inside = 1; next }
  inside { if ($0 !~ /^          /) exit; print substr($0, 11) }
' "$repo/README.md")"
[ -n "$step" ] || fail "README.md has no \"Tests under workspace-write\" step with a run: | script"
echo "audit job replay: the step is:"
echo "$step"

mkdir -p "$scratch/bin"
if ! command -v sudo >/dev/null && [ "$(id -u)" = 0 ]; then
  printf '#!/bin/sh\nwhile [ $# -gt 0 ]; do case "$1" in --preserve-env=*) shift ;; *) break ;; esac; done\nexec "$@"\n' \
    >"$scratch/bin/sudo"
  chmod +x "$scratch/bin/sudo"
fi
export PATH="$scratch/bin:$target_dir/debug:$PATH"

cd "$scratch" && cargo new --quiet --vcs none proj && cd proj || fail "cargo new"
cargo fetch --quiet || fail "cargo fetch" # the job's step before
bash -c "$step" >"$scratch/out" 2>&1
status=$?
[ $status = 0 ] || fail "on a fresh cargo new project the job exited $status:
$(cat "$scratch/out")"
grep -q "sandbox-run: audit: no denials observed" "$scratch/out" || fail "no clean summary:
$(cat "$scratch/out")"
echo "audit job replay: a fresh cargo new project passes"

outside="/opt/execward-audit-job-$$"
cat >>src/main.rs <<RUST

#[test]
fn writes_outside_the_workspace() {
    std::fs::write("$outside", "x").unwrap();
}
RUST
bash -c "$step" >"$scratch/out" 2>&1
status=$?
[ ! -e "$outside" ] || { rm -f "$outside"; fail "the test wrote $outside"; }
[ $status = 3 ] || fail "with a test writing $outside the job exited $status, not 3:
$(cat "$scratch/out")"
grep -q '^::error title=Sandbox denied fs.make_reg.*::/opt denied' "$scratch/out" ||
  fail "no annotation naming /opt:
$(cat "$scratch/out")"
echo "audit job replay: a test writing $outside fails the job (exit 3) with its annotation"
