//! The seccomp allow-list holds by construction: every syscall number of the architecture that
//! the reviewed list (policies/seccomp/allow.json) does not name is refused inside the sandbox,
//! with ENOSYS or EPERM, never executed; x32 numbers are refused and the i386 entry (`int 0x80`)
//! kills the process. Run as root and as uid 65534, with an unsandboxed control run that shows
//! the sweep sees calls reach the kernel.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
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
            sandbox::syscall_table::number(name)
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

/// The socket calls the sandbox admits, stated here independently of the policy files: with the
/// network off only `AF_UNIX`; with it on also `AF_NETLINK`, and IPv4/IPv6 stream and datagram
/// sockets of protocol 0, TCP, UDP or the family's ICMP. Arguments are compared as the kernel
/// reads them: 32-bit ints, the type under `SOCK_TYPE_MASK`.
fn socket_admitted(network: bool, family: i64, kind: i64, protocol: i64) -> bool {
    let (family, kind, protocol) = (family as i32, (kind as i32) & 0xf, protocol as i32);
    let stream_or_dgram = kind == libc::SOCK_STREAM || kind == libc::SOCK_DGRAM;
    match family {
        libc::AF_UNIX => true,
        libc::AF_NETLINK => network,
        libc::AF_INET => {
            network && stream_or_dgram && [0, 6, 17, libc::IPPROTO_ICMP].contains(&protocol)
        }
        libc::AF_INET6 => {
            network && stream_or_dgram && [0, 6, 17, libc::IPPROTO_ICMPV6].contains(&protocol)
        }
        _ => false,
    }
}

/// `"family/0xtype/0xprotocol"` (the socket sweep's keys) as numbers.
fn socket_key(key: &str) -> (i64, i64, i64) {
    let parts: Vec<&str> = key.split('/').collect();
    (parts[0].parse().unwrap(), hex(parts[1]), hex(parts[2]))
}

/// Parses a `0x...` number of a sweep key (a negative number prints as its 64-bit pattern).
fn hex(text: &str) -> i64 {
    u64::from_str_radix(text.trim_start_matches("0x"), 16)
        .unwrap_or_else(|e| panic!("bad sweep key part {text}: {e}")) as i64
}

/// A sweep's outcomes as `refused` (EPERM or ENOSYS, the sandbox's two answers) or `reached`
/// (any other errno, EBADF for the descriptor -1 the calls pass, EINVAL for a flag the kernel
/// rejects first).
fn reached_or_refused(
    outcomes: &serde_json::Map<String, serde_json::Value>,
) -> BTreeMap<String, &'static str> {
    outcomes
        .iter()
        .map(|(key, outcome)| {
            let refused = outcome == "EPERM" || outcome == "ENOSYS";
            (key.clone(), if refused { "refused" } else { "reached" })
        })
        .collect()
}

/// Whether `setsockopt(level, optname)` is refused: TCP Fast Open on connect and the TCP repair
/// options, compared on 32 bits.
fn tcp_option_refused(level: i64, optname: i64) -> bool {
    level as i32 == libc::IPPROTO_TCP && [19, 20, 21, 22, 29, 30].contains(&(optname as i32))
}

