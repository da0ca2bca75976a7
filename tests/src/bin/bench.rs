//! `bench`: every benchmark of the project, each beside its baseline measured in the same run.
//!
//! ```text
//! cargo run --release -p tests --bin bench -- [--quick]
//!     [--only spawn|output|sandbox|remote|remote-latency|egress] [--write docs/benchmarks.md] [--check]
//! ```
//! Figures are medians with p10-p90 spreads; ratios compare ours to the baseline, and each row
//! with a target says whether it holds (`--check`: exit 1 when one does not). The binaries
//! measured are the ones next to this executable (build with `cargo build --release --workspace`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

struct Row {
    figure: String,
    ours: String,
    baseline: String,
    ratio: String,
    target: String,
    /// Whether the figure meets its target; `None` for a row reported without one.
    holds: Option<bool>,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn summary_ms(mut samples: Vec<f64>) -> (f64, String) {
    samples.sort_by(f64::total_cmp);
    let median = percentile(&samples, 0.5);
    (
        median,
        format!(
            "{:.2} ms (p10 {:.2}, p90 {:.2})",
            median,
            percentile(&samples, 0.1),
            percentile(&samples, 0.9)
        ),
    )
}

fn bin_dir() -> PathBuf {
    std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf()
}

struct Server {
    child: Child,
    url: String,
}

impl Server {
    fn start() -> Server {
        Server::start_with(&[])
    }

    fn start_with(args: &[&str]) -> Server {
        Server::spawn(Command::new(bin_dir().join("exec-server")).args(args))
    }

    /// Start `command` (a binary next to this one, `RUST_LOG=warn`); its first stdout line is
    /// its URL.
    fn spawn(command: &mut Command) -> Server {
        let mut child = command
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "{:?} next to bench (cargo build --release --workspace): {e}",
                    command.get_program()
                )
            });
        let mut line = Vec::new();
        let mut stdout = child.stdout.take().unwrap();
        let mut byte = [0u8];
        while stdout.read(&mut byte).unwrap() == 1 && byte[0] != b'\n' {
            line.push(byte[0]);
        }
        Server {
            child,
            url: String::from_utf8(line).unwrap(),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Client {
    ws: Ws,
    next_id: u64,
}

impl Client {
    async fn connect(url: &str) -> Client {
        let (ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
        let mut client = Client { ws, next_id: 1 };
        client
            .request("initialize", json!({"clientName": "bench"}))
            .await;
        client
    }

    async fn send(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let text = json!({"id": id, "method": method, "params": params}).to_string();
        self.ws.send(Message::text(text)).await.unwrap();
        id
    }

    async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.send(method, params).await;
        loop {
            let message: Value =
                serde_json::from_slice(&self.ws.next().await.unwrap().unwrap().into_data())
                    .unwrap();
            if message["id"] == json!(id) {
                assert!(message.get("error").is_none(), "{method} failed: {message}");
                return message["result"].clone();
            }
        }
    }
}

#[derive(serde::Deserialize)]
struct Frame<'a> {
    #[serde(borrow)]
    method: Option<&'a str>,
    #[serde(borrow)]
    params: Option<Params<'a>>,
}

#[derive(serde::Deserialize)]
struct Params<'a> {
    #[serde(borrow)]
    chunk: Option<&'a str>,
}

/// Start `argv`, consume notifications until `process/closed`; returns output bytes received.
async fn run_to_close(
    client: &mut Client,
    id: &str,
    argv: &[&str],
    sandbox: Option<&Value>,
    decode: &mut Vec<u8>,
) -> u64 {
    let mut params = json!({"processId": id, "argv": argv, "cwd": "file:///tmp", "env": {"PATH": "/usr/bin:/bin"}});
    if let Some(sandbox) = sandbox {
        params["sandbox"] = sandbox.clone();
    }
    client.send("process/start", params).await;
    let mut bytes = 0u64;
    loop {
        let data = client.ws.next().await.unwrap().unwrap().into_data();
        let frame: Frame = serde_json::from_slice(&data).unwrap();
        match frame.method {
            Some("process/output") => {
                let chunk = frame.params.and_then(|p| p.chunk).unwrap();
                decode.resize(chunk.len() / 4 * 3 + 3, 0);
                let out = base64_simd::Out::from_slice(decode.as_mut_slice());
                bytes += base64_simd::STANDARD
                    .decode(chunk.as_bytes(), out)
                    .unwrap()
                    .len() as u64;
            }
            Some("process/closed") => return bytes,
            _ => {}
        }
    }
}

