//! Asking before a refusal is final (`--ask`, `network.ask`): when the allowlist refuses a
//! destination (no `allow` pattern matches; a `deny` pattern is always final), the proxy asks
//! the outer `sandbox-run` and holds the connection until the answer or the timeout.
//!
//! ```text
//!  egress-proxy ──Question──► outer sandbox-run ──► the terminal (y/p/N), or the --ask-fd peer
//!       ▲                         │                  (exec-server: `egress/approve`)
//!       └────────Answer───────────┘
//! ```
//!
//! The channel from the proxy is a `SOCK_SEQPACKET` socket pair made by the outer: one JSON
//! message per packet, at most [`MAX_ASK_MESSAGE_BYTES`], never reachable from the sandbox (the
//! command has neither end; the proxy runs outside its namespaces). The --ask-fd peer speaks
//! the same messages as JSON lines. The proxy alone keeps time ([`AskConfig::timeout_ms`]): an
//! answer that comes later finds no one waiting and is dropped. A refused name is not resolved
//! before the answer; after an approval every address check still applies.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How long a connection is held waiting for an answer when none is configured.
pub const ASK_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest wait that may be configured (`--ask-timeout`): a held connection is a thread.
pub const MAX_ASK_TIMEOUT: Duration = Duration::from_secs(600);

/// Largest question or answer (JSON): names are at most 253 bytes, paths are cut to fit.
pub const MAX_ASK_MESSAGE_BYTES: usize = 4096;

/// Longest request path carried in a question (longer ones are cut, marked with `...`).
pub const MAX_QUESTION_PATH_BYTES: usize = 1024;

/// Questions waiting for an answer at once; more are refused at once (each holds a thread).
pub const MAX_PENDING_QUESTIONS: usize = 32;

/// The proxy's asking configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AskConfig {
    /// How long a connection is held for an answer, in milliseconds.
    pub timeout_ms: u64,
}

/// What the proxy asks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Question {
    /// Matches the answer to its question.
    pub id: u64,
    /// How the client asked: `connect`, `http` or `socks5`.
    pub protocol: String,
    /// The host as the client named it (normalised).
    pub host: String,
    /// The port.
    pub port: u16,
    /// The request method (plain HTTP only; a tunnel's requests are not seen before it opens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// The request path (plain HTTP only), cut at [`MAX_QUESTION_PATH_BYTES`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The rule that would allow it (`--allow-domain host:port`).
    pub rule: String,
}

/// An answer's decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Refused.
    Deny,
    /// This connection only.
    Connection,
    /// Every connection of this process to the same host and port.
    Process,
    /// Every connection of the session's processes to the same host and port (the proxy
    /// serves one process: for it, as `process`; exec-server remembers it for the session).
    Session,
}

impl Scope {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Deny => "deny",
            Self::Connection => "connection",
            Self::Process => "process",
            Self::Session => "session",
        }
    }
}

/// The answer to one question.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Answer {
    /// The question's id.
    pub id: u64,
    /// What was decided.
    pub decision: Scope,
    /// Who decided (`terminal`, `client`): for the approval's record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

/// `path` cut to at most [`MAX_QUESTION_PATH_BYTES`] (on a character boundary).
pub fn cut_path(path: &str) -> String {
    if path.len() <= MAX_QUESTION_PATH_BYTES {
        return path.to_owned();
    }
    let mut end = MAX_QUESTION_PATH_BYTES - 3;
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &path[..end])
}

#[cfg(target_os = "linux")]
pub use linux::{Asker, Responder, serve_questions};

#[cfg(target_os = "linux")]
mod linux {
    use std::collections::{HashMap, HashSet};
    use std::io::{BufRead, BufReader, Write};
    use std::os::fd::OwnedFd;
    use std::sync::mpsc;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use super::{Answer, MAX_ASK_MESSAGE_BYTES, MAX_PENDING_QUESTIONS, Question, Scope};

    /// The proxy's side: sends questions, waits for their answers, remembers approvals for
    /// the process.
    pub struct Asker {
        socket: Arc<OwnedFd>,
        timeout: Duration,
        next_id: Mutex<u64>,
        waiting: Arc<Mutex<HashMap<u64, mpsc::SyncSender<Answer>>>>,
        /// `host:port` approved for the process (or session).
        approved: Mutex<HashSet<(String, u16)>>,
    }

