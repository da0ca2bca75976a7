//! Sending one `http/request` exchange: resolve and check the target, send on a pooled client
//! pinned to the checked addresses, follow redirects hop by hop with the same checks.
//!
//! Pinning: a name is resolved here (`HttpClients::resolve_checked`) and the reqwest client
//! that carries the request is built with exactly those addresses (`resolve_to_addrs`); its own
//! resolver refuses every lookup, so nothing reqwest does can reach an address that was not
//! checked.
//! Clients are cached per (host, checked addresses), so connections are pooled across requests
//! to the same server, and a name that starts resolving elsewhere gets a fresh check and a fresh
//! client. Redirects are followed here, not by reqwest, so every hop is checked the same way.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use proto::methods::http::HttpRedirectPolicy;
use reqwest::header::{AUTHORIZATION, COOKIE, HeaderMap, LOCATION, PROXY_AUTHORIZATION};
use reqwest::{Method, StatusCode, Url};
use tokio::time::Instant;

use super::targets::{RunningHost, TargetPolicy};
use super::{AllowlistRefusal, HttpError};
use crate::limits::{
    HTTP_CLIENT_CACHE_ENTRIES, HTTP_POOL_IDLE_TIMEOUT, HTTP_POOL_MAX_IDLE_PER_HOST,
    MAX_HTTP_REDIRECTS,
};

/// One request as it goes out (the same for every redirect hop, except what a redirect
/// changes).
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// The method.
    pub method: Method,
    /// The URL.
    pub url: Url,
    /// Headers in order.
    pub headers: HeaderMap,
    /// The body.
    pub body: Option<Vec<u8>>,
}

/// Key of a cached client: the host name (empty for an IP literal) and the checked addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PinKey {
    host: String,
    addresses: Vec<SocketAddr>,
}

/// Server-wide HTTP machinery: the server's listeners, TLS roots, and the client cache.
pub struct HttpClients {
    host: RunningHost,
    tls: OnceLock<Result<rustls::ClientConfig, rustls::Error>>,
    cache: Mutex<VecDeque<(PinKey, reqwest::Client)>>,
}

impl HttpClients {
    /// Clients for a server listening on `listeners`.
    pub fn new(listeners: Vec<SocketAddr>) -> Self {
        Self {
            host: RunningHost::new(listeners),
            tls: OnceLock::new(),
            cache: Mutex::new(VecDeque::new()),
        }
    }

    /// Send `outgoing` under `policy`, following redirects unless `redirects` says stop, within
    /// `deadline`.
    ///
    /// # Errors
    /// [`HttpError`]: a refused target, a failed resolution, a timeout, an upstream failure,
    /// too many redirects.
    pub async fn send(
        &self,
        mut outgoing: Outgoing,
        policy: &TargetPolicy,
        redirects: HttpRedirectPolicy,
        deadline: Option<Instant>,
        timeout_ms: Option<u64>,
    ) -> Result<reqwest::Response, HttpError> {
        for _hop in 0..=MAX_HTTP_REDIRECTS {
            if policy.egress.is_some() {
                check_host_header(&outgoing)?;
            }
            let client = self.pinned_client(&outgoing.url, policy).await?;
            if let Some(rules) = &policy.egress {
                check_request_scope(rules, &outgoing)?;
            }
            let mut request = client
                .request(outgoing.method.clone(), outgoing.url.clone())
                .headers(outgoing.headers.clone());
            if let Some(body) = &outgoing.body {
                request = request.body(body.clone());
            }
            if let Some(deadline) = deadline {
                let remaining = deadline.saturating_duration_since(Instant::now());
                if remaining.is_zero() {
                    return Err(HttpError::TimedOut {
                        timeout_ms: timeout_ms.unwrap_or(0),
                    });
                }
                request = request.timeout(remaining);
            }
            let response = request
                .send()
                .await
                .map_err(|error| HttpError::upstream(&outgoing.url, error, timeout_ms))?;
            match redirect(&outgoing, &response) {
                Some(next) if redirects == HttpRedirectPolicy::Follow => outgoing = next,
                _ => return Ok(response),
            }
        }
        Err(HttpError::TooManyRedirects {
            url: outgoing.url.to_string(),
            limit: MAX_HTTP_REDIRECTS,
        })
    }

    /// A client that can only reach the checked addresses of `url`'s host.
    async fn pinned_client(
        &self,
        url: &Url,
        policy: &TargetPolicy,
    ) -> Result<reqwest::Client, HttpError> {
        let port = url
            .port_or_known_default()
            .ok_or_else(|| HttpError::UrlWithoutPort {
                url: url.to_string(),
            })?;
        let host = url.host_str().ok_or_else(|| HttpError::UrlWithoutHost {
            url: url.to_string(),
        })?;
        if let Some(rules) = &policy.egress {
            check_allowlist(rules, host, port, url)?;
        }
        let literal = host
            .strip_prefix('[')
            .and_then(|inner| inner.strip_suffix(']'))
            .unwrap_or(host)
            .parse::<IpAddr>();
        let key = match literal {
            Ok(ip) => {
                self.check(SocketAddr::new(ip, port), url, policy)?;
                PinKey {
                    host: String::new(),
                    addresses: Vec::new(),
                }
            }
            Err(_) => {
                let name = host.to_ascii_lowercase();
                let mut addresses = self.resolve_checked(&name, port, url, policy).await?;
                addresses.sort();
                PinKey {
                    host: name,
                    addresses,
                }
            }
        };
        let tls = self.tls().await?;
        self.client_for(key, tls)
    }

