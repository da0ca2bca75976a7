//! The `exec-rendezvous` command line (here, not in the binary, so its man page and shell
//! completions are generated from the same definition).

use std::path::PathBuf;

use clap::Parser;

/// Reference registry + rendezvous for execward's remote mode: executors register and hold one
/// websocket each; harnesses look them up and open relay streams; frames are routed by stream id
/// and never decrypted. State is in memory. Every request needs `Authorization: Bearer <token>`
/// with a token of the credentials file (--credentials): executor tokens register and serve
/// environments, harness tokens connect to them, admin tokens release key bindings. SIGHUP
/// rereads the file.
///
/// Exit status: 0 after a clean shutdown (SIGINT, SIGTERM); 2 when the command line or a file it
/// names is wrong (listen address, credentials file, certificate, --nats-creds); 1 when the OS
/// refused the bind or NATS (--cluster) could not be reached or did not prove itself (its
/// certificate).
#[derive(Debug, Parser)]
#[command(name = "exec-rendezvous", version, about, long_about)]
pub struct Cli {
    /// Where to listen: IP:PORT, http://IP:PORT, or https://IP:PORT (needs --tls-cert and
    /// --tls-key; a bare IP:PORT serves TLS when they are given). Port 0 picks a free port.
    #[arg(
        long,
        value_name = "[http[s]://]IP:PORT",
        default_value = "127.0.0.1:0"
    )]
    pub listen: String,
    /// The credentials file (TOML: `[[executor]]`, `[[harness]]`, `[[admin]]` tokens,
    /// optional `[[environment]]` key pins). See docs/remote.md.
    #[arg(long, value_name = "FILE")]
    pub credentials: PathBuf,
    /// Serve TLS (https:// and wss://) with this PEM certificate chain.
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Base ws(s):// URL handed to endpoints for their websockets (default: ws:// and the
    /// listen address, wss:// with TLS).
    #[arg(long, value_name = "URL")]
    pub public_url: Option<String>,
    /// Websockets (executor and harness) one credential may hold at once; more are refused
    /// with 503, so one token cannot take every socket the rendezvous has.
    #[arg(
        long,
        value_name = "N",
        default_value_t = crate::rendezvous::MAX_SOCKETS_PER_CREDENTIAL,
        value_parser = at_least_one
    )]
    pub max_sockets_per_credential: usize,
    /// Streams of one environment that the sockets of one harness credential may own
    /// together; frames opening more are dropped, so one credential cannot take every stream
    /// of an executor however many sockets it opens.
    #[arg(
        long,
        value_name = "N",
        default_value_t = crate::rendezvous::MAX_STREAMS_PER_CREDENTIAL,
        value_parser = at_least_one
    )]
    pub max_streams_per_credential: usize,
    /// Environments bound at once (on this node, or across the cluster with --cluster): a
    /// registration of one more new id is refused until an operator releases one, so an
    /// executor credential granted "*" cannot grow the registry without end.
    #[arg(
        long,
        value_name = "N",
        default_value_t = crate::rendezvous::MAX_ENVIRONMENTS,
        value_parser = at_least_one
    )]
    pub max_environments: usize,
    /// Make this node one of a cluster sharing its registry and routing through NATS
    /// (nats-server with JetStream): one or more nats://HOST:PORT or tls://HOST:PORT, comma
    /// separated. Without it the rendezvous is one process with its state in memory. See
    /// docs/remote.md "Scaling the rendezvous".
    #[arg(
        long,
        value_name = "URL[,URL...]",
        value_delimiter = ',',
        requires = "node_name"
    )]
    pub cluster: Vec<String>,
    /// This node's name in the cluster (in leases and logs): 1 to 64 bytes of A-Z a-z 0-9 . _ -.
    #[arg(long, value_name = "NAME", requires = "cluster")]
    pub node_name: Option<String>,
    /// NATS credentials file (JWT and nkey seed) for --cluster.
    #[arg(
        long,
        value_name = "FILE",
        env = "EXECWARD_NATS_CREDS",
        requires = "cluster"
    )]
    pub nats_creds: Option<PathBuf>,
    /// Extra CA certificates (PEM) to verify tls:// NATS servers with (beside the system's).
    #[arg(long, value_name = "PEM", requires = "cluster")]
    pub nats_ca_file: Option<PathBuf>,
    /// Log format on stderr: text (coloured only on a terminal) or json (one object per line).
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = crate::cli::LogFormat::Text)]
    pub log_format: crate::cli::LogFormat,
}

/// A count of at least 1.
fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(count) => Ok(count),
        Err(error) => Err(format!("expected a whole number: {error}")),
    }
}
