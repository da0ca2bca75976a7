//! Secrets on the host stay out of every sandbox (issue 30):
//! - a sandbox of server A cannot read server C's token file or reach C's unix socket, also when
//!   A's launchers were built before C started, and neither can a standalone `sandbox-run`;
//! - the built-in profiles keep the well-known credential stores (`~/.ssh`, `~/.aws`, ...)
//!   unreadable (EACCES, no content) through `process/start`, `fs/readFile` and `sandbox-run`,
//!   and one store lifted by name is readable.
//!
//! Every case runs with the servers as root and as uid 65534, through launchers and one-shot
//! (`--one-shot-sandbox --one-shot-helpers`), each with an unsandboxed control that succeeds.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tests::matrix::{identities, launch_modes};
use tests::{ExecServer, file_uri, install_binaries, scratch, unb64};

/// EACCES: what a masked path answers.
const EACCES: i64 = 13;

/// A scratch directory with an install of the binaries and a workspace owned by `uid`.
struct Install {
    _base: tempfile::TempDir,
    root: PathBuf,
    bin: PathBuf,
    ws: PathBuf,
    uid: Option<u32>,
}

impl Install {
    fn new(uid: Option<u32>) -> Self {
        let base = scratch::scratch_dir("host-secrets-");
        let root = std::fs::canonicalize(base.path()).unwrap();
        let bin = root.join("bin");
        install_binaries(&bin);
        let ws = root.join("ws");
        std::fs::create_dir(&ws).unwrap();
        let install = Self {
            _base: base,
            root,
            bin,
            ws,
            uid,
        };
        install.own(&install.ws);
        install
    }

    fn own(&self, path: &Path) {
        if let Some(uid) = self.uid {
            std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
        }
    }

    /// A file holding `text`, mode 0600, owned by the uid.
    fn secret_file(&self, path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
        self.own(path);
    }

    fn start(&self, args: &[&str], home: Option<&Path>) -> ExecServer {
        let uid = self.uid;
        ExecServer::start_binary(&self.bin.join("exec-server"), args, |command| {
            // A working directory every uid can enter: a sandboxed fs request without a cwd
            // runs in the server's, and the checkout may sit below a 0700 directory.
            command
                .env_clear()
                .env("PATH", "/usr/bin:/bin")
                .env("RUST_LOG", "supervisor=debug")
                .current_dir("/");
            if let Some(home) = home {
                command.env("HOME", home);
            }
            if let Some(uid) = uid {
                command.uid(uid).gid(uid);
            }
        })
    }

    fn probe(&self) -> String {
        self.bin.join("probe").to_str().unwrap().to_owned()
    }

    /// `sandbox-run ARGS -- COMMAND` of this install, as the uid, with `HOME` set when given.
    fn sandbox_run(
        &self,
        args: &[&str],
        command: &[&str],
        home: Option<&Path>,
    ) -> std::process::Output {
        let mut cmd = std::process::Command::new(self.bin.join("sandbox-run"));
        cmd.args(args)
            .arg("--")
            .args(command)
            .current_dir(&self.ws)
            .env_clear()
            .env("PATH", "/usr/bin:/bin");
        if let Some(home) = home {
            cmd.env("HOME", home);
        }
        if let Some(uid) = self.uid {
            cmd.uid(uid).gid(uid);
        }
        cmd.output().unwrap()
    }
}

/// Runs the probe under `sandbox` through the server; returns its JSON report.
async fn probe_through(
    client: &mut tests::Client,
    install: &Install,
    id: &str,
    sandbox: Option<&Value>,
    op: &[&str],
) -> Value {
    let probe = install.probe();
    tests::probe_report(client, &probe, &install.ws, id, sandbox, op).await
}

/// The policy shapes a sandboxed command can have.
fn policy_shapes(ws: &Path) -> Vec<(&'static str, Value)> {
    let cwd = file_uri(ws);
    vec![
        (
            "workspace-write",
            json!({"profile": "workspace-write", "cwd": cwd}),
        ),
        (
            "read-only, network on",
            json!({"profile": "read-only", "cwd": cwd, "networkAccess": true}),
        ),
        (
            "filesystem unrestricted, network off",
            json!({"type": "external-sandbox"}),
        ),
    ]
}

/// What a server logs for a connection it accepted.
fn connection_lines(server: &ExecServer) -> usize {
    server
        .stderr()
        .lines()
        .filter(|line| line.contains("connection open") || line.contains("dropping connection"))
        .count()
}