    fn check(
        &self,
        address: SocketAddr,
        url: &Url,
        policy: &TargetPolicy,
    ) -> Result<(), HttpError> {
        policy
            .check(address, &self.host)
            .map_err(|refusal| HttpError::TargetRefused {
                url: url.to_string(),
                address,
                reason: refusal.describe(),
            })
    }

    /// Resolve `name` and check every address; one refused address refuses the name (a name
    /// that mixes allowed and refused addresses is not trusted to mean the allowed ones).
    async fn resolve_checked(
        &self,
        name: &str,
        port: u16,
        url: &Url,
        policy: &TargetPolicy,
    ) -> Result<Vec<SocketAddr>, HttpError> {
        let resolved: Vec<SocketAddr> = tokio::net::lookup_host((name, port))
            .await
            .map_err(|source| HttpError::Resolve {
                host: name.to_owned(),
                source,
            })?
            .collect();
        if resolved.is_empty() {
            return Err(HttpError::NoAddress {
                host: name.to_owned(),
            });
        }
        for address in &resolved {
            self.check(*address, url, policy)?;
        }
        Ok(resolved)
    }

    /// The TLS configuration, built once. Loading the system's trust roots reads and parses
    /// hundreds of files: it runs on the blocking pool, never on an async worker (nor under the
    /// client cache's lock, where a second request would block another worker behind it).
    async fn tls(&self) -> Result<rustls::ClientConfig, HttpError> {
        if let Some(config) = self.tls.get() {
            return config.clone().map_err(HttpError::Tls);
        }
        let built = tokio::task::spawn_blocking(tls_config)
            .await
            .unwrap_or_else(|error| Err(rustls::Error::General(error.to_string())));
        self.tls
            .get_or_init(|| built)
            .clone()
            .map_err(HttpError::Tls)
    }

    fn client_for(
        &self,
        key: PinKey,
        tls: rustls::ClientConfig,
    ) -> Result<reqwest::Client, HttpError> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(position) = cache.iter().position(|(cached, _)| *cached == key)
            && let Some(entry) = cache.remove(position)
        {
            let client = entry.1.clone();
            cache.push_back(entry);
            return Ok(client);
        }
        let mut builder = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .dns_resolver(RefuseAllLookups)
            .pool_idle_timeout(HTTP_POOL_IDLE_TIMEOUT)
            .pool_max_idle_per_host(HTTP_POOL_MAX_IDLE_PER_HOST);
        if !key.host.is_empty() {
            builder = builder.resolve_to_addrs(&key.host, &key.addresses);
        }
        let client = builder.build().map_err(HttpError::Client)?;
        if cache.len() >= HTTP_CLIENT_CACHE_ENTRIES {
            cache.pop_front();
        }
        cache.push_back((key, client.clone()));
        Ok(client)
    }
}

/// rustls with the ring provider and the system's trust roots (`SSL_CERT_FILE` and
/// `SSL_CERT_DIR` are honoured).
fn tls_config() -> Result<rustls::ClientConfig, rustls::Error> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for error in &native.errors {
        tracing::warn!(%error, "http/request: cannot load some system trust roots");
    }
    let (added, ignored) = roots.add_parsable_certificates(native.certs);
    tracing::debug!(added, ignored, "http/request: loaded system trust roots");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config)
}

/// The resolver of every client: names are resolved and checked before a client sees them, so
/// any lookup reaching this one is a bug and fails closed.
struct RefuseAllLookups;

impl reqwest::dns::Resolve for RefuseAllLookups {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let name = name.as_str().to_owned();
        Box::pin(async move { Err(format!("unchecked DNS lookup of {name} refused").into()) })
    }
}

/// With an allowlist, every `Host` header of a hop must name the hop's URL host (the check the
/// egress proxy makes, [`egress::http::host_header_names`]): otherwise a request to an
/// allowed front would be routed to any host behind it.
fn check_host_header(outgoing: &Outgoing) -> Result<(), HttpError> {
    use sandbox::policy::network::Host;
    let url = &outgoing.url;
    let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
        return Ok(());
    };
    let Ok(parsed) = Host::parse(host) else {
        // The allowlist check refuses it, naming why.
        return Ok(());
    };
    for value in outgoing.headers.get_all(reqwest::header::HOST) {
        let text = String::from_utf8_lossy(value.as_bytes());
        if !egress::http::host_header_names(&text, &parsed, port) {
            return Err(HttpError::HostHeaderMismatch {
                url: url.to_string(),
                host: parsed.to_string(),
                value: text.into_owned(),
            });
        }
    }
    Ok(())
}

