//! A file `sandbox-run` writes about a command (the denial audit's report, `--audit FILE`; the
//! egress proxy's log, `--egress-log FILE`), opened before the command starts and written
//! through that descriptor.
//!
//! `sandbox-run` often runs as root and writes the report after the command ran; writing by
//! path then would follow whatever the command planted there (a symlink at `denials.sarif` in
//! the workspace pointing at a root-owned file outside). So:
//! - the parent directory is opened once, as the user named it;
//! - the file is created in it by descriptor, never following a symlink at its name
//!   (`O_NOFOLLOW`); inside a writable root of the policy a regular file or symlink already
//!   there is removed and the report created fresh (`O_EXCL`), since only the command could have
//!   put it there; a device or FIFO (`/dev/null`, `/dev/stdout`) is written as it is, never
//!   removed;
//! - the report is written through that descriptor when the command has ended.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use crate::policy::ResolvedPolicy;

/// Where the report goes.
#[derive(Debug)]
pub enum ReportFile {
    /// `-`: standard output.
    Stdout,
    /// A file created before the command started.
    File(File),
}

/// Why a report file could not be opened: which file (`what`, e.g. "audit report"), where,
/// and the [`Refusal`].
#[derive(Debug, thiserror::Error)]
#[error("{what} {}: {refusal}", path.display())]
pub struct ReportFileError {
    /// What the file is for, as the user knows it ("audit report", "egress log").
    pub what: &'static str,
    /// The path as given.
    pub path: PathBuf,
    /// What was wrong.
    pub refusal: Refusal,
}

/// What was wrong with a report file's path.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// The path does not end in a file name (`/`, `..`).
    #[error("must name a file")]
    NotAFileName,
    /// The directory could not be opened.
    #[error("cannot open its directory: {0}")]
    Directory(nix::errno::Errno),
    /// The opened directory's path could not be read back.
    #[error("cannot resolve its directory: {0}")]
    ResolveDirectory(std::io::Error),
    /// A directory is at the name.
    #[error("is a directory")]
    IsDirectory,
    /// A symlink is at the name, outside the writable roots (only the command could have put
    /// one inside them, and there it is replaced).
    #[error("is a symlink; refusing to write through it (remove it or choose another path)")]
    Symlink,
    /// What the command left at the name could not be removed.
    #[error("cannot replace it: {0}")]
    Replace(nix::errno::Errno),
    /// Something appeared at the name between the check and the create.
    #[error("appeared while it was being created; refusing to write through it")]
    Appeared,
    /// The create failed.
    #[error("cannot create it: {0}")]
    Create(nix::errno::Errno),
}

impl ReportFile {
    /// Opens (creates) the file `path` for `what` ("audit report", "egress log") under `policy`.
    ///
    /// # Errors
    /// [`ReportFileError`] naming the file and the path: no file name, the parent cannot be
    /// opened, or a symlink sits at the name outside the writable roots.
    pub fn open(
        path: &Path,
        what: &'static str,
        policy: &ResolvedPolicy,
    ) -> Result<Self, ReportFileError> {
        let setup = |refusal| ReportFileError {
            what,
            path: path.to_owned(),
            refusal,
        };
        if path.as_os_str() == "-" {
            return Ok(Self::Stdout);
        }
        let Some(Component::Normal(name)) = path.components().next_back() else {
            return Err(setup(Refusal::NotAFileName));
        };
        let parent = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
            _ => PathBuf::from("."),
        };
        let dir: OwnedFd = nix::fcntl::open(
            &parent,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|err| setup(Refusal::Directory(err)))?;
        let resolved_parent = std::fs::read_link(format!("/proc/self/fd/{}", {
            use std::os::fd::AsRawFd;
            dir.as_raw_fd()
        }))
        .map_err(|err| setup(Refusal::ResolveDirectory(err)))?;
        let inside_writable_root =
            policy.restricts_filesystem() && policy.can_write(&resolved_parent.join(name));
        let existing =
            nix::sys::stat::fstatat(&dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW);
        let kind = existing.as_ref().ok().map(|st| st.st_mode & libc::S_IFMT);
        let base = OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let flags = match kind {
            None => base | OFlag::O_CREAT | OFlag::O_EXCL,
            Some(libc::S_IFDIR) => return Err(setup(Refusal::IsDirectory)),
            Some(libc::S_IFLNK) if !inside_writable_root => {
                return Err(setup(Refusal::Symlink));
            }
            // Only the command (or an earlier one) could have put a file or link here: start
            // fresh. Never anything else: a device (/dev/null) or a FIFO is written as it is.
            Some(libc::S_IFLNK | libc::S_IFREG) if inside_writable_root => {
                match nix::unistd::unlinkat(&dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir) {
                    Ok(()) | Err(nix::errno::Errno::ENOENT) => {}
                    Err(err) => return Err(setup(Refusal::Replace(err))),
                }
                base | OFlag::O_CREAT | OFlag::O_EXCL
            }
            Some(libc::S_IFREG) => base | OFlag::O_TRUNC,
            Some(_) => base,
        };
        let file = nix::fcntl::openat(dir.as_fd(), name, flags, Mode::from_bits_truncate(0o644))
            .map_err(|err| match err {
                nix::errno::Errno::ELOOP => setup(Refusal::Symlink),
                nix::errno::Errno::EEXIST => setup(Refusal::Appeared),
                err => setup(Refusal::Create(err)),
            })?;
        Ok(Self::File(File::from(file)))
    }

    /// Writes the whole report.
    ///
    /// # Errors
    /// The write error.
    pub fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            Self::Stdout => {
                let mut stdout = std::io::stdout().lock();
                stdout.write_all(bytes)?;
                stdout.flush()
            }
            Self::File(file) => {
                file.write_all(bytes)?;
                file.flush()
            }
        }
    }
}
