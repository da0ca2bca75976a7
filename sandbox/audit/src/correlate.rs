//! Turning audit records into [`Denial`]s of one command tree, and only of it (sans-I/O).
//!
//! Attribution rules, exact rather than heuristic:
//! - Landlock: a `LANDLOCK_DOMAIN status=allocated` record names the process that created the
//!   domain (`pid`, the thread-group id). Only domains created by the tree's root process are
//!   ours; every `LANDLOCK_ACCESS` record carries its domain id.
//! - seccomp and failed syscalls: the outer `sandbox-run` starts a fresh audit session before
//!   the sandbox exists, and every descendant inherits it (changing it needs
//!   `CAP_AUDIT_CONTROL`, which the command never holds); records are ours when their `ses` is
//!   that session. Without a session (it could not be created), only the root pid itself is
//!   attributed. Failed syscalls of the processes that run only `sandbox-run`'s own code
//!   ([`Target::own_pids`]) are never the command's.
//!
//! What a failed syscall of the tree means when no Landlock record of ours accounts for it:
//! - `EROFS`: the read-only mount layer (Landlock never sees it: the mount check comes first);
//! - `EACCES` on a path the policy masks (a `deny` entry or a hidden path: an empty mode-000
//!   file or directory): the mount layer too;
//! - any other `EACCES`/`EPERM`: [`Layer::Unexplained`]. A file's own mode, a missing
//!   capability, or a layer nobody logs (a Landlock domain the command stacked with logging off
//!   would look exactly like this): the audit cannot tell them apart, so it reports them.
//!   Queries (`access`, `faccessat`) that answer "no" are not refusals and are not reported.
//!
//! Attempts to hide denials are recorded in [`Evasion`]: a call `policies/seccomp/audit.json`
//! refuses (stacking a Landlock domain or a seccomp filter), and a Landlock denial in the tree by
//! a domain the sandbox did not create. Either makes the report incomplete.
//!
//! Records of one event share a serial; an event is complete at its `EOE` record, when it is
//! stale, when more than [`MAX_PENDING_EVENTS`] are open (the oldest), or when the caller calls
//! [`Correlator::finish`]. A `SECCOMP` record stands alone (seccomp decides before syscall
//! auditing starts) and completes at once. Memory: at most [`MAX_PENDING_EVENTS`] events of
//! [`MAX_RECORDS_PER_EVENT`] records, of the kinds used here only.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::advice::masked;
use crate::limits::{MAX_PENDING_EVENTS, MAX_RECORDS_PER_EVENT};
use crate::records::{
    AUDIT_CWD, AUDIT_EOE, AUDIT_LANDLOCK_ACCESS, AUDIT_LANDLOCK_DOMAIN, AUDIT_PATH, AUDIT_SECCOMP,
    AUDIT_SYSCALL, Record, rfc3339,
};
use sandbox::denial::{Denial, Layer};
use sandbox::linux::seccomp;
use sandbox::policy::ResolvedPolicy;
use sandbox::syscall_table as syscalls;

