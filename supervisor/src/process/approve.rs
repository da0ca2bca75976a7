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

use std::sync::Arc;

use proto::jsonrpc::{Message, Request, RequestId};
use proto::methods::EGRESS_APPROVE;
use proto::methods::egress::{ApproveParams, ApproveResult};
use sandbox::egress::ask::{ASK_TIMEOUT, Answer, MAX_ASK_MESSAGE_BYTES, Question, Scope};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

use crate::session::Attachment;

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
