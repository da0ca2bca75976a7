//! The command's side of a start: its `execve` arguments prepared before the fork (the
//! egress proxy's and the trust bundle's variables set), then, in the forked child, its
//! session, terminal, signals and rlimits, and the `execve` along its `PATH`.

use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::super::spec::Command;
use crate::exit::code::{EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, EXIT_SETUP_FAILED};

/// Where `execvp` looks when the command's environment has no `PATH`.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// The command's `execve` arguments, prepared before the fork.
pub(in crate::linux) struct Exec {
    program: OsString,
    candidates: Vec<CString>,
    argv: Vec<CString>,
    envp: Vec<CString>,
    limits: crate::limits::CommandLimits,
}

impl Exec {
    /// With `egress_port`, the proxy variables are set to the egress proxy (and override the
    /// command's own: nothing else is reachable); with `ca_bundle`, the trust variables
    /// ([`crate::egress::trust::TRUST_VARIABLES`]) point at it (and override the command's
    /// own: the bundle holds the host's roots too).
    pub(in crate::linux) fn new(
        command: &Command,
        egress_port: Option<u16>,
        ca_bundle: Option<&Path>,
    ) -> Self {
        let cstring = |bytes: &[u8]| CString::new(bytes).unwrap_or_default();
        let program = command.argv.first().cloned().unwrap_or_default();
        let argv = command.argv.iter().map(|a| cstring(a.as_bytes())).collect();
        let mut proxy_env = egress_port.map(proxy_environment).unwrap_or_default();
        proxy_env.extend(ca_bundle.into_iter().flat_map(|bundle| {
            crate::egress::trust::TRUST_VARIABLES
                .iter()
                .map(|name| (OsString::from(name), bundle.as_os_str().to_owned()))
        }));
        let envp = command
            .env
            .iter()
            .filter(|(key, _)| !proxy_env.iter().any(|(name, _)| name == key))
            .chain(proxy_env.iter())
            .map(|(key, value)| {
                let mut entry = key.as_bytes().to_vec();
                entry.push(b'=');
                entry.extend_from_slice(value.as_bytes());
                cstring(&entry)
            })
            .collect();
        let path = command
            .env
            .iter()
            .find(|(key, _)| key == "PATH")
            .map_or(OsStr::new(DEFAULT_PATH), |(_, value)| value.as_os_str());
        let candidates = search_path(&program, path)
            .iter()
            .map(|p| cstring(p.as_os_str().as_bytes()))
            .collect();
        Self {
            program,
            candidates,
            argv,
            envp,
            limits: command.limits.clone(),
        }
    }
}

/// The proxy variables of a command whose network is an allowlist: HTTP and HTTPS through the
/// proxy's HTTP side, everything else through its SOCKS5 side (`socks5h`: names are resolved by
/// the proxy, as they must be: the sandbox has no DNS), and no exceptions.
pub(in crate::linux) fn proxy_environment(port: u16) -> Vec<(OsString, OsString)> {
    let http = format!("http://127.0.0.1:{port}");
    let socks = format!("socks5h://127.0.0.1:{port}");
    [
        ("HTTP_PROXY", http.as_str()),
        ("HTTPS_PROXY", http.as_str()),
        ("ALL_PROXY", socks.as_str()),
        ("NO_PROXY", ""),
        ("http_proxy", http.as_str()),
        ("https_proxy", http.as_str()),
        ("all_proxy", socks.as_str()),
        ("no_proxy", ""),
    ]
    .into_iter()
    .map(|(key, value)| (OsString::from(key), OsString::from(value)))
    .collect()
}

/// Where `execvp` would look for `program` along `path`.
fn search_path(program: &OsStr, path: &OsStr) -> Vec<PathBuf> {
    if program.as_bytes().contains(&b'/') {
        return vec![PathBuf::from(program)];
    }
    path.as_bytes()
        .split(|b| *b == b':')
        .map(|dir| {
            let dir = if dir.is_empty() { b"." as &[u8] } else { dir };
            Path::new(OsStr::from_bytes(dir)).join(program)
        })
        .collect()
}

/// The command's process: its own session, the sandbox's terminal as its controlling
/// terminal, default signals, its rlimits, then `execve`. Never returns.
pub(in crate::linux) fn start_command(
    exec: &Exec,
    slave: Option<&OwnedFd>,
    relayed: [bool; 3],
) -> ! {
    crate::sys::reset_signals_for_exec();
    let _ = nix::unistd::setsid();
    if let Some(slave) = slave {
        let _ = crate::sys::set_controlling_terminal(slave.as_fd());
        for (fd, relayed) in crate::sys::Stdio::ALL.into_iter().zip(relayed) {
            if relayed {
                let _ = crate::sys::replace_stdio(slave.as_fd(), fd);
            }
        }
        // This process's copy (the parent closes its own).
        let _ = nix::unistd::close(slave.as_raw_fd());
    }
    exec_prepared(exec)
}

/// The command's rlimits, then `execve` along its `PATH`. Never returns.
pub(in crate::linux) fn exec_prepared(exec: &Exec) -> ! {
    // Last, so nothing of the setup above counts against them (and PID 1 never has them).
    if let Err(err) = crate::limits::apply_pool_rlimits_to_current_process(&exec.limits)
        .and_then(|()| exec.limits.apply_rlimits_to_current_process())
    {
        eprintln!("sandbox-run: {err}");
        crate::sys::exit_now(i32::from(EXIT_SETUP_FAILED));
    }
    // As execvp: keep looking after "not there" and "not permitted", report a permission
    // problem if one was met, stop at any other error.
    let mut error = std::io::Error::from_raw_os_error(libc::ENOENT);
    for candidate in &exec.candidates {
        let failed = crate::sys::execve(candidate, &exec.argv, &exec.envp);
        match failed.raw_os_error() {
            Some(libc::ENOENT | libc::ENOTDIR) => {}
            Some(libc::EACCES) => error = failed,
            _ => {
                error = failed;
                break;
            }
        }
    }
    eprintln!(
        "sandbox-run: cannot execute {}: {error}",
        exec.program.to_string_lossy()
    );
    let status = if error.raw_os_error() == Some(libc::ENOENT) {
        EXIT_NOT_FOUND
    } else {
        EXIT_CANNOT_EXECUTE
    };
    crate::sys::exit_now(i32::from(status))
}
