//! Pathname unix sockets outside the writable roots are out of reach of a sandboxed
//! `process/start` unless the policy names them (`allowUnixSockets`), issue 30:
//! - a tmux server started outside does not run a sandboxed client's `run-shell` (its marker
//!   file is never created), and does when the socket is named;
//! - a second exec-server listening on a unix socket under the scratch directory (`/var/tmp`)
//!   cannot be reached;
//! - host `/tmp` (issue 35): a script there runs, writes there stay private, a denied file there
//!   stays unreadable, and a tmux server's socket there is unreachable unless named.
//!
//! Every case runs with the server as root and as uid 65534, through launchers and one-shot
//! (`--one-shot-sandbox --one-shot-helpers`), each with an unsandboxed control that succeeds.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use tests::matrix::{identities, launch_modes};
use tests::{ExecServer, file_uri, install_binaries, scratch};

/// An install of the binaries, a workspace and an outside directory, owned by `uid`.
struct Install {
    _base: tempfile::TempDir,
    bin: PathBuf,
    ws: PathBuf,
    outside: PathBuf,
    uid: Option<u32>,
}

impl Install {
    fn new(uid: Option<u32>) -> Self {
        let base = scratch::scratch_dir("unix-sockets-");
        let root = std::fs::canonicalize(base.path()).unwrap();
        let bin = root.join("bin");
        install_binaries(&bin);
        let ws = root.join("ws");
        let outside = root.join("outside");
        for dir in [&ws, &outside] {
            std::fs::create_dir(dir).unwrap();
            if let Some(uid) = uid {
                std::os::unix::fs::chown(dir, Some(uid), Some(uid)).unwrap();
            }
        }
        scratch::assert_outside_writable_roots(&outside);
        Self {
            _base: base,
            bin,
            ws,
            outside,
            uid,
        }
    }

    fn start(&self, args: &[&str]) -> ExecServer {
        let uid = self.uid;
        ExecServer::start_binary(&self.bin.join("exec-server"), args, |command| {
            command
                .env_clear()
                .env("PATH", "/usr/bin:/bin")
                .current_dir("/");
            if let Some(uid) = uid {
                command.uid(uid).gid(uid);
            }
        })
    }

    /// A command as the uid, with a clean environment.
    fn command(&self, program: &str) -> std::process::Command {
        let mut command = std::process::Command::new(program);
        // tmux runs its commands with the user's shell: nobody's is nologin.
        command
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("SHELL", "/bin/sh")
            .current_dir(&self.outside);
        if let Some(uid) = self.uid {
            command.uid(uid).gid(uid);
        }
        command
    }

    fn workspace_write(&self, named: &[&Path]) -> Value {
        let mut sandbox = json!({"profile": "workspace-write", "cwd": file_uri(&self.ws)});
        if !named.is_empty() {
            sandbox["allowUnixSockets"] = json!(
                named
                    .iter()
                    .map(|p| p.to_str().unwrap())
                    .collect::<Vec<_>>()
            );
        }
        sandbox
    }
}

/// A tmux server on `socket`, killed on drop.
struct Tmux<'a> {
    install: &'a Install,
    socket: PathBuf,
}

impl<'a> Tmux<'a> {
    fn start(install: &'a Install, socket: PathBuf) -> Self {
        let status = install
            .command("tmux")
            .arg("-S")
            .arg(&socket)
            .args(["new-session", "-d", "sleep 600"])
            .status()
            .expect("tmux is installed (.ci/run installs it)");
        assert!(status.success(), "tmux new-session: {status}");
        Self { install, socket }
    }
}

impl Drop for Tmux<'_> {
    fn drop(&mut self) {
        let _ = self
            .install
            .command("tmux")
            .arg("-S")
            .arg(&self.socket)
            .arg("kill-server")
            .status();
    }
}

/// The three runs that show a tmux server's socket is reachable only when named: a control
/// without a sandbox, a sandboxed client the policy does not name the socket to, and one it does.
/// Each run's marker (written by the tmux server, outside every sandbox) says whether the
/// server ran the client's command.
struct TmuxReach<'a> {
    install: &'a Install,
    tmux: &'a Tmux<'a>,
    context: &'a str,
}

