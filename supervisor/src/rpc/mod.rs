//! JSON-RPC over one websocket: the connection loop ([`connection`]), method routing
//! ([`dispatch`]) and the one mapping from internal errors to JSON-RPC errors ([`errors`]).

pub mod connection;
pub mod dispatch;
pub mod errors;
