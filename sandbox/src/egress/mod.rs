//! The sandbox's side of the egress proxy, the only way out of a sandbox whose network is an
//! allowlist. The proxy itself is the `egress` crate (binary `egress-proxy`, which the outer
//! `sandbox-run` execs from its own directory); what both sides share is here:
//!
//! - [`config`]: what the outer hands the proxy ([`ProxyConfig`]) and what the proxy reports
//!   back ([`EgressEvent`], turned into denial records: layer `proxy`, operation
//!   `net.connect`);
//! - [`hosts`]: the `--egress-hosts` mapping; [`credentials`]: the upstream proxy's;
//! - [`ask`]: asking a person (or exec-server's client) before a refusal is final;
//! - [`trust`]: the inspection CA installed inside the sandbox (`inspect=true`);
//! - [`launch`]: the outer's side: exec the proxy, read its events, stop it.

pub mod ask;
pub mod config;
pub mod credentials;
pub mod hosts;
pub mod trust;

#[cfg(target_os = "linux")]
pub mod launch;

pub use config::{EgressEvent, ProxyConfig};

/// Name of the proxy binary, found next to `sandbox-run`.
pub const PROXY_BINARY: &str = "egress-proxy";