    impl Asker {
        /// An asker on `socket` (its reader thread starts here) waiting `timeout` per question.
        ///
        /// # Errors
        /// The reader thread could not be started.
        pub fn start(socket: OwnedFd, timeout: Duration) -> std::io::Result<Self> {
            let socket = Arc::new(socket);
            let waiting: Arc<Mutex<HashMap<u64, mpsc::SyncSender<Answer>>>> = Arc::default();
            let (reader, dispatch) = (Arc::clone(&socket), Arc::clone(&waiting));
            std::thread::Builder::new()
                .name("egress-answers".to_owned())
                .stack_size(64 * 1024)
                .spawn(move || {
                    let mut packet = vec![0u8; MAX_ASK_MESSAGE_BYTES];
                    loop {
                        match nix::unistd::read(&*reader, &mut packet) {
                            Ok(0) => return,
                            Ok(n) => {
                                let Ok(answer) = serde_json::from_slice::<Answer>(&packet[..n])
                                else {
                                    continue;
                                };
                                let waiter = dispatch
                                    .lock()
                                    .unwrap_or_else(|p| p.into_inner())
                                    .remove(&answer.id);
                                if let Some(waiter) = waiter {
                                    let _ = waiter.try_send(answer);
                                }
                            }
                            Err(nix::errno::Errno::EINTR) => {}
                            Err(_) => return,
                        }
                    }
                })?;
            Ok(Self {
                socket,
                timeout,
                next_id: Mutex::new(1),
                waiting,
                approved: Mutex::default(),
            })
        }

        /// Whether `host:port` was approved for the process already.
        pub fn remembered(&self, host: &str, port: u16) -> bool {
            self.approved
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&(host.to_owned(), port))
        }

        /// Asks `question` (its id is set here) and waits for the answer; `None` when none came
        /// in time (or too many questions wait already). An approval for the process or
        /// session is remembered.
        pub fn ask(&self, mut question: Question) -> Option<Answer> {
            let (tx, rx) = mpsc::sync_channel(1);
            {
                let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
                if waiting.len() >= MAX_PENDING_QUESTIONS {
                    return None;
                }
                let mut next = self.next_id.lock().unwrap_or_else(|p| p.into_inner());
                question.id = *next;
                *next += 1;
                waiting.insert(question.id, tx);
            }
            let id = question.id;
            let sent = serde_json::to_vec(&question)
                .ok()
                .filter(|bytes| bytes.len() <= MAX_ASK_MESSAGE_BYTES)
                .is_some_and(|bytes| nix::unistd::write(&*self.socket, &bytes).is_ok());
            let answer = if sent {
                let deadline = Instant::now() + self.timeout;
                rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
                    .ok()
            } else {
                None
            };
            self.waiting
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
            if let Some(answer) = &answer
                && matches!(answer.decision, Scope::Process | Scope::Session)
            {
                self.approved
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert((question.host, question.port));
            }
            answer
        }
    }

    /// Who the outer asks.
    pub enum Responder {
        /// The controlling terminal (`sandbox-run --ask`): `y` this connection, `p` this
        /// process, anything else or nothing before the timeout: no. Without a terminal: no.
        Terminal {
            /// How long the person has to answer.
            timeout: Duration,
        },
        /// A peer on this descriptor (exec-server): questions out, answers in, JSON lines.
        Peer(OwnedFd),
    }

    /// The outer's side: a thread that reads the proxy's questions from `socket`, asks
    /// `responder` one at a time, and writes each answer back.
    ///
    /// # Errors
    /// The thread could not be started.
    pub fn serve_questions(socket: OwnedFd, responder: Responder) -> std::io::Result<()> {
        std::thread::Builder::new()
            .name("egress-ask".to_owned())
            .spawn(move || {
                let (mut peer, terminal_timeout) = match responder {
                    Responder::Peer(fd) => {
                        let file = std::fs::File::from(fd);
                        match file.try_clone() {
                            Ok(reader) => (Some((file, BufReader::new(reader))), None),
                            Err(_) => (None, None),
                        }
                    }
                    Responder::Terminal { timeout } => (None, Some(timeout)),
                };
                let mut packet = vec![0u8; MAX_ASK_MESSAGE_BYTES];
                loop {
                    let n = match nix::unistd::read(&socket, &mut packet) {
                        Ok(0) => return,
                        Ok(n) => n,
                        Err(nix::errno::Errno::EINTR) => continue,
                        Err(_) => return,
                    };
                    let Ok(question) = serde_json::from_slice::<Question>(&packet[..n]) else {
                        continue;
                    };
                    let decision = match (&mut peer, terminal_timeout) {
                        (Some((out, answers)), _) => ask_peer(out, answers, &question),
                        (None, Some(timeout)) => Some(super::terminal::ask(&question, timeout)),
                        (None, None) => None,
                    };
                    let answer = decision.unwrap_or(Answer {
                        id: question.id,
                        decision: Scope::Deny,
                        by: None,
                    });
                    if let Ok(bytes) = serde_json::to_vec(&answer) {
                        let _ = nix::unistd::write(&socket, &bytes);
                    }
                }
            })?;
        Ok(())
    }

    /// One question to the peer, and its answer (the next line; a line for another id, an
    /// old question the proxy gave up on, is skipped). `None` when the peer is gone.
    fn ask_peer(
        out: &mut std::fs::File,
        answers: &mut BufReader<std::fs::File>,
        question: &Question,
    ) -> Option<Answer> {
        let mut line = serde_json::to_vec(question).ok()?;
        line.push(b'\n');
        out.write_all(&line).ok()?;
        loop {
            let mut text = Vec::new();
            let read = answers
                .by_ref()
                .take(MAX_ASK_MESSAGE_BYTES as u64)
                .read_until(b'\n', &mut text)
                .ok()?;
            if read == 0 {
                return None;
            }
            let Ok(mut answer) = serde_json::from_slice::<Answer>(&text) else {
                continue;
            };
            if answer.id == question.id {
                answer.by.get_or_insert_with(|| "client".to_owned());
                return Some(answer);
            }
        }
    }

    use std::io::Read as _;
}