async fn spawn_round_trip(rows: &mut Vec<Row>, runs: usize) {
    let server = Server::start();
    let mut client = Client::connect(&server.url).await;
    let mut scratch = Vec::new();
    let mut ours = Vec::new();
    let mut direct = Vec::new();
    for run in 0..runs + 10 {
        let started = Instant::now();
        run_to_close(
            &mut client,
            &format!("true-{run}"),
            &["/bin/true"],
            None,
            &mut scratch,
        )
        .await;
        let ours_ms = started.elapsed().as_secs_f64() * 1e3;
        let started = Instant::now();
        Command::new("/bin/true").status().unwrap();
        let direct_ms = started.elapsed().as_secs_f64() * 1e3;
        if run >= 10 {
            ours.push(ours_ms);
            direct.push(direct_ms);
        }
    }
    let (ours_median, ours_text) = summary_ms(ours);
    let (direct_median, direct_text) = summary_ms(direct);
    rows.push(Row {
        figure: format!("spawn round trip of /bin/true, start to closed ({runs} runs)"),
        ours: ours_text,
        baseline: format!("{direct_text} direct std::process spawn+wait"),
        ratio: format!("{:.2}x", ours_median / direct_median),
        target: "<= 1.5x".into(),
        holds: Some(ours_median / direct_median <= 1.5),
    });
}

fn summary_with_p99(mut samples: Vec<f64>) -> (f64, String) {
    samples.sort_by(f64::total_cmp);
    let median = percentile(&samples, 0.5);
    (
        median,
        format!("{:.3} ms (p99 {:.3})", median, percentile(&samples, 0.99)),
    )
}

async fn timed_requests(
    client: &mut Client,
    method: &str,
    params: &Value,
    runs: usize,
) -> Vec<f64> {
    let mut samples = Vec::with_capacity(runs);
    for run in 0..runs + 5 {
        let started = Instant::now();
        client.request(method, params.clone()).await;
        if run >= 5 {
            samples.push(started.elapsed().as_secs_f64() * 1e3);
        }
    }
    samples
}

