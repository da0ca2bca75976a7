//! The executor's side of the router: its socket challenged to prove the bound key, then made
//! the environment's executor; frames from it routed to the harness socket owning their stream,
//! and (in cluster mode) control messages from other nodes.

use super::*;

impl Router {
    /// Serve an executor socket until it closes: challenge it to prove it holds the bound key,
    /// then make it the environment's executor (replacing any previous one).
    pub async fn serve_executor<S>(
        &self,
        environment: &str,
        socket: WebSocketStream<S>,
        secret: CredentialSecret,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (socket_id, close, _guard) = self.open(environment, Role::Executor, secret);
        let (mut sink, mut incoming) = socket.split();
        let proven = tokio::select! {
            proven = self.prove(environment, socket_id, &mut sink, &mut incoming) => proven,
            () = close.notified() => false,
        };
        if !proven {
            let _ = sink.close().await;
            return;
        }
        let (queue, mut outbox) = self.executor_queue();
        {
            let mut table = self.table();
            let Some(env) = table.get_mut(environment) else {
                return;
            };
            env.executor = Some((socket_id, Queue::Local(queue)));
        }
        // Cluster mode: take the environment's subject (the other nodes' harness frames).
        let mut seat = match &self.cluster {
            Some(cluster) => match ExecutorSeat::take(cluster, environment).await {
                Ok(seat) => Some(seat),
                Err(error) => {
                    tracing::warn!(environment, %error, "cannot take the environment's subject: executor socket closed");
                    self.forget_executor(environment, socket_id);
                    let _ = sink.close().await;
                    return;
                }
            },
            None => None,
        };
        tracing::info!(
            environment,
            socket = socket_id,
            "executor socket open (key proven)"
        );
        loop {
            tokio::select! {
                control = next_control(&mut seat) => {
                    let Some(control) = control else { break };
                    if let Some(seat) = &mut seat
                        && !self.on_control(environment, seat, control)
                    {
                        flush_queued(&mut sink, &mut outbox).await;
                        break;
                    }
                }
                message = incoming.next() => match message {
                    Some(Ok(WsMessage::Binary(bytes))) => self.route_from_executor(environment, bytes),
                    Some(Ok(WsMessage::Close(_))) | None | Some(Err(_)) => break,
                    Some(Ok(_)) => {}
                },
                frame = outbox.recv() => {
                    let Some(frame) = frame else { break };
                    if send_batch(&mut sink, frame, &mut outbox).await.is_err() {
                        break;
                    }
                }
                () = close.notified() => {
                    // Revoked or displaced: what was queued (the resets) goes out first.
                    flush_queued(&mut sink, &mut outbox).await;
                    break;
                }
            }
        }
        self.forget_executor(environment, socket_id);
        drop(seat);
        let _ = sink.close().await;
        tracing::info!(environment, socket = socket_id, "executor socket closed");
    }

    /// Forget `socket_id` as `environment`'s executor (if it still is).
    fn forget_executor(&self, environment: &str, socket_id: u64) {
        if let Some(env) = self.table().get_mut(environment)
            && env
                .executor
                .as_ref()
                .is_some_and(|(id, _)| *id == socket_id)
        {
            env.executor = None;
        }
    }

    /// Cluster mode: act on one message of the environment's subject. Returns `false` when the
    /// executor socket must close (another node took it over, or the binding was released).
    fn on_control(&self, environment: &str, seat: &mut ExecutorSeat, control: Received) -> bool {
        match control.control {
            Control::Frame {
                socket,
                party,
                frame,
            } => {
                let account = || self.credential_account(party);
                let Some(remote) = seat.remote(socket, party, account, control.reply) else {
                    return true;
                };
                let Ok(route) = route(&frame) else {
                    return true;
                };
                if is_proof_stream(&route.stream_id) {
                    return true;
                }
                let harness = Harness {
                    socket,
                    party,
                    queue: &remote.queue,
                    account: &remote.account,
                };
                self.route_to_executor(environment, &harness, &mut remote.limiter, route, frame);
                true
            }
            Control::SocketClosed { socket } => {
                if let Some(remote) = seat.forget(socket) {
                    let party = remote.party;
                    drop(remote);
                    self.harness_queue_closed(party);
                }
                if let Some(env) = self.table().get_mut(environment) {
                    env.streams.retain(|_, route| route.socket != socket);
                }
                true
            }
            Control::Takeover { node } => {
                if node == seat.nonce() {
                    return true;
                }
                tracing::info!(
                    environment,
                    "another socket of the executor was proven (here or on another node): closing this one"
                );
                false
            }
            Control::Release => {
                tracing::info!(environment, "binding released or displaced by an operator");
                if let Some(env) = self.table().get_mut(environment) {
                    env.reset_all("the environment's key binding was released");
                }
                self.table().remove(environment);
                false
            }
        }
    }

