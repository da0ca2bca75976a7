//! The HTTP endpoints of the rendezvous (see the module above for what each does): the axum
//! router, authentication by bearer token and role, registration, lookup, and the executor and
//! harness websocket upgrades handed to the stream router.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hyper_util::rt::TokioIo;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role as WsRole;

use super::cluster::Cluster;
use super::cluster::registry::{Binding, ClusterRegistryError, Registered};
use super::cluster::sockets::ClusterSocketSlot;
use super::credentials::{Caller, Role};
use super::registration::{RegisterError, validate_registration};
use crate::limits::UPGRADE_HEAD_TIMEOUT;
use crate::relay::driver::relay_websocket_config;
use crate::relay::registry::{
    ConnectResponse, RegisterRequest, RegisterResponse, validate_environment_id,
};

use super::{
    Admitted, AppState, CredentialSocket, MAX_RENDEZVOUS_CONNECTIONS, MAX_REQUEST_BODY_BYTES,
};

pub(super) fn app(state: Arc<AppState>) -> axum::Router {
    axum::Router::new()
        .route("/v1/environments/{id}", post(register).delete(unbind))
        .route("/v1/environments/{id}/connect", post(connect))
        .route("/v1/environments/{id}/executor", get(executor_socket))
        .route("/v1/environments/{id}/harness", get(harness_socket))
        .fallback(|| async { text(StatusCode::NOT_FOUND, "no such endpoint\n") })
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            authenticate,
        ))
        .layer(DefaultBodyLimit::max(MAX_REQUEST_BODY_BYTES))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// `GET /readyz`: 200 when the node serves; in cluster mode 503 while its NATS link is down.
async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    match &state.cluster {
        Some(cluster) if !cluster.is_linked() => text(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("NATS link down (node {})\n", cluster.node()),
        ),
        Some(cluster) => text(
            StatusCode::OK,
            &format!("ready (node {}, NATS linked)\n", cluster.node()),
        ),
        None => text(StatusCode::OK, "ready\n"),
    }
}

/// The cluster registry's failure as a response: 503 (another node may answer).
fn cluster_unavailable(error: &ClusterRegistryError) -> Response {
    tracing::warn!(%error, "cluster registry unavailable");
    text(StatusCode::SERVICE_UNAVAILABLE, &format!("{error}\n"))
}

/// Name and key of `id`: from the cluster registry in cluster mode, else from memory.
async fn lookup(state: &AppState, id: &str) -> Result<Option<(String, String)>, Response> {
    match &state.cluster {
        Some(cluster) => match cluster.lookup(id).await {
            Ok(binding) => Ok(binding.map(|b| (b.name, b.public_key))),
            Err(error) => Err(cluster_unavailable(&error)),
        },
        None => Ok(state.router.lookup(id)),
    }
}

/// A plain-text response; a refusal also closes the connection (a client that was refused
/// has nothing more to say on it, and a refused upgrade must not linger).
fn text(status: StatusCode, body: &str) -> Response {
    let mut response = (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body.to_owned(),
    )
        .into_response();
    if status.is_client_error() || status.is_server_error() {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

fn json<T: serde::Serialize>(value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Err(error) => text(StatusCode::INTERNAL_SERVER_ERROR, &format!("{error}\n")),
    }
}

fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    headers
        .get(header::AUTHORIZATION)?
        .as_bytes()
        .strip_prefix(b"Bearer ")
}

