//! `exec-rendezvous`: the reference registry + rendezvous for remote mode (in memory).
//!
//! Prints its `http(s)://HOST:PORT` as the first stdout line, serves until SIGINT/SIGTERM,
//! rereads its credentials file on SIGHUP. See docs/remote.md.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use supervisor::rendezvous::{Rendezvous, RendezvousOptions};
use supervisor::server::{ShutdownSignals, announce_url};

/// Reference registry + rendezvous for execward's remote mode: executors register and hold one
/// websocket each; harnesses look them up and open relay streams; frames are routed by stream id
/// and never decrypted. State is in memory. Every request needs `Authorization: Bearer <token>`
/// with a token of the credentials file (--credentials): executor tokens register and serve
/// environments, harness tokens connect to them, admin tokens release key bindings. SIGHUP
/// rereads the file.
#[derive(Debug, Parser)]
#[command(name = "exec-rendezvous", version, about, long_about)]
struct Cli {
    /// Where to listen: IP:PORT, http://IP:PORT, or https://IP:PORT (needs --tls-cert and
    /// --tls-key; a bare IP:PORT serves TLS when they are given). Port 0 picks a free port.
    #[arg(
        long,
        value_name = "[http[s]://]IP:PORT",
        default_value = "127.0.0.1:0"
    )]
    listen: String,
    /// The credentials file (TOML: `[[executor]]`, `[[harness]]`, `[[admin]]` tokens,
    /// optional `[[environment]]` key pins). See docs/remote.md.
    #[arg(long, value_name = "FILE")]
    credentials: PathBuf,
    /// Serve TLS (https:// and wss://) with this PEM certificate chain.
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Base ws(s):// URL handed to endpoints for their websockets (default: ws:// and the
    /// listen address, wss:// with TLS).
    #[arg(long, value_name = "URL")]
    public_url: Option<String>,
    /// Websockets (executor and harness) one credential may hold at once; more are refused
    /// with 503, so one token cannot take every socket the rendezvous has.
    #[arg(
        long,
        value_name = "N",
        default_value_t = supervisor::rendezvous::MAX_SOCKETS_PER_CREDENTIAL,
        value_parser = at_least_one
    )]
    max_sockets_per_credential: usize,
    /// Log format on stderr: text (coloured only on a terminal) or json (one object per line).
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = supervisor::cli::LogFormat::Text)]
    log_format: supervisor::cli::LogFormat,
}

fn main() -> ExitCode {
    supervisor::tune_allocator();
    let cli = Cli::parse();
    supervisor::cli::init_logging(cli.log_format);
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!(
                "exec-rendezvous: {}",
                supervisor::cli::describe_error(error.as_ref())
            );
            ExitCode::from(2)
        }
    }
}

/// A count of at least 1.
fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(count) => Ok(count),
        Err(error) => Err(format!("expected a whole number: {error}")),
    }
}

/// `IP:PORT`, `http://IP:PORT` or `https://IP:PORT`: the address, and the scheme asked for
/// (`None` for a bare address).
fn parse_listen(listen: &str) -> anyhow::Result<(SocketAddr, Option<bool>)> {
    let (rest, https) = match listen.split_once("://") {
        Some(("http", rest)) => (rest, Some(false)),
        Some(("https", rest)) => (rest, Some(true)),
        Some((scheme, _)) => {
            anyhow::bail!("--listen {listen:?}: scheme {scheme:?} is not http or https")
        }
        None => (listen, None),
    };
    let address = rest.trim_end_matches('/').parse().map_err(|e| {
        anyhow::anyhow!(
            "--listen {listen:?} must be IP:PORT, http://IP:PORT or https://IP:PORT ({e})"
        )
    })?;
    Ok((address, https))
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let (listen, https) = parse_listen(&cli.listen)?;
    let tls = cli.tls_cert.zip(cli.tls_key);
    match (https, tls.is_some()) {
        (Some(true), false) => {
            anyhow::bail!("--listen {} needs --tls-cert and --tls-key", cli.listen)
        }
        (Some(false), true) => anyhow::bail!(
            "--listen {} is plain HTTP but --tls-cert was given; use https://IP:PORT",
            cli.listen
        ),
        _ => {}
    }
    let options = RendezvousOptions {
        listen,
        credentials_file: cli.credentials,
        tls,
        public_url: cli.public_url,
        max_sockets_per_credential: cli.max_sockets_per_credential,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let shutdown = ShutdownSignals::install()?;
        let mut hangups =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
        let rendezvous = Rendezvous::bind(options).await?;
        let reloader = rendezvous.reloader();
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                match reloader.reload() {
                    Ok(()) => tracing::info!("credentials reloaded"),
                    Err(error) => {
                        tracing::error!(%error, "credentials not reloaded; the previous ones stay in force");
                    }
                }
            }
        });
        announce_url(&rendezvous.url())?;
        tracing::info!(url = %rendezvous.url(), "rendezvous listening");
        rendezvous.serve_until(shutdown.recv()).await;
        anyhow::Ok(())
    })
}
