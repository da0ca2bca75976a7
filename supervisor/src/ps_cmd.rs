//! `exec-server ps`: what a server runs, as a table (or its `GET /status` JSON with `--json`).
//!
//! It shows the session-independent view (`GET /status`: every session, its processes, the
//! budgets), not `process/list`, which lists only the caller's own session: an operator asking
//! "what runs here" wants every session. The request is admitted as a websocket upgrade would
//! be (the bearer token from `--token-file`, or the caller's own user); like `exec`, `ps` never
//! sends a token over plain `ws://` to a host that is not loopback.
//!
//! Process ids are the clients' strings: they are shown with control characters escaped, so a
//! hostile id cannot drive the operator's terminal.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use proto::methods::process::{ProcessInfo, ProcessState};
use proto::methods::status::ServerStatus;

use crate::untrusted::LogField;

/// How long `ps` waits for the server's answer.
pub const PS_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest `GET /status` answer `ps` reads (1,000 processes take about 400 KiB).
pub const MAX_STATUS_BYTES: u64 = 64 * 1024 * 1024;

/// Arguments of `exec-server ps`.
#[derive(Debug, clap::Args)]
pub struct PsArgs {
    /// The server: ws://HOST:PORT or unix:/path.sock (its `GET /status` is read).
    #[arg(long, value_name = "URL")]
    pub connect: String,

    /// File holding the bearer token (surrounding whitespace removed).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,

    /// Print the `GET /status` JSON as the server sent it instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Why `ps` failed.
#[derive(Debug, thiserror::Error)]
pub enum PsError {
    /// The URL is not `ws://HOST:PORT` or `unix:PATH`.
    #[error(
        "--connect {0:?} is not ws://HOST:PORT or unix:/path.sock (wss:// is not supported by ps yet)"
    )]
    Url(String),
    /// A token would go over plain text to another host.
    #[error("refusing to send a bearer token over plain ws:// to {0:?}, which is not loopback")]
    TokenOverPlainText(String),
    /// The token file cannot be read or is empty.
    #[error("cannot read the token from {path}: {reason}")]
    TokenFile {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// Connecting or talking to the server failed.
    #[error("GET /status from {url}: {source}")]
    Io {
        /// The server.
        url: String,
        /// The error.
        source: std::io::Error,
    },
    /// The server answered with another status than 200.
    #[error("GET /status from {url}: the server answered {status}: {body}")]
    Refused {
        /// The server.
        url: String,
        /// The status line's code and text.
        status: String,
        /// The answer's body.
        body: String,
    },
    /// The answer is not a status.
    #[error("GET /status from {url}: the answer is not a status: {source}")]
    Parse {
        /// The server.
        url: String,
        /// The error.
        source: serde_json::Error,
    },
}

/// Run `ps`: print the table (or the JSON) on stdout.
///
/// # Errors
/// See [`PsError`].
pub fn run(args: &PsArgs) -> Result<(), PsError> {
    let token = match &args.token_file {
        None => None,
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|error| PsError::TokenFile {
                path: path.clone(),
                reason: error.to_string(),
            })?;
            let token = text.trim().to_owned();
            if token.is_empty() {
                return Err(PsError::TokenFile {
                    path: path.clone(),
                    reason: "the file is empty".to_owned(),
                });
            }
            Some(token)
        }
    };
    let body = fetch_status(&args.connect, token.as_deref())?;
    let mut stdout = std::io::stdout().lock();
    let written = if args.json {
        writeln!(stdout, "{body}")
    } else {
        let status: ServerStatus =
            serde_json::from_str(&body).map_err(|source| PsError::Parse {
                url: args.connect.clone(),
                source,
            })?;
        write!(stdout, "{}", render(&status))
    };
    written.map_err(|source| PsError::Io {
        url: args.connect.clone(),
        source,
    })
}

trait Duplex: Read + Write {}
impl<T: Read + Write> Duplex for T {}