async fn sandboxed_read_file(rows: &mut Vec<Row>, runs: usize) {
    let dir = std::env::temp_dir().join(format!("execward-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("4k.bin");
    std::fs::write(&file, vec![7u8; 4096]).unwrap();
    let uri = format!("file://{}", file.display());
    let plain = json!({"path": uri});
    let sandboxed = json!({"path": uri, "sandbox": {"profile": "read-only"}});
    let server = Server::start();
    let mut client = Client::connect(&server.url).await;
    let (unsandboxed_median, unsandboxed_text) =
        summary_with_p99(timed_requests(&mut client, "fs/readFile", &plain, runs).await);
    let (pooled_median, pooled_text) =
        summary_with_p99(timed_requests(&mut client, "fs/readFile", &sandboxed, runs).await);
    let one_shot_server = Server::start_with(&["--one-shot-helpers"]);
    let mut one_shot_client = Client::connect(&one_shot_server.url).await;
    let (one_shot_median, one_shot_text) = summary_with_p99(
        timed_requests(&mut one_shot_client, "fs/readFile", &sandboxed, runs / 5).await,
    );
    let _ = std::fs::remove_dir_all(&dir);
    rows.push(Row {
        figure: format!("sandboxed fs/readFile 4 KiB, pooled helpers ({runs} runs)"),
        ours: pooled_text.clone(),
        baseline: format!("{unsandboxed_text} unsandboxed"),
        ratio: format!("{:.2}x", pooled_median / unsandboxed_median),
        target: "<= 3x".into(),
        holds: Some(pooled_median / unsandboxed_median <= 3.0),
    });
    rows.push(Row {
        figure: format!(
            "sandboxed fs/readFile 4 KiB, one helper per request ({} runs)",
            runs / 5
        ),
        ours: one_shot_text,
        baseline: format!("{pooled_text} pooled"),
        ratio: format!("pooled {:.1}x faster", one_shot_median / pooled_median),
        target: "pooled >= 10x faster".into(),
        holds: Some(one_shot_median / pooled_median >= 10.0),
    });
}

async fn sandboxed_spawn(rows: &mut Vec<Row>, runs: usize) {
    let server = Server::start();
    let mut client = Client::connect(&server.url).await;
    let mut scratch = Vec::new();
    let sandbox = json!({"profile": "workspace-write", "cwd": "file:///tmp"});
    let mut plain = Vec::new();
    let mut sandboxed = Vec::new();
    let mut direct = Vec::new();
    for run in 0..runs + 5 {
        let started = Instant::now();
        run_to_close(
            &mut client,
            &format!("p-{run}"),
            &["/bin/true"],
            None,
            &mut scratch,
        )
        .await;
        let plain_ms = started.elapsed().as_secs_f64() * 1e3;
        let started = Instant::now();
        run_to_close(
            &mut client,
            &format!("s-{run}"),
            &["/bin/true"],
            Some(&sandbox),
            &mut scratch,
        )
        .await;
        let sandboxed_ms = started.elapsed().as_secs_f64() * 1e3;
        let started = Instant::now();
        Command::new("/bin/true").status().unwrap();
        let direct_ms = started.elapsed().as_secs_f64() * 1e3;
        if run >= 5 {
            plain.push(plain_ms);
            sandboxed.push(sandboxed_ms);
            direct.push(direct_ms);
        }
    }
    let (sandboxed_median, sandboxed_text) = summary_ms(sandboxed);
    let (plain_median, plain_text) = summary_ms(plain);
    let (direct_median, direct_text) = summary_ms(direct);
    rows.push(Row {
        figure: format!(
            "sandboxed process/start of /bin/true (workspace-write), start to closed ({runs} runs)"
        ),
        ours: sandboxed_text,
        baseline: format!("{plain_text} unsandboxed; {direct_text} direct spawn"),
        ratio: format!(
            "{:.2}x unsandboxed, {:.2}x direct",
            sandboxed_median / plain_median,
            sandboxed_median / direct_median
        ),
        target: "<= 2x direct".into(),
        holds: Some(sandboxed_median / direct_median <= 2.0),
    });
}

async fn output_throughput(rows: &mut Vec<Row>, mib: u64, runs: usize) {
    let server = Server::start();
    let mut client = Client::connect(&server.url).await;
    let count = format!("{}", mib * 1024 * 1024);
    let mut scratch = Vec::new();
    let mut ours = Vec::new();
    let mut pipe = Vec::new();
    for run in 0..runs {
        let started = Instant::now();
        let bytes = run_to_close(
            &mut client,
            &format!("head-{run}"),
            &["head", "-c", &count, "/dev/zero"],
            None,
            &mut scratch,
        )
        .await;
        assert_eq!(bytes, mib * 1024 * 1024, "every byte must arrive");
        ours.push(mib as f64 / started.elapsed().as_secs_f64());
        let started = Instant::now();
        let mut child = Command::new("head")
            .args(["-c", &count, "/dev/zero"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let mut buf = vec![0u8; 256 * 1024];
        let mut total = 0u64;
        loop {
            let n = stdout.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            total += n as u64;
        }
        child.wait().unwrap();
        assert_eq!(total, mib * 1024 * 1024);
        pipe.push(mib as f64 / started.elapsed().as_secs_f64());
    }
    rows.push(throughput_row(
        format!("output throughput, head -c {mib}M /dev/zero to a Rust client ({runs} runs)"),
        (ours, ""),
        (pipe, " plain pipe"),
        40.0,
    ));
}

/// A throughput row: medians with min-max ranges, ratio as a percentage of the baseline, whose
/// target is at least `min_percent` of it.
fn throughput_row(
    figure: String,
    ours: (Vec<f64>, &str),
    baseline: (Vec<f64>, &str),
    min_percent: f64,
) -> Row {
    let summary = |(mut samples, label): (Vec<f64>, &str)| {
        samples.sort_by(f64::total_cmp);
        let median = percentile(&samples, 0.5);
        let text = format!(
            "{median:.0} MiB/s (range {:.0}-{:.0}){label}",
            samples[0],
            samples[samples.len() - 1]
        );
        (median, text)
    };
    let (ours_median, ours) = summary(ours);
    let (baseline_median, baseline) = summary(baseline);
    let percent = 100.0 * ours_median / baseline_median;
    Row {
        figure,
        ours,
        baseline,
        ratio: format!("{percent:.0}%"),
        target: format!(">= {min_percent:.0}%"),
        holds: Some(percent >= min_percent),
    }
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cpu}, {cores} cores, Linux {}", kernel.trim())
}

/// The `sandbox-run` startup benchmark (`sandbox-bench`, next to this binary): /bin/true
/// directly, through sandbox-run with namespaces on and off, and through bwrap when installed.
fn sandbox_run_table(runs: usize) -> String {
    let output = Command::new(bin_dir().join("sandbox-bench"))
        .arg(runs.to_string())
        .output();
    match output {
        Ok(output) if output.status.success() => format!(
            "\n## sandbox-run startup (sandbox-bench, target: within 2x of direct)\n\n```text\n{}```\n",
            String::from_utf8_lossy(&output.stdout)
        ),
        Ok(output) => format!(
            "\n## sandbox-run startup\n\nsandbox-bench failed: {}\n",
            String::from_utf8_lossy(&output.stderr)
        ),
        Err(error) => format!("\n## sandbox-run startup\n\nsandbox-bench could not run: {error}\n"),
    }
}

fn render(rows: &[Row], command: &str) -> String {
    let mut out = String::from(
        "| figure | ours | baseline | ratio | target | holds |\n|---|---|---|---|---|---|\n",
    );
    for row in rows {
        let holds = match row.holds {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "-",
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {holds} |\n",
            row.figure, row.ours, row.baseline, row.ratio, row.target
        ));
    }
    format!(
        "# Benchmarks\n\nMachine: {}.\nCommand: `{command}`.\n\n{out}",
        machine()
    )
}

/// Every benchmark of the project beside its baseline, each row marked against its target.
///
/// The binaries measured are the ones next to this executable: build with
/// `cargo build --release --workspace` first.
#[derive(Debug, clap::Parser)]
#[command(name = "bench")]
struct Cli {
    /// Fewer runs per figure (a smoke run of a minute or two).
    #[arg(long)]
    quick: bool,
    /// Run one group only.
    #[arg(long, value_enum, value_name = "GROUP")]
    only: Option<Group>,
    /// Also write the report (Markdown) to FILE, e.g. docs/benchmarks.md.
    #[arg(long, value_name = "FILE")]
    write: Option<PathBuf>,
    /// Exit 1 when a figure misses its target (after printing and writing the report).
    #[arg(long)]
    check: bool,
}

/// A group of benchmarks (`--only`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Group {
    /// Process spawn round trip.
    Spawn,
    /// Output throughput.
    Output,
    /// Sandboxed fs and spawn, and sandbox-run startup.
    Sandbox,
    /// Remote mode through a local rendezvous.
    Remote,
    /// Only the round-trip rows of remote mode (for profiling the request path).
    RemoteLatency,
    /// The egress proxy of an allowlisted sandbox network.
    Egress,
}

/// The rows whose figure misses its target.
fn misses(rows: &[Row]) -> Vec<&Row> {
    rows.iter().filter(|row| row.holds == Some(false)).collect()
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cli = <Cli as clap::Parser>::parse();
    let quick = cli.quick;
    let only = cli.only;
    let wanted = |group: Group| only.is_none_or(|only| only == group);
    let mut rows = Vec::new();
    if wanted(Group::Spawn) {
        spawn_round_trip(&mut rows, if quick { 50 } else { 200 }).await;
    }
    if wanted(Group::Output) {
        output_throughput(
            &mut rows,
            if quick { 256 } else { 1024 },
            if quick { 2 } else { 5 },
        )
        .await;
    }
    if wanted(Group::Sandbox) {
        sandboxed_read_file(&mut rows, if quick { 200 } else { 1000 }).await;
        sandboxed_spawn(&mut rows, if quick { 50 } else { 200 }).await;
    }
    if wanted(Group::Remote) {
        remote_mode(&mut rows, quick).await;
    }
    if only == Some(Group::RemoteLatency) {
        let setup = remote_setup().await;
        relay_request_latency(&mut rows, &setup, if quick { 200 } else { 1000 }).await;
    }
    if wanted(Group::Egress) {
        egress_proxy(
            &mut rows,
            if quick { 256 } else { 1024 },
            if quick { 2 } else { 5 },
            if quick { 50 } else { 200 },
        );
    }
    let command = format!(
        "cargo run --release -p tests --bin bench --{}",
        args.iter().map(|a| format!(" {a}")).collect::<String>()
    );
    let mut report = render(&rows, &command);
    if wanted(Group::Sandbox) {
        report.push_str(&sandbox_run_table(if quick { 50 } else { 300 }));
    }
    println!("{report}");
    if let Some(path) = cli.write {
        std::fs::write(&path, &report).unwrap();
        eprintln!("wrote {}", path.display());
    }
    let missed = misses(&rows);
    for row in &missed {
        eprintln!(
            "bench: missed its target: {} ({}, target {})",
            row.figure, row.ratio, row.target
        );
    }
    if cli.check && !missed.is_empty() {
        return std::process::ExitCode::FAILURE;
    }
    std::process::ExitCode::SUCCESS
}

// Remote mode: the relay through a local exec-rendezvous against the same executor's local
// websocket. Both sides use the library client (`ExecServerClient`), so the figures differ only
// in the transport: one websocket vs. harness -> rendezvous -> executor with Noise and the
// endpoints' reliability layer.

/// Harness credential of the bench's own rendezvous (handed to its children through the
/// environment).
const BENCH_REGISTRY_TOKEN: &str = "execward-bench-harness-token";
/// Executor credential of the bench's own rendezvous.
const BENCH_EXECUTOR_TOKEN: &str = "execward-bench-executor-token";
/// Environment id the bench's executor registers as.
const BENCH_ENVIRONMENT: &str = "bench";
/// How long the executor may take to register.
const REGISTRATION_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// Start `binary` (next to this executable) with the bench credentials; its first stdout line
/// is its URL.
fn start_with_registry_token(binary: &str, args: &[&str]) -> Server {
    Server::spawn(
        Command::new(bin_dir().join(binary))
            .args(args)
            .env(supervisor::relay::REGISTRY_TOKEN_ENV, BENCH_REGISTRY_TOKEN)
            .env(supervisor::relay::EXECUTOR_TOKEN_ENV, BENCH_EXECUTOR_TOKEN),
    )
}

/// A rendezvous and one executor registered with it; `executor.url` is its local websocket.
struct RemoteSetup {
    _rendezvous: Server,
    executor: Server,
    registry: String,
    _dir: tempfile::TempDir,
}

async fn remote_setup() -> RemoteSetup {
    let dir = tempfile::tempdir().unwrap();
    let credentials = dir.path().join("credentials.toml");
    std::fs::write(
        &credentials,
        format!(
            "[[executor]]\ntoken = \"{BENCH_EXECUTOR_TOKEN}\"\nenvironments = [\"{BENCH_ENVIRONMENT}\"]\n\n[[harness]]\ntoken = \"{BENCH_REGISTRY_TOKEN}\"\nenvironments = [\"{BENCH_ENVIRONMENT}\"]\n"
        ),
    )
    .unwrap();
    let identity = dir.path().join("identity");
    let rendezvous = start_with_registry_token(
        "exec-rendezvous",
        &[
            "--listen",
            "127.0.0.1:0",
            "--credentials",
            credentials.to_str().unwrap(),
        ],
    );
    let registry = rendezvous.url.clone();
    let executor = start_with_registry_token(
        "exec-server",
        &[
            "--listen",
            "ws://127.0.0.1:0",
            "--remote",
            &registry,
            "--environment-id",
            BENCH_ENVIRONMENT,
            "--identity-file",
            identity.to_str().unwrap(),
        ],
    );
    let tls = supervisor::relay::tls::client_config_for(&registry, None).unwrap();
    let client = supervisor::relay::registry::RegistryClient::new(&registry, &tls).unwrap();
    let deadline = Instant::now() + REGISTRATION_DEADLINE;
    while client
        .connect(BENCH_ENVIRONMENT, BENCH_REGISTRY_TOKEN)
        .await
        .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "the executor did not register within {REGISTRATION_DEADLINE:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    RemoteSetup {
        _rendezvous: rendezvous,
        executor,
        registry,
        _dir: dir,
    }
}