    /// Challenge a new executor socket and check its answer within [`PROOF_TIMEOUT`]; on
    /// success, tell it it was accepted. Frames it sends before answering are dropped.
    async fn prove<Si, St>(
        &self,
        environment: &str,
        socket_id: u64,
        sink: &mut Si,
        incoming: &mut St,
    ) -> bool
    where
        Si: futures_util::Sink<WsMessage> + Unpin,
        St: futures_util::Stream<Item = Result<WsMessage, tokio_tungstenite::tungstenite::Error>>
            + Unpin,
    {
        let Some(key) = self
            .lookup(environment)
            .and_then(|(_, key)| decode_public_key(&key).ok().map(|bytes| (key, bytes)))
        else {
            return false;
        };
        let (challenge, frame) = match Challenge::new(environment, socket_id, &key.1) {
            Ok(challenge) => challenge,
            Err(error) => {
                tracing::error!(%error, "cannot challenge an executor socket");
                return false;
            }
        };
        // Sent again every PROOF_RESEND_INTERVAL until answered: the link may lose frames
        // (the endpoints repair losses; this exchange is no exception).
        let challenge_bytes = frame.encode();
        let answer = async {
            let mut resend = tokio::time::interval(PROOF_RESEND_INTERVAL);
            loop {
                tokio::select! {
                    _ = resend.tick() => {
                        if sink.send(WsMessage::binary(challenge_bytes.clone())).await.is_err() {
                            return None;
                        }
                    }
                    message = incoming.next() => match message {
                        Some(Ok(WsMessage::Binary(bytes))) => {
                            if let Ok(frame) = Frame::decode(&bytes)
                                && frame.stream_id == challenge.stream_id()
                                && matches!(frame.body, Body::Handshake(_))
                            {
                                return Some(frame);
                            }
                        }
                        Some(Ok(_)) => {}
                        Some(Err(_)) | None => return None,
                    },
                }
            }
        };
        let Ok(Some(answer)) = tokio::time::timeout(PROOF_TIMEOUT, answer).await else {
            tracing::warn!(
                environment,
                socket = socket_id,
                "executor socket closed: no answer to the key challenge within PROOF_TIMEOUT"
            );
            return false;
        };
        let stream_id = challenge.stream_id().to_owned();
        if let Err(error) = challenge.verify(&answer) {
            tracing::warn!(environment, socket = socket_id, %error, "executor socket refused");
            let refusal = Frame::new(stream_id, reset_body(&error.to_string())).encode();
            let _ = sink.send(WsMessage::binary(refusal)).await;
            return false;
        }
        // The binding may have changed while the socket answered (an operator's pin).
        if self.lookup(environment).is_none_or(|(_, now)| now != key.0) {
            return false;
        }
        // Twice: one may be lost. (If both are, the executor takes the first harness frame as
        // the acceptance.)
        let accepted = accepted_frame(&stream_id).encode();
        sink.feed(WsMessage::binary(accepted.clone())).await.is_ok()
            && sink.send(WsMessage::binary(accepted)).await.is_ok()
    }

    fn route_from_executor(&self, environment: &str, frame: Bytes) {
        let Ok(stream_id) = route_stream_id(&frame) else {
            return;
        };
        let table = self.table();
        if let Some(route) = table
            .get(environment)
            .and_then(|env| env.streams.get(&stream_id))
            && route.queue.try_send(frame).is_err()
        {
            tracing::debug!(environment, "harness socket queue full: frame dropped");
        }
    }
}

/// The next message of an executor seat's subject; pending forever on a single node, `None`
/// once the subscription ended (the NATS client closed).
async fn next_control(seat: &mut Option<ExecutorSeat>) -> Option<Received> {
    match seat {
        Some(seat) => seat.next().await,
        None => std::future::pending().await,
    }
}