/// Every request past this point carries a known credential ([`Caller`] in its extensions).
async fn authenticate(
    State(state): State<Arc<AppState>>,
    mut request: Request,
    next: Next,
) -> Response {
    let caller =
        bearer(request.headers()).and_then(|token| state.credentials().authenticate(token));
    match caller {
        Some(caller) => {
            if let Some(Admitted(marker)) = request.extensions().get::<Admitted>() {
                marker.send_replace(true);
            }
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        None => text(StatusCode::UNAUTHORIZED, "missing or wrong bearer token\n"),
    }
}

/// Check the caller for `role` and `id`: `Some(response)` to send when refused.
fn refusal(request_caller: Option<&Caller>, role: Role, id: &str) -> Option<Response> {
    let Some(caller) = request_caller else {
        return Some(text(
            StatusCode::UNAUTHORIZED,
            "missing or wrong bearer token\n",
        ));
    };
    if let Err(reason) = validate_environment_id(id) {
        return Some(text(StatusCode::BAD_REQUEST, &format!("{reason}\n")));
    }
    if caller.role != role {
        tracing::info!(credential = %caller.label, environment = id, "refused: wrong role");
        return Some(text(
            StatusCode::FORBIDDEN,
            &format!(
                "this {} credential may not do this; it needs an {} credential\n",
                caller.role.name(),
                role.name()
            ),
        ));
    }
    if !caller.covers(id) {
        tracing::info!(credential = %caller.label, environment = id, "refused: environment not granted");
        return Some(text(
            StatusCode::FORBIDDEN,
            &format!("this credential is not granted environment {id:?}\n"),
        ));
    }
    None
}

async fn register(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    caller: Option<axum::Extension<Caller>>,
    request: Request,
) -> Response {
    if let Some(response) = refusal(caller.as_deref(), Role::Executor, &id) {
        return response;
    }
    // Read only once authorised, bounded in size and in time (a trickled body must not hold
    // a connection).
    let body = match tokio::time::timeout(
        UPGRADE_HEAD_TIMEOUT,
        axum::body::to_bytes(request.into_body(), MAX_REQUEST_BODY_BYTES),
    )
    .await
    {
        Ok(Ok(body)) => body,
        Ok(Err(_)) => {
            return text(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("body over MAX_REQUEST_BODY_BYTES ({MAX_REQUEST_BODY_BYTES})\n"),
            );
        }
        Err(_) => {
            return text(
                StatusCode::REQUEST_TIMEOUT,
                &format!("body not received within {UPGRADE_HEAD_TIMEOUT:?}\n"),
            );
        }
    };
    let registration: RegisterRequest = match serde_json::from_slice(&body) {
        Ok(registration) => registration,
        Err(error) => {
            return text(
                StatusCode::BAD_REQUEST,
                &format!("body must be {{\"name\", \"publicKey\"}}: {error}\n"),
            );
        }
    };
    let credentials = state.credentials();
    let pinned = credentials.pinned_key(&id);
    let registered = match &state.cluster {
        Some(cluster) => register_in_cluster(&state, cluster, &id, registration, pinned).await,
        None => state.router.register(&id, registration, pinned),
    };
    match registered {
        Ok(()) => {
            tracing::info!(environment = %id, "environment registered");
            json(&RegisterResponse {
                rendezvous_url: format!("{}/v1/environments/{id}/executor", state.public_url),
            })
        }
        Err(error @ RegisterError::KeyConflict { .. }) => {
            tracing::warn!(environment = %id, "registration with another key refused");
            text(StatusCode::CONFLICT, &format!("{error}\n"))
        }
        Err(RegisterError::Unavailable(reason)) => {
            tracing::warn!(%reason, "cluster registry unavailable");
            text(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!("the cluster registry is unavailable: {reason}\n"),
            )
        }
        Err(error) => text(StatusCode::BAD_REQUEST, &format!("{error}\n")),
    }
}

/// Cluster mode: bind (or confirm) in the cluster registry by compare-and-set, then hold the
/// binding in this node's table for the executor socket that follows.
async fn register_in_cluster(
    state: &AppState,
    cluster: &Cluster,
    id: &str,
    registration: crate::relay::registry::RegisterRequest,
    pinned: Option<&str>,
) -> Result<(), RegisterError> {
    validate_registration(id, &registration, pinned)?;
    let binding = Binding {
        name: registration.name,
        public_key: registration.public_key,
    };
    match cluster
        .register(id, &binding, pinned, state.router.max_environments())
        .await
    {
        Ok(outcome) => {
            if outcome == Registered::Displaced {
                tracing::warn!(
                    environment = id,
                    "an operator's pin displaced the binding to another key"
                );
            }
            state.router.adopt(id, binding.name, &binding.public_key);
            Ok(())
        }
        Err(ClusterRegistryError::Refused(error)) => Err(error),
        Err(error) => Err(RegisterError::Unavailable(error.to_string())),
    }
}

async fn unbind(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    caller: Option<axum::Extension<Caller>>,
) -> Response {
    if let Some(response) = refusal(caller.as_deref(), Role::Admin, &id) {
        return response;
    }
    let released = match &state.cluster {
        Some(cluster) => match cluster.release(&id).await {
            Ok(released) => released | state.router.unbind(&id),
            Err(error) => return cluster_unavailable(&error),
        },
        None => state.router.unbind(&id),
    };
    if released {
        tracing::info!(environment = %id, "binding released by an operator");
        text(StatusCode::OK, "binding released\n")
    } else {
        text(StatusCode::NOT_FOUND, "environment not registered\n")
    }
}

async fn connect(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    caller: Option<axum::Extension<Caller>>,
) -> Response {
    if let Some(response) = refusal(caller.as_deref(), Role::Harness, &id) {
        return response;
    }
    let known = match lookup(&state, &id).await {
        Ok(known) => known,
        Err(response) => return response,
    };
    match known {
        Some((name, public_key)) => json(&ConnectResponse {
            rendezvous_url: format!("{}/v1/environments/{id}/harness", state.public_url),
            public_key,
            name,
        }),
        None => text(StatusCode::NOT_FOUND, "environment not registered\n"),
    }
}

/// The caller of a websocket endpoint of `role` for environment `id`, and the environment's
/// name and bound key; or the refusal (401/403 for the caller, 404 for an unknown environment).
async fn socket_caller(
    state: &AppState,
    caller: Option<axum::Extension<Caller>>,
    role: Role,
    id: &str,
) -> Result<(Caller, (String, String)), Response> {
    if let Some(response) = refusal(caller.as_deref(), role, id) {
        return Err(response);
    }
    let Some(axum::Extension(caller)) = caller else {
        return Err(text(
            StatusCode::UNAUTHORIZED,
            "missing or wrong bearer token\n",
        ));
    };
    match lookup(state, id).await? {
        Some(known) => Ok((caller, known)),
        None => Err(text(StatusCode::NOT_FOUND, "environment not registered\n")),
    }
}

async fn executor_socket(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    caller: Option<axum::Extension<Caller>>,
    request: Request,
) -> Response {
    let (caller, (name, public_key)) =
        match socket_caller(&state, caller, Role::Executor, &id).await {
            Ok(admitted) => admitted,
            Err(response) => return response,
        };
    if state.cluster.is_some() {
        // The socket proves the key the cluster holds, here.
        state.router.adopt(&id, name, &public_key);
    }
    let cluster_slot = match cluster_socket_slot(&state, &caller, &id).await {
        Ok(slot) => slot,
        Err(response) => return response,
    };
    upgrade(state, id, &caller, true, request, cluster_slot)
}

async fn harness_socket(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    caller: Option<axum::Extension<Caller>>,
    request: Request,
) -> Response {
    let caller = match socket_caller(&state, caller, Role::Harness, &id).await {
        Ok((caller, _)) => caller,
        Err(response) => return response,
    };
    let cluster_slot = match cluster_socket_slot(&state, &caller, &id).await {
        Ok(slot) => slot,
        Err(response) => return response,
    };
    upgrade(state, id, &caller, false, request, cluster_slot)
}

/// Cluster mode: count the socket against its credential across the cluster (503 past
/// `--max-sockets-per-credential`, or when the cluster cannot count); `None` on a single node.
async fn cluster_socket_slot(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<Option<ClusterSocketSlot>, Response> {
    let Some(cluster) = &state.cluster else {
        return Ok(None);
    };
    match cluster
        .take_socket(caller.secret.token(), state.max_per_credential)
        .await
    {
        Ok(Some(slot)) => Ok(Some(slot)),
        Ok(None) => {
            tracing::info!(
                credential = %caller.label,
                environment = id,
                "refused: too many sockets for one credential across the cluster"
            );
            Err(too_many_sockets(state.max_per_credential))
        }
        Err(error) => Err(cluster_unavailable(&error)),
    }
}

fn too_many_sockets(max: usize) -> Response {
    text(
        StatusCode::SERVICE_UNAVAILABLE,
        &format!(
            "too many sockets for this credential: at most {max} at once \
             (exec-rendezvous --max-sockets-per-credential)\n"
        ),
    )
}

/// Answer a websocket upgrade with 101 and serve the socket once hyper hands it over.
fn upgrade(
    state: Arc<AppState>,
    id: String,
    caller: &Caller,
    executor: bool,
    mut request: Request,
    cluster_slot: Option<ClusterSocketSlot>,
) -> Response {
    if state.cluster.as_ref().is_some_and(|c| !c.is_linked()) {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "this node lost its NATS link; try another node\n",
        );
    }
    let headers = request.headers();
    let is_upgrade = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let Some(key) = headers.get(header::SEC_WEBSOCKET_KEY).cloned() else {
        return text(StatusCode::BAD_REQUEST, "expected a websocket upgrade\n");
    };
    if !is_upgrade {
        return text(StatusCode::BAD_REQUEST, "expected a websocket upgrade\n");
    }
    let Ok(permit) = state.sockets.clone().try_acquire_owned() else {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!(
                "too many sockets: MAX_RENDEZVOUS_CONNECTIONS ({MAX_RENDEZVOUS_CONNECTIONS})\n"
            ),
        );
    };
    let credential = caller.label.as_str();
    let secret = caller.secret.clone();
    let Some(slot) = CredentialSocket::take(&state, credential) else {
        tracing::info!(
            credential,
            environment = id,
            "refused: too many sockets for one credential"
        );
        return too_many_sockets(state.max_per_credential);
    };
    let on_upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(upgraded) => upgraded,
            Err(error) => {
                tracing::debug!(%error, "websocket upgrade failed");
                return;
            }
        };
        let socket = WebSocketStream::from_raw_socket(
            TokioIo::new(upgraded),
            WsRole::Server,
            Some(relay_websocket_config()),
        )
        .await;
        if executor {
            state.router.serve_executor(&id, socket, secret).await;
        } else {
            state.router.serve_harness(&id, socket, secret).await;
        }
        drop((slot, permit, cluster_slot));
    });
    let accept = derive_accept_key(key.as_bytes());
    let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    if let Ok(value) = HeaderValue::from_str(&accept) {
        headers.insert(header::SEC_WEBSOCKET_ACCEPT, value);
    }
    response
}