/// (relay client, local websocket client) of the same executor.
async fn relay_and_local_clients(
    setup: &RemoteSetup,
) -> (supervisor::ExecServerClient, supervisor::ExecServerClient) {
    let relay = supervisor::ExecServerClient::connect_remote(
        supervisor::RemoteExecServerConnectArgs::new(
            &setup.registry,
            BENCH_ENVIRONMENT,
            BENCH_REGISTRY_TOKEN,
        )
        .with_client_name("bench-relay"),
    )
    .await
    .unwrap();
    let local = supervisor::ExecServerClient::connect(
        supervisor::ExecServerClientConnectOptions::new(&setup.executor.url)
            .with_client_name("bench-local"),
    )
    .await
    .unwrap();
    (relay, local)
}

/// Run `argv` through the library client; the output bytes received by `closed`.
async fn library_output_bytes(
    client: &supervisor::ExecServerClient,
    process_id: &str,
    argv: &[&str],
) -> u64 {
    let mut params = tests::start_params(process_id, argv);
    params.cwd = supervisor::FileUri::from_path(std::path::Path::new("/tmp")).unwrap();
    let (_process, mut events) = client.start_process(params).await.unwrap().into_parts();
    let mut bytes = 0u64;
    while let Some(event) = events.next().await {
        match event {
            supervisor::ProcessEvent::Output { data, .. } => bytes += data.len() as u64,
            supervisor::ProcessEvent::Closed { .. } => return bytes,
            supervisor::ProcessEvent::Failed { error } => panic!("{process_id} failed: {error}"),
            supervisor::ProcessEvent::Exited { .. } => {}
        }
    }
    panic!("the events of {process_id} ended without closed");
}

