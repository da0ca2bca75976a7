//! The server's memory during a siege: its peak RSS ([`PeakRss`]) and a cgroup v1 memory group
//! with a hard limit ([`MemoryCgroup`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::rss_kib;

/// Samples the server's RSS every 20 ms on a thread and keeps the peak.
pub struct PeakRss {
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PeakRss {
    /// Start sampling `pid`.
    pub fn start(pid: i32) -> PeakRss {
        let peak = Arc::new(AtomicU64::new(rss_kib(pid)));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (peak.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let kib = std::fs::read_to_string(format!("/proc/{pid}/status"))
                    .ok()
                    .and_then(|status| {
                        status
                            .lines()
                            .find_map(|l| l.strip_prefix("VmRSS:"))
                            .and_then(|v| {
                                v.trim().trim_end_matches("kB").trim().parse::<u64>().ok()
                            })
                    });
                if let Some(kib) = kib {
                    p.fetch_max(kib, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(20)); // sampling interval
            }
        });
        PeakRss {
            peak,
            stop,
            thread: Some(thread),
        }
    }

    /// The peak so far, in KiB.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// Stop sampling; the peak in KiB.
    pub fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.peak()
    }
}

impl Drop for PeakRss {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A memory cgroup (v1) with a hard limit.
pub struct MemoryCgroup {
    dir: PathBuf,
}

/// Where the v1 memory controller is mounted.
const MEMORY_CONTROLLER: &str = "/sys/fs/cgroup/memory";

impl MemoryCgroup {
    /// A new group limited to `limit_bytes`, or `None` when the host has no writable v1 memory
    /// controller (not root, or another cgroup layout).
    pub fn try_new(name: &str, limit_bytes: u64) -> Option<MemoryCgroup> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let root = std::path::Path::new(MEMORY_CONTROLLER);
        if !root.join("memory.limit_in_bytes").exists() {
            return None;
        }
        let dir = root.join(format!(
            "execward-{name}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&dir).ok()?;
        let group = MemoryCgroup { dir };
        std::fs::write(
            group.dir.join("memory.limit_in_bytes"),
            limit_bytes.to_string(),
        )
        .ok()?;
        Some(group)
    }

    /// Move `pid` (and what it starts from now on) into the group.
    pub fn add(&self, pid: i32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .unwrap_or_else(|e| panic!("move {pid} into {}: {e}", self.dir.display()));
    }

    /// Processes the kernel's OOM killer killed in the group.
    pub fn oom_kills(&self) -> u64 {
        std::fs::read_to_string(self.dir.join("memory.oom_control"))
            .ok()
            .and_then(|text| {
                text.lines()
                    .find_map(|line| line.strip_prefix("oom_kill "))
                    .and_then(|n| n.trim().parse().ok())
            })
            .unwrap_or(0)
    }

    /// The group's peak usage (resident memory of its processes and the page cache they
    /// caused), in bytes, and how often it hit its limit.
    pub fn peak_and_failures(&self) -> (u64, u64) {
        let read = |name: &str| {
            std::fs::read_to_string(self.dir.join(name))
                .ok()
                .and_then(|text| text.trim().parse().ok())
                .unwrap_or(0)
        };
        (read("memory.max_usage_in_bytes"), read("memory.failcnt"))
    }

    /// The group's limit, in bytes.
    pub fn limit(&self) -> u64 {
        std::fs::read_to_string(self.dir.join("memory.limit_in_bytes"))
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // Members still alive (a killed server's children are killed by its guardian a moment
        // later) move back to the root group, then the group goes.
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(5) {
            if let Ok(procs) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
                for pid in procs.lines() {
                    let _ = std::fs::write(
                        std::path::Path::new(MEMORY_CONTROLLER).join("cgroup.procs"),
                        pid,
                    );
                }
            }
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20)); // retry interval
        }
    }
}
