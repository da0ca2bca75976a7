//! execward's supervisor: the `exec-server` binary's library, the Rust client, remote mode and
//! the reference rendezvous.
//!
//! A client connects over a websocket (TCP or unix socket), speaks JSON-RPC (see
//! `docs/protocol.md`), and drives processes and files. The server holds no extra privilege and
//! never sandboxes itself; sandboxed work is done by separately exec'd helpers.
//!
//! Cargo features, one per product (all on by default, but `schema`):
//!
//! | feature | builds | adds dependencies |
//! |---|---|---|
//! | `client` | the client library: `ExecServerClient` over `ws://` and `unix:` ([`client`]) | none beyond tokio, tokio-tungstenite, serde and `proto` without its relay |
//! | `remote` | remote mode's relay glue (`relay`); with `client`, `ExecServerClient::connect_remote` and `wss://` URLs; with `server`, the executor (`exec-server --remote`) | `proto`'s relay (prost, snow), reqwest, rustls |
//! | `server` | the exec server (`exec-server`, `exec-guardian`, the `exec` subcommand); includes `client` and `remote`, which that binary also serves | `sandbox`, `fs-helper` (Landlock, seccomp), clap |
//! | `rendezvous` | the reference registry + rendezvous (`exec-rendezvous`); includes `server` | axum, hyper |
//! | `schema` (off by default) | `rendezvous_credentials_schema` and the `schema` features of `proto` and `sandbox`: what `tests/tests/schemas/` writes `docs/schema/` from; includes `rendezvous` | schemars |
//!
//! An embedder that only drives servers builds `--no-default-features --features client` (add
//! `remote` to reach executors through a rendezvous): no sandbox, helpers or HTTP server.
//!
//! Embedding the server (feature `server`):
//! ```no_run
//! # #[cfg(feature = "server")]
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use supervisor::{DEFAULT_LISTEN_URL, ExecServerRuntimePaths, run_main};
//! run_main(DEFAULT_LISTEN_URL, ExecServerRuntimePaths::next_to_current_exe()?).await?;
//! # Ok(()) }
//! ```

#![deny(unsafe_code)]

// The exec server (feature `server`): `server` binds and shuts down, `transport` accepts, `rpc`
// routes; the rest are the handlers and the leaves they share. Only what the binaries and
// embedders use is public: `server` (and the re-exports below), `cli`, `process::guardian`.
#[cfg(feature = "server")]
mod budget;
#[cfg(feature = "server")]
pub mod cli;
#[cfg(feature = "server")]
mod containment;
#[cfg(feature = "server")]
mod cpu_pool;
#[cfg(feature = "server")]
mod environment;
#[cfg(feature = "server")]
mod fs;
#[cfg(feature = "server")]
mod http;
#[cfg(feature = "server")]
mod listen;
#[cfg(feature = "server")]
mod observe;
#[cfg(feature = "server")]
mod outbound;
#[cfg(feature = "server")]
mod paths;
#[cfg(feature = "server")]
mod process;
#[cfg(feature = "server")]
mod rpc;
#[cfg(feature = "server")]
mod sandboxing;
#[cfg(feature = "server")]
pub mod server;
#[cfg(feature = "server")]
mod session;
#[cfg(feature = "server")]
mod state;
// The only unsafe code of the crate: raw calls, each behind a safe wrapper.
#[cfg(feature = "server")]
#[allow(unsafe_code)]
mod sys;
#[cfg(feature = "server")]
mod transport;
#[cfg(feature = "server")]
mod untrusted;

// The client (feature `client`): the library, and `exec_cmd`, the `exec` subcommand of the
// `exec-server` binary (it parses with `cli`, so it builds with `server`, which includes
// `client`).
#[cfg(feature = "client")]
pub mod client;
#[cfg(feature = "server")]
pub mod exec_cmd;
#[cfg(feature = "server")]
pub mod ps_cmd;

// Remote mode (feature `remote`): the relay glue both ends share, the harness end (with
// `client`) and the executor end (with `server`).
#[cfg(feature = "remote")]
pub mod relay;

// The reference registry + rendezvous (feature `rendezvous`).
#[cfg(feature = "rendezvous")]
pub mod rendezvous;
/// The JSON Schema of the rendezvous credentials file (feature `schema`, for docs/schema/).
#[cfg(feature = "schema")]
pub use rendezvous::credentials::file_schema as rendezvous_credentials_schema;

// When a client may send a token over plain text (both clients ask it).
#[cfg(any(feature = "client", feature = "remote"))]
mod plain_text;

// Error text shared by the server's and the relay's messages.
#[cfg(any(feature = "server", feature = "remote"))]
mod error_text;

// Every limit, with its unit and reason (all features; the protocol limits clients rely on come
// from `proto::limits`).
pub mod limits;

#[cfg(feature = "client")]
pub use client::{
    CLIENT_EVENT_BUFFER_BYTES, ConnectionState, ExecServerClient, ExecServerClientConnectOptions,
    ExecServerError, HttpBody, HttpRequest, HttpResponseData, HttpStreamResponse, ProcessEvent,
    ProcessHandle, RemoteProcess,
};
#[cfg(all(feature = "client", feature = "remote"))]
pub use client::{RelayTransport, RemoteExecServerConnectArgs};
#[cfg(feature = "server")]
pub use listen::{DEFAULT_LISTEN_URL, ExecServerListenUrlParseError, ListenAddress};
#[cfg(feature = "server")]
pub use paths::{ExecServerRuntimePaths, RuntimePathsError};
/// `exec-guardian`'s side of the guardian protocol (the binary is a call to
/// [`guardian::serve`]).
#[cfg(feature = "server")]
pub use process::guardian;
pub use proto::FileUri;
pub use proto::methods as protocol;
/// The server's start-up error. (`ExecServerError` is the client's error, as in the seeds' Rust
/// surface.)
#[cfg(feature = "server")]
pub use server::ExecServerError as ExecServerStartError;
#[cfg(feature = "server")]
pub use server::{BoundServer, ServerOptions, run_main, run_main_with_options};
#[cfg(feature = "server")]
pub use sys::tune_allocator;
