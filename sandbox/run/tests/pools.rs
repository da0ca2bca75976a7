//! Kernel pools the host shares (issue 31): a sandboxed command that takes all it can of one
//! (inotify instances and watches, queued signals through POSIX timers, POSIX message-queue
//! bytes, AIO contexts, pseudo-terminals, keys) leaves enough that a host process of the same uid, and a second
//! sandbox, still get one. Each pool also has a control showing the exhaustion is real: the
//! same hog unsandboxed takes the uid's (or the host's) whole pool, so a host process then gets
//! none. Run as root and as uid 65534, each hog in a fresh `sandbox-run`; every hog is killed
//! (and so gives its pool back) before the next step.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // test support functions outside #[test]

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::*;

/// Takes `POOL` until the kernel refuses (or `CAP` were taken), prints `took N then ERRNO`, and
/// holds what it took for `HOLD` seconds, taking more whenever it can. argv: POOL HOLD [CAP].
const HOG: &str = r#"
import ctypes, errno, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
what, hold = sys.argv[1], float(sys.argv[2])
cap = int(sys.argv[3]) if len(sys.argv) > 3 else 1 << 30
n, err, held = 0, "", []
# Files to watch (`watches`), made by the test in the working directory.
files = sorted(os.path.join("watch", f) for f in os.listdir("watch")) if os.path.isdir("watch") else []
watched = [0]
def fail():
    return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
def take():
    if what == "inotify":
        fd = libc.inotify_init1(0o2000000)
        held.append(fd)
        return fd >= 0
    if what == "watches":
        # Every file in one instance, then the next instance: each watch counts.
        if not held or watched[0] >= len(files):
            fd = libc.inotify_init1(0o2000000)
            if fd < 0:
                return False
            held.append(fd)
            watched[0] = 0
        ok = libc.inotify_add_watch(held[-1], files[watched[0]].encode(), 0x100) >= 0
        if ok:
            watched[0] += 1
        return ok
    if what == "keys":
        # add_key (x86_64) of a 1000-byte user key into the process keyring: the uid's key
        # quota (kernel.keys.maxbytes; root_maxbytes for root).
        desc = ("execward-pools-%d-%d" % (os.getpid(), n)).encode()
        return libc.syscall(248, b"user", desc, b"k" * 1000, 1000, ctypes.c_int(-2)) >= 0
    if what == "timers":
        tid = ctypes.c_void_p()
        return libc.timer_create(1, None, ctypes.byref(tid)) == 0
    if what == "mqueue":
        class Attr(ctypes.Structure):
            _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long),
                        ("msgsize", ctypes.c_long), ("cur", ctypes.c_long),
                        ("pad", ctypes.c_long * 4)]
        rt = ctypes.CDLL("librt.so.1", use_errno=True)
        name = ("/execward-pools-%d-%d" % (os.getpid(), n)).encode()
        fd = rt.mq_open(name, os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(Attr(0, 10, 8192, 0)))
        if fd >= 0:
            rt.mq_unlink(name)  # the queue lives as long as its descriptor
            held.append(fd)
        return fd >= 0
    if what == "aio":
        ctx = ctypes.c_ulong(0)
        return libc.syscall(206, 1024, ctypes.byref(ctx)) == 0  # io_setup (x86_64)
    if what == "pty":
        try:
            held.append(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))
            return True
        except OSError as e:
            ctypes.set_errno(e.errno)
            return False
    if what == "threads":
        # Tasks (a thread is one, as a process is): threads parked in pause(2) on small stacks.
        if not held:
            attr = ctypes.create_string_buffer(128)
            libc.pthread_attr_init(attr)
            libc.pthread_attr_setstacksize(attr, ctypes.c_size_t(65536))
            held.append(attr)
        tid = ctypes.c_ulong()
        rc = libc.pthread_create(ctypes.byref(tid), held[0], ctypes.cast(libc.pause, ctypes.c_void_p), None)
        if rc != 0:
            ctypes.set_errno(rc)
            return False
        return True
    if what in ("inflight", "inflight-host"):
        # One descriptor per SCM_RIGHTS message, 100 messages a socket pair (its queue
        # holds them without blocking); the uid's count of descriptors in flight grows by one
        # each. `inflight-host` is a host process at the soft RLIMIT_NOFILE every process
        # starts with.
        import socket, array
        if not held:
            if what == "inflight-host":
                import resource
                resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
            held.append(os.pipe())
        if len(held) == 1 or held[-1][2] >= 100:
            a, b = socket.socketpair()
            held.append([a, b, 0])
        fds = array.array("i", [held[0][0]]).tobytes()
        try:
            held[-1][0].sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)], socket.MSG_DONTWAIT)
        except OSError as e:
            ctypes.set_errno(e.errno)
            return False
        held[-1][2] += 1
        return True
    raise SystemExit("unknown pool " + what)
