//! Turning audit records into [`Denial`]s of one command tree, and only of it (sans-I/O).
//!
//! Attribution rules, exact rather than heuristic:
//! - Landlock: a `LANDLOCK_DOMAIN status=allocated` record names the process that created the
//!   domain (`pid`, the thread-group id). Only domains created by the tree's root process are
//!   ours; every `LANDLOCK_ACCESS` record carries its domain id. Domains the program nests
//!   inside ours are its own business and are not reported.
//! - seccomp and the read-only mount layer: the root process starts a fresh audit session
//!   before it confines itself, and every descendant inherits it; records are ours when their
//!   `ses` is that session. Without a session (it could not be created), only the root pid
//!   itself is attributed.
//!
//! Records of one event share a serial; an event is complete at its `EOE` record, or when the
//! caller calls [`Correlator::finish`].

use std::collections::{BTreeMap, BTreeSet};

use crate::audit::advice::allow_rule;
use crate::audit::denial::{Denial, Layer};
use crate::audit::records::{
    AUDIT_CWD, AUDIT_EOE, AUDIT_LANDLOCK_ACCESS, AUDIT_LANDLOCK_DOMAIN, AUDIT_PATH, AUDIT_SECCOMP,
    AUDIT_SYSCALL, Record, rfc3339,
};
use crate::audit::syscalls;
use crate::policy::ResolvedPolicy;

/// `EROFS`: what the read-only mount layer returns.
const EROFS: i64 = 30;
/// `O_CREAT` in open flags.
const O_CREAT: u64 = 0o100;
/// `AT_REMOVEDIR` in `unlinkat` flags.
const AT_REMOVEDIR: u64 = 0x200;
/// Mask of the action part of a seccomp return value.
const SECCOMP_RET_ACTION_FULL: u64 = 0xffff_0000;
/// `SECCOMP_RET_ERRNO`.
const SECCOMP_RET_ERRNO: u64 = 0x0005_0000;
/// Syscalls the seccomp filter answers with an errno by design rather than to refuse them:
/// `clone3` gets `ENOSYS` so libc falls back to `clone`, whose flags the filter checks. With
/// `SECCOMP_FILTER_FLAG_LOG` they are logged too, but they are not denials.
const SECCOMP_FALLBACK_SYSCALLS: &[&str] = &["clone3"];
/// Pending events older than this many seconds (record time) are flushed without an `EOE`.
const STALE_EVENT_SECS: u64 = 2;

/// The command tree being audited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    /// The process that confined itself (thread-group id, initial pid namespace).
    pub root_pid: u32,
    /// The audit session every process of the tree is in, when one was created.
    pub session: Option<u32>,
}

/// Sans-I/O correlator: records in, denials out.
#[derive(Debug)]
pub struct Correlator {
    target: Target,
    policy: ResolvedPolicy,
    domains: BTreeSet<String>,
    pending: BTreeMap<u64, Vec<Record>>,
}

impl Correlator {
    /// A correlator for `target`, confined by `policy` (used for the allow-rule advice).
    pub fn new(target: Target, policy: ResolvedPolicy) -> Self {
        Self {
            target,
            policy,
            domains: BTreeSet::new(),
            pending: BTreeMap::new(),
        }
    }

    /// Adds one record; returns the denials of the events it completed.
    pub fn push(&mut self, record: Record) -> Vec<Denial> {
        let serial = record.serial;
        let now = record.secs;
        let complete = record.kind == AUDIT_EOE;
        self.pending.entry(serial).or_default().push(record);
        let mut done: Vec<u64> = Vec::new();
        if complete {
            done.push(serial);
        }
        done.extend(
            self.pending
                .iter()
                .filter(|(s, records)| {
                    **s != serial
                        && records
                            .first()
                            .is_some_and(|r| r.secs + STALE_EVENT_SECS < now)
                })
                .map(|(s, _)| *s),
        );
        done.sort_unstable();
        let mut out = Vec::new();
        for serial in done {
            if let Some(records) = self.pending.remove(&serial) {
                out.extend(self.event(&records));
            }
        }
        out
    }

