//! Running `sandbox-run`: the binaries installed where every identity can run them, a
//! workspace per identity with its hosts file, a deadline on every wait, what the run printed,
//! the `--allow-domain` arguments, and the helpers several groups share (a Python client, the
//! proxy's pid, a private network namespace, the refusals of an `--egress-log`).

use super::*;

/// `sandbox-run` and `egress-proxy` side by side in a directory every identity can traverse.
pub(crate) fn installed() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = scratch::scratch_dir("egress-bin-").keep();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        for (name, from) in [
            (
                "sandbox-run",
                PathBuf::from(env!("CARGO_BIN_EXE_sandbox-run")),
            ),
            ("egress-proxy", common::egress_proxy_exe()),
        ] {
            let to = dir.join(name);
            std::fs::copy(from, &to).unwrap();
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        dir
    })
}

/// A scratch directory owned by `uid` with a hosts file mapping the test names to 127.0.0.1.
pub(crate) struct Workspace {
    _dir: tempfile::TempDir,
    pub(crate) path: PathBuf,
    pub(crate) hosts: PathBuf,
    pub(crate) uid: Option<u32>,
}

impl Workspace {
    pub(crate) fn new(uid: Option<u32>) -> Self {
        let dir = scratch::scratch_dir("egress-");
        let path = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        let hosts = path.join("hosts");
        std::fs::write(
            &hosts,
            "127.0.0.1 registry.test pypi.test other.test a.example.test secret.example.test\n",
        )
        .unwrap();
        std::fs::set_permissions(&hosts, std::fs::Permissions::from_mode(0o644)).unwrap();
        if let Some(uid) = uid {
            std::os::unix::fs::chown(&path, Some(uid), Some(uid)).unwrap();
        }
        Self {
            _dir: dir,
            path,
            hosts,
            uid,
        }
    }

    /// `sandbox-run --policy workspace-write --egress-hosts HOSTS ARGS -- COMMAND` as the
    /// workspace's identity.
    pub(crate) fn command(&self, args: &[&str], command: &[&str]) -> Command {
        let mut cmd = Command::new(installed().join("sandbox-run"));
        cmd.args(["--policy", "workspace-write", "--egress-hosts"])
            .arg(&self.hosts)
            .args(args)
            .arg("--")
            .args(command)
            .current_dir(&self.path)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", &self.path)
            .stdin(Stdio::null());
        if let Some(uid) = self.uid {
            cmd.uid(uid).gid(uid);
        }
        cmd
    }

    pub(crate) fn run(&self, args: &[&str], command: &[&str]) -> Output {
        let child = self
            .command(args, command)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_output(child, DEADLINE * 3)
    }
}

/// Waits for `child` under a deadline (killing it and failing when it passes).
pub(crate) fn wait_output(child: std::process::Child, deadline: Duration) -> Output {
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(deadline) {
        Ok(output) => output.unwrap(),
        Err(_) => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            panic!("sandbox-run did not finish within {deadline:?}");
        }
    }
}

pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

pub(crate) fn describe(output: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        text(&output.stdout),
        text(&output.stderr)
    )
}

/// `--allow-domain` arguments for `names` plus the origin's address itself (names resolve to
/// 127.0.0.1, which is reached only when named).
pub(crate) fn allow(names: &[&str], origin: &Origin) -> Vec<String> {
    let mut args = Vec::new();
    for name in names {
        args.push("--allow-domain".to_owned());
        args.push(format!("{name}:{}", origin.port));
    }
    args.push("--allow-domain".to_owned());
    args.push(format!("127.0.0.1:{}", origin.port));
    args
}

pub(crate) fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// Runs `body` on a thread in a network namespace of its own (so children it starts are there
/// too), whose `lo` is up and also carries `addresses`: public-looking addresses of "this host",
/// which a name may resolve to. Needs root.
pub(crate) fn in_private_network<T: Send>(
    addresses: &[&str],
    body: impl FnOnce() -> T + Send,
) -> T {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test makes a network namespace: run it as root"
    );
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // SAFETY: unshare on this thread only; no memory is touched.
                assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
                let ip = |args: &[&str]| {
                    let status = Command::new("ip").args(args).status().unwrap();
                    assert!(status.success(), "ip {args:?}");
                };
                ip(&["link", "set", "lo", "up"]);
                for address in addresses {
                    ip(&["addr", "add", address, "dev", "lo"]);
                }
                body()
            })
            .join()
            .unwrap()
    })
}

/// A Python snippet run inside the sandbox.
pub(crate) fn python(ws: &Workspace, args: &[String], code: &str) -> Output {
    ws.run(&strs(args), &[PYTHON, "-c", code])
}

/// The `egress-proxy` whose parent is `parent`.
pub(crate) fn proxy_of(parent: u32) -> Option<i32> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((comm, rest)) = stat.split_once(") ") else {
            continue;
        };
        let ppid = rest
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<u32>().ok());
        if comm.ends_with("(egress-proxy") && ppid == Some(parent) {
            return Some(pid);
        }
    }
    None
}

/// Python helpers for the framing and STARTTLS cases: the proxy's port, `exchange` (send each
/// message, `None` meaning "read one answer", then half-close and read to the end: prints how
/// many `200` answers came back) and `hello(name)` (a hand-made ClientHello naming `name`).
pub(crate) const CLIENT_PY: &str = "import socket, os, sys\n\
port = int(os.environ['HTTP_PROXY'].rstrip('/').rsplit(':', 1)[1])\n\
def exchange(label, *messages):\n\
\x20   s = socket.create_connection(('127.0.0.1', port), timeout=10)\n\
\x20   answers = b''\n\
\x20   try:\n\
\x20       for m in messages:\n\
\x20           if m is None:\n\
\x20               answers += s.recv(4096)\n\
\x20           else:\n\
\x20               s.sendall(m)\n\
\x20       s.shutdown(socket.SHUT_WR)\n\
\x20       while True:\n\
\x20           chunk = s.recv(4096)\n\
\x20           if not chunk:\n\
\x20               break\n\
\x20           answers += chunk\n\
\x20   except OSError as e:\n\
\x20       pass\n\
\x20   print(label, answers.count(b' 200 '))\n\
def hello(name):\n\
\x20   name = name.encode()\n\
\x20   entry = b'\\x00' + len(name).to_bytes(2, 'big') + name\n\
\x20   names = len(entry).to_bytes(2, 'big') + entry\n\
\x20   ext = b'\\x00\\x00' + len(names).to_bytes(2, 'big') + names\n\
\x20   body = b'\\x03\\x03' + bytes(32) + b'\\x00' + b'\\x00\\x02\\x13\\x01' + b'\\x01\\x00' + len(ext).to_bytes(2, 'big') + ext\n\
\x20   hs = b'\\x01' + len(body).to_bytes(3, 'big') + body\n\
\x20   return b'\\x16\\x03\\x01' + len(hs).to_bytes(2, 'big') + hs\n";

/// The refusals in an `--egress-log`.
pub(crate) fn refusals(log: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["allowed"] == false)
        .collect()
}