async fn relay_output_throughput(rows: &mut Vec<Row>, setup: &RemoteSetup, mib: u64, runs: usize) {
    let (relay, local) = relay_and_local_clients(setup).await;
    let count = format!("{}", mib * 1024 * 1024);
    let argv = ["head", "-c", count.as_str(), "/dev/zero"];
    let mut ours = Vec::new();
    let mut baseline = Vec::new();
    for run in 0..runs {
        // Alternate which goes first so neither always runs on a warmer machine.
        for relay_turn in [run % 2 == 0, run % 2 == 1] {
            let (client, samples, name) = if relay_turn {
                (&relay, &mut ours, "relay")
            } else {
                (&local, &mut baseline, "local")
            };
            let started = Instant::now();
            let bytes = library_output_bytes(client, &format!("{name}-head-{run}"), &argv).await;
            assert_eq!(bytes, mib * 1024 * 1024, "every byte must arrive ({name})");
            samples.push(mib as f64 / started.elapsed().as_secs_f64());
        }
    }
    rows.push(throughput_row(
        format!(
            "remote mode: output throughput, head -c {mib}M /dev/zero, library client ({runs} runs)"
        ),
        (ours, " relay"),
        (baseline, " local websocket"),
        60.0,
    ));
    relay.close();
    local.close();
}

