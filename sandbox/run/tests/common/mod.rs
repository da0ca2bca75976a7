//! Kernel-test support: every case runs `sandbox-run` in a fresh process, which re-executes this
//! test binary as the in-sandbox probe (`probe_entry`), as root and as an unprivileged uid.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

#[path = "../../../../tests/src/bin/probe.rs"]
#[allow(dead_code, clippy::all)]
pub mod probe;

#[path = "../../../../tests/src/scratch.rs"]
pub mod scratch;

/// `sandbox-run`, at a path every identity of [`identities`] can execute.
pub fn sandbox_run_exe() -> PathBuf {
    // sandbox-run starts egress-proxy from its own directory: a copy takes it along.
    scratch::traversable_with(
        Path::new(env!("CARGO_BIN_EXE_sandbox-run")),
        &[&egress_proxy_exe()],
    )
}

/// `egress-proxy` in the target directory: another package's binary (`execward-egress`), so
/// cargo builds it for these tests only when they run with `--workspace` (the README's
/// command) or after `cargo build --workspace --bins`.
pub fn egress_proxy_exe() -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_sandbox-run")).with_file_name("egress-proxy");
    assert!(
        path.is_file(),
        "{} not found: it is built by another package; run `cargo build --workspace --bins` \
         first (or the tests with --workspace)",
        path.display()
    );
    path
}

/// This test binary (re-executed as the in-sandbox probe), at a path every identity can execute.
pub fn probe_exe() -> PathBuf {
    scratch::traversable(&std::env::current_exe().unwrap())
}

/// Environment variable carrying the probe arguments (JSON array) into the sandbox.
pub const PROBE_ENV: &str = "SANDBOX_KERNEL_TEST_PROBE";
/// The unprivileged identity the root runs drop to.
pub const NOBODY: u32 = 65534;

/// How this test binary is re-executed as the probe: its `probe_entry` function is marked
/// `#[ignore]` (it is an entry point, not a test, and must not count as a passing one) and run
/// explicitly.
pub const PROBE_ARGS: [&str; 6] = [
    "--exact",
    "probe_entry",
    "--ignored",
    "--nocapture",
    "--test-threads=1",
    "-q",
];

/// Call from an `#[ignore]`d `#[test] fn probe_entry()`: when this binary was re-executed as the probe,
/// run the probe and exit.
pub fn probe_entry() {
    if let Ok(args) = std::env::var(PROBE_ENV) {
        let args: Vec<String> = serde_json::from_str(&args).unwrap();
        println!("PROBE_RESULT {}", probe::run_probe(&args));
        std::process::exit(0);
    }
}

/// Identities to run each case as: root and nobody. Fails (never silently narrows to one
/// identity) when the tests do not run as root.
pub fn identities() -> Vec<Option<u32>> {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the kernel tests run each case as root and as uid {NOBODY}: run them as root (CI does)"
    );
    vec![None, Some(NOBODY)]
}

/// A workspace with a `.git`, and an outside directory with one file, both owned by `uid`.
pub struct Fixture {
    _base: tempfile::TempDir,
    pub ws: PathBuf,
    pub outside: PathBuf,
    pub outside_file: PathBuf,
    pub uid: Option<u32>,
}

impl Fixture {
    pub fn new(uid: Option<u32>) -> Self {
        let base = scratch::scratch_dir("sbx-");
        let root = std::fs::canonicalize(base.path()).unwrap();
        let ws = root.join("ws");
        let outside = root.join("outside");
        std::fs::create_dir_all(ws.join(".git")).unwrap();
        std::fs::write(ws.join(".git/config"), "[core]\n").unwrap();
        std::fs::write(ws.join("inside.txt"), "inside\n").unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let outside_file = outside.join("outside.txt");
        std::fs::write(&outside_file, "original\n").unwrap();
        std::fs::set_permissions(&outside_file, std::fs::Permissions::from_mode(0o644)).unwrap();
        scratch::assert_outside_writable_roots(&outside);
        if let Some(uid) = uid {
            for path in [
                &ws,
                &ws.join(".git"),
                &ws.join(".git/config"),
                &ws.join("inside.txt"),
                &outside,
                &outside_file,
            ] {
                std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
            }
        }
        Self {
            _base: base,
            ws,
            outside,
            outside_file,
            uid,
        }
    }

