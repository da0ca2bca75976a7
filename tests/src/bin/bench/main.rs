//! `bench`: every benchmark of the project, each beside its baseline measured in the same run.
//!
//! ```text
//! cargo run --release -p execward-tests --bin bench -- [--quick]
//!     [--only spawn|output|sandbox|remote|remote-latency|cluster|egress] [--write docs/benchmarks.md] [--check]
//! ```
//! Figures are medians with p10-p90 spreads; ratios compare ours to the baseline, and each row
//! with a target says whether it holds (`--check`: exit 1 when one does not). The binaries
//! measured are the ones next to this executable (build with `cargo build --release --workspace`).
//!
//! This file holds the command line and the harness every group shares (the server process, a
//! websocket client, `run_to_close`); each benchmark group has its module (`spawn`, `output`,
//! `sandbox`, `remote` with `cluster`, `egress`) and `table` holds the rows, their statistics and the rendering.
#![deny(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cluster;
mod egress;
mod output;
mod remote;
mod sandbox;
mod spawn;
// The only unsafe code of the binary: raw calls, each behind a safe wrapper.
#[allow(unsafe_code)]
mod sys;
mod table;

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::cluster::cluster_mode;
use crate::egress::egress_proxy;
use crate::output::output_throughput;
use crate::remote::{relay_request_latency, remote_mode, remote_setup};
use crate::sandbox::{sandbox_run_table, sandboxed_read_file, sandboxed_spawn};
use crate::spawn::{spawn_round_trip, start_after_idle};
use crate::table::{Row, render};

use proto::methods::process::binary::{OUTPUT_FRAME_KIND, OutputFrame};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

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

/// CPU seconds (user + system) process `pid` has used so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_comm = stat.rsplit_once(") ").unwrap().1;
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat(5); after the comm, 12 and 13 (from 1).
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / crate::sys::clock_ticks_per_second()
}

impl Server {
    /// The server's process id.
    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn start() -> Server {
        Server::start_with(&[])
    }

    fn start_with(args: &[&str]) -> Server {
        Server::spawn(Command::new(bin_dir().join("exec-server")).args(args))
    }

    /// Start `command` (a binary next to this one, `RUST_LOG=warn`, or `$BENCH_SERVER_LOG` for
    /// profiling, e.g. `supervisor::process=debug`); its first stdout line is its URL.
    fn spawn(command: &mut Command) -> Server {
        let log = std::env::var("BENCH_SERVER_LOG").unwrap_or_else(|_| "warn".to_owned());
        let mut child = command
            .env("RUST_LOG", log)
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
        Client::connect_with(url, false).await
    }

    /// A client that asks for `process/output` as binary frames (`binary`) or as JSON.
    async fn connect_with(url: &str, binary: bool) -> Client {
        let (ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
        let mut client = Client { ws, next_id: 1 };
        let result = client
            .request(
                "initialize",
                json!({"clientName": "bench", "binaryOutput": binary}),
            )
            .await;
        assert_eq!(result["binaryOutput"] == json!(true), binary, "{result}");
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
        if data.first() == Some(&OUTPUT_FRAME_KIND) {
            // A binary output frame: the bytes are there as they are (copied out, as an
            // application taking them would).
            let frame = OutputFrame::decode(&data).unwrap();
            decode.clear();
            decode.extend_from_slice(frame.data);
            bytes += frame.data.len() as u64;
            continue;
        }
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

/// Milliseconds from start to `closed` of one `/bin/true` through `client` (sandboxed when
/// `sandbox` is given).
async fn true_to_close_ms(
    client: &mut Client,
    id: &str,
    sandbox: Option<&Value>,
    scratch: &mut Vec<u8>,
) -> f64 {
    let started = std::time::Instant::now();
    run_to_close(client, id, &["/bin/true"], sandbox, scratch).await;
    started.elapsed().as_secs_f64() * 1e3
}

/// Milliseconds `command` took to spawn and exit (it must succeed).
fn status_ms(command: &mut Command) -> f64 {
    let started = std::time::Instant::now();
    let status = command.status().unwrap();
    assert!(status.success(), "{command:?} failed: {status}");
    started.elapsed().as_secs_f64() * 1e3
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
    /// Remote mode through a local rendezvous, and through a cluster of two nodes on NATS.
    Remote,
    /// Only the round-trip rows of remote mode (for profiling the request path).
    RemoteLatency,
    /// Only the cluster rows of remote mode (for profiling the path through NATS).
    Cluster,
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
        start_after_idle(&mut rows, if quick { 10 } else { 40 }).await;
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
        cluster_mode(&mut rows, quick).await;
    }
    if only == Some(Group::Cluster) {
        cluster_mode(&mut rows, quick).await;
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
        "cargo run --release -p execward-tests --bin bench --{}",
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

#[cfg(test)]
mod unit {
    use super::*;
    use crate::table::throughput_row;

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
