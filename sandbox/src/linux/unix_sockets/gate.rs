//! What the holder allows: the policy's writable roots and the sockets it names, judged on
//! the descriptor a pathname resolves to.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::needs_notifier;
use crate::policy::ResolvedPolicy;
use crate::sys;

/// A socket the policy names, pinned when the sandbox started.
struct Named {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

/// What the holder allows: the policy's writable roots and its named sockets.
pub struct Gate {
    policy: ResolvedPolicy,
    named: Vec<Named>,
    pub(super) reporter: crate::linux::unix_refusals::Reporter,
    overlays: Vec<Overlay>,
}

/// An overlaid directory (`/tmp`): a socket on the overlay's mount lies in a writable root
/// only when its inode lives in the command's own upper layer; one of the host's, seen through
/// the lower layer, is refused whatever its path. (Sockets on mounts bound into it, a writable
/// root or a named socket, are judged as anywhere else.)
struct Overlay {
    path: PathBuf,
    /// The overlay's mount id (`None`: not identifiable, every socket on it is refused).
    mount: Option<u64>,
    upper: OwnedFd,
}

/// The decision about one pathname.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    Allowed,
    Denied(PathBuf),
}

impl Gate {
    /// The gate of a command under `policy` when this host needs the notifier for it
    /// ([`needs_notifier`]); see [`Self::open`]. `overlays`: the overlaid directories of the
    /// command's mount namespace and their upper layers ([`crate::linux::mounts::Applied::overlays`]).
    pub fn for_policy(
        policy: &ResolvedPolicy,
        overlays: Vec<(PathBuf, OwnedFd)>,
        warnings: &mut Vec<String>,
    ) -> Option<Self> {
        needs_notifier(policy).then(|| {
            let mut gate = Self::open(policy, warnings);
            for (path, upper) in overlays {
                let mount = sys::open_no_symlinks(None, &path)
                    .ok()
                    .and_then(|fd| mount_id(fd.as_fd()));
                gate.overlays.push(Overlay { path, mount, upper });
            }
            gate
        })
    }

    /// Pins the policy's named sockets (`allowUnixSockets`) by device and inode, opening each
    /// without following any symlink: one swapped in since the policy was resolved names
    /// nothing (reported in `warnings`). Call it in the sandbox's mount namespace.
    pub fn open(policy: &ResolvedPolicy, warnings: &mut Vec<String>) -> Self {
        let mut named = Vec::new();
        for path in &policy.unix_sockets {
            if denied_explicitly(policy, path) {
                // A hidden path (a server's socket) or a deny entry wins over a name.
                warnings.push(format!(
                    "allowed unix socket {} is hidden or denied by the policy; it stays \
                     unreachable",
                    path.display()
                ));
                continue;
            }
            let pinned = sys::open_no_symlinks(None, path)
                .and_then(|fd| nix::sys::stat::fstat(&fd).map_err(std::io::Error::from));
            match pinned {
                Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFSOCK => named.push(Named {
                    path: path.clone(),
                    dev: st.st_dev,
                    ino: st.st_ino,
                }),
                Ok(_) => warnings.push(format!(
                    "allowed unix socket {} is not a socket; it stays unreachable",
                    path.display()
                )),
                Err(err) => warnings.push(format!(
                    "allowed unix socket {} cannot be opened without following a symlink \
                     ({err}); it stays unreachable",
                    path.display()
                )),
            }
        }
        Self {
            policy: policy.clone(),
            named,
            reporter: crate::linux::unix_refusals::Reporter::new(None),
            overlays: Vec::new(),
        }
    }

    /// Refusals go to `channel` (the outer's refusal channel, when the denial audit runs)
    /// instead of stderr.
    pub fn report_to(mut self, channel: Option<OwnedFd>) -> Self {
        self.reporter = crate::linux::unix_refusals::Reporter::new(channel);
        self
    }

    /// Refusals go as one line to `stderr` (a copy of the command's stderr) instead of the
    /// holder's own.
    pub fn report_on(mut self, stderr: OwnedFd) -> Self {
        self.reporter = self.reporter.with_stderr(stderr);
        self
    }

    /// The descriptors the gate owns (its overlays' upper layers, its reporter's channel and
    /// stderr copy): a holder that closes what it inherited must keep these, or their owners
    /// would close them a second time.
    pub fn descriptors(&self) -> Vec<RawFd> {
        self.overlays
            .iter()
            .map(|overlay| overlay.upper.as_raw_fd())
            .chain(self.reporter.descriptors())
            .collect()
    }

