//! The reference registry + rendezvous (`exec-rendezvous`): small, in memory, one process.
//!
//! HTTP (every request needs `Authorization: Bearer <token>`, compared in constant time):
//! - `POST /v1/environments/{id}` `{"name","publicKey"}` → `{"rendezvousUrl"}`: an executor
//!   registers (again after every reconnect; the last registration wins).
//! - `POST /v1/environments/{id}/connect` → `{"rendezvousUrl","publicKey","name"}`: a harness
//!   looks an environment up (404 when unknown).
//! - `GET /v1/environments/{id}/executor` (websocket): the executor's socket; a new one replaces
//!   the old.
//! - `GET /v1/environments/{id}/harness` (websocket): a harness socket; it may carry many streams.
//! - `GET /readyz` → 200 without auth.
//!
//! Routing ([`router`]) reads only a frame's envelope for its `stream_id`; payloads are opaque
//! (Noise ciphertext) and never inspected. Reliability is the endpoints' job: a frame with no
//! route, or for a full socket queue, is dropped.

pub mod http;
pub mod router;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::Role;

use crate::relay::driver::relay_websocket_config;
use crate::relay::registry::{
    ConnectResponse, RegisterRequest, RegisterResponse, validate_environment_id,
};
use http::{Request, Response};
use router::Router;

/// Simultaneous TCP connections (HTTP and websockets); more are closed right after accept.
pub const MAX_RENDEZVOUS_CONNECTIONS: usize = 4096;

/// How the rendezvous runs.
#[derive(Clone)]
pub struct RendezvousOptions {
    /// Address to bind (port 0 picks one).
    pub listen: SocketAddr,
    /// The bearer token every request must carry.
    pub token: String,
    /// Base `ws://HOST:PORT` handed out in `rendezvousUrl` (default: the bound address). Lets a
    /// proxy sit between endpoints and the rendezvous.
    pub public_url: Option<String>,
}

impl std::fmt::Debug for RendezvousOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RendezvousOptions")
            .field("listen", &self.listen)
            .field("token", &"<redacted>")
            .field("public_url", &self.public_url)
            .finish()
    }
}

/// A bound rendezvous.
pub struct Rendezvous {
    listener: TcpListener,
    state: Arc<State>,
}

struct State {
    token: Vec<u8>,
    public_url: String,
    router: Router,
    slots: Arc<tokio::sync::Semaphore>,
}

impl Rendezvous {
    /// Bind.
    ///
    /// # Errors
    /// The bind error.
    pub async fn bind(options: RendezvousOptions) -> std::io::Result<Self> {
        let listener = TcpListener::bind(options.listen).await?;
        let address = listener.local_addr()?;
        let public_url = options
            .public_url
            .unwrap_or_else(|| format!("ws://{address}"));
        Ok(Self {
            listener,
            state: Arc::new(State {
                token: options.token.into_bytes(),
                public_url: public_url.trim_end_matches('/').to_owned(),
                router: Router::default(),
                slots: Arc::new(tokio::sync::Semaphore::new(MAX_RENDEZVOUS_CONNECTIONS)),
            }),
        })
    }

    /// `http://HOST:PORT` of the registry endpoints.
    pub fn url(&self) -> String {
        match self.listener.local_addr() {
            Ok(address) => format!("http://{address}"),
            Err(_) => "http://unknown".into(),
        }
    }

    /// Serve until `stop` resolves.
    pub async fn serve_until(self, stop: impl std::future::Future<Output = ()>) {
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => break,
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        let _ = stream.set_nodelay(true);
                        let Ok(permit) = self.state.slots.clone().try_acquire_owned() else {
                            continue;
                        };
                        let state = self.state.clone();
                        tokio::spawn(async move {
                            handle(stream, state).await;
                            drop(permit);
                        });
                    }
                    Err(error) => {
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    }
                },
            }
        }
    }
}