/// `EPERM`.
const EPERM: i64 = 1;
/// `EACCES`.
const EACCES: i64 = 13;
/// `EROFS`: what the read-only mount layer returns.
const EROFS: i64 = 30;
/// `O_ACCMODE` in open flags.
const O_ACCMODE: u64 = 0o3;
/// `O_CREAT` in open flags.
const O_CREAT: u64 = 0o100;
/// `O_TRUNC` in open flags.
const O_TRUNC: u64 = 0o1000;
/// `O_DIRECTORY` in open flags.
const O_DIRECTORY: u64 = 0o200_000;
/// `AT_REMOVEDIR` in `unlinkat` flags.
const AT_REMOVEDIR: u64 = 0x200;
/// Mask of the action part of a seccomp return value.
const SECCOMP_RET_ACTION_FULL: u64 = 0xffff_0000;
/// `SECCOMP_RET_ERRNO`.
const SECCOMP_RET_ERRNO: u64 = 0x0005_0000;
/// Actions that refuse nothing by themselves: `SECCOMP_RET_USER_NOTIF` (the unix-socket gate
/// decides, and reports its own refusals as layer `unix-sockets`), `SECCOMP_RET_TRACE`,
/// `SECCOMP_RET_LOG`, `SECCOMP_RET_ALLOW`. Logged because the command's own filter carries
/// `SECCOMP_FILTER_FLAG_LOG`.
const SECCOMP_NOT_A_REFUSAL: [u64; 4] = [0x7fc0_0000, 0x7ff0_0000, 0x7ffc_0000, 0x7fff_0000];
/// Syscalls the seccomp filter answers with an errno by design rather than to refuse them:
/// `clone3` gets `ENOSYS` so libc falls back to `clone`, whose flags the filter checks. With
/// `SECCOMP_FILTER_FLAG_LOG` they are logged too, but they are not denials.
const SECCOMP_FALLBACK_SYSCALLS: &[&str] = &["clone3"];
/// Syscalls that only ask whether an access would be allowed (`test -w`, `which`): a "no" is an
/// answer, not a refusal. Landlock does not check them, so no hidden layer is missed either.
const QUERY_SYSCALLS: &[&str] = &["access", "faccessat", "faccessat2"];
/// Pending events older than this many seconds (record time) are completed without an `EOE`.
const STALE_EVENT_SECS: u64 = 2;
/// Record kinds the correlator uses; every other record is dropped on arrival.
const USED_KINDS: [u16; 7] = [
    AUDIT_SYSCALL,
    AUDIT_PATH,
    AUDIT_CWD,
    AUDIT_EOE,
    AUDIT_SECCOMP,
    AUDIT_LANDLOCK_ACCESS,
    AUDIT_LANDLOCK_DOMAIN,
];

/// The command tree being audited.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The process that confined itself (and created the Landlock domain): thread-group id in
    /// the initial pid namespace.
    pub root_pid: u32,
    /// The audit session every process of the tree is in, when one was created.
    pub session: Option<u32>,
    /// Processes of the session that run only `sandbox-run`'s own code (the collector, and PID
    /// 1 when the command runs in namespaces): their failed syscalls are not the command's.
    pub own_pids: Vec<u32>,
}

/// What the command did that could have hidden denials.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Evasion {
    /// Refused calls of `policies/seccomp/audit.json` (stacking a Landlock domain or seccomp
    /// filter), by syscall name.
    pub nesting: BTreeMap<String, u64>,
    /// Landlock denials in the tree by a domain the sandbox did not create.
    pub foreign_domain_denials: u64,
}

impl Evasion {
    /// Nothing was attempted.
    pub fn is_empty(&self) -> bool {
        self.nesting.is_empty() && self.foreign_domain_denials == 0
    }

    /// The coverage gaps, in plain words.
    pub fn gaps(&self) -> Vec<String> {
        let mut gaps = Vec::new();
        let times = |n: u64| {
            if n == 1 {
                "once".to_owned()
            } else {
                format!("{n} times")
            }
        };
        for (syscall, count) in &self.nesting {
            let what = if syscall.starts_with("landlock") {
                "a Landlock domain"
            } else {
                "a seccomp filter"
            };
            gaps.push(format!(
                "the command tried to stack {what} of its own ({syscall}, {}); refused with EPERM \
                 under the audit, but a command that tries to hide its denials makes the run \
                 untrustworthy: the report is incomplete",
                times(*count)
            ));
        }
        if self.foreign_domain_denials > 0 {
            gaps.push(format!(
                "{} Landlock denial(s) in the command tree came from a domain the sandbox did not \
                 create; a stacked domain can refuse without logging: the report is incomplete",
                self.foreign_domain_denials
            ));
        }
        gaps
    }
}

/// Sans-I/O correlator: records in, denials out (without advice: see
/// [`super::aggregate::Aggregate`]).
#[derive(Debug)]
pub struct Correlator {
    target: Target,
    policy: ResolvedPolicy,
    audit_refused: Vec<String>,
    domains: BTreeSet<String>,
    pending: BTreeMap<u64, Vec<Record>>,
    evasion: Evasion,
}