while n < cap:
    if not take():
        err = fail()
        break
    n += 1
print("took %d then %s" % (n, err), flush=True)
# Keep the pool exhausted: take back what other processes release.
until = time.time() + hold
while time.time() < until:
    if n < cap and take():
        n += 1
    time.sleep(0.005)
"#;

/// The tests exhaust pools of the uid they run as: one at a time, so no test's control starves
/// another test's step.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Attempts of the control's host process, one of which must be refused.
const CONTROL_ATTEMPTS: usize = 5;

/// How long a hog holds what it took (it is killed long before).
const HOLD_SECONDS: &str = "120";

struct Hog {
    child: Child,
    took: u64,
    error: String,
}

impl Drop for Hog {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `hog.py` written where `uid` can read it.
fn hog_script(fx: &Fixture) -> PathBuf {
    let path = fx.ws.join("hog.py");
    std::fs::write(&path, HOG).unwrap();
    path
}

/// Runs the hog (sandboxed under read-only with the network off, or not) as `uid` and waits
/// for its report; it keeps what it took until dropped.
fn hog(
    script: &Path,
    pool: &str,
    sandboxed: bool,
    cap: Option<u64>,
    uid: Option<u32>,
    cwd: &Path,
) -> Hog {
    let sandbox: &[&str] = &["--policy", "read-only"];
    hog_under(script, pool, sandboxed.then_some(sandbox), cap, uid, cwd)
}

/// [`hog`] under `sandbox-run SANDBOX --`, or unsandboxed.
fn hog_under(
    script: &Path,
    pool: &str,
    sandbox: Option<&[&str]>,
    cap: Option<u64>,
    uid: Option<u32>,
    cwd: &Path,
) -> Hog {
    let sandboxed = sandbox.is_some();
    let mut cmd = if let Some(args) = sandbox {
        let mut cmd = Command::new(sandbox_run_exe());
        cmd.args(args).arg("--");
        cmd
    } else {
        Command::new("/usr/bin/env")
    };
    cmd.arg("/usr/bin/python3")
        .arg(script)
        .args([pool, HOLD_SECONDS])
        .args(cap.map(|c| c.to_string()))
        .current_dir(cwd)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        // See empty_home: the credential deny set needs the mount namespace, so under
        // --no-namespaces a home holding a store (this host's /root/.npmrc) fails closed.
        .env("HOME", empty_home())
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    if let Some(uid) = uid {
        cmd.uid(uid).gid(uid);
    }
    let mut child = cmd.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let report = line
        .trim_end_matches('\n')
        .strip_prefix("took ")
        .unwrap_or_else(|| {
            let _ = child.kill();
            panic!("{pool} hog (sandboxed: {sandboxed}, as {uid:?}) printed {line:?}")
        });
    let (took, error) = report.split_once(" then ").unwrap();
    Hog {
        took: took.parse().unwrap(),
        error: error.to_owned(),
        child,
    }
}

/// One of `pool`, taken by a process of `uid` (sandboxed or not) that then ends.
fn one(script: &Path, pool: &str, sandboxed: bool, uid: Option<u32>, cwd: &Path) -> Hog {
    let mut taken = hog(script, pool, sandboxed, Some(1), uid, cwd);
    let _ = taken.child.kill();
    taken
}

fn proc_number(path: &str) -> u64 {
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// The share a sandbox gets of a host limit (what `sandbox::limits::pool_share` computes).
fn share(host: u64) -> u64 {
    (host / sandbox::limits::POOL_SHARE_DIVISOR).max(1)
}

/// Asserts that, while `sandboxed` holds all it could, a host process of `uid` and a second
/// sandbox still get one.
fn others_still_get_one(script: &Path, pool: &str, uid: Option<u32>, cwd: &Path, second: bool) {
    let host = one(script, pool, false, uid, cwd);
    assert_eq!(
        (host.took, host.error.as_str()),
        (1, ""),
        "{pool} as {uid:?}: a host process got none while a sandbox held its share"
    );
    if second {
        let other = one(script, pool, true, uid, cwd);
        assert_eq!(
            (other.took, other.error.as_str()),
            (1, ""),
            "{pool} as {uid:?}: a second sandbox got none while the first held its share"
        );
    }
}

/// The control: unsandboxed, the hog takes the uid's (host's) whole pool, and a host process
/// of the uid then gets none (`refused` is its errno). The hog is gone when this returns.
fn unsandboxed_hog_starves_the_host(
    script: &Path,
    pool: &str,
    uid: Option<u32>,
    cwd: &Path,
    refused: &str,
) {
    let held = hog(script, pool, false, None, uid, cwd);
    // Other processes of the uid (the machine is shared) may release one between the hog's
    // report and an attempt, which the hog then takes back within milliseconds: the control
    // needs one refusal among a few attempts.
    let attempts: Vec<(u64, String)> = (0..CONTROL_ATTEMPTS)
        .map(|_| {
            let host = one(script, pool, false, uid, cwd);
            (host.took, host.error.clone())
        })
        .collect();
    let (took, error) = (held.took, held.error.clone());
    drop(held);
    assert!(
        attempts.iter().any(|(n, e)| *n == 0 && e == refused),
        "{pool} as {uid:?}: the unsandboxed hog (took {took} then {error}) did not exhaust the \
         pool (the control): {attempts:?}"
    );
}

#[test]
fn a_sandbox_takes_only_its_share_of_the_uids_inotify_instances() {
    let _serial = serial();
    let host_max = proc_number("/proc/sys/fs/inotify/max_user_instances");
    for uid in identities() {
        let fx = Fixture::new(uid);
        let script = hog_script(&fx);
        let held = hog(&script, "inotify", true, None, uid, &fx.ws);
        assert_eq!(
            (held.took, held.error.as_str()),
            (share(host_max), "EMFILE"),
            "as {uid:?}: the sandbox's inotify instances are not bounded to its share"
        );
        others_still_get_one(&script, "inotify", uid, &fx.ws, true);
        drop(held);
        unsandboxed_hog_starves_the_host(&script, "inotify", uid, &fx.ws, "EMFILE");
    }
}

/// Files the `watches` hog watches, each instance all of them: few instances reach the uid's
/// whole watch quota (a control that needed more than the uid's instances would stop at those).
const WATCHED_FILES: usize = 8192;

fn make_watched_files(fx: &Fixture) {
    let dir = fx.ws.join("watch");
    std::fs::create_dir(&dir).unwrap();
    for i in 0..WATCHED_FILES {
        std::fs::write(dir.join(i.to_string()), "").unwrap();
    }
}

#[test]
fn a_sandbox_takes_only_its_share_of_the_uids_inotify_watches() {
    let _serial = serial();
    let host_max = proc_number("/proc/sys/fs/inotify/max_user_watches");
    for uid in identities() {
        let fx = Fixture::new(uid);
        let script = hog_script(&fx);
        make_watched_files(&fx);
        let held = hog(&script, "watches", true, None, uid, &fx.ws);
        assert_eq!(
            (held.took, held.error.as_str()),
            (share(host_max), "ENOSPC"),
            "as {uid:?}: the sandbox's inotify watches are not bounded to its share"
        );
        others_still_get_one(&script, "watches", uid, &fx.ws, true);
        drop(held);
        unsandboxed_hog_starves_the_host(&script, "watches", uid, &fx.ws, "ENOSPC");
    }
}

#[test]
fn a_sandbox_takes_no_keys_from_the_uids_quota() {
    let _serial = serial();
    for uid in identities() {
        let fx = Fixture::new(uid);
        let script = hog_script(&fx);
        // The keyring calls are refused by seccomp (the quota is the host uid's, and no user
        // namespace maximum covers it).
        let held = hog(&script, "keys", true, None, uid, &fx.ws);
        assert_eq!(
            (held.took, held.error.as_str()),
            (0, "EPERM"),
            "as {uid:?}: a sandbox added a key"
        );
        others_still_get_one(&script, "keys", uid, &fx.ws, false);
        drop(held);
        unsandboxed_hog_starves_the_host(&script, "keys", uid, &fx.ws, "EDQUOT");
    }
}

#[test]
fn a_sandbox_takes_only_its_share_of_the_uids_pending_signals() {
    let _serial = serial();
    let (host_max, _) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_SIGPENDING).unwrap();
    for uid in identities() {
        let fx = Fixture::new(uid);
        let script = hog_script(&fx);
        let held = hog(&script, "timers", true, None, uid, &fx.ws);
        assert_eq!(
            (held.took, held.error.as_str()),
            (
                sandbox::limits::pool_share(host_max, sandbox::limits::MAX_SANDBOX_PENDING_SIGNALS),
                "EAGAIN"
            ),
            "as {uid:?}: the sandbox's queued signals are not bounded to its share"
        );
        others_still_get_one(&script, "timers", uid, &fx.ws, true);
        drop(held);
        // Without the namespace layer (best effort) the command charges the host uid's count
        // directly; its rlimit share still bounds it.
        let sandbox: &[&str] = &["--policy", "read-only", "--no-namespaces"];
        let held = hog_under(&script, "timers", Some(sandbox), None, uid, &fx.ws);
        // The share bounds the uid's whole count here, of which other processes of the uid
        // may already hold a few.
        let share =
            sandbox::limits::pool_share(host_max, sandbox::limits::MAX_SANDBOX_PENDING_SIGNALS);
        assert!(
            held.took <= share && held.took + 64 >= share && held.error == "EAGAIN",
            "as {uid:?} without namespaces: took {} then {} (share {share})",
            held.took,
            held.error
        );
        others_still_get_one(&script, "timers", uid, &fx.ws, false);
        drop(held);
        unsandboxed_hog_starves_the_host(&script, "timers", uid, &fx.ws, "EAGAIN");
    }
}

#[test]
fn a_sandbox_takes_no_posix_message_queue_bytes_from_the_uid() {
    let _serial = serial();
    for uid in identities() {
        let fx = Fixture::new(uid);
        let script = hog_script(&fx);
        // Landlock refuses creating a queue (the mqueue filesystem is in no rule); the
        // command's RLIMIT_MSGQUEUE share would bound it otherwise.
        let held = hog(&script, "mqueue", true, None, uid, &fx.ws);
        assert_eq!(
            (held.took, held.error.as_str()),
            (0, "EACCES"),
            "as {uid:?}: a sandbox created a POSIX message queue"
        );
        others_still_get_one(&script, "mqueue", uid, &fx.ws, false);
        drop(held);
        unsandboxed_hog_starves_the_host(&script, "mqueue", uid, &fx.ws, "EMFILE");
    }
}

#[test]
fn a_sandbox_cannot_take_the_hosts_aio_contexts() {
    let _serial = serial();
    for uid in identities() {
        let fx = Fixture::new(uid);
        let script = hog_script(&fx);
        let held = hog(&script, "aio", true, None, uid, &fx.ws);
        assert_eq!(
            (held.took, held.error.as_str()),
            (0, "ENOSYS"),
            "as {uid:?}: io_setup is admitted in the sandbox"
        );
        others_still_get_one(&script, "aio", uid, &fx.ws, false);
        drop(held);
        unsandboxed_hog_starves_the_host(&script, "aio", uid, &fx.ws, "EAGAIN");
    }
}

#[test]
fn a_sandboxs_devpts_instance_holds_only_its_share_of_the_hosts_ptys() {
    let _serial = serial();
    for uid in identities() {
        let fx = Fixture::new(uid);
        let script = hog_script(&fx);
        let held = hog(&script, "pty", true, None, uid, &fx.ws);
        assert_eq!(
            (held.took, held.error.as_str()),
            (sandbox::limits::SANDBOX_PTYS, "ENOSPC"),
            "as {uid:?}: the sandbox's devpts instance is not bounded"
        );
        others_still_get_one(&script, "pty", uid, &fx.ws, true);
    }
    // The control: a devpts instance without `max=` (what the sandbox had) gives more than
    // the bound. Taking the host's whole pool would fail every other user of the machine's
    // terminals for a moment, so the control stops one past the bound.
    let unbounded = Command::new("/usr/bin/unshare")
        .args(["--user", "--map-root-user", "--mount", "/bin/sh", "-c"])
        .arg(format!(
            "mount -t devpts -o newinstance,ptmxmode=0666 devpts /dev/pts && \
             mount --bind /dev/pts/ptmx /dev/ptmx && \
             exec /usr/bin/python3 -c 'import os; fds=[os.open(\"/dev/ptmx\", os.O_RDWR) \
             for _ in range({})]; print(len(fds))'",
            sandbox::limits::SANDBOX_PTYS + 1
        ))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&unbounded.stdout).trim(),
        (sandbox::limits::SANDBOX_PTYS + 1).to_string(),
        "an unbounded devpts instance (the control): {}",
        String::from_utf8_lossy(&unbounded.stderr)
    );
}

