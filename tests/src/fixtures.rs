//! Test fixtures and small helpers: sandbox directories, child processes waited on under a
//! deadline, waiting for a file, medians, and the root requirement.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::{DEADLINE, scratch};

/// Panic with a clear message unless the tests run as root (mounts, low limits for others).
#[track_caller]
pub fn require_root(what: &str) {
    assert!(
        nix::unistd::geteuid().is_root(),
        "{what} needs root (it mounts filesystems); run the test suite as root"
    );
}

/// A test that cannot run on this host says so and returns (the caller returns after this),
/// except under CI (the `CI` variable set, as `.ci/run` sets it), where a missing host feature
/// is a failure: CI's machine has every feature the suite needs, so a skip there would hide a
/// regression in how the server finds it.
#[track_caller]
pub fn skip_unless_ci(reason: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "{reason}: CI is set, where this would have been skipped; a CI host must have it"
    );
    println!("skipped: {reason}");
}

/// Wait until `path` exists, polling, panicking after `deadline`.
pub fn wait_for_file(path: &Path, deadline: Duration) {
    let started = Instant::now();
    while !path.exists() {
        assert!(
            started.elapsed() < deadline,
            "{} did not appear within {deadline:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10)); // polling interval, not a wait
    }
}

/// Median of durations (panics on an empty list).
pub fn median(durations: &[Duration]) -> Duration {
    let mut sorted = durations.to_vec();
    sorted.sort();
    sorted[sorted.len() / 2]
}

/// A workspace under /tmp and an "outside" directory that no restricting policy may write
/// (under [`scratch::scratch_base`]: neither a workspace root, /tmp nor $TMPDIR), holding a
/// sentinel `secret.txt`.
pub struct SandboxDirs {
    /// The workspace (cwd of the policies under test).
    pub workspace: tempfile::TempDir,
    /// Outside every writable root.
    pub outside: tempfile::TempDir,
}

impl SandboxDirs {
    /// Create both directories and `outside/secret.txt`.
    pub fn new() -> SandboxDirs {
        let workspace = tempfile::Builder::new()
            .prefix("ew-ws-")
            .tempdir_in("/tmp")
            .expect("workspace under /tmp");
        let outside = scratch::scratch_dir("ew-out-");
        scratch::assert_outside_writable_roots(outside.path());
        std::fs::write(outside.path().join("secret.txt"), b"outside").expect("secret.txt");
        SandboxDirs { workspace, outside }
    }
}

impl Default for SandboxDirs {
    fn default() -> Self {
        Self::new()
    }
}

/// Wait for `child` to exit, killing it (and failing the test) after `deadline`.
pub fn wait_child(child: &mut Child, deadline: Duration) -> ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if started.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("child process did not exit within {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(10)); // polling interval, not a wait
    }
}

/// Run `cmd` with `stdin` as its input and collect (status, stdout, stderr), all within
/// [`DEADLINE`].
pub fn output_within(cmd: &mut Command, stdin: &[u8]) -> (ExitStatus, String, String) {
    use std::io::Write as _;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin)
        .expect("write stdin");
    let read_all = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            pipe.read_to_string(&mut text).expect("read output");
            text
        })
    };
    let out = read_all(Box::new(child.stdout.take().expect("stdout")));
    let err = read_all(Box::new(child.stderr.take().expect("stderr")));
    let status = wait_child(&mut child, DEADLINE);
    (
        status,
        out.join().expect("stdout reader"),
        err.join().expect("stderr reader"),
    )
}
