//! `egress/approve`: the server's side of asking before an egress refusal is final.
//!
//! A sandboxed process whose allowlist asks (`network.ask`) gets a socket as
//! `sandbox-run --ask-fd` ([`super::spawn::ASK_FD`]); its egress proxy's questions arrive on
//! it as JSON lines (at most [`MAX_ASK_MESSAGE_BYTES`] each), one at a time. For each:
//! - an approval for the session already covers the host and port: `session`, without asking;
//! - the session's connection declared `egressApprove` at `initialize`: the server sends it an
//!   `egress/approve` request and waits at most [`ASK_TIMEOUT`] for the answer;
//! - otherwise (no such client, detached, no answer, an error answer): `deny`, at once.
//!
//! The socket is the server's and `sandbox-run`'s alone: the command never holds it (PID 1
//! closes every inherited descriptor, the proxy talks to `sandbox-run` over a pair of its own).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use proto::jsonrpc::{Message, Request, RequestId};
use proto::methods::EGRESS_APPROVE;
use proto::methods::egress::{ApproveParams, ApproveResult};
use sandbox::egress::ask::{ASK_TIMEOUT, Answer, MAX_ASK_MESSAGE_BYTES, Question, Scope};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

use crate::session::Attachment;

/// Most `egress/approve` requests of one session waiting for their answers (each process asks
/// one at a time; more than this many processes asking at once are refused at once).
pub const MAX_PENDING_APPROVALS: usize = 64;

/// Most host:port pairs one session remembers as approved for the session.
pub const MAX_SESSION_APPROVALS: usize = 1024;

/// A session's `egress/approve` requests in flight and its approvals for the session.
#[derive(Default)]
pub struct Approvals {
    next: AtomicU64,
    pending: Mutex<HashMap<String, oneshot::Sender<Option<Value>>>>,
    remembered: Mutex<HashSet<(String, u16)>>,
}

impl Approvals {
    /// A new request id (`approve-N`) and where its answer will arrive; `None` when
    /// [`MAX_PENDING_APPROVALS`] wait already.
    fn register(&self) -> Option<(String, oneshot::Receiver<Option<Value>>)> {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if pending.len() >= MAX_PENDING_APPROVALS {
            return None;
        }
        let id = format!("approve-{}", self.next.fetch_add(1, Ordering::Relaxed) + 1);
        let (tx, rx) = oneshot::channel();
        pending.insert(id.clone(), tx);
        Some((id, rx))
    }

    fn forget(&self, id: &str) {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }

    /// Delivers a client's response (`Some(result)`, or `None` for an error response) to the
    /// request `id`; `false` when no such request waits (the caller reports it as unexpected).
    pub fn complete(&self, id: &RequestId, result: Option<Value>) -> bool {
        let RequestId::String(id) = id else {
            return false;
        };
        let waiter = self
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        match waiter {
            Some(waiter) => {
                let _ = waiter.send(result);
                true
            }
            None => false,
        }
    }

    fn remembered(&self, host: &str, port: u16) -> bool {
        self.remembered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&(host.to_owned(), port))
    }

    fn remember(&self, host: &str, port: u16) {
        let mut remembered = self.remembered.lock().unwrap_or_else(|p| p.into_inner());
        if remembered.len() < MAX_SESSION_APPROVALS {
            remembered.insert((host.to_owned(), port));
        }
    }
}

/// Serves the questions of process `process_id` from `socket` until `sandbox-run` closes it.
pub async fn serve(socket: tokio::net::UnixStream, process_id: String, sink: Arc<Attachment>) {
    let (read, mut write) = socket.into_split();
    let mut reader = tokio::io::BufReader::new(read);
    loop {
        let mut line = Vec::new();
        let limit = MAX_ASK_MESSAGE_BYTES as u64 + 1;
        match (&mut reader).take(limit).read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) if line.last() != Some(&b'\n') => return,
            Ok(_) => {}
        }
        let Ok(question) = serde_json::from_slice::<Question>(&line) else {
            continue;
        };
        let answer = decide(&question, &process_id, &sink).await;
        let Ok(mut text) = serde_json::to_vec(&answer) else {
            continue;
        };
        text.push(b'\n');
        if write.write_all(&text).await.is_err() {
            return;
        }
    }
}

async fn decide(question: &Question, process_id: &str, sink: &Attachment) -> Answer {
    let answer = |decision: Scope| Answer {
        id: question.id,
        decision,
        by: Some("client".to_owned()),
    };
    let approvals = &sink.approvals;
    if approvals.remembered(&question.host, question.port) {
        return answer(Scope::Session);
    }
    // Refused without a client's word: said so in the refusal.
    let unasked = Answer {
        id: question.id,
        decision: Scope::Deny,
        by: Some("server: no attached client declared egressApprove".to_owned()),
    };
    let Some(sender) = sink.approving_sender() else {
        return unasked;
    };
    let Some((id, response)) = approvals.register() else {
        return unasked;
    };
    let params = ApproveParams {
        process_id: process_id.to_owned(),
        host: question.host.clone(),
        port: question.port,
        protocol: question.protocol.clone(),
        method: question.method.clone(),
        path: question.path.clone(),
        rule: question.rule.clone(),
    };
    let request = Message::Request(Request {
        id: RequestId::String(id.clone()),
        method: EGRESS_APPROVE.to_owned(),
        params: serde_json::to_value(params).ok(),
    });
    if sender
        .send(crate::outbound::Outbound::Message(request))
        .await
        .is_err()
    {
        approvals.forget(&id);
        return unasked;
    }
    let result = tokio::time::timeout(ASK_TIMEOUT, response).await;
    approvals.forget(&id);
    let decision = match result {
        Ok(Ok(Some(value))) => serde_json::from_value::<ApproveResult>(value)
            .ok()
            .and_then(|result| serde_json::from_value::<Scope>(Value::String(result.decision)).ok())
            .unwrap_or(Scope::Deny),
        _ => Scope::Deny,
    };
    if decision == Scope::Session {
        approvals.remember(&question.host, question.port);
    }
    answer(decision)
}