    /// Whether the socket `target` (an `O_PATH` descriptor of it) may be connected to.
    pub(super) fn verdict(&self, target: BorrowedFd<'_>, st: &libc::stat) -> Verdict {
        if self
            .named
            .iter()
            .any(|named| named.dev == st.st_dev && named.ino == st.st_ino)
        {
            return Verdict::Allowed;
        }
        let link = format!("/proc/self/fd/{}", target.as_raw_fd());
        let Ok(path) = std::fs::read_link(&link) else {
            return Verdict::Denied(PathBuf::from("(unknown path)"));
        };
        let deleted = path.as_os_str().as_bytes().ends_with(b" (deleted)");
        if !deleted
            && path.is_absolute()
            && self.policy.can_write(&path)
            && self.own_if_overlaid(target, &path)
        {
            Verdict::Allowed
        } else {
            Verdict::Denied(path)
        }
    }

    /// False when `target` is on an overlay's own mount and no socket lives at its place in
    /// the command's upper layer: it is the host's, seen through the lower layer.
    fn own_if_overlaid(&self, target: BorrowedFd<'_>, path: &Path) -> bool {
        let on = mount_id(target);
        let Some(overlay) = self
            .overlays
            .iter()
            .find(|o| path.starts_with(&o.path) && (o.mount.is_none() || o.mount == on))
        else {
            return true;
        };
        let Ok(relative) = path.strip_prefix(&overlay.path) else {
            return false;
        };
        open_beneath_no_symlinks(overlay.upper.as_fd(), relative)
            .and_then(|fd| nix::sys::stat::fstat(&fd).map_err(std::io::Error::from))
            .is_ok_and(|own| own.st_mode & libc::S_IFMT == libc::S_IFSOCK)
    }

    /// The sockets it pins, for the report.
    pub fn named_paths(&self) -> Vec<&Path> {
        self.named.iter().map(|n| n.path.as_path()).collect()
    }
}

/// Whether `path` lies at or below a path the policy hides (a server's socket, token, ...) or
/// whose most specific rule is a deny entry. A path no rule covers is not "explicitly" denied:
/// naming a socket is how a policy that cannot read its directory reaches it.
pub(super) fn denied_explicitly(policy: &ResolvedPolicy, path: &Path) -> bool {
    if policy
        .hidden_paths()
        .iter()
        .any(|hidden| path.starts_with(hidden))
    {
        return true;
    }
    policy
        .rules()
        .iter()
        .filter(|rule| path.starts_with(&rule.path))
        .max_by_key(|rule| (rule.path.components().count(), rule.access))
        .is_some_and(|rule| rule.access == crate::policy::Access::Deny)
}

/// The id of the mount `fd` lies on (`mnt_id` of `/proc/self/fdinfo`).
fn mount_id(fd: BorrowedFd<'_>) -> Option<u64> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix("mnt_id:"))
        .and_then(|id| id.trim().parse().ok())
}

/// `O_PATH` open of `path` (relative to `dir`), following symlinks as `connect` would.
/// `relative` (normal components only) opened `O_PATH` below `dir` one component at a time,
/// following no symlink: with `openat` (the holder's seccomp filter refuses `openat2`).
fn open_beneath_no_symlinks(dir: BorrowedFd<'_>, relative: &Path) -> std::io::Result<OwnedFd> {
    use nix::fcntl::OFlag;
    let flags = OFlag::O_PATH | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW;
    let mut current: Option<OwnedFd> = None;
    for component in relative.components() {
        let std::path::Component::Normal(name) = component else {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        };
        let base = current.as_ref().map_or(dir, AsFd::as_fd);
        let next = nix::fcntl::openat(base, name, flags, nix::sys::stat::Mode::empty())?;
        current = Some(next);
    }
    current.ok_or_else(|| std::io::Error::from_raw_os_error(libc::EINVAL))
}

pub(super) fn open_following(dir: Option<BorrowedFd<'_>>, path: &Path) -> std::io::Result<OwnedFd> {
    use nix::fcntl::OFlag;
    let flags = OFlag::O_PATH | OFlag::O_CLOEXEC;
    let mode = nix::sys::stat::Mode::empty();
    match dir {
        Some(dir) => nix::fcntl::openat(dir, path, flags, mode),
        None => nix::fcntl::open(path, flags, mode),
    }
    .map_err(std::io::Error::from)
}