/// Descriptors the unsandboxed control keeps in flight: past the soft limit a host process
/// starts with, so one at that default is refused.
const INFLIGHT_CONTROL: u64 = 2 * sandbox::limits::HOST_DEFAULT_OPEN_FILES;

#[test]
fn a_sandbox_keeps_its_descriptors_in_flight_below_the_hosts_default_limit() {
    use sandbox::limits::{HOST_DEFAULT_OPEN_FILES, SANDBOX_OPEN_FILES};
    let _serial = serial();
    for uid in identities() {
        let fx = Fixture::new(uid);
        let script = hog_script(&fx);
        // Sends are refused once the uid's count is above the sender's soft RLIMIT_NOFILE: the
        // sandbox's (SANDBOX_OPEN_FILES) is below the host's default, whoever the uid is (a
        // sandboxed root has no CAP_SYS_RESOURCE on the host). Other processes of the uid may
        // hold a few in flight already.
        let held = hog(&script, "inflight", true, None, uid, &fx.ws);
        assert!(
            held.took <= SANDBOX_OPEN_FILES + 1
                && held.took + 64 >= SANDBOX_OPEN_FILES
                && held.error == "ETOOMANYREFS",
            "as {uid:?}: the sandbox's descriptors in flight are not bounded by its \
             RLIMIT_NOFILE: took {} then {}",
            held.took,
            held.error
        );
        // A host process of the uid at the soft limit every process starts with still sends.
        // (A second sandbox with the same limit does not while this one holds all it can:
        // the count is the uid's, compared with each sender's own limit; see
        // SANDBOX_OPEN_FILES.)
        let host = one(&script, "inflight-host", false, uid, &fx.ws);
        assert_eq!(
            (host.took, host.error.as_str()),
            (1, ""),
            "as {uid:?}: a host process at RLIMIT_NOFILE {HOST_DEFAULT_OPEN_FILES} got none \
             while a sandbox held its all"
        );
        drop(held);
        // The control: unsandboxed, the same hog (at the limit the server's processes have)
        // puts more in flight than the sandbox could.
        let held = hog(
            &script,
            "inflight",
            false,
            Some(INFLIGHT_CONTROL),
            uid,
            &fx.ws,
        );
        assert_eq!(
            (held.took, held.error.as_str()),
            (INFLIGHT_CONTROL, ""),
            "as {uid:?}: the unsandboxed hog (the control)"
        );
        if uid.is_some() {
            // Root is exempt from the check (CAP_SYS_RESOURCE); any other uid's host process
            // at the default limit is now refused.
            let host = one(&script, "inflight-host", false, uid, &fx.ws);
            assert_eq!(
                (host.took, host.error.as_str()),
                (0, "ETOOMANYREFS"),
                "as {uid:?}: the unsandboxed hog did not starve a host process (the control)"
            );
        }
    }
}