/// Refuses a request (every hop, redirects included) whose method or path the matching `allow`
/// patterns limit it from (`methods=`, `paths=`). The server makes the request itself, so this
/// holds for `https://` too, which the egress proxy can only refuse whole.
fn check_request_scope(rules: &sandbox::EgressRules, outgoing: &Outgoing) -> Result<(), HttpError> {
    use sandbox::policy::network::{Host, suggested_rule};
    let url = &outgoing.url;
    let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
        return Ok(());
    };
    let Ok(parsed) = Host::parse(host) else {
        return Ok(());
    };
    let scope = rules.request_scope(&parsed, port);
    let target = match url.query() {
        Some(query) => format!("{}?{query}", url.path()),
        None => url.path().to_owned(),
    };
    let method = outgoing.method.as_str();
    if scope.permits(method, &target) {
        return Ok(());
    }
    Err(HttpError::NotInAllowlist {
        url: url.to_string(),
        host: parsed.to_string(),
        port,
        reason: AllowlistRefusal::RequestLimited {
            request: format!("{method} {target}"),
            allowed: scope.describe(),
        },
        rule: format!(
            "'{}' with that method and path (methods=, paths=)",
            suggested_rule(&parsed, port)
        ),
    })
}

/// Refuses `host:port` (of every hop, redirects included) unless the sandbox's allowlist allows
/// it by name.
fn check_allowlist(
    rules: &sandbox::EgressRules,
    host: &str,
    port: u16,
    url: &Url,
) -> Result<(), HttpError> {
    use sandbox::policy::network::{Decision, Host, Refusal, TunnelMode, suggested_rule};
    let refused =
        |named: String, reason: AllowlistRefusal, rule: String| HttpError::NotInAllowlist {
            url: url.to_string(),
            host: named,
            port,
            reason,
            rule,
        };
    let parsed = Host::parse(host).map_err(|error| {
        refused(
            host.to_owned(),
            AllowlistRefusal::BadHost(error),
            "none".to_owned(),
        )
    })?;
    match rules.decide(&parsed, port) {
        Decision::Allowed(_)
            if url.scheme() == "http"
                && rules.tunnel_mode(&parsed, port) == TunnelMode::TlsOnly =>
        {
            Err(refused(
                parsed.to_string(),
                AllowlistRefusal::PlainHttpToTlsOnly,
                "none: use https:// for this destination".to_owned(),
            ))
        }
        Decision::Allowed(_) => Ok(()),
        Decision::Denied(Refusal::NotAllowed) => Err(refused(
            parsed.to_string(),
            AllowlistRefusal::NotAllowed,
            suggested_rule(&parsed, port),
        )),
        Decision::Denied(Refusal::DeniedByRule(rule)) => Err(refused(
            parsed.to_string(),
            AllowlistRefusal::DeniedByPattern { pattern: rule },
            "none (remove the deny pattern)".to_owned(),
        )),
    }
}

/// The next hop of a redirect response, as browsers and reqwest follow it: 301/302 turn a POST
/// into a GET without body, 303 turns everything but HEAD into a GET, 307/308 keep method and
/// body; credentials are dropped when the origin changes.
fn redirect(current: &Outgoing, response: &reqwest::Response) -> Option<Outgoing> {
    let status = response.status();
    if !matches!(
        status,
        StatusCode::MOVED_PERMANENTLY
            | StatusCode::FOUND
            | StatusCode::SEE_OTHER
            | StatusCode::TEMPORARY_REDIRECT
            | StatusCode::PERMANENT_REDIRECT
    ) {
        return None;
    }
    let location = response.headers().get(LOCATION)?.to_str().ok()?;
    let url = current.url.join(location).ok()?;
    if !matches!(url.scheme(), "http" | "https") {
        return None;
    }
    let mut next = current.clone();
    let to_get = match status {
        StatusCode::SEE_OTHER => current.method != Method::HEAD,
        StatusCode::MOVED_PERMANENTLY | StatusCode::FOUND => current.method == Method::POST,
        _ => false,
    };
    if to_get {
        next.method = Method::GET;
        next.body = None;
        for name in ["content-type", "content-length", "content-encoding"] {
            next.headers.remove(name);
        }
    }
    if url.origin() != current.url.origin() {
        for name in [AUTHORIZATION, COOKIE, PROXY_AUTHORIZATION] {
            next.headers.remove(name);
        }
    }
    next.url = url;
    Some(next)
}

/// Deadline of a request with `timeoutMs`.
pub fn deadline(timeout_ms: Option<u64>) -> Option<Instant> {
    timeout_ms.map(|ms| Instant::now() + Duration::from_millis(ms))
}