#[cfg(target_os = "linux")]
mod terminal {
    use std::io::Write;
    use std::os::fd::AsFd;
    use std::time::{Duration, Instant};

    use super::{Answer, Question, Scope};

    /// Asks on `/dev/tty`: `y` (this connection), `p` (this process), else no; no terminal or
    /// no answer within `timeout`: no.
    pub(super) fn ask(question: &Question, timeout: Duration) -> Answer {
        let decision = ask_terminal(question, timeout).unwrap_or(Scope::Deny);
        Answer {
            id: question.id,
            decision,
            by: Some("terminal".to_owned()),
        }
    }

    fn ask_terminal(question: &Question, timeout: Duration) -> Option<Scope> {
        let mut tty = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY | libc::O_CLOEXEC)
            .open("/dev/tty")
            .ok()?;
        let what = match (&question.method, &question.path) {
            (Some(method), Some(path)) => format!(" ({method} {path})"),
            _ => String::new(),
        };
        let prompt = super::super::config::escape_control(&format!(
            "sandbox-run: the command asks to reach {}:{}{what}, which the allowlist refuses \
             (to allow it always: {}). Allow? [y = this connection, p = this process, N] ",
            question.host, question.port, question.rule
        ));
        tty.write_all(prompt.as_bytes()).ok()?;
        let deadline = Instant::now() + timeout;
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let millis = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
            if millis == 0 {
                let _ = tty.write_all(b"\nsandbox-run: no answer; refused\n");
                return None;
            }
            let mut fds = [nix::poll::PollFd::new(
                tty.as_fd(),
                nix::poll::PollFlags::POLLIN,
            )];
            match nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(millis)) {
                Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
                Ok(_) => {}
                Err(_) => return None,
            }
            match std::io::Read::read(&mut tty, &mut byte) {
                Ok(0) => return None,
                Ok(_) if byte[0] == b'\n' || byte[0] == b'\r' => break,
                Ok(_) if line.len() < 16 => line.push(byte[0]),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
        match String::from_utf8_lossy(&line)
            .trim()
            .to_ascii_lowercase()
            .as_str()
        {
            "y" | "yes" => Some(Scope::Connection),
            "p" => Some(Scope::Process),
            _ => None,
        }
    }

    use std::os::unix::fs::OpenOptionsExt;
}
