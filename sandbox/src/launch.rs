//! The launch request exec-server hands `sandbox-run` (`--launch-fd N`): the policy it resolved
//! once, from its own environment, and the command to run. The command's environment travels
//! here, never in `sandbox-run`'s own environment: nothing from the request (`LD_PRELOAD`,
//! `GCONV_PATH`, `TMPDIR`, ...) touches `sandbox-run` before it is confined, and `sandbox-run`
//! resolves nothing again.
//!
//! The request is JSON in a sealed memfd (so the server never blocks writing it), read once.

use std::io::Read;
use std::os::fd::{OwnedFd, RawFd};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::policy::ResolvedPolicy;

/// Largest launch request read (argv and environment are bounded well below this by the
/// server's own limits).
pub const MAX_LAUNCH_REQUEST_BYTES: u64 = 16 * 1024 * 1024;

/// What to run, under which resolved policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaunchRequest {
    /// The policy, resolved by the server.
    pub policy: ResolvedPolicy,
    /// Program and arguments.
    pub argv: Vec<String>,
    /// The command's complete environment.
    pub env: Vec<(String, String)>,
    /// The working directory (absolute, validated by the server).
    pub cwd: PathBuf,
    /// Run even if a layer the policy needs is missing.
    #[serde(default)]
    pub best_effort: bool,
    /// Rlimits for the command and its wall-clock time (the server's cgroup bounds memory and
    /// processes).
    #[serde(
        default,
        skip_serializing_if = "crate::limits::CommandLimits::is_empty"
    )]
    pub limits: crate::limits::CommandLimits,
}

/// Why a launch request could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// Reading the descriptor failed.
    #[error("reading the launch request from descriptor {fd} failed: {source}")]
    Read {
        /// The descriptor.
        fd: RawFd,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The request is larger than [`MAX_LAUNCH_REQUEST_BYTES`].
    #[error(
        "the launch request is larger than MAX_LAUNCH_REQUEST_BYTES ({MAX_LAUNCH_REQUEST_BYTES})"
    )]
    TooLarge,
    /// The request does not parse.
    #[error("the launch request is malformed: {0}")]
    Malformed(String),
    /// Writing the request failed.
    #[error("writing the launch request failed: {0}")]
    Write(std::io::Error),
}

impl LaunchRequest {
    /// Reads the request from inherited descriptor `fd` (and closes it).
    ///
    /// # Errors
    /// [`LaunchError`] when the descriptor cannot be read or the JSON is malformed.
    #[cfg(target_os = "linux")]
    pub fn read_from_fd(fd: RawFd) -> Result<Self, LaunchError> {
        // `fd` was handed to us for this purpose alone (exec-server's file action); the wrapper
        // checks that it is open before taking ownership.
        let owned =
            crate::sys::take_inherited_fd(fd).map_err(|source| LaunchError::Read { fd, source })?;
        read_json(owned)
    }

    /// The request in a sealed memfd, positioned at its start, ready to be inherited.
    ///
    /// # Errors
    /// [`LaunchError::Write`].
    pub fn to_memfd(&self) -> Result<OwnedFd, LaunchError> {
        write_json(self)
    }
}

/// Reads one JSON value of at most [`MAX_LAUNCH_REQUEST_BYTES`] from `fd` (a memfd made by
/// [`write_json`]) and closes it.
///
/// # Errors
/// [`LaunchError`] when the descriptor cannot be read or the JSON is malformed.
pub fn read_json<T: serde::de::DeserializeOwned>(fd: OwnedFd) -> Result<T, LaunchError> {
    use std::os::fd::AsRawFd;
    let raw = fd.as_raw_fd();
    let file = std::fs::File::from(fd);
    let mut text = Vec::new();
    (&file)
        .take(MAX_LAUNCH_REQUEST_BYTES + 1)
        .read_to_end(&mut text)
        .map_err(|source| LaunchError::Read { fd: raw, source })?;
    if text.len() as u64 > MAX_LAUNCH_REQUEST_BYTES {
        return Err(LaunchError::TooLarge);
    }
    serde_json::from_slice(&text).map_err(|err| LaunchError::Malformed(err.to_string()))
}

/// `value` as JSON in a sealed memfd, positioned at its start, ready to be inherited or sent.
///
/// # Errors
/// [`LaunchError::Write`].
pub fn write_json<T: Serialize>(value: &T) -> Result<OwnedFd, LaunchError> {
    use nix::sys::memfd::{MFdFlags, memfd_create};
    use std::io::{Seek, Write};
    let json = serde_json::to_vec(value).map_err(|e| LaunchError::Write(e.into()))?;
    let fd = memfd_create(
        c"execward-launch",
        MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
    )
    .map_err(|e| LaunchError::Write(e.into()))?;
    let mut file = std::fs::File::from(fd);
    file.write_all(&json).map_err(LaunchError::Write)?;
    file.rewind().map_err(LaunchError::Write)?;
    let seals = nix::fcntl::SealFlag::F_SEAL_SEAL
        | nix::fcntl::SealFlag::F_SEAL_SHRINK
        | nix::fcntl::SealFlag::F_SEAL_GROW
        | nix::fcntl::SealFlag::F_SEAL_WRITE;
    nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_ADD_SEALS(seals))
        .map_err(|e| LaunchError::Write(e.into()))?;
    Ok(OwnedFd::from(file))
}
