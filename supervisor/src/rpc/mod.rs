//! JSON-RPC over one websocket: the connection loop ([`connection`]), the state its requests
//! share ([`shared`]), method routing ([`dispatch`]) and the one mapping from internal errors to
//! JSON-RPC errors ([`errors`]). The loop imports the routing, the routing imports the shared
//! state; never the other way.

pub mod connection;
pub mod dispatch;
pub mod errors;
pub mod shared;