impl TmuxReach<'_> {
    async fn run(
        &self,
        client: &mut tests::Client,
        name: &str,
        sandbox: Option<&Value>,
    ) -> (tests::ProcessOutput, bool) {
        let marker = self.install.outside.join(name);
        let id = format!("tmux-{name}");
        let out = tmux_run_shell(
            client,
            &id,
            &self.tmux.socket,
            &marker,
            sandbox,
            &self.install.ws,
        )
        .await;
        (out, marker.exists())
    }

    /// Unsandboxed, the tmux server runs the client's command.
    async fn control(&self, client: &mut tests::Client) {
        let (out, ran) = self.run(client, "control", None).await;
        let context = self.context;
        assert_eq!(out.exit_code, Some(0), "{context}, control: {out:?}");
        assert!(ran, "{context}, control: no marker");
    }

    /// Under `sandbox` (which does not name the socket) the client fails and the server runs
    /// nothing; returns the client's stderr.
    async fn denied(&self, client: &mut tests::Client, sandbox: &Value) -> String {
        let (out, ran) = self.run(client, "denied", Some(sandbox)).await;
        let context = self.context;
        assert_ne!(out.exit_code, Some(0), "{context}: tmux client succeeded");
        assert!(!ran, "{context}: the tmux server ran run-shell");
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// Under `sandbox` (which names the socket) the server runs the client's command.
    async fn named(&self, client: &mut tests::Client, sandbox: &Value) {
        let (out, ran) = self.run(client, "named", Some(sandbox)).await;
        let context = self.context;
        assert_eq!(
            out.exit_code,
            Some(0),
            "{context}, named: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(ran, "{context}, named: no marker");
    }
}

/// `tmux -S SOCKET run-shell "touch MARKER"` through the server (sandboxed when `sandbox` is
/// given); returns the process's output.
async fn tmux_run_shell(
    client: &mut tests::Client,
    id: &str,
    socket: &Path,
    marker: &Path,
    sandbox: Option<&Value>,
    cwd: &Path,
) -> tests::ProcessOutput {
    let touch = format!("touch {}", marker.display());
    let mut extra = json!({"cwd": file_uri(cwd), "env": {"PATH": "/usr/bin:/bin"}});
    if let Some(sandbox) = sandbox {
        extra["sandbox"] = sandbox.clone();
    }
    client
        .run(
            id,
            &["tmux", "-S", socket.to_str().unwrap(), "run-shell", &touch],
            extra,
        )
        .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tmux_server_outside_is_unreachable_unless_named() {
    for uid in identities() {
        for (mode, flags) in launch_modes() {
            let install = Install::new(uid);
            let socket = install.outside.join("tmux.sock");
            let tmux = Tmux::start(&install, socket.clone());
            let mut args = vec!["--listen", "ws://127.0.0.1:0"];
            args.extend(flags);
            let server = install.start(&args);
            let mut client = server.client().await;
            let context = format!("{mode} as {uid:?}");

            let denied = install.workspace_write(&[]);
            let named = install.workspace_write(&[&tmux.socket]);
            let reach = TmuxReach {
                install: &install,
                tmux: &tmux,
                context: &context,
            };
            reach.control(&mut client).await;
            let stderr = reach.denied(&mut client, &denied).await;
            assert!(
                stderr.contains("Permission denied"),
                "{context}: expected EACCES from connect, got {stderr}"
            );
            reach.named(&mut client, &named).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_exec_server_on_a_unix_socket_cannot_be_driven() {
    for uid in identities() {
        for (mode, flags) in launch_modes() {
            let install = Install::new(uid);
            let socket = install.outside.join("second.sock");
            let listen = format!("unix:{}", socket.to_str().unwrap());
            let _second = install.start(&["--listen", &listen]);
            let mut args = vec!["--listen", "ws://127.0.0.1:0"];
            args.extend(flags);
            let server = install.start(&args);
            let mut client = server.client().await;
            let probe = install.bin.join("probe");
            let probe = probe.to_str().unwrap();
            let op = ["unix-connect", socket.to_str().unwrap()];
            let context = format!("{mode} as {uid:?}");
            let sandbox = install.workspace_write(&[]);
            let report = tests::probe_report(
                &mut client,
                probe,
                &install.ws,
                "sandboxed",
                Some(&sandbox),
                &op,
            )
            .await;
            assert_eq!(
                report["ok"], false,
                "{context}: reached the second server: {report}"
            );
            let report =
                tests::probe_report(&mut client, probe, &install.ws, "control", None, &op).await;
            assert_eq!(report["ok"], true, "{context}, control: {report}");
        }
    }
}

/// A listener on a socket outside the roots, reachable by the uid; counts connections.
fn outside_listener(install: &Install) -> (PathBuf, std::os::unix::net::UnixListener) {
    use std::os::unix::fs::PermissionsExt;
    let path = install.outside.join("daemon.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
    listener.set_nonblocking(true).unwrap();
    (path, listener)
}

fn accepted(listener: &std::os::unix::net::UnixListener) -> usize {
    std::iter::from_fn(|| listener.accept().ok()).count()
}

/// A refused connect of an audited process is a `process/denied` notification naming the
/// socket (layer `unix-sockets`, operation `unix.connect`), on a launcher server and a
/// one-shot one (audited starts always run a one-shot `sandbox-run`), and `exec --audit`
/// prints it; without the audit the refusal is a line on the process's stderr on both paths.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_connect_is_reported_as_a_denial() {
    for uid in identities() {
        for (mode, flags) in launch_modes() {
            let install = Install::new(uid);
            let (path, listener) = outside_listener(&install);
            let path_text = path.to_str().unwrap();
            let mut args = vec!["--listen", "ws://127.0.0.1:0"];
            args.extend(flags);
            let server = install.start(&args);
            let mut client = server.client().await;
            let probe = install.bin.join("probe");
            let probe = probe.to_str().unwrap();
            let context = format!("{mode} as {uid:?}");
            let sandbox = install.workspace_write(&[]);
            let info = client.call("environment/info", json!({})).await;
            assert_eq!(
                info["sandbox"]["unixSockets"], "seccomp-notify",
                "{context}: this case covers the gate's own records; where Landlock keeps the \
                 rule (ABI 9) the kernel audit reports it: {info}"
            );

            let extra = json!({
                "cwd": file_uri(&install.ws),
                "sandbox": sandbox,
                "auditDenials": true,
            });
            client
                .start("audited", &[probe, "unix-connect", path_text], extra)
                .await
                .unwrap();
            let denied = client
                .wait_for_notification(
                    "a unix-sockets process/denied",
                    std::time::Duration::from_secs(20),
                    |n| {
                        n["method"] == "process/denied"
                            && n["params"]["denial"]["layer"] == "unix-sockets"
                    },
                )
                .await;
            let denial = &denied["params"]["denial"];
            assert_eq!(denied["params"]["processId"], "audited", "{context}");
            assert_eq!(denial["operation"], "unix.connect", "{context}: {denial}");
            assert_eq!(denial["path"], path_text, "{context}: {denial}");
            assert_eq!(denial["errno"], "EACCES", "{context}: {denial}");
            let out = client.collect("audited").await;
            let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            assert_eq!(report["ok"], false, "{context}: {out:?}");
            assert_eq!(accepted(&listener), 0, "{context}: the listener saw it");

            // Without the audit: one line on the process's stderr (the launcher's PID 1 too).
            let out = client
                .run(
                    "plain",
                    &[probe, "unix-connect", path_text],
                    json!({"cwd": file_uri(&install.ws), "sandbox": install.workspace_write(&[])}),
                )
                .await;
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains(&format!("denied: connect to unix socket {path_text}")),
                "{context}: {stderr}"
            );
            assert_eq!(accepted(&listener), 0, "{context}: the listener saw it");

            // exec --audit prints it.
            let mut cmd = std::process::Command::new(tests::exec_server_binary());
            cmd.args(["exec", "--connect", server.url(), "--cwd"])
                .arg(&install.ws)
                .args(["--sandbox", "workspace-write", "--audit", "--"])
                .args([probe, "unix-connect", path_text]);
            let (_, _, stderr) = tests::output_within(&mut cmd, b"");
            assert!(
                stderr.lines().any(|line| line.starts_with(&format!(
                    "exec-server exec: denied unix.connect {path_text}"
                ))),
                "{context}: {stderr}"
            );
            assert_eq!(accepted(&listener), 0, "{context}: the listener saw it");

            // Control: unsandboxed, the same connect reaches the listener.
            let report = tests::probe_report(
                &mut client,
                probe,
                &install.ws,
                "control",
                None,
                &["unix-connect", path_text],
            )
            .await;
            assert_eq!(report["ok"], true, "{context}, control: {report}");
            assert_eq!(accepted(&listener), 1, "{context}, control");
        }
    }
}

/// A directory under the host's `/tmp` (mode 0755, owned by `uid`) holding a script that
/// prints `ran` and the `data` file beside it, and a `secret`; removed when dropped.
fn host_tmp_dir(uid: Option<u32>) -> (tempfile::TempDir, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("execward-host-tmp-")
        .tempdir_in("/tmp")
        .unwrap();
    let path = std::fs::canonicalize(dir.path()).unwrap();
    std::fs::write(path.join("data"), "host-data\n").unwrap();
    std::fs::write(path.join("secret"), "k\n").unwrap();
    let script = path.join("run.sh");
    let text = format!("#!/bin/sh\necho ran\ncat {}/data\n", path.display());
    std::fs::write(&script, text).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    if let Some(uid) = uid {
        for file in [&path, &path.join("data"), &path.join("secret"), &script] {
            std::os::unix::fs::chown(file, Some(uid), Some(uid)).unwrap();
        }
    }
    (dir, path)
}

/// Host `/tmp` under workspace-write (issue 35): a script a harness wrote there runs, a write
/// there stays in the command's private layer (checked on the host; the unsandboxed control's
/// write lands), a denied file there stays unreadable (the control reads it), and a tmux
/// server whose socket is under the host's `/tmp` does not run a sandboxed client's command
/// unless the socket is named (the control's does).
#[tokio::test(flavor = "multi_thread")]
async fn host_tmp_is_readable_its_writes_stay_private_and_its_sockets_unreachable_unless_named() {
    for uid in identities() {
        for (mode, flags) in launch_modes() {
            let install = Install::new(uid);
            let (_dir, host) = host_tmp_dir(uid);
            let secret = host.join("secret");
            let mut args = vec!["--listen", "ws://127.0.0.1:0"];
            args.extend(flags);
            let server = install.start(&args);
            let mut client = server.client().await;
            let context = format!("{mode} as {uid:?}");
            let mut sandbox = install.workspace_write(&[]);
            sandbox["denyPaths"] = json!([secret.to_str().unwrap()]);
            let extra = |sandboxed: bool| {
                let mut extra =
                    json!({"cwd": file_uri(&install.ws), "env": {"PATH": "/usr/bin:/bin"}});
                if sandboxed {
                    extra["sandbox"] = sandbox.clone();
                }
                extra
            };

            let script = host.join("run.sh");
            let out = client
                .run("script", &[script.to_str().unwrap()], extra(true))
                .await;
            assert_eq!(
                (out.exit_code, String::from_utf8_lossy(&out.stdout).as_ref()),
                (Some(0), "ran\nhost-data\n"),
                "{context}: the /tmp script: {}",
                String::from_utf8_lossy(&out.stderr)
            );

            let written = host.join("written");
            let write = format!("echo mine > {0} && cat {0}", written.display());
            let out = client
                .run("write", &["/bin/sh", "-c", &write], extra(true))
                .await;
            assert_eq!(
                (out.exit_code, String::from_utf8_lossy(&out.stdout).as_ref()),
                (Some(0), "mine\n"),
                "{context}: writing /tmp: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(!written.exists(), "{context}: the write reached host /tmp");
            let out = client
                .run("write-control", &["/bin/sh", "-c", &write], extra(false))
                .await;
            assert_eq!(out.exit_code, Some(0), "{context}, control: {out:?}");
            assert!(written.exists(), "{context}, control: no write on the host");

            let probe = install.bin.join("probe");
            let probe = probe.to_str().unwrap();
            let read = ["read", secret.to_str().unwrap()];
            let report = tests::probe_report(
                &mut client,
                probe,
                &install.ws,
                "secret",
                Some(&sandbox),
                &read,
            )
            .await;
            assert_eq!(report["error"], "EACCES", "{context}: {report}");
            let report = tests::probe_report(
                &mut client,
                probe,
                &install.ws,
                "secret-control",
                None,
                &read,
            )
            .await;
            assert_eq!(report["ok"], true, "{context}, control: {report}");

            let tmux = Tmux::start(&install, host.join("tmux.sock"));
            let reach = TmuxReach {
                install: &install,
                tmux: &tmux,
                context: &context,
            };
            reach.control(&mut client).await;
            reach.denied(&mut client, &sandbox).await;
            let report = tests::probe_report(
                &mut client,
                probe,
                &install.ws,
                "socket",
                Some(&sandbox),
                &["unix-connect", tmux.socket.to_str().unwrap()],
            )
            .await;
            assert_eq!(report["ok"], false, "{context}: connected: {report}");
            let mut named = install.workspace_write(&[&tmux.socket]);
            named["denyPaths"] = json!([secret.to_str().unwrap()]);
            reach.named(&mut client, &named).await;
        }
    }
}