async fn relay_request_latency(rows: &mut Vec<Row>, setup: &RemoteSetup, runs: usize) {
    let (relay, local) = relay_and_local_clients(setup).await;
    let path = supervisor::FileUri::from_path(std::path::Path::new("/tmp")).unwrap();
    let mut ours = Vec::new();
    let mut baseline = Vec::new();
    for run in 0..runs + 10 {
        for (client, samples) in [(&relay, &mut ours), (&local, &mut baseline)] {
            let started = Instant::now();
            let metadata = client
                .fs_get_metadata(proto::methods::fs::PathParams {
                    path: path.clone(),
                    sandbox: None,
                })
                .await
                .unwrap();
            assert!(metadata.is_directory);
            if run >= 10 {
                samples.push(started.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    let (ours_median, ours_text) = summary_with_p99(ours);
    let (baseline_median, baseline_text) = summary_with_p99(baseline);
    rows.push(Row {
        figure: format!("remote mode: fs/getMetadata round trip, library client ({runs} runs)"),
        ours: format!("{ours_text} relay"),
        baseline: format!("{baseline_text} local websocket"),
        ratio: format!("{:.2}x", ours_median / baseline_median),
        target: "reported (no target)".into(),
        holds: None,
    });
    relay.close();
    local.close();
}

async fn remote_mode(rows: &mut Vec<Row>, quick: bool) {
    let setup = remote_setup().await;
    relay_output_throughput(
        rows,
        &setup,
        if quick { 256 } else { 1024 },
        if quick { 2 } else { 3 },
    )
    .await;
    relay_request_latency(rows, &setup, if quick { 200 } else { 1000 }).await;
}

// The egress proxy: bytes and connections from inside a sandbox whose network is an allowlist
// (through `egress-proxy`) against the same client connecting directly over loopback.

/// The client, run directly and inside the sandbox: `bulk MIB` sends MIB MiB and waits for the
/// sink's one-byte acknowledgement, printing MiB/s; `connect N` opens N connections, each until
/// its first echoed byte, printing each time in milliseconds. Through the proxy (`HTTPS_PROXY`
/// set) each connection is a CONNECT tunnel.
const EGRESS_CLIENT: &str = r#"
import os, socket, sys, time
mode, count, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
proxy = os.environ.get('HTTPS_PROXY')
def connect():
    if not proxy:
        return socket.create_connection(('127.0.0.1', port))
    s = socket.create_connection(('127.0.0.1', int(proxy.rsplit(':', 1)[1])))
    s.sendall(b'CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n' % port)
    head = b''
    while not head.endswith(b'\r\n\r\n'):
        head += s.recv(1)
    assert head.startswith(b'HTTP/1.1 200'), head
    return s
if mode == 'bulk':
    s = connect()
    s.sendall(b'B')
    block = memoryview(bytearray(1 << 20))
    started = time.perf_counter()
    for _ in range(count):
        s.sendall(block)
    s.shutdown(socket.SHUT_WR)
    assert s.recv(1) == b'k'
    print(count / (time.perf_counter() - started))
else:
    for _ in range(count):
        started = time.perf_counter()
        s = connect()
        s.sendall(b'E')
        assert s.recv(1) == b'E'
        print((time.perf_counter() - started) * 1000)
        s.close()
"#;

/// A sink on 127.0.0.1: `B` then bytes until EOF, answered with `k`; `E` echoed.
fn egress_sink() -> u16 {
    use std::io::Write;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut first = [0u8; 1];
                if stream.read_exact(&mut first).is_err() {
                    return;
                }
                if first[0] == b'E' {
                    let _ = stream.write_all(b"E");
                    return;
                }
                let mut buf = vec![0u8; 1 << 20];
                while stream.read(&mut buf).is_ok_and(|n| n > 0) {}
                let _ = stream.write_all(b"k");
            });
        }
    });
    port
}