fn wait_for_connection_line(server: &ExecServer, before: usize) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if connection_lines(server) > before {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20)); // polling interval
    }
    false
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_of_one_server_cannot_read_another_servers_token_or_reach_its_socket() {
    for uid in identities() {
        for (mode, flags) in launch_modes() {
            let install = Install::new(uid);
            let c_dir = install.root.join("server-c");
            std::fs::create_dir(&c_dir).unwrap();
            install.own(&c_dir);
            let token = c_dir.join("token");
            install.secret_file(&token, "c-s3cret\n");
            let token_path = token.to_str().unwrap();
            let socket = c_dir.join("c.sock");
            let socket_path = socket.to_str().unwrap();
            let mut args = vec!["--listen", "ws://127.0.0.1:0"];
            args.extend(flags);
            let server_a = install.start(&args, None);
            let mut client = server_a.client().await;
            let shapes = policy_shapes(&install.ws);
            // Before C runs its token is a file like any other: each shape reads it, and (in
            // launcher mode) each shape's launcher is built now, before C exists.
            for (n, (shape, sandbox)) in shapes.iter().enumerate() {
                let before = probe_through(
                    &mut client,
                    &install,
                    &format!("before-{n}"),
                    Some(sandbox),
                    &["read", token_path],
                )
                .await;
                assert_eq!(before["ok"], true, "{shape}: read before C: {before}");
            }
            let listen = format!("unix:{socket_path}");
            let server_c = install.start(
                &["--listen", &listen, "--auth-token-file", token_path],
                None,
            );
            let mut own = tests::Client::connect_with_headers(
                server_c.url(),
                &[("Authorization", "Bearer c-s3cret")],
            )
            .await
            .unwrap();
            own.initialize().await;
            let logged = {
                // The test's own connection is logged first.
                let deadline = Instant::now() + Duration::from_secs(10);
                while connection_lines(&server_c) == 0 && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20)); // polling interval
                }
                connection_lines(&server_c)
            };
            for (n, (shape, sandbox)) in shapes.iter().enumerate() {
                let context = format!("{shape}, {mode}, as {uid:?}");
                let read = probe_through(
                    &mut client,
                    &install,
                    &format!("token-{n}"),
                    Some(sandbox),
                    &["read", token_path],
                )
                .await;
                assert_eq!(read["ok"], false, "{context}: read C's token: {read}");
                assert_eq!(read["errno"], EACCES, "{context}: {read}");
                let connect = probe_through(
                    &mut client,
                    &install,
                    &format!("socket-{n}"),
                    Some(sandbox),
                    &["unix-connect", socket_path],
                )
                .await;
                assert_eq!(connect["ok"], false, "{context}: reached C: {connect}");
            }
            // The registry itself is out of sight (a private /run or /dev/shm).
            let registry = match uid {
                None => PathBuf::from("/run/execward/servers"),
                Some(uid) => PathBuf::from(format!("/dev/shm/execward-{uid}/servers")),
            };
            let entry = std::fs::read_dir(&registry)
                .unwrap()
                .map(|e| e.unwrap().path())
                .find(|path| {
                    std::fs::read_to_string(path).is_ok_and(|text| text.contains(token_path))
                })
                .expect("C registered its token");
            let entry_path = entry.to_str().unwrap();
            for (n, (shape, sandbox)) in shapes.iter().enumerate() {
                let read = probe_through(
                    &mut client,
                    &install,
                    &format!("registry-{n}"),
                    Some(sandbox),
                    &["read", entry_path],
                )
                .await;
                assert_eq!(read["ok"], false, "{shape}: read the registry: {read}");
            }
            let read = probe_through(
                &mut client,
                &install,
                "control-registry",
                None,
                &["read", entry_path],
            )
            .await;
            assert_eq!(read["ok"], true, "control read of the registry: {read}");
            // A standalone sandbox-run of the same uid reads the registry too.
            let probe = install.probe();
            let out = install.sandbox_run(
                &["--policy", "workspace-write"],
                &[&probe, "read", token_path],
                None,
            );
            let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
            assert_eq!(
                report["errno"], EACCES,
                "sandbox-run read C's token: {out:?}"
            );
            // --explain names it among the hidden paths.
            let out = install.sandbox_run(&["--policy", "read-only", "--explain"], &["true"], None);
            let explain: Value = serde_json::from_slice(&out.stdout).unwrap();
            assert!(
                explain["policy"]["hidden"]
                    .as_array()
                    .is_some_and(|hidden| hidden.iter().any(|p| p == token_path)),
                "--explain does not list C's token as hidden: {explain}"
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert_eq!(
                connection_lines(&server_c),
                logged,
                "C logged a connection from a sandbox ({mode}, as {uid:?}):\n{}",
                server_c.stderr()
            );
            // Control: unsandboxed, the same command of A reads C's token and reaches C.
            let read = probe_through(
                &mut client,
                &install,
                "control-token",
                None,
                &["read", token_path],
            )
            .await;
            assert_eq!(read["ok"], true, "control read: {read}");
            let connect = probe_through(
                &mut client,
                &install,
                "control-socket",
                None,
                &["unix-connect", socket_path],
            )
            .await;
            assert_eq!(connect["ok"], true, "control connect: {connect}");
            assert!(
                wait_for_connection_line(&server_c, logged),
                "control: C logs the connection"
            );
        }
    }
}

