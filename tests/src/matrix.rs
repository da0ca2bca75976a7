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
