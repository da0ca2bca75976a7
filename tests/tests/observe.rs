//! Seeing what runs (issue 40): `process/list`, `GET /status`, `GET /metrics`, `exec-server ps`
//! and the lifecycle log events.
//!
//! One server runs a process that exited, one the memory limit's OOM killer killed, two that
//! still run (one sandboxed) and one in a neighbour session; each view is checked against what
//! the test knows of them (ids, states, pids, exit codes, reasons, limits, memory, counts), not
//! for presence. The pages are refused to whoever a websocket upgrade is refused to (another
//! user without the token, on TCP and on the unix socket), with the server as root and as uid
//! 65534, and served to the server's own user as the control.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tests::matrix::{ListenerFixture, server_users};
use tests::{DEADLINE, ExecServer, budget_in, output_within, sh};

const TOKEN: &str = "observe-token";

/// The hog's memory limit, and what it tries to hold (a shell variable of 100 MB).
const HOG_LIMIT: u64 = 32 << 20;
/// The running sleep's memory limit.
const RUNNER_LIMIT: u64 = 64 << 20;
const HOG: &str = "echo before; x=$(head -c 100000000 /dev/zero | tr '\\0' a); echo after";

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The value of the sample `name` (with its labels, as rendered) in a metrics page.
fn sample(page: &str, name: &str) -> f64 {
    page.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no sample {name} in\n{page}"))
        .parse()
        .unwrap()
}

fn by_id<'a>(processes: &'a [Value], id: &str) -> &'a Value {
    processes
        .iter()
        .find(|p| p["processId"] == id)
        .unwrap_or_else(|| panic!("no process {id} in {processes:?}"))
}

fn ids(processes: &[Value]) -> Vec<&str> {
    processes
        .iter()
        .map(|p| p["processId"].as_str().unwrap())
        .collect()
}

/// The checks every view makes of the session's four processes.
fn assert_processes(processes: &[Value], began_ms: u64, ended_ms: u64, view: &str) {
    assert_eq!(
        ids(processes),
        ["done", "hog", "runner", "boxed"],
        "{view}: the session's processes, oldest first, and no other session's"
    );
    for process in processes {
        let started = process["startedAtMs"].as_u64().unwrap();
        assert!(
            (began_ms..=ended_ms).contains(&started),
            "{view}: started within the test ({began_ms}..={ended_ms}): {process}"
        );
        assert!(process["pid"].as_i64().unwrap() > 1, "{view}: {process}");
    }
    let done = by_id(processes, "done");
    assert_eq!(done["state"], "closed", "{view}: {done}");
    assert_eq!(done["exitCode"], 3, "{view}: {done}");
    assert_eq!(done["reason"], "exit", "{view}: {done}");
    assert!(done.get("resources").is_none(), "{view}: {done}");
    assert!(done["usage"]["wallMillis"].is_u64(), "{view}: {done}");

    let hog = by_id(processes, "hog");
    assert_eq!(hog["state"], "closed", "{view}: {hog}");
    assert_eq!(hog["reason"], "oom", "{view}: {hog}");
    assert_eq!(
        hog["limits"]["memoryBytes"]["value"], HOG_LIMIT,
        "{view}: {hog}"
    );
    let peak = hog["usage"]["peakMemoryBytes"].as_u64().unwrap();
    assert!(
        (HOG_LIMIT / 2..=HOG_LIMIT).contains(&peak),
        "{view}: the hog's peak is near its limit and not above it: {hog}"
    );

    for id in ["runner", "boxed"] {
        let running = by_id(processes, id);
        assert_eq!(running["state"], "running", "{view}: {running}");
        assert!(running.get("exitCode").is_none(), "{view}: {running}");
        assert_eq!(running["sandboxed"], id == "boxed", "{view}: {running}");
        let pid = running["pid"].as_i64().unwrap();
        assert!(
            std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "{view}: {id}'s pid {pid} is a live process"
        );
    }
    let runner = by_id(processes, "runner");
    let pid = runner["pid"].as_i64().unwrap();
    // process/start answers once the child exists; its exec may still be under way.
    let deadline = Instant::now() + DEADLINE;
    loop {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        if cmdline == b"sleep\x0030\0" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{view}: runner's pid {pid} is the sleep (cmdline {cmdline:?})"
        );
        std::thread::sleep(Duration::from_millis(5)); // polling interval, not a wait
    }
    // Its memory limit gives it a memory cgroup on every host that enforces one.
    assert_eq!(
        runner["limits"]["memoryBytes"]["value"], RUNNER_LIMIT,
        "{view}: {runner}"
    );
    let memory = runner["resources"]["memoryCurrentBytes"].as_u64().unwrap();
    assert!(
        memory > 0 && memory < RUNNER_LIMIT / 2,
        "{view}: a sleep's tree holds some memory, far below its limit: {runner}"
    );
    assert!(
        runner["resources"]["cpuMillis"].is_u64(),
        "{view}: {runner}"
    );
}

