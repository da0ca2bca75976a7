//! The harness's side of the router: a harness socket's frames, limited per socket and per
//! credential, routed to the environment's executor (through the node holding it, in cluster
//! mode).

use super::*;

impl Router {
    /// Serve a harness socket until it closes.
    pub async fn serve_harness<S>(
        &self,
        environment: &str,
        socket: WebSocketStream<S>,
        secret: CredentialSecret,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        // The same on every node in cluster mode, so that a credential's frames counted here
        // count in one account whether they came from a socket of this node or of another.
        let party = match &self.cluster {
            Some(cluster) => cluster.party(secret.token()),
            None => secret.party(),
        };
        let (queue, mut outbox, account) = self.harness_queue(party);
        // Cluster mode: frames for this socket arrive on a subject of its own.
        let seat = match &self.cluster {
            Some(cluster) => match HarnessSeat::take(cluster, environment, &secret, &queue).await {
                Ok(seat) => Some(seat),
                Err(error) => {
                    tracing::warn!(environment, %error, "cannot subscribe a harness socket: closed");
                    return;
                }
            },
            None => None,
        };
        let (socket_id, close, _guard) = self.open(environment, Role::Harness, secret);
        let queue = Queue::Local(queue);
        let mut limiter = NewStreamLimiter::new(Instant::now());
        let (mut sink, mut incoming) = socket.split();
        let sender = Harness {
            socket: socket_id,
            party,
            queue: &queue,
            account: &account,
        };
        loop {
            tokio::select! {
                message = incoming.next() => match message {
                    Some(Ok(WsMessage::Binary(bytes))) => {
                        self.route_from_harness(environment, &sender, &mut limiter, bytes, seat.as_ref());
                    }
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
                    // Revoked: what was queued (the resets) goes out first.
                    flush_queued(&mut sink, &mut outbox).await;
                    break;
                }
            }
        }
        if limiter.dropped > 0 {
            tracing::info!(
                environment,
                socket = socket_id,
                dropped = limiter.dropped,
                "harness socket closed; frames opening streams over its limits were dropped"
            );
        }
        if let Some(env) = self.table().get_mut(environment) {
            env.streams.retain(|_, route| route.socket != socket_id);
        }
        if let Some(seat) = seat {
            seat.closed(socket_id);
        }
        let _ = sink.close().await;
        drop((queue, outbox, account));
        self.harness_queue_closed(party);
    }

    fn route_from_harness(
        &self,
        environment: &str,
        harness: &Harness<'_>,
        limiter: &mut NewStreamLimiter,
        frame: Bytes,
        seat: Option<&HarnessSeat>,
    ) {
        let Ok(route) = route(&frame) else {
            return;
        };
        // A proof challenge is the rendezvous's own: a harness relaying one must not reach
        // the executor (it would make the real executor prove a stranger's socket).
        if is_proof_stream(&route.stream_id) {
            limiter.dropped += 1;
            return;
        }
        // A handshake costs the executor a Noise operation: limited before the table is
        // even locked, so a flood of them costs one envelope decode each.
        if route.handshake && !limiter.allow(Instant::now()) {
            return;
        }
        match seat {
            // Cluster mode: to whichever node holds the executor socket; it keeps the table.
            Some(seat) => seat.forward(harness.socket, &frame),
            None => self.route_to_executor(environment, harness, limiter, route, frame),
        }
    }
}
