#!/usr/bin/env bash
# Replays README.md's shell blocks as a newcomer would paste them, and checks each does what the
# README says. Run from anywhere; CI runs it after the test suite (.ci/run).
#
# Every ```sh block of README.md must be listed below, either replayed or skipped with the
# reason: a new block that is neither fails the replay, so the README cannot grow an example
# nobody ran. A block is found by its first line, taken from README.md itself (never copied
# here), and run with bash in a scratch HOME after the documented install, with two
# substitutions that keep CI from building everything twice:
#   - `target/release/` reads `target/debug/` and `cargo build --release --workspace` is the
#     debug build the test suite already made;
#   - `./install.sh` installs the debug build (`--profile dev`).
# Each block runs in a HOME of its own holding only what the README's install put there
# (~/.local): whatever else a block needs (a project, a server to talk to, a token file) it must
# make itself, as a paste into a fresh shell would.
set -uo pipefail
# /srv, /run, the network and the scratch HOME are this script's own: private mount and network
# namespaces (loopback only) with tmpfs on /srv and /run, so what the examples start (servers on
# ports 4000 and 7700, the servers registry under /run) touches nothing real and collides with
# nothing.
if [ "${EXECWARD_README_REPLAY_NS:-}" != 1 ]; then
  EXECWARD_README_REPLAY_NS=1 unshare --mount --net --propagation private -- "$0" "$@"
  status=$?
  # The CI audit job reads the kernel audit log, whose netlink socket exists only in the
  # initial network namespace: it is replayed out here.
  "$(dirname "$0")/audit-job.sh" || status=1
  exit $status
fi
ip link set lo up && mount -t tmpfs -o mode=0755 readme-srv /srv &&
  mount -t tmpfs -o mode=0755 readme-run /run || exit 1
repo="$(cd "$(dirname "$0")/../.." && pwd)"
readme="$repo/README.md"
target_dir="$(cd "$repo" && cargo metadata --format-version 1 --no-deps |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
scratch="$(mktemp -d /tmp/execward-readme.XXXXXX)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -- "$pid" 2>/dev/null; done
  rm -rf "$scratch"
}
trap cleanup EXIT
failures=0
fail() {
  echo "readme replay: FAIL: $*" >&2
  failures=$((failures + 1))
}

# The toolchain stays where it is when HOME moves.
export CARGO_HOME="${CARGO_HOME:-$HOME/.cargo}" RUSTUP_HOME="${RUSTUP_HOME:-$HOME/.rustup}"
export PATH="$CARGO_HOME/bin:$PATH"
export HOME="$scratch/home"
mkdir -p "$HOME"
cd "$repo" || exit 1
(cd "$repo" && cargo build --quiet --workspace --bins) || exit 1

# Prints the ```sh block whose first line is $1 (exactly), with the substitutions above.
block() {
  awk -v first="$1" '
    /^```/ { if (inside) { if (found) exit; inside = 0; next } if ($0 == "```sh") { inside = 1; fresh = 1 } next }
    inside && fresh { fresh = 0; if ($0 == first) found = 1 }
    inside && found { print }
  ' "$readme" | sed -e "s#target/release/#$target_dir/debug/#g" \
    -e "s#^cargo build --release --workspace#cargo build --quiet --workspace --bins#" \
    -e "s#^\./install\.sh #./install.sh --profile dev #"
}

