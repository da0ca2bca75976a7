//! The seccomp allow-list holds by construction: every syscall number of the architecture that
//! the reviewed list (policies/seccomp/allow.json) does not name is refused inside the sandbox,
//! with ENOSYS or EPERM, never executed; x32 numbers are refused and the i386 entry (`int 0x80`)
//! kills the process. Run as root and as uid 65534, with an unsandboxed control run that shows
//! the sweep sees calls reach the kernel.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::process::ExitStatusExt;

use common::*;
use sandbox::linux::seccomp::{Variant, allowed_syscalls};

/// Not a test: the entry point of this binary re-executed as the in-sandbox probe.
#[test]
#[ignore = "entry point of the in-sandbox probe, run by the tests themselves"]
fn probe_entry() {
    common::probe_entry();
}

/// Highest syscall number swept: well past the newest the tables know (462 on x86_64), so
/// numbers a kernel adds next year are covered too.
const SWEEP_LAST: i64 = 600;

/// Syscalls the kernel never lets a filter see: x86_64's `uretprobe` (335) and `uprobe` (336)
/// are only valid from the kernel's uprobe trampolines, pass seccomp by design (Linux 6.12 and
/// 6.16) and refuse any other caller (SIGILL, ENXIO), doing nothing.
#[cfg(target_arch = "x86_64")]
const UNFILTERABLE: &[i64] = &[335, 336];
#[cfg(not(target_arch = "x86_64"))]
const UNFILTERABLE: &[i64] = &[];

/// The allow-list's syscall numbers on this architecture, as the probe's skip list (plus
/// [`UNFILTERABLE`]).
fn allowed_numbers(network_allowed: bool) -> String {
    let variant = Variant {
        network_allowed,
        audit: false,
    };
    let numbers: Vec<String> = allowed_syscalls(variant)
        .unwrap()
        .iter()
        .map(|name| {
            sandbox::audit::syscalls::number(name)
                .unwrap_or_else(|| panic!("{name} has no number"))
                .to_string()
        })
        .chain(UNFILTERABLE.iter().map(i64::to_string))
        .collect();
    numbers.join(",")
}

#[test]
fn every_syscall_off_the_allow_list_is_refused() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        for (policy, network) in [
            (&["--policy", "workspace-write"][..], false),
            (
                &["--policy", "workspace-write", "--allow-network"][..],
                true,
            ),
        ] {
            let spec = format!("0-{SWEEP_LAST}/{}", allowed_numbers(network));
            let result = probe(policy, &["sweep", &spec], uid, &fx.ws);
            assert_eq!(
                result["detail"],
                serde_json::json!({}),
                "syscalls off the allow-list reached the kernel under {policy:?} as {uid:?}"
            );
        }
        let spec = format!("0-{SWEEP_LAST}/{}", allowed_numbers(true));
        let control = probe(
            &["--policy", "danger-full-access"],
            &["sweep", &spec],
            uid,
            &fx.ws,
        );
        let reached = control["detail"].as_object().unwrap().len();
        assert!(
            reached > 20,
            "control: unsandboxed, only {reached} calls reached the kernel: {control}"
        );
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn x32_numbers_are_refused_and_the_i386_entry_kills() {
    const X32_SYSCALL_BIT: i64 = 0x4000_0000;
    for uid in identities() {
        let fx = Fixture::new(uid);
        let spec = format!("{}-{}/", X32_SYSCALL_BIT, X32_SYSCALL_BIT + SWEEP_LAST);
        let result = probe(
            &["--policy", "workspace-write"],
            &["sweep", &spec],
            uid,
            &fx.ws,
        );
        assert_eq!(
            result["detail"],
            serde_json::json!({}),
            "as {uid:?}: {result}"
        );
        let exe = probe_exe();
        // The probe entry through the environment, as probe() does, but the status matters here.
        let mut cmd = std::process::Command::new(sandbox_run_exe());
        cmd.args(["--policy", "workspace-write", "--"])
            .arg(&exe)
            .args(PROBE_ARGS)
            .current_dir(&fx.ws)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env(PROBE_ENV, r#"["int80-getpid"]"#);
        if let Some(uid) = uid {
            use std::os::unix::process::CommandExt;
            cmd.uid(uid).gid(uid);
        }
        let status = cmd.output().unwrap().status;
        assert_eq!(
            status.signal(),
            Some(libc::SIGSYS),
            "the i386 entry was not killed as {uid:?}: {status:?}"
        );
    }
}