/// A credential store, the file the test reads in it, and whether the store is a directory.
const STORES: &[(&str, &str)] = &[
    ("~/.ssh", ".ssh/id_ed25519"),
    ("~/.aws", ".aws/credentials"),
    ("~/.config/gcloud", ".config/gcloud/credentials.db"),
    ("~/.azure", ".azure/msal_token_cache.json"),
    ("~/.kube/config", ".kube/config"),
    ("~/.docker/config.json", ".docker/config.json"),
    ("~/.netrc", ".netrc"),
    ("~/.git-credentials", ".git-credentials"),
    ("~/.gnupg", ".gnupg/private-keys-v1.d/key.key"),
    ("~/.config/gh", ".config/gh/hosts.yml"),
    ("~/.npmrc", ".npmrc"),
    ("~/.pypirc", ".pypirc"),
    ("~/.cargo/credentials", ".cargo/credentials"),
    ("~/.cargo/credentials.toml", ".cargo/credentials.toml"),
];

/// A fake home under the scratch directory with every store holding a distinct secret.
fn fake_home(install: &Install) -> PathBuf {
    let home = install.root.join("home");
    std::fs::create_dir(&home).unwrap();
    install.own(&home);
    for (n, (_, file)) in STORES.iter().enumerate() {
        let path = home.join(file);
        install.secret_file(&path, &format!("SECRET-{n}\n"));
        let mut dir = path.parent().unwrap();
        while dir != home {
            install.own(dir);
            dir = dir.parent().unwrap();
        }
    }
    home
}

