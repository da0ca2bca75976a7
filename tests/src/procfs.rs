//! `/proc` probes: whether a process is dead, its children and descendants, its stat fields,
//! resident memory, open descriptors and command line.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// True when `/proc/<pid>` is gone or the process is a zombie (dead, not yet reaped).
pub fn process_is_dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat_field(&stat, 3).is_none_or(|state| state == "Z" || state == "X"),
    }
}

/// The live processes whose parent is `parent`.
pub fn children_of(parent: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| stat_field(&stat, 4))
                .and_then(|ppid| ppid.parse::<i32>().ok())
                == Some(parent)
        })
        .collect()
}

/// Field `n` (1-based, as in proc(5)) of a `/proc/<pid>/stat` line.
pub fn stat_field(stat: &str, n: usize) -> Option<String> {
    let after_comm = &stat[stat.rfind(')')? + 2..];
    after_comm
        .split_whitespace()
        .nth(n.checked_sub(3)?)
        .map(str::to_owned)
}

/// Poll until `pid` is dead, panicking after `deadline`.
pub fn wait_process_dead(pid: i32, deadline: Duration, what: &str) {
    let started = Instant::now();
    while !process_is_dead(pid) {
        assert!(
            started.elapsed() < deadline,
            "{what} (pid {pid}) still alive after {deadline:?}"
        );
        std::thread::sleep(Duration::from_millis(10)); // polling interval, not a wait
    }
}

/// `VmRSS` of `pid` in KiB, from `/proc/<pid>/status`.
pub fn rss_kib(pid: i32) -> u64 {
    status_kib(pid, "VmRSS")
}

/// `VmHWM` (peak resident memory) of `pid` in KiB, from `/proc/<pid>/status`.
pub fn peak_rss_kib(pid: i32) -> u64 {
    status_kib(pid, "VmHWM")
}

/// The `field` (a `... kB` line) of `/proc/<pid>/status`.
fn status_kib(pid: i32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// Number of open descriptors of `pid` (entries of `/proc/<pid>/fd`).
pub fn fd_count(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/fd: {e}"))
        .count()
}

/// What each open descriptor of `pid` refers to (`fd -> target`, as `/proc/<pid>/fd` links
/// show it), sorted by descriptor; for naming the descriptors a leak left behind.
pub fn fd_targets(pid: i32) -> Vec<(i32, String)> {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    let mut targets: Vec<(i32, String)> = entries
        .flatten()
        .filter_map(|entry| {
            let fd = entry.file_name().to_string_lossy().parse().ok()?;
            let target = std::fs::read_link(entry.path()).ok()?;
            Some((fd, target.to_string_lossy().into_owned()))
        })
        .collect();
    targets.sort_unstable();
    targets
}

/// Pids of every live (non-zombie) descendant of `pid`, found through `/proc/*/stat` parents.
pub fn descendants(pid: i32) -> Vec<i32> {
    let mut parents = HashMap::new();
    for entry in std::fs::read_dir("/proc").expect("read /proc").flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        if matches!(stat_field(&stat, 3).as_deref(), Some("Z" | "X")) {
            continue;
        }
        if let Some(parent) = stat_field(&stat, 4).and_then(|p| p.parse::<i32>().ok()) {
            parents.insert(child, parent);
        }
    }
    let mut found = Vec::new();
    let mut frontier = vec![pid];
    while let Some(current) = frontier.pop() {
        for (&child, &parent) in &parents {
            if parent == current && !found.contains(&child) {
                found.push(child);
                frontier.push(child);
            }
        }
    }
    found.sort_unstable();
    found
}

/// The command line of `pid` with NULs shown as spaces (empty when it is gone).
pub fn cmdline(pid: i32) -> String {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    String::from_utf8_lossy(&raw)
        .replace('\0', " ")
        .trim()
        .to_owned()
}

/// Live processes whose command line is exactly `sleep MARK` (host pids, sandboxed or not):
/// tests mark the daemons they leave behind with a unique sleep length.
pub fn sleeping(mark: &str) -> Vec<i32> {
    let wanted = format!("sleep\0{mark}\0");
    std::fs::read_dir("/proc")
        .expect("read /proc")
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == wanted.as_bytes())
        })
        .filter(|pid| !process_is_dead(*pid))
        .collect()
}