async fn handle(mut stream: TcpStream, state: Arc<State>) {
    let request = match http::read_request(&mut stream).await {
        Ok(request) => request,
        Err(error) => {
            tracing::debug!(%error, "dropping a connection with an unreadable request");
            let _ = http::write_response(
                &mut stream,
                &Response::text(400, "Bad Request", &error.to_string()),
            )
            .await;
            return;
        }
    };
    if request.method == "GET" && request.path == "/readyz" {
        let _ = http::write_response(&mut stream, &Response::text(200, "OK", "ready\n")).await;
        return;
    }
    if !request.bearer_matches(&state.token) {
        let response = Response::text(401, "Unauthorized", "missing or wrong bearer token\n");
        let _ = http::write_response(&mut stream, &response).await;
        return;
    }
    match route(&request, &state) {
        Routed::Respond(response) => {
            let _ = http::write_response(&mut stream, &response).await;
        }
        Routed::Socket {
            environment,
            executor,
        } => {
            let Some(key) = request.websocket_key.clone() else {
                let response = Response::text(400, "Bad Request", "expected a websocket upgrade\n");
                let _ = http::write_response(&mut stream, &response).await;
                return;
            };
            if crate::transport::http::write_upgrade(&mut stream, &key)
                .await
                .is_err()
            {
                return;
            }
            let socket = WebSocketStream::from_partially_read(
                stream,
                request.leftover,
                Role::Server,
                Some(relay_websocket_config()),
            )
            .await;
            if executor {
                state.router.serve_executor(&environment, socket).await;
            } else {
                state.router.serve_harness(&environment, socket).await;
            }
        }
    }
}

enum Routed {
    Respond(Response),
    Socket { environment: String, executor: bool },
}

fn route(request: &Request, state: &State) -> Routed {
    let segments: Vec<&str> = request.path.trim_start_matches('/').split('/').collect();
    let (method, rest) = match segments.as_slice() {
        ["v1", "environments", id, rest @ ..] => {
            if let Err(reason) = validate_environment_id(id) {
                return Routed::Respond(Response::text(400, "Bad Request", &reason));
            }
            ((request.method.as_str(), *id), rest)
        }
        _ => return Routed::Respond(Response::text(404, "Not Found", "no such endpoint\n")),
    };
    let id = method.1;
    match (method.0, rest) {
        ("POST", []) => {
            let registration: RegisterRequest = match serde_json::from_slice(&request.body) {
                Ok(registration) => registration,
                Err(error) => {
                    return Routed::Respond(Response::text(
                        400,
                        "Bad Request",
                        &format!("body must be {{\"name\", \"publicKey\"}}: {error}"),
                    ));
                }
            };
            if let Err(reason) = state.router.register(id, registration) {
                return Routed::Respond(Response::text(400, "Bad Request", &reason));
            }
            tracing::info!(environment = id, "environment registered");
            Routed::Respond(Response::json(&RegisterResponse {
                rendezvous_url: format!("{}/v1/environments/{id}/executor", state.public_url),
            }))
        }
        ("POST", ["connect"]) => match state.router.lookup(id) {
            Some((name, public_key)) => Routed::Respond(Response::json(&ConnectResponse {
                rendezvous_url: format!("{}/v1/environments/{id}/harness", state.public_url),
                public_key,
                name,
            })),
            None => Routed::Respond(Response::text(
                404,
                "Not Found",
                "environment not registered\n",
            )),
        },
        ("GET", ["executor"]) | ("GET", ["harness"]) => {
            if state.router.lookup(id).is_none() {
                return Routed::Respond(Response::text(
                    404,
                    "Not Found",
                    "environment not registered\n",
                ));
            }
            Routed::Socket {
                environment: id.to_owned(),
                executor: rest == ["executor"],
            }
        }
        _ => Routed::Respond(Response::text(404, "Not Found", "no such endpoint\n")),
    }
}
