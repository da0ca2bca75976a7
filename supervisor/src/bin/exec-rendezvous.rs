//! `exec-rendezvous`: the reference registry + rendezvous for remote mode (in memory).
//!
//! Prints its `http(s)://HOST:PORT` as the first stdout line, serves until SIGINT/SIGTERM,
//! rereads its credentials file on SIGHUP. See docs/remote.md.

#![deny(unsafe_code)]

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use supervisor::rendezvous::cli::Cli;
use supervisor::rendezvous::cluster::ClusterOptions;
use supervisor::rendezvous::{Rendezvous, RendezvousOptions};
use supervisor::server::{ShutdownSignals, announce_url};

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
            ExitCode::from(supervisor::cli::server_failure_status(&error))
        }
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
        max_streams_per_credential: cli.max_streams_per_credential,
        max_environments: cli.max_environments,
        cluster: cli.node_name.map(|node_name| ClusterOptions {
            urls: cli.cluster,
            node_name,
            creds_file: cli.nats_creds,
            ca_file: cli.nats_ca_file,
        }),
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