/// Runs [`EGRESS_CLIENT`] directly or inside `sandbox-run --allow-domain 127.0.0.1:PORT`;
/// returns the numbers it printed.
fn egress_client(sandboxed: bool, mode: &str, count: usize, port: u16) -> Vec<f64> {
    let args = [mode.to_owned(), count.to_string(), port.to_string()];
    let mut command = if sandboxed {
        let mut command = Command::new(bin_dir().join("sandbox-run"));
        command
            .args(["--policy", "read-only", "--allow-domain"])
            .arg(format!("127.0.0.1:{port}"))
            .args(["--", "/usr/bin/python3", "-c", EGRESS_CLIENT]);
        command
    } else {
        let mut command = Command::new("/usr/bin/python3");
        command.args(["-c", EGRESS_CLIENT]);
        command
    };
    let output = command
        .args(args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(output.status.success(), "egress client {mode} failed");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| line.trim().parse::<f64>().unwrap())
        .collect()
}

/// The floor of the proxy's topology: a bare relay on 127.0.0.1 (no sandbox, no policy, no
/// handshake) that splices each connection to the sink through a pipe as the proxy does, so
/// its bytes cross the same two loopback TCP hops.
fn splice_relay(sink: u16) -> u16 {
    fn pump(from: std::net::TcpStream, to: std::net::TcpStream) {
        use std::os::fd::AsRawFd;
        let (pipe_out, pipe_in) = nix::unistd::pipe().unwrap();
        let _ = nix::fcntl::fcntl(&pipe_in, nix::fcntl::FcntlArg::F_SETPIPE_SZ(256 * 1024));
        let splice = |from: i32, to: i32, len: usize| {
            // SAFETY: descriptors owned by this function; no offsets.
            let n = unsafe {
                libc::splice(from, std::ptr::null_mut(), to, std::ptr::null_mut(), len, 0)
            };
            usize::try_from(n).unwrap_or(0)
        };
        loop {
            let mut pending = splice(from.as_raw_fd(), pipe_in.as_raw_fd(), 256 * 1024);
            if pending == 0 {
                break;
            }
            while pending > 0 {
                let sent = splice(pipe_out.as_raw_fd(), to.as_raw_fd(), pending);
                if sent == 0 {
                    return;
                }
                pending -= sent;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Write);
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { continue };
            let upstream = std::net::TcpStream::connect(("127.0.0.1", sink)).unwrap();
            let (client_reader, upstream_writer) =
                (client.try_clone().unwrap(), upstream.try_clone().unwrap());
            std::thread::spawn(move || pump(client_reader, upstream_writer));
            std::thread::spawn(move || pump(upstream, client));
        }
    });
    port
}