/// Issue 30: the seccomp layer's argument rules hold by construction, not for the example an
/// attack used: every socket family, type and protocol outside what the sandbox admits is
/// refused (MPTCP, SCTP, UDP-Lite, raw and sequenced-packet sockets among them), socket pairs
/// of any family but `AF_UNIX` are refused with the network on too, `MSG_FASTOPEN`
/// is refused on all three send calls whatever other flag bit comes with it, and
/// `TCP_FASTOPEN_CONNECT` and the TCP repair options are refused, each compared on the 32 bits
/// the kernel reads. The control sweeps the same calls unsandboxed and sees them reach the kernel.
#[test]
fn socket_protocols_send_flags_and_tcp_options_off_the_list_are_refused() {
    let fast_open = i64::from(libc::MSG_FASTOPEN);
    for uid in identities() {
        let fx = Fixture::new(uid);
        let run = |policy: &[&str], op: &str| {
            let result = probe(policy, &[op], uid, &fx.ws);
            result["detail"].as_object().cloned().unwrap_or_else(|| {
                panic!("{op} under {policy:?} as {uid:?} reported no map: {result}")
            })
        };
        for (policy, network) in [
            (&["--policy", "workspace-write"][..], false),
            (
                &["--policy", "workspace-write", "--allow-network"][..],
                true,
            ),
        ] {
            let context = format!("{policy:?} as {uid:?}");
            let reached = run(policy, "socket-sweep");
            let off_list: Vec<(&String, &serde_json::Value)> = reached
                .iter()
                .filter(|(key, _)| {
                    let (family, kind, protocol) = socket_key(key);
                    !socket_admitted(network, family, kind, protocol)
                })
                .collect();
            assert!(
                off_list.is_empty(),
                "sockets off the list reached the kernel under {context}: {off_list:?}"
            );
            // The sweep sees an admitted socket being made (not a sweep that reaches nothing).
            let expected_ok = if network { "2/0x1/0x6" } else { "1/0x1/0x0" };
            assert_eq!(reached[expected_ok], "ok", "{expected_ok} under {context}");

            // socketpair: AF_UNIX only, network on or off (the kernel makes the sockets before
            // asking the family for a pair).
            let pairs = run(policy, "socketpair-sweep");
            let off_list: Vec<(&String, &serde_json::Value)> = pairs
                .iter()
                .filter(|(key, _)| socket_key(key).0 != i64::from(libc::AF_UNIX))
                .collect();
            assert!(
                off_list.is_empty(),
                "socket pairs off the list reached the kernel under {context}: {off_list:?}"
            );
            assert_eq!(pairs["1/0x1/0x0"], "ok", "AF_UNIX pair under {context}");

            let sends = reached_or_refused(&run(policy, "send-flag-sweep"));
            let expected: BTreeMap<String, &str> = probe::net::swept_send_flags()
                .into_iter()
                .flat_map(|flags| {
                    let refused = (flags as i32 as i64) & fast_open != 0;
                    let outcome = if refused { "refused" } else { "reached" };
                    ["sendto", "sendmsg", "sendmmsg"]
                        .map(|call| (format!("{call}/{flags:#x}"), outcome))
                })
                .collect();
            assert_eq!(sends, expected, "send flags under {context}");

            let options = reached_or_refused(&run(policy, "setsockopt-sweep"));
            assert!(
                options.len() > 300,
                "setsockopt sweep too small: {options:?}"
            );
            for (key, outcome) in &options {
                let (level, optname) = key.split_once('/').unwrap();
                let refused = tcp_option_refused(hex(level), hex(optname));
                let expected = if refused { "refused" } else { "reached" };
                assert_eq!(*outcome, expected, "setsockopt {key} under {context}");
            }
            assert_eq!(options["0x6/0x1e"], "refused", "TCP_FASTOPEN_CONNECT swept");
        }
        // Control: unsandboxed, inet sockets off the list are made (MPTCP, UDP-Lite, ... as the
        // kernel has them), and every send flag and option reaches the kernel.
        let control = ["--policy", "danger-full-access"];
        let result = probe(&control, &["socket-sweep", "2,10"], uid, &fx.ws);
        let reached = result["detail"].as_object().unwrap();
        let off_list = reached
            .keys()
            .filter(|key| {
                let (family, kind, protocol) = socket_key(key);
                [2, 10].contains(&family) && !socket_admitted(true, family, kind, protocol)
            })
            .count();
        assert!(
            off_list > 0,
            "control as {uid:?}: no inet socket off the list reached the kernel: {reached:?}"
        );
        let result = probe(&control, &["socketpair-sweep", "2", "1,2"], uid, &fx.ws);
        let pairs = result["detail"].as_object().unwrap();
        assert!(
            pairs.contains_key("2/0x1/0x0"),
            "control as {uid:?}: socketpair(AF_INET) did not reach the kernel: {pairs:?}"
        );
        for op in ["send-flag-sweep", "setsockopt-sweep"] {
            let outcomes = reached_or_refused(&run(&control, op));
            assert!(
                outcomes.values().all(|outcome| *outcome == "reached"),
                "control {op} as {uid:?}: {outcomes:?}"
            );
        }
    }
}