impl Correlator {
    /// A correlator for `target`, confined by `policy` (which paths its mount layer masks).
    pub fn new(target: Target, policy: ResolvedPolicy) -> Self {
        Self {
            target,
            policy,
            audit_refused: audit_refused_syscalls(),
            domains: BTreeSet::new(),
            pending: BTreeMap::new(),
            evasion: Evasion::default(),
        }
    }

    /// What the command did that could have hidden denials, so far.
    pub fn evasion(&self) -> &Evasion {
        &self.evasion
    }

    /// Adds one record; returns the denials of the events it completed.
    pub fn push(&mut self, record: Record) -> Vec<Denial> {
        if !USED_KINDS.contains(&record.kind)
            || (record.kind == AUDIT_LANDLOCK_DOMAIN && record.raw("status") != Some("allocated"))
        {
            return Vec::new();
        }
        let serial = record.serial;
        let now = record.secs;
        let mut done: Vec<u64> = Vec::new();
        let mut out = Vec::new();
        if record.kind == AUDIT_SECCOMP && !self.pending.contains_key(&serial) {
            out.extend(self.event(std::slice::from_ref(&record)));
        } else {
            let complete = record.kind == AUDIT_EOE;
            let records = self.pending.entry(serial).or_default();
            if records.len() < MAX_RECORDS_PER_EVENT {
                records.push(record);
            }
            if complete {
                done.push(serial);
            }
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
        let overflow = (self.pending.len() - done.len().min(self.pending.len()))
            .saturating_sub(MAX_PENDING_EVENTS);
        done.extend(
            self.pending
                .keys()
                .filter(|s| !done.contains(s))
                .take(overflow)
                .copied()
                .collect::<Vec<_>>(),
        );
        done.sort_unstable();
        done.dedup();
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

    fn own(&self, record: &Record) -> bool {
        record
            .number("pid")
            .and_then(|p| u32::try_from(p).ok())
            .is_some_and(|pid| self.target.own_pids.contains(&pid))
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
        // The tree's failed syscall (not one of sandbox-run's own processes).
        let tree_call = syscall.filter(|s| self.in_session(s) && !self.own(s));
        let syscall_name = syscall
            .and_then(|s| s.number("syscall"))
            .map(syscalls::name);
        let pid = syscall
            .and_then(|s| s.number("pid"))
            .and_then(|p| u32::try_from(p).ok());
        let exe = syscall.and_then(|s| s.text("exe"));
        let errno = syscall.and_then(|s| s.number("exit")).and_then(errno_name);
        let mut out = Vec::new();

        for access in records.iter().filter(|r| r.kind == AUDIT_LANDLOCK_ACCESS) {
            let ours = access
                .raw("domain")
                .is_some_and(|d| self.domains.contains(d));
            if !ours {
                if tree_call.is_some() {
                    self.evasion.foreign_domain_denials += 1;
                }
                continue;
            }
            let path = access.text("path").map(|p| trim_dir(&p));
            let address = net_address(access);
            for blocker in access.raw("blockers").unwrap_or("").split(',') {
                if blocker.is_empty() {
                    continue;
                }
                out.push(denial(
                    access,
                    Layer::Landlock,
                    blocker.to_owned(),
                    (path.clone(), address.clone()),
                    (pid, exe.clone(), syscall_name.clone(), errno.clone()),
                ));
            }
        }

        for record in records.iter().filter(|r| r.kind == AUDIT_SECCOMP) {
            if !self.in_session(record) {
                continue;
            }
            let code = record.hex("code").unwrap_or(0);
            if SECCOMP_NOT_A_REFUSAL.contains(&(code & SECCOMP_RET_ACTION_FULL)) {
                continue;
            }
            let name = record
                .number("syscall")
                .map(syscalls::name)
                .unwrap_or_else(|| "unknown".to_owned());
            if SECCOMP_FALLBACK_SYSCALLS.contains(&name.as_str()) {
                continue;
            }
            // `code` is the action only (the kernel logs `ret & SECCOMP_RET_ACTION_FULL`): the
            // errno returned is not recorded.
            let mut operation = name.clone();
            if code & SECCOMP_RET_ACTION_FULL != SECCOMP_RET_ERRNO {
                operation = format!("{name} (process killed)");
            }
            if self.audit_refused.contains(&name) {
                *self.evasion.nesting.entry(name.clone()).or_default() += 1;
            }
            let pid = record.number("pid").and_then(|p| u32::try_from(p).ok());
            let exe = record.text("exe");
            out.push(denial(
                record,
                Layer::Seccomp,
                operation,
                (None, None),
                (pid, exe, Some(name), None),
            ));
        }

        if !out.is_empty() {
            return out;
        }
        let Some(call) = tree_call else {
            return out;
        };
        let name = syscall_name.clone().unwrap_or_default();
        if QUERY_SYSCALLS.contains(&name.as_str()) {
            return out;
        }
        let exit = call.number("exit").unwrap_or(0);
        let details = (pid, exe, syscall_name, errno);
        if exit == -EROFS {
            let (operation, path) = file_operation(&name, call, records);
            out.push(denial(call, Layer::Mount, operation, (path, None), details));
        } else if exit == -EACCES || exit == -EPERM {
            let (operation, path) = file_operation(&name, call, records);
            let is_masked = exit == -EACCES
                && path
                    .as_deref()
                    .is_some_and(|p| masked(&self.policy, Path::new(p)));
            if is_masked {
                out.push(denial(call, Layer::Mount, operation, (path, None), details));
            } else {
                out.push(denial(
                    call,
                    Layer::Unexplained,
                    name,
                    (path, None),
                    details,
                ));
            }
        }
        out
    }
}

/// The syscalls `policies/seccomp/audit.json` refuses (nested Landlock and seccomp).
pub fn audit_refused_syscalls() -> Vec<String> {
    let variant = seccomp::Variant {
        network_allowed: true,
        audit: true,
    };
    seccomp::filters_for(variant)
        .unwrap_or_default()
        .into_iter()
        .filter(|(name, _)| name == "audit")
        .flat_map(|(_, filter)| filter.filter.into_iter().map(|rule| rule.syscall))
        .collect()
}

/// A denial without advice (the aggregate adds it to the ones it keeps).
fn denial(
    record: &Record,
    layer: Layer,
    operation: String,
    (path, address): (Option<String>, Option<String>),
    (pid, exe, syscall, errno): (Option<u32>, Option<String>, Option<String>, Option<String>),
) -> Denial {
    Denial {
        time: rfc3339(record.secs, record.millis),
        pid,
        exe,
        layer,
        operation,
        path,
        address,
        syscall,
        errno,
        allow_rule: String::new(),
    }
}

/// `-13` → `EACCES` (the errors the audit reports).
fn errno_name(exit: i64) -> Option<String> {
    match -exit {
        EPERM => Some("EPERM".to_owned()),
        EACCES => Some("EACCES".to_owned()),
        EROFS => Some("EROFS".to_owned()),
        n if n > 0 => Some(format!("errno {n}")),
        _ => None,
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

/// The operation (Landlock's vocabulary where one applies) and path of a failed syscall.
fn file_operation(name: &str, call: &Record, records: &[Record]) -> (String, Option<String>) {
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
            let reading =
                !creating && flag_arg.is_some_and(|f| f & O_ACCMODE == 0 && f & O_TRUNC == 0);
            let directory = flag_arg.is_some_and(|f| f & O_DIRECTORY != 0);
            match object {
                Some(file) if reading && directory => ("fs.read_dir", Some(file)),
                Some(file) if reading => ("fs.read_file", Some(file)),
                Some(file) => ("fs.write_file", Some(file)),
                None if creating => ("fs.make_reg", parent),
                None => ("fs.write_file", parent),
            }
        }
        "execve" | "execveat" => ("fs.execute", object.or(parent)),
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