    /// Asserts the outside directory still holds exactly the original file, unchanged.
    pub fn assert_outside_untouched(&self, context: &str) {
        let names: Vec<String> = std::fs::read_dir(&self.outside)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            vec!["outside.txt".to_owned()],
            "{context}: outside dir changed"
        );
        let text = std::fs::read_to_string(&self.outside_file).unwrap();
        assert_eq!(text, "original\n", "{context}: outside file changed");
        let mode = std::fs::metadata(&self.outside_file)
            .unwrap()
            .permissions()
            .mode()
            & 0o7777;
        assert_eq!(mode, 0o644, "{context}: outside file mode changed");
    }
}

/// The `HOME` of `sandbox-run` in these tests: an empty directory, so the credential stores of
/// the host's real home (an `~/.npmrc` the namespace layer alone can mask) do not make the
/// `--no-namespaces` cases fail closed. The credential deny set has its own tests.
pub fn empty_home() -> &'static Path {
    static HOME: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    HOME.get_or_init(|| {
        let home = scratch::scratch_base().join("empty-home");
        let _ = std::fs::create_dir(&home);
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755)).unwrap();
        home
    })
}

/// `sandbox-run ARGS -- COMMAND` with a clean environment, as `uid`, in `cwd`.
pub fn sandbox_run(
    sandbox_args: &[&str],
    command: &[&str],
    uid: Option<u32>,
    cwd: &Path,
) -> Output {
    let mut cmd = Command::new(sandbox_run_exe());
    cmd.args(sandbox_args)
        .arg("--")
        .args(command)
        .current_dir(cwd)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", empty_home());
    if let Some(uid) = uid {
        cmd.uid(uid).gid(uid);
    }
    cmd.output().unwrap()
}

/// Runs the probe `op` under `sandbox-run sandbox_args` and returns its JSON report.
pub fn probe(sandbox_args: &[&str], op: &[&str], uid: Option<u32>, cwd: &Path) -> Value {
    probe_with_env(sandbox_args, op, uid, cwd, &[])
}

/// [`probe`] with `env` added to the probe's environment (beside `PATH`).
pub fn probe_with_env(
    sandbox_args: &[&str],
    op: &[&str],
    uid: Option<u32>,
    cwd: &Path,
    env: &[(&str, &Path)],
) -> Value {
    let exe = probe_exe();
    let mut cmd = Command::new(sandbox_run_exe());
    cmd.args(sandbox_args)
        .arg("--")
        .arg(&exe)
        .args(PROBE_ARGS)
        .current_dir(cwd)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", empty_home())
        .envs(env.iter().copied())
        .env(PROBE_ENV, serde_json::to_string(op).unwrap());
    if let Some(uid) = uid {
        cmd.uid(uid).gid(uid);
    }
    let output = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let Some(line) = stdout.lines().find_map(|l| l.strip_prefix("PROBE_RESULT ")) else {
        panic!(
            "probe {op:?} under {sandbox_args:?} as {uid:?} printed no result (status {:?})\nstdout: {stdout}\nstderr: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    };
    serde_json::from_str(line).unwrap()
}

/// Asserts the probe was refused by the sandbox (EPERM/EACCES/EROFS, or one of `also`).
pub fn assert_blocked(result: &Value, also: &[&str], context: &str) {
    let error = result["error"].as_str().unwrap_or("");
    assert!(
        result["blocked"] == true || also.contains(&error),
        "{context}: expected a denial, got {result}"
    );
}

/// Asserts the probe succeeded.
pub fn assert_allowed(result: &Value, context: &str) {
    assert!(
        result["ok"] == true,
        "{context}: expected success, got {result}"
    );
}

/// Path as `&str`.
pub fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}
