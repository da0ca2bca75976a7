#!/usr/bin/env bash
# Build execward and install it under a prefix (default ~/.local):
#
#   PREFIX/bin/exec-server, sandbox-run, exec-rendezvous      the commands
#   PREFIX/libexec/execward/fs-helper, exec-guardian,         internal helpers exec-server and
#                            sandbox-run, egress-proxy         sandbox-run run (found there,
#                                                              never through $PATH)
#   PREFIX/share/man/man1/exec-server.1, exec-server-exec.1, sandbox-run.1
#   PREFIX/share/bash-completion/completions/, share/zsh/site-functions/,
#   PREFIX/share/fish/vendor_completions.d/                    shell completions
#
# Man pages and completions are generated from the binaries' own clap definitions
# (cli-docs/). The benchmark and test tools (sandbox-bench, probe, bench, load) are not installed.
#
# Usage: ./install.sh [--prefix DIR] [--profile release|dev] [--uninstall]
set -euo pipefail

usage() {
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}

prefix="${HOME:?HOME is not set; pass --prefix}/.local"
profile=release
uninstall=false
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix="${2:?--prefix needs a directory}"; shift 2 ;;
    --prefix=*) prefix="${1#--prefix=}"; shift ;;
    --profile) profile="${2:?--profile needs release or dev}"; shift 2 ;;
    --profile=*) profile="${1#--profile=}"; shift ;;
    --uninstall) uninstall=true; shift ;;
    -h|--help) usage 0 ;;
    *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$profile" in
  release) profile_dir=release ;;
  dev) profile_dir=debug ;;
  *) echo "install.sh: --profile must be release or dev (got $profile)" >&2; exit 2 ;;
esac
mkdir -p "$prefix"
prefix="$(cd "$prefix" && pwd)"

commands=(exec-server sandbox-run exec-rendezvous)
helpers=(fs-helper exec-guardian sandbox-run egress-proxy)
pages=(exec-server exec-server-exec sandbox-run exec-rendezvous)
completed=(exec-server sandbox-run exec-rendezvous)
libexec="$prefix/libexec/execward"

if $uninstall; then
  for name in "${commands[@]}"; do rm -f "$prefix/bin/$name"; done
  rm -rf "$libexec"
  for page in "${pages[@]}"; do rm -f "$prefix/share/man/man1/$page.1"; done
  for name in "${completed[@]}"; do
    rm -f "$prefix/share/bash-completion/completions/$name.bash" \
      "$prefix/share/zsh/site-functions/_$name" \
      "$prefix/share/fish/vendor_completions.d/$name.fish"
  done
  echo "removed execward from $prefix"
  exit 0
fi

cd "$(dirname "$0")"
# --workspace with named binaries: only these are built, and every dependency's features resolve
# as in `cargo build --workspace` and `cargo test --workspace`, so an install after either
# reuses what it built (a `-p` selection resolves proto's and rustix's features differently and
# rebuilds everything above them).
cargo build --locked --profile "$profile" --workspace \
  --bin exec-server --bin exec-guardian --bin exec-rendezvous \
  --bin sandbox-run --bin egress-proxy --bin fs-helper --bin execward-cli-docs
target_dir="$(cargo metadata --format-version 1 --no-deps --locked |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
built="$target_dir/$profile_dir"

install -d "$prefix/bin" "$libexec"
for name in "${commands[@]}"; do install -m 0755 "$built/$name" "$prefix/bin/$name"; done
for name in "${helpers[@]}"; do install -m 0755 "$built/$name" "$libexec/$name"; done
"$built/execward-cli-docs" "$prefix" >/dev/null

echo "installed execward into $prefix:"
echo "  commands:          $prefix/bin/{$(IFS=,; echo "${commands[*]}")}"
echo "  internal helpers:  $libexec/{$(IFS=,; echo "${helpers[*]}")} (run by exec-server; not for \$PATH)"
echo "  man pages:         $prefix/share/man/man1 ($(IFS=' '; echo "${pages[*]}"))"
echo "  completions:       bash, zsh, fish under $prefix/share"
case ":$PATH:" in
  *":$prefix/bin:"*) ;;
  *) echo "note: $prefix/bin is not on \$PATH; add it: export PATH=\"$prefix/bin:\$PATH\"" ;;
esac
