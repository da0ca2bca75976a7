//! The `sandbox-run` command line: its flags and their parsing.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::Parser;

/// Run a command under an execward sandbox policy.
#[derive(Debug, Parser)]
#[command(
    name = "sandbox-run",
    version,
    after_help = "Examples:\n  \
        sandbox-run --policy workspace-write --cwd ~/proj -- cargo test\n  \
        sandbox-run --policy workspace-write --allow toolchain-caches -- cargo test\n  \
        sandbox-run --policy read-only -- cat /etc/hostname\n  \
        sandbox-run --policy ./my-profile.toml --allow-network -- curl https://example.com\n  \
        sandbox-run --allow-domain pypi.org --allow-domain files.pythonhosted.org -- pip install requests\n  \
        sandbox-run --policy '{\"profile\":\"workspace-write\",\"cwd\":\"file:///ws\"}' -- make\n  \
        sandbox-run --policy workspace-write --explain -- true\n\n\
        The command runs in its own user, mount, PID and IPC namespaces (and network namespace\n\
        when the network is off), with no capabilities, private /tmp, /run, /dev and /proc,\n\
        Landlock and a seccomp allow-list. When stdin or stdout is a terminal it gets a\n\
        terminal of its own. Nothing it starts outlives it.\n\n\
        Exit status: the program's (sandbox-run dies of the same signal when one killed it);\n\
        125 if the sandbox could not be set up; 126/127 if the program could not be\n\
        executed / was not found. Policies: see policies/README.md."
)]
pub struct Cli {
    /// Policy: a built-in name (read-only, workspace-write, danger-full-access), the name of
    /// one of your own profiles (~/.config/execward/profiles/NAME.toml; see --list-profiles), a
    /// profile file (*.toml, or any path containing '/'), or a JSON sandbox object (starts
    /// with '{').
    /// A profile file inside a writable root of the policy it produces is refused (the
    /// sandboxed command could rewrite it for the next run).
    #[arg(long, value_name = "NAME|FILE.toml|JSON", default_value = "read-only")]
    pub policy: String,
    /// The wire sandbox object as JSON (same as a `--policy` starting with '{').
    #[arg(long, value_name = "JSON", conflicts_with = "policy")]
    pub policy_json: Option<String>,
    /// The command's working directory, and the directory cwd-dependent rules (the workspace
    /// of workspace-write) resolve against. Default: the JSON policy's cwd when it has one,
    /// else the current directory. Must exist (see --create-missing).
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<PathBuf>,
    /// Extra writable root (repeatable); .git/.agents/.codex inside stay read-only. Must
    /// exist (see --create-missing).
    #[arg(long = "writable-root", value_name = "DIR")]
    pub writable_roots: Vec<PathBuf>,
    /// Create a missing --cwd or --writable-root (mode 0755) instead of refusing it.
    #[arg(long)]
    pub create_missing: bool,
    /// Apply a named allowance from policies/allowances/ (repeatable): `toolchain-caches`
    /// makes the caches of cargo (registry, git checkouts, lock files), pip, npm and ccache
    /// writable, never their programs, configuration or shell start-up files. Paths come from
    /// this process's $CARGO_HOME, $XDG_CACHE_HOME and $HOME.
    #[arg(long = "allow", value_name = "NAME")]
    pub allowances: Vec<String>,
    /// Leave one store of the built-in credential deny set readable (repeatable), named as in
    /// policies/credential-stores.toml: `--allow-credential-store '~/.aws'`.
    #[arg(long = "allow-credential-store", value_name = "STORE")]
    pub allow_credential_stores: Vec<String>,
    /// Let the command connect to this pathname unix socket outside its writable roots
    /// (repeatable): `--allow-unix-socket /run/user/1000/ssh-agent.sock`.
    #[arg(long = "allow-unix-socket", value_name = "PATH")]
    pub allow_unix_sockets: Vec<PathBuf>,
    /// Extra path to hide (masked by the namespace layer, refused by Landlock); repeatable.
    #[arg(long = "deny", value_name = "PATH")]
    pub denies: Vec<PathBuf>,
    /// Pass the caller's variable NAME to the command (repeatable). By default the command
    /// gets the caller's environment less every name containing KEY, SECRET or TOKEN (in any
    /// case) and exec-server's own EXECWARD_* variables, as exec-server's envPolicy does.
    #[arg(long = "env", value_name = "NAME", help_heading = "Environment")]
    pub keep_env: Vec<OsString>,
    /// Set NAME to VALUE for the command (repeatable; applied last).
    #[arg(long = "setenv", value_name = "NAME=VALUE", value_parser = crate::env::parse_assignment, help_heading = "Environment")]
    pub set_env: Vec<(OsString, OsString)>,
    /// Remove NAME from the command's environment (repeatable).
    #[arg(long = "unsetenv", value_name = "NAME", help_heading = "Environment")]
    pub unset_env: Vec<OsString>,
    /// Start the command's environment empty (then --env, --setenv apply).
    #[arg(long, help_heading = "Environment")]
    pub clearenv: bool,
    /// Allow network access.
    #[arg(long, conflicts_with_all = ["allow_domains", "deny_domains"])]
    pub allow_network: bool,
    /// Limit the network to an allowlist and add PATTERN to it (repeatable): `host`,
    /// `*.domain`, an IP literal, each with an optional `:PORT` (default 80 and 443), or a
    /// named set such as `@package-registries`, optionally followed by ` tunnel=any` (an
    /// unknown protocol may pass; default: TLS only on 443, TLS or Host-checked HTTP elsewhere)
    /// or ` tunnel=tls-only`, and/or ` methods=GET,HEAD` (` methods=read-only`: GET, HEAD,
    /// OPTIONS) and ` paths=/PREFIX,...`: only those requests pass, checked on every request of
    /// plain HTTP; TLS to such a destination is refused (it would hide them). The command
    /// reaches them only through the egress proxy
    /// (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY are set for it), which checks every request and
    /// every TLS ClientHello it sends.
    #[arg(long = "allow-domain", value_name = "PATTERN")]
    pub allow_domains: Vec<String>,
    /// Refuse PATTERN even when an --allow-domain pattern matches (repeatable; without a port:
    /// every port).
    #[arg(long = "deny-domain", value_name = "PATTERN")]
    pub deny_domains: Vec<String>,
    /// Names the egress proxy resolves without DNS, in hosts-file format (`ADDRESS NAME...`):
    /// local mirrors, air-gapped sites, tests.
    #[arg(long, value_name = "FILE")]
    pub egress_hosts: Option<PathBuf>,
    /// Send every allowed connection through this HTTP proxy (`http://HOST:PORT`) with
    /// `CONNECT host:port`; needs an allowlist (--allow-domain or the policy's). The egress
    /// proxy still checks every name against the allowlist; it does not resolve names then
    /// (the upstream does), so the address checks apply to IP literals only.
    #[arg(long, value_name = "URL")]
    pub upstream_proxy: Option<String>,
    /// Credentials for --upstream-proxy: FILE holds one line `USER:PASSWORD`, sent as
    /// `Proxy-Authorization: Basic ...` (never on the command line or in the environment).
    #[arg(long, value_name = "FILE", requires = "upstream_proxy")]
    pub upstream_proxy_credentials: Option<PathBuf>,
    /// Before refusing a destination no --allow-domain pattern matches (a --deny-domain match
    /// is final), ask on the controlling terminal (/dev/tty): `y` lets this connection
    /// through, `p` every connection of this command to that host and port, anything else no;
    /// no terminal, or no answer within --ask-timeout: no. Needs an allowlist. Every answer is
    /// in the egress log (`approval`: who, which scope) and every refusal on stderr or in the
    /// audit, as without --ask.
    #[arg(long)]
    pub ask: bool,
    /// Ask the peer on descriptor N instead of the terminal (exec-server's `egress/approve`):
    /// questions out and answers in, as JSON lines (see sandbox::egress::ask).
    #[arg(long, value_name = "N")]
    pub ask_fd: Option<i32>,
    /// How long a connection is held for an answer, in seconds (default 30: ASK_TIMEOUT; at
    /// most 600).
    #[arg(long, value_name = "SECONDS")]
    pub ask_timeout: Option<f64>,
    /// Write every egress decision, allowed destinations too, as JSON lines to FILE (created
    /// before the command starts): the allowlist a build needs.
    #[arg(long, value_name = "FILE")]
    pub egress_log: Option<PathBuf>,
    /// Run even if a layer the policy needs is unavailable (reported on stderr).
    #[arg(long)]
    pub best_effort: bool,
    /// Do not use namespaces (Landlock + seccomp only; no PID namespace, no private /tmp).
    #[arg(long)]
    pub no_namespaces: bool,
    /// List the profiles --policy takes by name (built-in, then the user's own in
    /// ~/.config/execward/profiles/NAME.toml) with their descriptions, and exit.
    #[arg(long)]
    pub list_profiles: bool,
    /// Print the resolved rules and the layers that will apply, as JSON, and exit.
    #[arg(long)]
    pub explain: bool,
    /// Print the enforcement report as JSON on stderr before running the program.
    #[arg(long)]
    pub report: bool,
    /// Address space per process (RLIMIT_AS), e.g. 512M or 2G (suffixes K, M, G: powers of
    /// 1024). Bounds each process, not the tree: exec-server bounds a tree's memory with a
    /// cgroup instead.
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    pub memory: Option<u64>,
    /// Processes of the sandbox's user (RLIMIT_NPROC, counted in the sandbox's own user
    /// namespace). The kernel exempts uid 0, so as root this needs --best-effort (exec-server
    /// bounds a tree with a pids cgroup instead). Without it: the sandbox's share of the host's
    /// tasks (an eighth of the fewest of kernel.pid_max, kernel.threads-max and RLIMIT_NPROC,
    /// at most 8192; --explain shows it), which binds every user but root.
    #[arg(long, value_name = "N")]
    pub pids: Option<u64>,
    /// CPU seconds per process (RLIMIT_CPU: SIGXCPU at the limit, SIGKILL a second later).
    #[arg(long, value_name = "SECONDS")]
    pub cpu_time: Option<u64>,
    /// Wall-clock seconds; then the whole sandbox is killed (its output so far is delivered).
    #[arg(long, value_name = "SECONDS")]
    pub wall_time: Option<u64>,
    /// Internal (exec-server): read the resolved policy and the command from inherited
    /// descriptor N instead of the options above.
    #[arg(long, value_name = "N", hide = true, conflicts_with_all = ["policy_json", "cwd", "writable_roots", "allowances", "denies", "allow_credential_stores", "allow_unix_sockets", "allow_network", "allow_domains", "deny_domains", "explain", "memory", "pids", "cpu_time", "wall_time"])]
    pub launch_fd: Option<i32>,
    /// Internal (exec-server): serve as a pre-confined launcher on the `SOCK_SEQPACKET`
    /// socket on stdin (see `sandbox::linux::launcher`).
    #[arg(long, hide = true, conflicts_with_all = ["launch_fd", "policy_json", "cwd", "writable_roots", "allowances", "denies", "allow_credential_stores", "allow_unix_sockets", "allow_network", "allow_domains", "deny_domains", "explain", "memory", "pids", "cpu_time", "wall_time"])]
    pub launcher: bool,
    /// The program and its arguments.
    #[arg(
        last = true,
        value_name = "PROGRAM [ARGS]...",
        required_unless_present_any = ["launch_fd", "launcher", "list_profiles"]
    )]
    pub command: Vec<OsString>,
}