fn egress_proxy(rows: &mut Vec<Row>, mib: usize, runs: usize, connects: usize) {
    let port = egress_sink();
    let relay = splice_relay(port);
    let (mut proxied, mut bare, mut direct) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        proxied.extend(egress_client(true, "bulk", mib, port));
        bare.extend(egress_client(false, "bulk", mib, relay));
        direct.extend(egress_client(false, "bulk", mib, port));
    }
    rows.push(throughput_row(
        format!("{mib} MiB through the egress proxy (CONNECT tunnel) vs direct loopback TCP ({runs} runs)"),
        (proxied.clone(), ""),
        (direct.clone(), " direct"),
        70.0,
    ));
    let mut floor = throughput_row(
        format!(
            "{mib} MiB through a bare splice relay (the same two loopback hops, no sandbox) vs \
             direct: the topology's floor"
        ),
        (bare.clone(), " bare relay"),
        (direct, " direct"),
        0.0,
    );
    floor.target = "floor reported".into();
    floor.holds = None;
    rows.push(floor);
    rows.push(throughput_row(
        format!("{mib} MiB through the egress proxy vs the bare splice relay"),
        (proxied, ""),
        (bare, " bare relay"),
        85.0,
    ));
    let (ours, ours_text) = summary_ms(egress_client(true, "connect", connects, port));
    let (base, base_text) = summary_ms(egress_client(false, "connect", connects, port));
    rows.push(Row {
        figure: format!(
            "connect + first byte through the egress proxy vs direct ({connects} connections)"
        ),
        ours: ours_text,
        baseline: base_text,
        ratio: format!("+{:.2} ms", ours - base),
        target: "added latency reported".into(),
        holds: None,
    });
}

#[cfg(test)]
mod unit {
    use super::*;

    fn row(holds: Option<bool>) -> Row {
        Row {
            figure: format!("figure {holds:?}"),
            ours: "1 ms".into(),
            baseline: "1 ms".into(),
            ratio: "1.00x".into(),
            target: "<= 1.5x".into(),
            holds,
        }
    }

    #[test]
    fn each_row_is_marked_against_its_target_and_misses_are_listed() {
        let rows = [row(Some(true)), row(Some(false)), row(None)];
        let table = render(&rows, "bench");
        assert!(table.contains("| target | holds |"), "{table}");
        assert!(table.contains("| <= 1.5x | yes |"), "{table}");
        assert!(table.contains("| <= 1.5x | **no** |"), "{table}");
        assert!(table.contains("| <= 1.5x | - |"), "{table}");
        let missed: Vec<&str> = misses(&rows).iter().map(|r| r.figure.as_str()).collect();
        assert_eq!(missed, ["figure Some(false)"]);
    }

    #[test]
    fn a_throughput_row_holds_at_or_above_its_share_of_the_baseline() {
        let row = |ours: f64| throughput_row("t".into(), (vec![ours], ""), (vec![100.0], ""), 40.0);
        assert_eq!(row(40.0).holds, Some(true));
        assert_eq!(row(39.0).holds, Some(false));
        assert_eq!(row(39.0).target, ">= 40%");
    }
}
