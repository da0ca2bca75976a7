//! The matrix the sandbox's server-level tests run over: the server's identity (root and an
//! unprivileged uid) and the way a sandboxed start is launched (the session's launcher, or a
//! `sandbox-run` of its own).

/// The unprivileged identity the servers also run as.
pub const NOBODY: u32 = 65534;

/// The identities to run a server as: root (`None`) and [`NOBODY`]. Panics unless the tests
/// run as root, which dropping to [`NOBODY`] needs (never a silent half run).
pub fn identities() -> Vec<Option<u32>> {
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests run the servers as root and as uid {NOBODY}; run them as root"
    );
    vec![None, Some(NOBODY)]
}

/// The two ways a sandboxed start is launched, by name, with the server flags that choose it.
pub fn launch_modes() -> [(&'static str, &'static [&'static str]); 2] {
    [
        ("launcher", &[]),
        ("one-shot", &["--one-shot-sandbox", "--one-shot-helpers"]),
    ]
}

/// A user that is neither root nor the server when the server runs as [`NOBODY`].
pub const OTHER: u32 = 65533;

/// The servers' users for listener-access tests: root (the test's) and [`NOBODY`]; with each,
/// a user that is neither it nor root.
pub fn server_users() -> Vec<(Option<u32>, u32)> {
    crate::require_root("the servers run as root and as uid 65534, their clients as others");
    vec![(None, NOBODY), (Some(NOBODY), OTHER)]
}

/// For tests of who may reach a listener: binaries every uid can run, a token file holding
/// `token` (0600) and a socket directory, both owned by the server's user.
pub struct ListenerFixture {
    _base: tempfile::TempDir,
    /// The installed binaries.
    pub bin: std::path::PathBuf,
    /// The token file.
    pub token_file: std::path::PathBuf,
    /// Where the server's unix socket goes.
    pub socket_dir: std::path::PathBuf,
}

impl ListenerFixture {
    /// A fixture in a scratch directory named `prefix...`, for a server run as `server_uid`.
    pub fn new(prefix: &str, token: &str, server_uid: Option<u32>) -> Self {
        use std::os::unix::fs::PermissionsExt;
        let base = crate::scratch::scratch_dir(prefix);
        let root = std::fs::canonicalize(base.path()).unwrap();
        let bin = root.join("bin");
        crate::install_binaries(&bin);
        let token_file = root.join("token");
        std::fs::write(&token_file, format!("{token}\n")).unwrap();
        std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let socket_dir = root.join("run");
        std::fs::create_dir(&socket_dir).unwrap();
        if let Some(uid) = server_uid {
            for path in [&token_file, &socket_dir] {
                std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
            }
        }
        Self {
            _base: base,
            bin,
            token_file,
            socket_dir,
        }
    }

    /// `probe ARGS...` as `uid` (the test's own user for `None`): the report's `detail`,
    /// after checking the probe itself ran (`context` names the call in a failure).
    pub fn probe(&self, uid: Option<u32>, args: &[&str], context: &str) -> serde_json::Value {
        use std::os::unix::process::CommandExt;
        let mut command = std::process::Command::new(self.bin.join("probe"));
        command.current_dir("/").args(args);
        if let Some(uid) = uid {
            command.uid(uid).gid(uid);
        }
        let (status, stdout, stderr) = crate::output_within(&mut command, b"");
        assert!(status.success(), "probe: {stdout} {stderr}");
        let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
        assert_eq!(report["ok"], true, "as uid {uid:?} {context}: {report}");
        report["detail"].clone()
    }
}