#[test]
fn a_sandbox_takes_only_its_share_of_the_hosts_tasks() {
    let _serial = serial();
    let share = sandbox::limits::host_processes_share();
    // RLIMIT_NPROC, counted in the sandbox's own user namespace, is what sandbox-run alone has;
    // the kernel does not apply it to uid 0 (exec-server's pids cgroup bounds root's sandboxes:
    // tests/tests/self_protection/pools.rs). So as uid 65534 only.
    let uid = Some(common::NOBODY);
    let fx = Fixture::new(uid);
    let script = hog_script(&fx);
    // The sandbox's PID 1 and the hog's main thread are tasks of the sandbox too.
    let held = hog(&script, "threads", true, None, uid, &fx.ws);
    assert!(
        held.took < share && held.took + 16 >= share && held.error == "EAGAIN",
        "the sandbox's tasks are not bounded to its share {share}: took {} then {}",
        held.took,
        held.error
    );
    others_still_get_one(&script, "threads", uid, &fx.ws, true);
    drop(held);
    // The control: unsandboxed, the same hog gets past the share (draining the host's process
    // IDs would stop every process of the machine from forking, so it stops one past).
    let held = hog(&script, "threads", false, Some(share + 1), uid, &fx.ws);
    assert_eq!(
        (held.took, held.error.as_str()),
        (share + 1, ""),
        "the unsandboxed hog (the control)"
    );
}