/// One run of the whole scenario (`args`: the server's flags, the launch path).
async fn views_report_what_runs(args: &[&str]) {
    let began_ms = now_ms();
    let server = ExecServer::start(args);
    let mut client = server.connect().await;
    let session = client.initialize().await;
    let mut neighbour = server.client().await;

    let done = client.run("done", &sh("exit 3"), json!({})).await;
    assert_eq!(done.exit_code, Some(3));
    client
        .start(
            "hog",
            &sh(HOG),
            json!({"limits": {"memoryBytes": HOG_LIMIT}}),
        )
        .await
        .unwrap();
    let hog = client.collect_within("hog", Duration::from_secs(30)).await;
    assert_eq!(
        hog.stdout_text(),
        "before\n",
        "the hog was killed while it grew"
    );
    client
        .start(
            "runner",
            &["sleep", "30"],
            json!({"limits": {"memoryBytes": RUNNER_LIMIT}}),
        )
        .await
        .unwrap();
    client
        .start(
            "boxed",
            &["sleep", "30"],
            json!({"sandbox": {"profile": "read-only"}}),
        )
        .await
        .unwrap();
    neighbour
        .start("other", &["sleep", "30"], json!({}))
        .await
        .unwrap();
    let ended_ms = now_ms();

    // process/list: the calling session's processes only.
    let list = client.call("process/list", json!({})).await;
    let processes = list["processes"].as_array().unwrap();
    assert_processes(
        processes,
        began_ms,
        ended_ms,
        &format!("process/list {args:?}"),
    );
    let theirs = neighbour.call("process/list", json!({})).await;
    assert_eq!(ids(theirs["processes"].as_array().unwrap()), ["other"]);

    // GET /status: every session, by tag, never by its whole (resumable) id.
    let (code, head, body) = server.get("/status").await;
    assert_eq!(code, 200, "{head}\n{body}");
    assert!(head.contains("application/json"), "{head}");
    assert!(
        !body.contains(&session),
        "the whole session id is not shown"
    );
    let status: Value = serde_json::from_str(&body).unwrap();
    let sessions = status["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 2, "{status}");
    assert_eq!(status["processesOmitted"], 0, "{status}");
    let mine = sessions
        .iter()
        .find(|s| s["tag"] == session[..8])
        .unwrap_or_else(|| panic!("no session tagged {} in {status}", &session[..8]));
    assert_eq!(mine["attached"], true);
    assert_processes(
        mine["processes"].as_array().unwrap(),
        began_ms,
        ended_ms,
        &format!("GET /status {args:?}"),
    );
    let inflight = mine["connectionBudgets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == "inflightBytes")
        .unwrap();
    assert_eq!(inflight["limit"], 160 << 20, "{inflight}");
    let budget = |name: &str| budget_in(&status, name);
    assert_eq!(
        budget("liveProcesses"),
        json!({"name": "liveProcesses", "unit": "processes", "limit": 4096, "inUse": 3}),
        "runner, boxed and the neighbour's process hold live-process slots; done and hog gave theirs back"
    );
    assert_eq!(budget("sessions")["inUse"], 2);
    assert_eq!(budget("connections")["inUse"], 2);

    // GET /metrics: counters and gauges with the same facts.
    let (code, head, page) = server.get("/metrics").await;
    assert_eq!(code, 200, "{head}\n{page}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    assert_eq!(sample(&page, "execward_processes_started_total"), 5.0);
    assert_eq!(
        sample(&page, "execward_processes_exited_total{reason=\"oom\"}"),
        1.0
    );
    assert_eq!(
        sample(&page, "execward_processes_exited_total{reason=\"exit\"}"),
        1.0
    );
    assert_eq!(sample(&page, "execward_processes_active"), 3.0);
    assert_eq!(sample(&page, "execward_sessions"), 2.0);
    assert_eq!(
        sample(
            &page,
            "execward_budget_in_use{budget=\"liveProcesses\",unit=\"processes\"}"
        ),
        3.0
    );
    assert_eq!(
        sample(
            &page,
            "execward_request_duration_seconds_count{method=\"process/list\"}"
        ),
        2.0
    );
    assert_eq!(
        sample(
            &page,
            "execward_request_duration_seconds_count{method=\"process/start\"}"
        ),
        5.0
    );
}

#[tokio::test]
async fn list_status_and_metrics_report_exited_oom_killed_and_running_processes() {
    tests::require_root("the memory limit needs the server's cgroups");
    // The sandboxed process through a launcher (the default), then through its own sandbox-run.
    views_report_what_runs(&[]).await;
    views_report_what_runs(&["--one-shot-sandbox"]).await;
}

#[tokio::test]
async fn ps_prints_every_sessions_processes_and_the_budgets() {
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    // A hostile id: its escape sequence must not reach the operator's terminal.
    client
        .start("ps-\u{1b}]0;x\u{7}sleeper", &["sleep", "30"], json!({}))
        .await
        .unwrap();
    let mut command = Command::new(tests::exec_server_binary());
    command.args(["ps", "--connect", server.url()]);
    let (status, stdout, stderr) = output_within(&mut command, b"");
    assert!(status.success(), "{stdout}\n{stderr}");
    let row = stdout
        .lines()
        .find(|line| line.contains("sleeper"))
        .unwrap_or_else(|| panic!("no row of the sleeper in\n{stdout}"));
    assert!(row.contains("running"), "{row}");
    assert!(row.contains("ps-\\u{1b}]0;x\\u{7}sleeper"), "{row}");
    assert!(!stdout.contains('\u{1b}'), "no raw escape: {stdout:?}");
    assert!(
        stdout
            .lines()
            .any(|line| line.split_whitespace().collect::<Vec<_>>()
                == ["liveProcesses", "1", "4096", "processes"]),
        "{stdout}"
    );
    // The Rust client's typed list of the same session sees nothing of it; its own start it does.
    let library = supervisor::ExecServerClient::connect(
        supervisor::ExecServerClientConnectOptions::new(server.url()),
    )
    .await
    .unwrap();
    assert_eq!(library.list_processes().await.unwrap(), []);
    let cwd = proto::FileUri::from_path(std::path::Path::new("/")).unwrap();
    let _sleeper = library
        .start_process(proto::methods::process::StartParams::new(
            "typed",
            ["/bin/sleep", "30"],
            cwd,
        ))
        .await
        .unwrap();
    let listed = library.list_processes().await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].process_id, "typed");
    assert_eq!(
        listed[0].state,
        proto::methods::process::ProcessState::Running
    );
    // --json prints the status as served.
    command.arg("--json");
    let (status, stdout, stderr) = output_within(&mut command, b"");
    assert!(status.success(), "{stderr}");
    let json: Value = serde_json::from_str(stdout.trim()).unwrap();
    let states: Vec<_> = json["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["processes"].as_array().unwrap().clone())
        .map(|p| p["state"].clone())
        .collect();
    assert_eq!(states, ["running", "running"], "{json}");
}

#[tokio::test]
async fn lifecycle_logs_are_json_with_typed_fields_and_no_argv_or_environment() {
    let server = ExecServer::start_with(&["--log-format", "json"], |command| {
        command.env("RUST_LOG", "info");
    });
    let mut client = server.client().await;
    client
        .start(
            "logged-1",
            &["sh", "-c", "exit 3", "argv-mark-7d1"],
            json!({"env": {"PATH": "/usr/bin:/bin", "ENV_MARK": "env-mark-93f"}}),
        )
        .await
        .unwrap();
    client.collect("logged-1").await;
    let deadline = Instant::now() + DEADLINE;
    let log = loop {
        let log = server.stderr();
        if log.contains("process exited") || Instant::now() > deadline {
            break log;
        }
        std::thread::sleep(Duration::from_millis(10)); // polling interval, not a wait
    };
    let lines: Vec<Value> = log
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect();
    for line in &lines {
        for (name, value) in line["fields"].as_object().unwrap() {
            if let Some(text) = value.as_str() {
                assert!(
                    !text.starts_with('"'),
                    "field {name} is a plain string, not a quoted one: {line}"
                );
            }
        }
    }
    assert!(!log.contains("argv-mark-7d1"), "no argv in the log:\n{log}");
    assert!(
        !log.contains("env-mark-93f"),
        "no environment in the log:\n{log}"
    );
    let event = |message: &str| {
        lines
            .iter()
            .find(|line| line["fields"]["message"] == message)
            .unwrap_or_else(|| panic!("no {message:?} event in\n{log}"))["fields"]
            .clone()
    };
    let started = event("process started");
    let exited = event("process exited");
    assert_eq!(started["process_id"], "logged-1");
    assert_eq!(exited["process_id"], "logged-1");
    assert!(started["pid"].as_u64().unwrap() > 1, "{started}");
    assert_eq!(started["pid"], exited["pid"]);
    assert_eq!(started["sandboxed"], false);
    assert_eq!(started["session_id"], exited["session_id"]);
    assert_eq!(
        started["session_id"].as_str().unwrap().len(),
        36,
        "a bare UUID: {started}"
    );
    assert_eq!(exited["exit_code"], 3);
    assert_eq!(exited["reason"], "exit");
    assert!(exited["duration_ms"].is_u64(), "{exited}");
    assert!(exited["cpu_ms"].is_u64(), "{exited}");
}

// ---------------------------------------------------------------------------------------------
// Who may read the pages: whoever may open a websocket, no one else
// ---------------------------------------------------------------------------------------------

/// Binaries every uid can run, a token file and a socket directory owned by the server's user
/// ([`ListenerFixture`]), with this file's ways to start a server and to read its pages.
struct Setup(ListenerFixture);

impl std::ops::Deref for Setup {
    type Target = ListenerFixture;

    fn deref(&self) -> &ListenerFixture {
        &self.0
    }
}

impl Setup {
    fn new(server_uid: Option<u32>) -> Setup {
        Setup(ListenerFixture::new("observe-", TOKEN, server_uid))
    }

    fn start(&self, uid: Option<u32>, listen: &str, token: bool) -> ExecServer {
        let token_file = self.token_file.to_str().unwrap();
        let mut args = vec!["--listen", listen];
        if token {
            args.extend(["--auth-token-file", token_file]);
        }
        ExecServer::start_binary(&self.bin.join("exec-server"), &args, |command| {
            command.current_dir("/");
            if let Some(uid) = uid {
                command.uid(uid).gid(uid);
            }
        })
    }

    /// `probe http-get URL PATH [TOKEN]` as `uid` (the test's own user for `None`).
    fn get(&self, uid: Option<u32>, url: &str, path: &str, token: Option<&str>) -> Value {
        let mut args = vec!["http-get", url, path];
        args.extend(token);
        self.probe(uid, &args, &format!("to {url}{path}"))
    }
}

/// The page was served: the status JSON, or the metrics text.
fn assert_served(answer: &Value, path: &str, who: &str) {
    assert_eq!(answer["status"], 200, "{who} {path}: {answer}");
    let body = answer["body"].as_str().unwrap();
    match path {
        "/status" => {
            let status: Value = serde_json::from_str(body).unwrap();
            assert!(status["budgets"].is_array(), "{who}: {status}");
        }
        _ => assert!(
            body.lines()
                .any(|line| line == "execward_processes_started_total 0"),
            "{who}: {body}"
        ),
    }
}

/// The page was refused with `status` and nothing of it was sent.
fn assert_refused(answer: &Value, status: u16, path: &str, who: &str) {
    assert_eq!(answer["status"], status, "{who} {path}: {answer}");
    let body = answer["body"].as_str().unwrap();
    assert!(
        !body.contains("budgets") && !body.contains("execward_"),
        "{who} {path}: nothing of the page: {body}"
    );
}

#[test]
fn status_and_metrics_are_refused_to_whom_the_websocket_refuses() {
    for (server_uid, other) in server_users() {
        let setup = Setup::new(server_uid);
        let who = |what: &str| format!("{what}, server uid {server_uid:?}");
        let tcp = setup.start(server_uid, "ws://127.0.0.1:0", true);
        let socket = setup.socket_dir.join("exec.sock");
        let unix_url = format!("unix:{}", socket.display());
        let _unix = setup.start(server_uid, &unix_url, true);
        // The socket's mode is the first layer; widened, the peer check must refuse alone.
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
        for path in ["/status", "/metrics"] {
            for url in [tcp.url(), unix_url.as_str()] {
                // Another user without the token: refused, as its upgrade is.
                let refused = setup.get(Some(other), url, path, None);
                assert_refused(&refused, 401, path, &who(&format!("another user on {url}")));
                assert!(
                    refused["body"]
                        .as_str()
                        .unwrap()
                        .contains(&format!("uid {other}")),
                    "{refused}"
                );
                // ...admitted with it.
                assert_served(
                    &setup.get(Some(other), url, path, Some(TOKEN)),
                    path,
                    &who(&format!("another user with the token on {url}")),
                );
                // A wrong token is refused even from the server's own user.
                assert_refused(
                    &setup.get(server_uid, url, path, Some("wrong")),
                    401,
                    path,
                    &who(&format!("a wrong token on {url}")),
                );
                // The control: the server's own user needs no token.
                assert_served(
                    &setup.get(server_uid, url, path, None),
                    path,
                    &who(&format!("the server's user on {url}")),
                );
            }
        }
        // Without a token file nothing admits another user: 403, whatever it sends.
        let tokenless = setup.start(server_uid, "ws://127.0.0.1:0", false);
        for path in ["/status", "/metrics"] {
            assert_refused(
                &setup.get(Some(other), tokenless.url(), path, Some(TOKEN)),
                403,
                path,
                &who("another user, no token configured"),
            );
        }
    }
}
