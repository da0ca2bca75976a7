//! `exec-rendezvous`: the reference registry + rendezvous for remote mode (in memory).
//!
//! Prints its `http://HOST:PORT` as the first stdout line, serves until SIGINT/SIGTERM.
//! The bearer token comes from $EXECWARD_REGISTRY_TOKEN. See docs/remote.md.

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use supervisor::relay::REGISTRY_TOKEN_ENV;
use supervisor::rendezvous::{Rendezvous, RendezvousOptions};
use supervisor::server::{ShutdownSignals, announce_url};

/// Reference registry + rendezvous for execward's remote mode: executors register and hold one
/// websocket each; harnesses look them up and open relay streams; frames are routed by stream id
/// and never decrypted. State is in memory. Every request needs
/// `Authorization: Bearer $EXECWARD_REGISTRY_TOKEN`.
#[derive(Debug, Parser)]
#[command(name = "exec-rendezvous", version, about, long_about)]
struct Cli {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, value_name = "IP:PORT", default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Base ws:// URL handed to endpoints for their websockets (default: ws://<listen address>).
    #[arg(long, value_name = "URL")]
    public_url: Option<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    supervisor::cli::init_logging();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("exec-rendezvous: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let token = std::env::var(REGISTRY_TOKEN_ENV).unwrap_or_default();
    if token.trim().is_empty() {
        anyhow::bail!("set ${REGISTRY_TOKEN_ENV} to the bearer token clients must present");
    }
    let options = RendezvousOptions {
        listen: cli.listen,
        token: token.trim().to_owned(),
        public_url: cli.public_url,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let shutdown = ShutdownSignals::install()?;
        let rendezvous = Rendezvous::bind(options).await?;
        announce_url(&rendezvous.url())?;
        tracing::info!(url = %rendezvous.url(), "rendezvous listening");
        rendezvous.serve_until(shutdown.recv()).await;
        anyhow::Ok(())
    })
}