# Runs block $1 with bash in directory $2 (default: the checkout), in a fresh HOME (set as
# $block_home) holding only the install's ~/.local, output to $scratch/out, its exit status to
# $scratch/status.
homes=0
run_block() {
  local text dir="${2:-$repo}"
  text="$(block "$1")"
  if [ -z "$text" ]; then
    fail "no \`\`\`sh block of README.md starts with: $1"
    return 1
  fi
  homes=$((homes + 1))
  block_home="$scratch/home.$homes"
  mkdir -p "$block_home"
  if [ -d "$HOME/.local" ]; then cp -a "$HOME/.local" "$block_home/"; fi
  echo "readme replay: running the block starting: $1"
  # Its own session, so what it starts in the background (`&`) is stopped with it.
  (cd "$dir" && HOME="$block_home" exec setsid timeout 300 bash -c "$text") >"$scratch/out" 2>&1 </dev/null &
  local pid=$! status
  wait "$pid"
  status=$?
  kill -- "-$pid" 2>/dev/null
  echo "$status" >"$scratch/status"
}
# Fails unless the last block exited with $1.
expect_status() {
  [ "$(cat "$scratch/status")" = "$1" ] || fail "block \"$2\": exited $(cat "$scratch/status"), not $1:
$(cat "$scratch/out")"
}
# Fails unless the last block's output holds $1 (a line exactly $1 with -x).
expect() {
  local flags=-qF
  if [ "$1" = -x ]; then flags=-qxF; shift; fi
  grep "$flags" -- "$1" "$scratch/out" || fail "block \"$2\": expected \"$1\" in its output:
$(cat "$scratch/out")"
}

replayed=()
skipped=()