    /// Completes every pending event (call after the last record arrived).
    pub fn finish(&mut self) -> Vec<Denial> {
        let pending = std::mem::take(&mut self.pending);
        pending
            .values()
            .flat_map(|records| self.event(records))
            .collect()
    }

    fn in_session(&self, record: &Record) -> bool {
        match self.target.session {
            Some(session) => record.number("ses") == Some(i64::from(session)),
            None => record.number("pid") == Some(i64::from(self.target.root_pid)),
        }
    }

    fn event(&mut self, records: &[Record]) -> Vec<Denial> {
        let root = i64::from(self.target.root_pid);
        for domain in records.iter().filter(|r| r.kind == AUDIT_LANDLOCK_DOMAIN) {
            if domain.raw("status") == Some("allocated")
                && domain.number("pid") == Some(root)
                && let Some(id) = domain.raw("domain")
            {
                self.domains.insert(id.to_owned());
            }
        }
        let syscall = records.iter().find(|r| r.kind == AUDIT_SYSCALL);
        let syscall_name = syscall
            .and_then(|s| s.number("syscall"))
            .map(syscalls::name);
        let pid = syscall
            .and_then(|s| s.number("pid"))
            .and_then(|p| u32::try_from(p).ok());
        let exe = syscall.and_then(|s| s.text("exe"));
        let mut out = Vec::new();

        for access in records.iter().filter(|r| r.kind == AUDIT_LANDLOCK_ACCESS) {
            let ours = access
                .raw("domain")
                .is_some_and(|d| self.domains.contains(d));
            if !ours {
                continue;
            }
            let path = access.text("path").map(|p| trim_dir(&p));
            let address = net_address(access);
            for blocker in access.raw("blockers").unwrap_or("").split(',') {
                if blocker.is_empty() {
                    continue;
                }
                out.push(self.denial(
                    access,
                    Layer::Landlock,
                    blocker.to_owned(),
                    path.clone(),
                    address.clone(),
                    (pid, exe.clone(), syscall_name.clone()),
                ));
            }
        }

        for seccomp in records.iter().filter(|r| r.kind == AUDIT_SECCOMP) {
            if !self.in_session(seccomp) {
                continue;
            }
            let code = seccomp.hex("code").unwrap_or(0);
            let name = seccomp
                .number("syscall")
                .map(syscalls::name)
                .unwrap_or_else(|| "unknown".to_owned());
            if SECCOMP_FALLBACK_SYSCALLS.contains(&name.as_str()) {
                continue;
            }
            let mut operation = name.clone();
            if code & SECCOMP_RET_ACTION_FULL != SECCOMP_RET_ERRNO {
                operation = format!("{name} (process killed)");
            }
            let pid = seccomp.number("pid").and_then(|p| u32::try_from(p).ok());
            let exe = seccomp.text("exe");
            out.push(self.denial(
                seccomp,
                Layer::Seccomp,
                operation,
                None,
                None,
                (pid, exe, Some(name)),
            ));
        }

        if out.is_empty()
            && let Some(call) = syscall.filter(|s| self.in_session(s))
            && call.number("exit") == Some(-EROFS)
        {
            let name = syscall_name.clone().unwrap_or_default();
            let (operation, path) = mount_operation(&name, call, records);
            out.push(self.denial(
                call,
                Layer::Mount,
                operation,
                path,
                None,
                (pid, exe, syscall_name),
            ));
        }
        out
    }

    fn denial(
        &self,
        record: &Record,
        layer: Layer,
        operation: String,
        path: Option<String>,
        address: Option<String>,
        (pid, exe, syscall): (Option<u32>, Option<String>, Option<String>),
    ) -> Denial {
        let allow_rule = allow_rule(&self.policy, layer, &operation, path.as_deref());
        Denial {
            time: rfc3339(record.secs, record.millis),
            pid,
            exe,
            layer,
            operation,
            path,
            address,
            syscall,
            allow_rule,
        }
    }
}

