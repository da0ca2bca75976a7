//! Whether a local peer's process runs in this server's user namespace.
//!
//! Every sandbox this project builds (and a container) runs in a user namespace of its own, and
//! a uid there proves nothing about what the process may do: a sandboxed command of another
//! execward server runs as the same user as that server, and a listener that admits its own user
//! without a token would let it drive this server outside its sandbox. A sandbox built after
//! this server registered cannot connect to its port or socket at all (`sandbox::servers`); one
//! already running when this server started can, and is told apart here.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Most `/proc` entries looked at for one socket's holders.
const MAX_PROCESSES_SCANNED: usize = 65_536;

/// The user namespace of a process (`/proc/PID/ns/user`'s device and inode), `None` when it
/// cannot be examined.
fn user_namespace(proc_dir: &Path) -> Option<(u64, u64)> {
    let meta = std::fs::metadata(proc_dir.join("ns/user")).ok()?;
    Some((meta.dev(), meta.ino()))
}

/// This process's user namespace.
fn own_user_namespace() -> Option<(u64, u64)> {
    user_namespace(Path::new("/proc/self"))
}

/// Whether process `pid` (in this server's PID namespace) runs in this server's user namespace;
/// `false` when either cannot be examined (fail closed).
pub fn pid_in_own_user_namespace(pid: i32) -> bool {
    match (
        own_user_namespace(),
        user_namespace(&Path::new("/proc").join(pid.to_string())),
    ) {
        (Some(own), Some(theirs)) => own == theirs,
        _ => false,
    }
}

/// How long a scan waits for descriptors when the server has none free (a descriptor shortage
/// passes: the scan is tried again every [`RETRY_PAUSE`] until then).
const DESCRIPTOR_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
/// Pause between scans while descriptors are short.
const RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(20);

/// Whether every process holding the socket with sockfs inode `inode` runs in this server's user
/// namespace, and at least one was found; `false` otherwise (fail closed: a holder this server
/// may not examine, or none left). A scan cut short because this server is out of descriptors
/// is tried again for up to [`DESCRIPTOR_WAIT`], so a connection accepted as descriptors free up
/// is not refused for the server's own shortage; then it fails closed too.
pub fn socket_holders_in_own_user_namespace(inode: u32) -> bool {
    let deadline = std::time::Instant::now() + DESCRIPTOR_WAIT;
    loop {
        match scan(inode) {
            Ok(verdict) => return verdict,
            Err(_) if std::time::Instant::now() < deadline => std::thread::sleep(RETRY_PAUSE),
            Err(_) => return false,
        }
    }
}

/// Whether `error` is this process (or the host) being out of descriptors.
fn out_of_descriptors(error: &std::io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// One scan of `/proc` for `inode`'s holders; `Err` when it was cut short by a descriptor
/// shortage.
fn scan(inode: u32) -> Result<bool, std::io::Error> {
    let Some(own) = own_user_namespace() else {
        return Ok(false);
    };
    let target = format!("socket:[{inode}]");
    let processes = match std::fs::read_dir("/proc") {
        Ok(processes) => processes,
        Err(error) if out_of_descriptors(&error) => return Err(error),
        Err(_) => return Ok(false),
    };
    let mut found = false;
    for process in processes.flatten().take(MAX_PROCESSES_SCANNED) {
        let name = process.file_name();
        if !name
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        let dir = process.path();
        let descriptors = match std::fs::read_dir(dir.join("fd")) {
            Ok(descriptors) => descriptors,
            Err(error) if out_of_descriptors(&error) => return Err(error),
            Err(_) => continue,
        };
        let holds = descriptors.flatten().any(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|link| link.as_os_str() == target.as_str())
        });
        if holds {
            if user_namespace(&dir) != Some(own) {
                return Ok(false);
            }
            found = true;
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn this_process_and_its_own_socket_are_in_its_user_namespace() {
        assert!(pid_in_own_user_namespace(std::process::id() as i32));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let inode = std::fs::metadata(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&listener)
        ))
        .unwrap()
        .ino();
        assert!(socket_holders_in_own_user_namespace(inode as u32));
        // A socket nobody holds is not vouched for.
        assert!(!socket_holders_in_own_user_namespace(u32::MAX));
    }

    /// A process in a user namespace of its own (as every sandbox is) is not vouched for, and
    /// neither is a socket it holds.
    #[test]
    fn a_process_in_another_user_namespace_and_its_socket_are_not() {
        let mut child = std::process::Command::new("unshare")
            .args(["--user", "--map-root-user", "--", "python3", "-c"])
            .arg("import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); time.sleep(10)")
            .spawn()
            .expect("unshare (util-linux) starts a process in a new user namespace");
        let pid = child.id() as i32;
        // Until `unshare` has moved itself into the new namespace.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while pid_in_own_user_namespace(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!pid_in_own_user_namespace(pid));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let inodes = loop {
            let inodes: Vec<u64> = std::fs::read_dir(format!("/proc/{pid}/fd"))
                .unwrap()
                .flatten()
                .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                .filter_map(|link| {
                    let text = link.to_string_lossy().into_owned();
                    text.strip_prefix("socket:[")?
                        .strip_suffix(']')?
                        .parse()
                        .ok()
                })
                .collect();
            if !inodes.is_empty() || std::time::Instant::now() > deadline {
                break inodes;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        assert!(!inodes.is_empty(), "the child never held its socket");
        for inode in inodes {
            assert!(!socket_holders_in_own_user_namespace(inode as u32));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}
