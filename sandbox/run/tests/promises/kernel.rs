//! Kernel interfaces: socket families by network mode, and the uprobe calls seccomp cannot see.

use super::*;

#[test]
fn socket_families_are_refused_by_network_mode() {
    let refused_always = [
        libc::AF_PACKET,
        libc::AF_VSOCK,
        libc::AF_ALG,
        libc::AF_BLUETOOTH,
    ];
    for uid in identities() {
        let fx = Fixture::new(uid);
        let family = |f: i32| f.to_string();
        for f in [libc::AF_INET, libc::AF_INET6, libc::AF_NETLINK]
            .into_iter()
            .chain(refused_always)
        {
            let result = probe(WW, &["socket", &family(f)], uid, &fx.ws);
            assert_blocked(
                &result,
                &[],
                &format!("family {f}, network off, as {uid:?}"),
            );
        }
        // Stream: AF_UNIX datagram sockets are refused where the unix-socket notifier runs
        // (sandbox/run/tests/unix_sockets.rs).
        assert_allowed(
            &probe(WW, &["unix-socket", "stream"], uid, &fx.ws),
            "AF_UNIX",
        );
        let on = &["--policy", "workspace-write", "--allow-network"];
        for f in [libc::AF_INET, libc::AF_INET6, libc::AF_NETLINK] {
            assert_allowed(
                &probe(on, &["socket", &family(f)], uid, &fx.ws),
                "network on",
            );
        }
        for f in refused_always {
            let result = probe(on, &["socket", &family(f)], uid, &fx.ws);
            assert_blocked(&result, &[], &format!("family {f}, network on, as {uid:?}"));
        }
    }
}

/// x86_64's `uretprobe` (335) and `uprobe` (336) pass every seccomp filter by the kernel's
/// design (the syscall sweep skips them); called inside the sandbox from an ordinary caller they
/// must be refused by the kernel: `uprobe` with ENXIO, `uretprobe` with SIGILL, in a child
/// process.
#[cfg(target_arch = "x86_64")]
#[test]
fn uprobe_and_uretprobe_refuse_an_ordinary_caller_inside_the_sandbox() {
    const ENXIO: i32 = 6;
    const SIGILL: i32 = 4;
    let script = "python3 -c 'import ctypes; l = ctypes.CDLL(None, use_errno=True); \
                  print(\"uprobe\", l.syscall(336), ctypes.get_errno())'; \
                  python3 -c 'import ctypes; ctypes.CDLL(None).syscall(335); print(\"returned\")'; \
                  echo \"uretprobe status $?\"";
    for uid in identities() {
        let fx = Fixture::new(uid);
        let out = sandbox_run(WW, &["/bin/sh", "-c", script], uid, &fx.ws);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("uprobe -1 {ENXIO}\nuretprobe status {}\n", 128 + SIGILL),
            "as {uid:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