/// `/a/b/` → `/a/b` (but `/` stays).
fn trim_dir(path: &str) -> String {
    let trimmed = path.trim_end_matches('/');
    if trimmed.is_empty() {
        "/".to_owned()
    } else {
        trimmed.to_owned()
    }
}

/// `daddr`/`dest` (connect) or `saddr`/`src` (bind) of a Landlock network record.
fn net_address(record: &Record) -> Option<String> {
    let pair = |addr: &str, port: &str| {
        let port = record.raw(port)?;
        Some(match record.raw(addr) {
            Some(a) if a.contains(':') => format!("[{a}]:{port}"),
            Some(a) => format!("{a}:{port}"),
            None => format!("port {port}"),
        })
    };
    pair("daddr", "dest").or_else(|| pair("saddr", "src"))
}

/// The operation (Landlock's vocabulary where one applies) and path of an `EROFS` syscall.
fn mount_operation(name: &str, call: &Record, records: &[Record]) -> (String, Option<String>) {
    let cwd = records
        .iter()
        .find(|r| r.kind == AUDIT_CWD)
        .and_then(|r| r.text("cwd"));
    let items: Vec<(String, String)> = records
        .iter()
        .filter(|r| r.kind == AUDIT_PATH)
        .filter_map(|r| Some((r.text("name")?, r.raw("nametype").unwrap_or("").to_owned())))
        .map(|(name, kind)| (absolute(&name, cwd.as_deref()), kind))
        .collect();
    let item = |kinds: &[&str]| {
        items
            .iter()
            .find(|(_, k)| kinds.contains(&k.as_str()))
            .map(|(n, _)| trim_dir(n))
    };
    let object = item(&["NORMAL", "CREATE", "DELETE", "UNKNOWN"]);
    let parent = item(&["PARENT"]);
    let flag_arg = match name {
        "open" => call.hex("a1"),
        "openat" | "unlinkat" => call.hex("a2"),
        _ => None,
    };
    let (operation, path) = match name {
        "open" | "openat" | "openat2" | "creat" => {
            let creating = name == "creat" || flag_arg.is_some_and(|f| f & O_CREAT != 0);
            match object {
                Some(file) => ("fs.write_file", Some(file)),
                None if creating => ("fs.make_reg", parent),
                None => ("fs.write_file", parent),
            }
        }
        "mkdir" | "mkdirat" => ("fs.make_dir", parent.or(object)),
        "mknod" | "mknodat" | "link" | "linkat" => ("fs.make_reg", parent.or(object)),
        "symlink" | "symlinkat" => ("fs.make_sym", parent.or(object)),
        "unlinkat" if flag_arg.is_some_and(|f| f & AT_REMOVEDIR != 0) => {
            ("fs.remove_dir", parent.or(object))
        }
        "unlink" | "unlinkat" => ("fs.remove_file", parent.or(object)),
        "rmdir" => ("fs.remove_dir", parent.or(object)),
        "rename" | "renameat" | "renameat2" => ("fs.rename", parent.or(object)),
        "truncate" | "ftruncate" => ("fs.truncate", object.or(parent)),
        "chmod" | "fchmod" | "fchmodat" | "fchmodat2" => ("fs.chmod", object.or(parent)),
        "chown" | "fchown" | "fchownat" | "lchown" => ("fs.chown", object.or(parent)),
        "utime" | "utimes" | "utimensat" | "futimesat" => ("fs.utime", object.or(parent)),
        other if other.contains("xattr") => ("fs.xattr", object.or(parent)),
        _ => return (name.to_owned(), object.or(parent)),
    };
    (operation.to_owned(), path)
}

fn absolute(name: &str, cwd: Option<&str>) -> String {
    match cwd {
        Some(cwd) if !name.starts_with('/') => format!("{}/{name}", cwd.trim_end_matches('/')),
        _ => name.to_owned(),
    }
}

#[cfg(test)]
mod tests;
