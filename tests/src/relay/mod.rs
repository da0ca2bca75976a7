//! Remote-mode test support: the real `exec-rendezvous` and `exec-server --remote` processes, a
//! JSON-RPC client over a relay stream, and a websocket proxy that records frames and injects
//! faults (drop, duplicate, reorder, delay) on the links to the rendezvous.
//!
//! Split by concern, every item re-exported here: `process` (the rendezvous and executor
//! processes), `client` ([`RemoteClient`]) and `proxy` (the fault-injecting [`Proxy`]).

mod client;
mod process;
mod proxy;

pub use client::RemoteClient;
pub use process::{
    Process, connect_args, start_executor, start_executor_with, start_rendezvous,
    start_rendezvous_with, wait_registered, wait_registered_with,
};
pub use proxy::{Faults, Proxy};

use supervisor::relay::registry::RegistryClient;

use crate::{DEADLINE, exec_server_binary};

/// The harness credential every remote test uses (granted every environment).
pub const TOKEN: &str = "relay-test-harness-token";
/// The executor credential every remote test uses (granted every environment).
pub const EXECUTOR_TOKEN: &str = "relay-test-executor-token";
/// The admin credential (releases key bindings).
pub const ADMIN_TOKEN: &str = "relay-test-admin-token";
/// An executor credential granted only `env-narrow` (403 elsewhere).
pub const NARROW_EXECUTOR_TOKEN: &str = "relay-test-narrow-executor";
/// A second harness credential (granted every environment): another party than [`TOKEN`]'s,
/// for tests where one harness attacks and another must not notice (quotas are per credential).
pub const ATTACKER_TOKEN: &str = "relay-test-attacking-harness";

/// The credentials file of every test rendezvous.
pub fn credentials_toml() -> String {
    format!(
        r#"[[executor]]
token = "{EXECUTOR_TOKEN}"
environments = ["*"]

[[executor]]
token = "{NARROW_EXECUTOR_TOKEN}"
environments = ["env-narrow"]

[[harness]]
token = "{TOKEN}"
environments = ["*"]

[[harness]]
token = "{ATTACKER_TOKEN}"
environments = ["*"]

[[admin]]
token = "{ADMIN_TOKEN}"
"#
    )
}

fn binary(name: &str) -> std::path::PathBuf {
    exec_server_binary().with_file_name(name)
}

/// The TLS client settings of the test registries: system roots plus `ca_file`.
pub fn client_tls(
    registry_url: &str,
    ca_file: Option<&std::path::Path>,
) -> std::sync::Arc<rustls::ClientConfig> {
    supervisor::relay::tls::client_config_for(registry_url, ca_file).unwrap()
}

/// A registry client for a test registry (plain loopback, or TLS trusting `ca_file`).
pub fn registry_client(registry_url: &str, ca_file: Option<&std::path::Path>) -> RegistryClient {
    RegistryClient::new(registry_url, &client_tls(registry_url, ca_file)).unwrap()
}

/// [`supervisor::ExecServerClient`] connection arguments for the test token.
pub fn remote_client_args(
    registry_url: &str,
    environment_id: &str,
) -> supervisor::RemoteExecServerConnectArgs {
    supervisor::RemoteExecServerConnectArgs::new(registry_url, environment_id, TOKEN)
        .with_client_name("relay-tests")
}

/// The library client through the rendezvous (connected and initialized within [`DEADLINE`]).
pub async fn remote_library_client(
    registry_url: &str,
    environment_id: &str,
) -> supervisor::ExecServerClient {
    tokio::time::timeout(
        DEADLINE,
        supervisor::ExecServerClient::connect_remote(remote_client_args(
            registry_url,
            environment_id,
        )),
    )
    .await
    .unwrap_or_else(|_| panic!("connecting to {environment_id} took over {DEADLINE:?}"))
    .unwrap_or_else(|e| panic!("connect to {environment_id}: {e}"))
}

/// A throwaway CA and a server certificate it signed for `localhost` and `127.0.0.1`, as PEM
/// files in a temporary directory (generated with rcgen for each test).
pub struct TestCa {
    /// The directory holding the files.
    pub dir: tempfile::TempDir,
    /// The CA certificate (what clients pass as --ca-file).
    pub ca_file: std::path::PathBuf,
    /// The server's certificate chain.
    pub cert_file: std::path::PathBuf,
    /// The server's private key.
    pub key_file: std::path::PathBuf,
}

impl TestCa {
    /// Generate the CA and the server certificate.
    pub fn generate() -> TestCa {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
        };
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "execward test CA");
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let server_key = KeyPair::generate().unwrap();
        let mut server_params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        server_params
            .distinguished_name
            .push(DnType::CommonName, "execward test rendezvous");
        let server_cert = server_params.signed_by(&server_key, &issuer).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.pem");
        let cert_file = dir.path().join("rendezvous.pem");
        let key_file = dir.path().join("rendezvous-key.pem");
        std::fs::write(&ca_file, ca_cert.pem()).unwrap();
        std::fs::write(&cert_file, server_cert.pem()).unwrap();
        std::fs::write(&key_file, server_key.serialize_pem()).unwrap();
        TestCa {
            dir,
            ca_file,
            cert_file,
            key_file,
        }
    }
}