impl Cli {
    /// What the environment flags ask for.
    pub fn env_flags(&self) -> crate::env::EnvFlags {
        crate::env::EnvFlags {
            clear: self.clearenv,
            keep: self.keep_env.clone(),
            unset: self.unset_env.clone(),
            set: self.set_env.clone(),
        }
    }
}

/// The whole `sandbox-run` command line: [`Cli`] plus, on Linux, the denial audit's flags
/// (`--audit`, ...). `sandbox-run` parses with it; man pages and completions are generated
/// from it.
pub fn command() -> clap::Command {
    use clap::CommandFactory;
    #[cfg(target_os = "linux")]
    {
        use clap::Args;
        // `augment_args` puts the audit flags' own doc comment in `about`; the command keeps its.
        let base = Cli::command();
        let about = base.get_about().cloned().unwrap_or_default();
        audit::cli::AuditArgs::augment_args(base).about(about)
    }
    #[cfg(not(target_os = "linux"))]
    {
        Cli::command()
    }
}

/// Why a `--memory` value is not a size.
#[derive(Debug, thiserror::Error)]
pub enum SizeError {
    /// A letter other than K, M or G ends it.
    #[error("unknown size suffix {suffix:?} (use K, M or G)")]
    Suffix {
        /// The suffix given.
        suffix: char,
    },
    /// It is not a positive number (of bytes, or of K, M, G) that fits in 64 bits.
    #[error("{text:?} is not a size (a positive number of bytes, or 512M, 2G)")]
    NotASize {
        /// The value given (trimmed).
        text: String,
    },
}

/// `--memory`'s value: bytes, or a number with a K, M or G suffix (powers of 1024).
fn parse_size(text: &str) -> Result<u64, SizeError> {
    let text = text.trim();
    let (digits, unit) = match text.char_indices().last() {
        Some((at, suffix)) if suffix.is_ascii_alphabetic() => {
            let unit: u64 = match suffix.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                _ => return Err(SizeError::Suffix { suffix }),
            };
            (&text[..at], unit)
        }
        _ => (text, 1),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .filter(|bytes| *bytes > 0)
        .ok_or_else(|| SizeError::NotASize {
            text: text.to_owned(),
        })
}