/// The body of `GET /status` at `url`.
fn fetch_status(url: &str, token: Option<&str>) -> Result<String, PsError> {
    let io = |source| PsError::Io {
        url: url.to_owned(),
        source,
    };
    let mut stream: Box<dyn Duplex> = if let Some(path) = url.strip_prefix("unix:") {
        let stream = std::os::unix::net::UnixStream::connect(path).map_err(io)?;
        stream.set_read_timeout(Some(PS_TIMEOUT)).map_err(io)?;
        Box::new(stream)
    } else if let Some(rest) = url.strip_prefix("ws://") {
        let address = rest.split('/').next().unwrap_or(rest);
        let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
        if token.is_some() && !crate::plain_text::is_loopback_host(host) {
            return Err(PsError::TokenOverPlainText(host.to_owned()));
        }
        let stream = std::net::TcpStream::connect(address).map_err(io)?;
        stream.set_read_timeout(Some(PS_TIMEOUT)).map_err(io)?;
        Box::new(stream)
    } else {
        return Err(PsError::Url(url.to_owned()));
    };
    let mut request = "GET /status HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n".to_owned();
    if let Some(token) = token {
        request.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).map_err(io)?;
    let mut answer = Vec::new();
    stream
        .take(MAX_STATUS_BYTES)
        .read_to_end(&mut answer)
        .map_err(io)?;
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head
        .lines()
        .next()
        .and_then(|line| line.split_once(' '))
        .map(|(_, status)| status.to_owned())
        .unwrap_or_default();
    if !status.starts_with("200") {
        return Err(PsError::Refused {
            url: url.to_owned(),
            status,
            body: LogField(body.trim()).to_string(),
        });
    }
    Ok(body.to_owned())
}

/// The table: one row per process (every session), then the budgets.
pub fn render(status: &ServerStatus) -> String {
    let mut rows = vec![
        [
            "SESSION",
            "PROCESS",
            "PID",
            "STATE",
            "AGE",
            "CPU",
            "MEMORY",
            "MEM LIMIT",
            "EXIT",
        ]
        .map(str::to_owned),
    ];
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        });
    for (tag, process) in status.processes() {
        rows.push(row(tag, process, now_ms));
    }
    let mut out = format!(
        "exec-server {}, up {}; {} sessions, {} fs-helpers, {} launchers\n",
        status.version,
        duration(status.uptime_ms),
        status.sessions.len(),
        status.helpers,
        status.launchers
    );
    out.push_str(&columns(&rows));
    if status.processes_omitted > 0 {
        out.push_str(&format!(
            "({} more processes not listed: the page holds at most MAX_STATUS_PROCESSES)\n",
            status.processes_omitted
        ));
    }
    out.push('\n');
    let mut budgets = vec![["BUDGET", "IN USE", "LIMIT", "UNIT"].map(str::to_owned)];
    for budget in &status.budgets {
        budgets.push([
            budget.name.clone(),
            budget.in_use.to_string(),
            budget.limit.to_string(),
            budget.unit.clone(),
        ]);
    }
    out.push_str(&columns(&budgets));
    out
}

fn row(tag: &str, process: &ProcessInfo, now_ms: u64) -> [String; 9] {
    let state = match process.state {
        ProcessState::Running => "running",
        ProcessState::Exited => "exited",
        ProcessState::Closed => "closed",
    };
    let (cpu, memory) = match (&process.resources, &process.usage) {
        (Some(live), _) => (live.cpu_millis, live.memory_current_bytes),
        (None, Some(usage)) => (Some(usage.cpu_millis), usage.peak_memory_bytes),
        (None, None) => (None, None),
    };
    let limit = process
        .limits
        .as_ref()
        .and_then(|limits| limits.memory_bytes.as_ref())
        .map(|limit| limit.value);
    let exit = match (process.exit_code, process.reason) {
        (Some(code), Some(reason)) => {
            format!("{code} ({})", crate::observe::metrics::reason_label(reason))
        }
        (Some(code), None) => code.to_string(),
        _ => "-".to_owned(),
    };
    [
        tag.to_owned(),
        LogField(&process.process_id).to_string(),
        process.pid.to_string(),
        state.to_owned(),
        duration(now_ms.saturating_sub(process.started_at_ms)),
        cpu.map_or("-".to_owned(), |millis| {
            format!("{:.2}s", millis as f64 / 1000.0)
        }),
        memory.map_or("-".to_owned(), bytes),
        limit.map_or("-".to_owned(), bytes),
        exit,
    ]
}

fn columns<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0usize; N];
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

fn duration(millis: u64) -> String {
    let seconds = millis / 1000;
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3600 => format!("{}m{}s", seconds / 60, seconds % 60),
        _ => format!("{}h{}m", seconds / 3600, seconds / 60 % 60),
    }
}

fn bytes(count: u64) -> String {
    const MIB: u64 = 1 << 20;
    if count >= MIB {
        format!("{:.1}MiB", count as f64 / MIB as f64)
    } else {
        format!("{:.1}KiB", count as f64 / 1024.0)
    }
}
