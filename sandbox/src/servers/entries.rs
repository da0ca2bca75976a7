//! One entry file read and checked, and whether the server that wrote it still runs.

use std::ffi::OsStr;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use super::{
    ENTRY_SUFFIX, Entry, MAX_ENTRY_BYTES, MAX_ENTRY_PATHS, MAX_ENTRY_PORTS, RegistryError,
};

/// Start time and PID namespace of `pid`, as `/proc` shows them.
pub(super) fn process_identity(pid: u32) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    // Field 22 overall is the 20th after the name (fields 3.. start at index 0).
    let start = rest.split_whitespace().nth(19)?.parse().ok()?;
    let ns = std::fs::metadata(format!("/proc/{pid}/ns/pid")).ok()?.ino();
    Some((start, ns))
}

pub(super) fn own_pid_namespace() -> u64 {
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
}

/// Whether the server that wrote `entry` still runs. An entry of another PID namespace cannot
/// be checked from here and counts as alive (keeping it only narrows a sandbox).
pub(super) fn entry_alive(entry: &Entry, own_ns: u64) -> bool {
    if entry.pid_namespace != own_ns || own_ns == 0 {
        return true;
    }
    process_identity(entry.pid)
        .is_some_and(|(start, ns)| start == entry.start_time && ns == entry.pid_namespace)
}

/// One entry file, `None` when it is not an entry (temporary or foreign name).
pub(super) fn read_entry(path: &Path, uid: u32) -> Result<Option<Entry>, RegistryError> {
    let name = path.file_name().and_then(OsStr::to_str).unwrap_or("");
    if name.starts_with('.') || !name.ends_with(ENTRY_SUFFIX) {
        return Ok(None);
    }
    let error = |reason: String| RegistryError::Entry {
        path: path.to_owned(),
        reason,
    };
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(file) => file,
        // Removed between the listing and this open: its server unregistered as it exited, and
        // an exited server has nothing left to hide. (Seen in CI: a neighbour's sandbox failed
        // to build while another server of the uid shut down.)
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(error(e.to_string())),
    };
    let meta = file.metadata().map_err(|e| error(e.to_string()))?;
    if !meta.is_file() || meta.uid() != uid {
        // Not one of the uid's servers wrote it (the directory is the uid's alone).
        return Ok(None);
    }
    if meta.len() > MAX_ENTRY_BYTES {
        return Err(error(format!("larger than {MAX_ENTRY_BYTES} bytes")));
    }
    let mut text = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(&file, MAX_ENTRY_BYTES + 1),
        &mut text,
    )
    .map_err(|e| error(e.to_string()))?;
    let entry: Entry = serde_json::from_slice(&text).map_err(|e| error(e.to_string()))?;
    if entry.hidden.len() > MAX_ENTRY_PATHS || entry.read_only.len() > MAX_ENTRY_PATHS {
        return Err(error(format!("more than {MAX_ENTRY_PATHS} paths")));
    }
    if entry.tcp_ports.len() > MAX_ENTRY_PORTS {
        return Err(error(format!("more than {MAX_ENTRY_PORTS} TCP ports")));
    }
    Ok(Some(entry))
}
