//! execward's supervisor: the `exec-server` binary's library.
//!
//! A client connects over a websocket (TCP or unix socket), speaks JSON-RPC (see
//! `docs/protocol.md`), and drives processes and files. The server holds no extra privilege and
//! never sandboxes itself; sandboxed work is done by separately exec'd helpers whose paths are
//! given by [`ExecServerRuntimePaths`].
//!
//! Embedding:
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use supervisor::{DEFAULT_LISTEN_URL, ExecServerRuntimePaths, run_main};
//! run_main(DEFAULT_LISTEN_URL, ExecServerRuntimePaths::next_to_current_exe()?).await?;
//! # Ok(()) }
//! ```

pub mod budget;
pub mod cli;
pub mod client;
pub mod containment;
pub mod cpu_pool;
pub mod environment;
pub mod exec_cmd;
pub mod fs;
pub mod http;
pub mod limits;
pub mod listen;
pub mod outbound;
pub mod paths;
pub mod process;
pub mod relay;
pub mod rendezvous;
pub mod rpc;
pub mod sandboxing;
pub mod server;
pub mod session;
pub mod state;
mod sys;
pub mod transport;
pub mod untrusted;

pub use client::{
    CLIENT_EVENT_BUFFER_BYTES, ConnectionState, ExecServerClient, ExecServerClientConnectOptions,
    ExecServerError, HttpBody, HttpRequest, HttpResponseData, HttpStreamResponse, ProcessEvent,
    ProcessHandle, RelayTransport, RemoteExecServerConnectArgs, RemoteProcess,
};
pub use listen::{DEFAULT_LISTEN_URL, ExecServerListenUrlParseError, ListenAddress};
pub use paths::ExecServerRuntimePaths;
pub use proto::FileUri;
pub use proto::methods as protocol;
/// The server's start-up error. (`ExecServerError` is the client's error, as in the seeds' Rust
/// surface.)
pub use server::ExecServerError as ExecServerStartError;
pub use server::{BoundServer, ServerOptions, run_main, run_main_with_options};
pub use sys::tune_allocator;