# Run: the server prints its URL first.
first="cargo build --release --workspace && target/release/exec-server"
replayed+=("$first")
text="$(block "$first")"
coproc server { exec setsid bash -c "$text" 2>/dev/null; }
pids+=("-$server_PID")
if read -r -t 60 url <&"${server[0]}" && [[ "$url" == ws://127.0.0.1:* ]]; then
  kill -- "-$server_PID"
else
  fail "block \"$first\": no ws:// URL on stdout within 60 s (got \"${url:-}\")"
fi

# The Python session, through the client library the README installs first.
python3 -c 'import execward' 2>/dev/null || python3 -m pip install --quiet "$repo/clients/python"
replayed+=("python: the session you can reproduce")
awk '/^```python/ { inside = 1; next } inside && /^```/ { exit } inside { print }' "$readme" |
  sed -e "s#target/release/#$target_dir/debug/#g" >"$scratch/session.py"
echo "readme replay: running the Python session"
if (cd "$repo" && timeout 60 python3 "$scratch/session.py") >"$scratch/out" 2>&1; then
  expect "write: accepted" "the Python session"
  expect "echo:hello" "the Python session"
  expect "reason='terminated'" "the Python session"
else
  fail "the Python session failed (is the client installed? python3 -m pip install ./clients/python):
$(cat "$scratch/out")"
fi

# Install, then every bare command below resolves.
first='./install.sh                  # builds (release) and installs under ~/.local; --prefix DIR, --uninstall'
replayed+=("$first")
run_block "$first" && {
  expect "installed execward into $block_home/.local" "$first"
  expect "Usage: exec-server" "$first"
  expect_status 0 "$first"
  # What every later block's HOME starts with.
  cp -a "$block_home/.local" "$HOME/"
  for file in bin/exec-server bin/sandbox-run libexec/execward/fs-helper \
    libexec/execward/exec-guardian libexec/execward/sandbox-run libexec/execward/egress-proxy share/man/man1/sandbox-run.1 \
    share/zsh/site-functions/_exec-server; do
    [ -f "$HOME/.local/$file" ] || fail "install: no $HOME/.local/$file"
  done
  for tool in sandbox-bench probe bench load fs-helper exec-guardian egress-proxy; do
    [ ! -e "$HOME/.local/bin/$tool" ] || fail "install: $tool must not be in bin/"
  done
}
export PATH="$HOME/.local/bin:$PATH"

skipped+=("cargo install --locked --path supervisor --bin exec-server --bin exec-guardian"
  "cargo test --workspace --no-fail-fast")
echo "readme replay: skipped the cargo install alternative (a second release build of three" \
  "packages; install.sh is replayed) and the test command (CI runs it just before)"

# sandbox-run examples: the block makes its project, Makefile and cache directory itself.
first="cargo new --vcs none ~/proj && cd ~/proj       # any project will do; a fresh one here"
replayed+=("$first")
run_block "$first" && {
  expect "test result: ok" "$first"
  expect "PRETTY_NAME=" "$first"
  expect '"op": "writable-bind"' "$first"
  expect_status 0 "$first"
  grep -qxF "built in $block_home/proj" "$block_home/proj/built" 2>/dev/null ||
    fail "block \"$first\": make did not run in ~/proj"
}

# Remote mode, pasted as one block.
first="cargo build --release --workspace"
replayed+=("$first")
run_block "$first" && {
  expect "pinned" "$first"
  expect "$(uname -s)" "$first"
  expect_status 0 "$first"
}

skipped+=("\$ echo '{\"operation\":\"fs/writeFile\",\"params\":{\"path\":\"file:///etc/evil\",\"dataBase64\":\"aGk=\"},")
echo "readme replay: skipped the fs-helper transcript (\$ prompts; fs-helper/tests/cli.rs checks it)"
skipped+=("sandbox-run --policy workspace-write --cwd ~/proj \\")
echo "readme replay: skipped the egress allowlist examples (they reach pypi.org and crates.io;" \
  "the replay has no network, and sandbox/run/tests cover the proxy against a local server)"
# The request-level rule and the ask flow: the block starts its own mirror on loopback.
first="# A local mirror stands in for a registry: its /simple/ index may be read, nothing else."
replayed+=("$first")
run_block "$first" && {
  expect -x '<a href="demo/">demo</a>' "$first"
  expect "POST: 403" "$first"
  expect "POST /simple/ to 127.0.0.1:8765 is outside what its pattern allows" "$first"
  expect "Allow? [y = this connection" "$first"
  expect '"approval":{"by":"terminal","scope":"connection"}' "$first"
  expect_status 0 "$first"
}
skipped+=("exec-server ps --connect ws://127.0.0.1:8700              # every session's processes and every budget")
echo "readme replay: skipped the exec-server ps sketch (a server on :8700; tests/tests/observe.rs::ps_prints_every_sessions_processes_and_the_budgets runs ps)"
skipped+=("exec-rendezvous --listen https://0.0.0.0:7443 --tls-cert rendezvous.pem --tls-key rendezvous-key.pem \\")
echo "readme replay: skipped the TLS deployment sketch (needs a certificate and a DNS name)"

# Scaling the rendezvous: its own nats-server (.ci/run installs it), three nodes, one executor.
first="# Scaling the rendezvous: one NATS server with JetStream, three nodes, an executor, a harness."
replayed+=("$first")
run_block "$first" && {
  expect -x "through node-2" "$first"
  expect -x "after node-1" "$first"
  expect_status 0 "$first"
}

# exec: the block starts its own two servers and waits for them.
first="# Two servers to talk to: one on loopback TCP, one on a unix socket with a token."
replayed+=("$first")
run_block "$first" && {
  expect -x "out" "$first"
  expect -x "err" "$first"
  expect -x "3" "$first"
  expect "stdin is not a terminal" "$first"
  expect "tests ran in $block_home/demo with RUST_LOG=debug" "$first"
  expect_status 0 "$first"
}

# Every ```sh block is either replayed or skipped.
while IFS= read -r line; do
  known=false
  for first in "${replayed[@]}" "${skipped[@]}"; do
    [ "$line" = "$first" ] && known=true
  done
  $known || fail "README.md has a \`\`\`sh block nobody replays or skips: $line"
done < <(awk '/^```/ { if (inside) { inside = 0; next } if ($0 == "```sh") { inside = 1; fresh = 1 } next }
  inside && fresh { print; fresh = 0 }' "$readme")

if [ "$failures" -gt 0 ]; then
  echo "readme replay: $failures failure(s)" >&2
  exit 1
fi
echo "readme replay: ${#replayed[@]} blocks replayed, ${#skipped[@]} skipped with reasons, all as documented"
