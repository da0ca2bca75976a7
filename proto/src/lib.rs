//! Wire types of the execward protocol: no I/O lives here.
//!
//! - [`jsonrpc`]: the JSON-RPC envelope as the reference speaks it (the `"jsonrpc"` member is
//!   optional on input and never produced), request ids that are integers or strings.
//! - [`error`]: the error codes, the machine-readable `data.kind`, and [`error::RpcError`].
//! - [`uri`]: [`uri::FileUri`], the `file:` URI every path on the wire is written as.
//! - [`methods`]: typed params and results of every method and notification.
//! - [`limits`]: the protocol limits both ends rely on (the server enforces them, clients size
//!   their requests by them).
//!
//! - `relay` (feature `relay`, on by default): the relay frames of remote mode (protobuf), the
//!   sans-I/O reliable stream and Noise. Without it, neither prost nor snow is built.
//! - `schema` (feature `schema`, off by default): `JsonSchema` for the wire types and the schema
//!   of every message (`docs/schema/` is generated from it).
#![forbid(unsafe_code)]

pub mod error;
pub mod jsonrpc;
pub mod limits;
pub mod methods;
#[cfg(feature = "relay")]
pub mod relay;
#[cfg(feature = "schema")]
pub mod schema;
pub mod uri;

pub use error::{ErrorData, ErrorKind, RpcError};
pub use jsonrpc::{Message, RequestId};
pub use uri::FileUri;
