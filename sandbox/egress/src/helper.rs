//! The `egress-proxy` process: take the descriptors the outer handed over, read the
//! configuration, confine itself, serve.
//!
//! Order: die with the outer (`PR_SET_PDEATHSIG`), take the descriptors, read the
//! configuration and this host's addresses, then confine (descriptors closed but the listener
//! and the event pipe, environment cleared, no capabilities, Landlock with no write rule but
//! `/dev/null` and the supervisor's ports refused, seccomp with the network on), and only then
//! start threads.

use std::net::TcpListener;
use std::os::fd::AsRawFd;

use sandbox::linux::{EnforceOptions, restrict_current_process};
use sandbox::policy::{ResolveContext, ResolvedPolicy, SandboxSpec};

use super::server::{Proxy, local_addresses, serve};

/// Why the proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    /// A descriptor named on the command line is not open.
    #[error("descriptor {fd} ({what}) is not usable: {source}")]
    Descriptor {
        /// Which one.
        what: &'static str,
        /// Its number.
        fd: i32,
        /// The OS error.
        source: std::io::Error,
    },
    /// The configuration could not be read.
    #[error(transparent)]
    Config(#[from] sandbox::egress::launch::ConfigReadError),
    /// The proxy's own policy could not be built.
    #[error("building the proxy's own policy failed: {0}")]
    Policy(#[from] sandbox::policy::PolicyError),
    /// The inspection CA or the upstream roots could not be made.
    #[error("setting up TLS inspection failed: {0}")]
    Inspection(String),
    /// Confinement failed.
    #[error(transparent)]
    Sandbox(#[from] sandbox::linux::SandboxError),
}

/// The descriptors `egress-proxy` gets.
#[derive(Clone, Copy, Debug)]
pub struct HelperFds {
    /// The listening socket (in the sandbox's network namespace).
    pub listen: i32,
    /// Where events go.
    pub events: i32,
    /// The configuration memfd.
    pub config: i32,
    /// The question socket (asking before refusing), when the outer asks.
    pub ask: Option<i32>,
    /// Where the inspection CA's certificate goes ([`sandbox::egress::trust`]), when a pattern asks
    /// for `inspect=true`.
    pub ca: Option<i32>,
    /// The outer's pid: when the proxy's parent is no longer it, the outer is gone.
    pub parent: u32,
}

/// The proxy's own policy: read everywhere, write nowhere but `/dev/null`, the network on
/// except the supervisor's ports.
///
/// # Errors
/// [`HelperError::Policy`].
pub fn proxy_policy(denied_ports: &[u16]) -> Result<ResolvedPolicy, HelperError> {
    let mut policy = SandboxSpec::named("read-only", None)
        .resolve_with(&ResolveContext::default())?
        .with_network(true);
    for port in denied_ports {
        policy = policy.with_denied_tcp_port(*port);
    }
    Ok(policy)
}

/// Runs the proxy. Returns only on a setup failure.
///
/// # Errors
/// [`HelperError`].
pub fn run(fds: HelperFds) -> Result<std::convert::Infallible, HelperError> {
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
    if std::os::unix::process::parent_id() != fds.parent {
        // The outer died before the death signal was armed.
        std::process::exit(1);
    }
    let take =
        |what: &'static str, fd: i32| {
            sandbox::linux::hygiene::take_inherited_fd(fd)
                .map_err(|source| HelperError::Descriptor { what, fd, source })
        };
    let listen = take("listener", fds.listen)?;
    let events = take("event pipe", fds.events)?;
    let config = sandbox::egress::launch::read_config(take("configuration", fds.config)?)?;
    let ask = fds.ask.map(|fd| take("question socket", fd)).transpose()?;
    let ca_channel = fds.ca.map(|fd| take("CA channel", fd)).transpose()?;
    let locals = local_addresses();
    // The inspection CA (its key in this process's memory only) and the upstream roots, read
    // before confinement; only when a pattern asks for inspection.
    let terminator = if config.rules.inspects_any() {
        Some(
            super::terminate::Terminator::new(config.upstream_roots.as_deref())
                .map_err(HelperError::Inspection)?,
        )
    } else {
        None
    };
    // The certificate (never the key) to the outer, which relays it to PID 1; the channel
    // closes here, before confinement.
    if let (Some(channel), Some(terminator)) = (ca_channel, &terminator) {
        sandbox::egress::trust::InspectionCa {
            certificate_pem: terminator.ca_pem(),
        }
        .send(std::fs::File::from(channel))
        .map_err(|err| HelperError::Inspection(err.to_string()))?;
    }
    let policy = proxy_policy(&config.denied_ports)?;
    let mut kept = vec![listen.as_raw_fd(), events.as_raw_fd()];
    kept.extend(ask.as_ref().map(AsRawFd::as_raw_fd));
    let options = EnforceOptions::for_helper(&kept);
    restrict_current_process(&policy, &options)?;
    let listener = TcpListener::from(listen);
    // Threads only now, confined.
    let asker = match (ask, &config.ask) {
        (Some(socket), Some(ask)) => Some(
            sandbox::egress::ask::Asker::start(
                socket,
                std::time::Duration::from_millis(ask.timeout_ms),
            )
            .map_err(|source| HelperError::Descriptor {
                what: "question socket",
                fd: fds.ask.unwrap_or(-1),
                source,
            })?,
        ),
        _ => None,
    };
    serve(
        listener,
        Proxy::new(config, locals, std::fs::File::from(events))
            .with_asker(asker)
            .with_terminator(terminator),
    )
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::proxy_policy;

    #[test]
    fn the_proxys_policy_writes_nowhere_and_refuses_the_supervisors_ports() {
        let policy = proxy_policy(&[4242]).unwrap();
        let writable: Vec<_> = policy
            .writable_roots()
            .into_iter()
            .map(|w| w.root)
            .collect();
        assert_eq!(writable, [Path::new("/dev/null")], "{policy:?}");
        for path in [
            "/",
            "/tmp",
            "/tmp/x",
            "/root",
            "/etc/passwd",
            "/proc/self/mem",
        ] {
            assert!(
                !policy.can_write(Path::new(path)),
                "{path} writable: {policy:?}"
            );
        }
        assert!(policy.can_read(Path::new("/etc/hosts")), "{policy:?}");
        assert!(policy.tmpdir.is_none(), "{policy:?}");
        assert_eq!(policy.denied_tcp_ports, [4242]);
    }
}