async fn cat(
    client: &mut tests::Client,
    id: &str,
    path: &Path,
    sandbox: Option<&Value>,
) -> tests::ProcessOutput {
    let mut extra = json!({
        "cwd": "file:///",
        // The command's own HOME changes nothing: the server's is used.
        "env": {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"},
    });
    if let Some(sandbox) = sandbox {
        extra["sandbox"] = sandbox.clone();
    }
    client
        .run(id, &["/bin/cat", path.to_str().unwrap()], extra)
        .await
}

async fn read_file(
    client: &mut tests::Client,
    path: &Path,
    sandbox: &Value,
) -> Result<Vec<u8>, tests::RpcError> {
    client
        .request(
            "fs/readFile",
            json!({"path": file_uri(path), "sandbox": sandbox}),
        )
        .await
        .map(|result| unb64(result["dataBase64"].as_str().unwrap_or("")))
}

fn assert_denied_cat(out: &tests::ProcessOutput, secret: &str, context: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains(secret),
        "{context}: the content came out"
    );
    assert_ne!(out.exit_code, Some(0), "{context}: cat succeeded");
    assert!(
        stderr.contains("Permission denied"),
        "{context}: expected EACCES, got {stderr:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn credential_stores_are_unreadable_under_the_built_in_profiles_and_readable_when_lifted() {
    for uid in identities() {
        for (mode, flags) in launch_modes() {
            let install = Install::new(uid);
            let home = fake_home(&install);
            let mut args = vec!["--listen", "ws://127.0.0.1:0"];
            args.extend(flags);
            let server = install.start(&args, Some(&home));
            let mut client = server.client().await;
            let cwd = file_uri(&install.ws);
            for profile in ["read-only", "workspace-write"] {
                let sandbox = json!({"profile": profile, "cwd": cwd});
                for (n, (store, file)) in STORES.iter().enumerate() {
                    let path = home.join(file);
                    let secret = format!("SECRET-{n}");
                    let context = format!("{store} under {profile}, {mode}, as {uid:?}");
                    let out = cat(
                        &mut client,
                        &format!("{profile}-{n}"),
                        &path,
                        Some(&sandbox),
                    )
                    .await;
                    assert_denied_cat(&out, &secret, &format!("process/start: {context}"));
                    let read = read_file(&mut client, &path, &sandbox).await;
                    let error = read.expect_err(&format!("fs/readFile read it: {context}"));
                    let data = serde_json::to_value(&error.data).unwrap();
                    assert_eq!(data["kind"], "sandboxDenied", "{context}: {error:?}");
                    assert!(
                        tests::error_text(&error).contains("Permission denied"),
                        "{context}: {error:?}"
                    );
                }
            }
            for (n, (store, file)) in STORES.iter().enumerate() {
                let path = home.join(file);
                let secret = format!("SECRET-{n}");
                let context = format!("{store} lifted, {mode}, as {uid:?}");
                let lifted = json!({
                    "profile": "workspace-write", "cwd": cwd,
                    "readableCredentialStores": [store],
                });
                let out = cat(&mut client, &format!("lifted-{n}"), &path, Some(&lifted)).await;
                assert_eq!(
                    String::from_utf8_lossy(&out.stdout),
                    format!("{secret}\n"),
                    "process/start: {context}: {out:?}"
                );
                let read = read_file(&mut client, &path, &lifted).await.unwrap();
                assert_eq!(
                    read,
                    format!("{secret}\n").as_bytes(),
                    "fs/readFile: {context}"
                );
                // The lift is of that one store: the next one stays denied.
                let (_, other) = STORES[(n + 1) % STORES.len()];
                let other_secret = format!("SECRET-{}", (n + 1) % STORES.len());
                let out = cat(
                    &mut client,
                    &format!("other-{n}"),
                    &home.join(other),
                    Some(&lifted),
                )
                .await;
                assert_denied_cat(&out, &other_secret, &format!("other store: {context}"));
                // Control: unsandboxed, the command reads it.
                let out = cat(&mut client, &format!("control-{n}"), &path, None).await;
                assert_eq!(
                    String::from_utf8_lossy(&out.stdout),
                    format!("{secret}\n"),
                    "control: {context}"
                );
            }
            // An unknown store cannot be lifted (a typo must not pass silently).
            let unknown = json!({
                "profile": "workspace-write", "cwd": cwd,
                "readableCredentialStores": ["~/.bashrc"],
            });
            let error = client
                .start("unknown", &["/bin/true"], json!({"sandbox": unknown}))
                .await
                .expect_err("an unknown store was accepted");
            assert!(error.message.contains("~/.bashrc"), "{error:?}");
        }
    }
}

#[test]
fn sandbox_run_denies_every_credential_store_and_lifts_one_by_name() {
    for uid in identities() {
        let install = Install::new(uid);
        let home = fake_home(&install);
        // --explain lists each store as a deny rule, and a lifted one no more.
        let explain_denies = |extra: &[&str]| -> Vec<String> {
            let mut args = vec!["--policy", "read-only", "--explain"];
            args.extend(extra);
            let out = install.sandbox_run(&args, &["true"], Some(&home));
            let explain: Value = serde_json::from_slice(&out.stdout).unwrap();
            explain["policy"]["filesystem"]["rules"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|rule| rule["access"] == "deny")
                .map(|rule| rule["path"].as_str().unwrap().to_owned())
                // Only the home's: another server's registered paths may be denied too.
                .filter(|path| Path::new(path).starts_with(&home))
                .collect()
        };
        let denies = explain_denies(&[]);
        let aws = home.join(".aws").to_str().unwrap().to_owned();
        assert!(denies.contains(&aws), "{denies:?}");
        assert_eq!(denies.len(), STORES.len(), "{denies:?}");
        let lifted = explain_denies(&["--allow-credential-store", "~/.aws"]);
        assert!(!lifted.contains(&aws), "{lifted:?}");
        assert_eq!(lifted.len(), STORES.len() - 1, "{lifted:?}");
        for (n, (store, file)) in STORES.iter().enumerate() {
            let path = home.join(file);
            let path = path.to_str().unwrap();
            let secret = format!("SECRET-{n}\n");
            for policy in ["read-only", "workspace-write"] {
                let out =
                    install.sandbox_run(&["--policy", policy], &["/bin/cat", path], Some(&home));
                let stderr = String::from_utf8_lossy(&out.stderr);
                assert!(
                    !out.status.success()
                        && out.stdout.is_empty()
                        && stderr.contains("Permission denied"),
                    "{store} under {policy} as {uid:?}: {out:?}"
                );
            }
            let out = install.sandbox_run(
                &["--policy", "read-only", "--allow-credential-store", store],
                &["/bin/cat", path],
                Some(&home),
            );
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                secret,
                "{store} lifted as {uid:?}: {out:?}"
            );
            let out = install.sandbox_run(
                &["--policy", "danger-full-access"],
                &["/bin/cat", path],
                Some(&home),
            );
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                secret,
                "control {store}"
            );
        }
    }
}
