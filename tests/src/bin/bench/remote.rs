//! The remote group: the relay against a local websocket, throughput and request latency.
//!
//! Remote mode: the relay through a local exec-rendezvous against the same executor's local
//! websocket. Both sides use the library client (`ExecServerClient`), so the figures differ only
//! in the transport: one websocket vs. harness -> rendezvous -> executor with Noise and the
//! endpoints' reliability layer.

use std::process::Command;
use std::time::Instant;

use crate::cpu_seconds;
use crate::table::{Row, summary_with_p99, throughput_row};
use crate::{Server, bin_dir};

/// Harness credential of the bench's own rendezvous (handed to its children through the
/// environment).
const BENCH_REGISTRY_TOKEN: &str = "execward-bench-harness-token";
/// Executor credential of the bench's own rendezvous.
const BENCH_EXECUTOR_TOKEN: &str = "execward-bench-executor-token";
/// Environment id the bench's executor registers as.
const BENCH_ENVIRONMENT: &str = "bench";
/// How long the executor may take to register.
const REGISTRATION_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// Start `binary` (next to this executable) with the bench credentials; its first stdout line
/// is its URL.
pub(crate) fn start_with_registry_token(binary: &str, args: &[&str]) -> Server {
    Server::spawn(
        Command::new(bin_dir().join(binary))
            .args(args)
            .env(supervisor::relay::REGISTRY_TOKEN_ENV, BENCH_REGISTRY_TOKEN)
            .env(supervisor::relay::EXECUTOR_TOKEN_ENV, BENCH_EXECUTOR_TOKEN),
    )
}

/// A rendezvous and one executor registered with it; `executor.url` is its local websocket.
pub(crate) struct RemoteSetup {
    rendezvous: Server,
    executor: Server,
    pub(crate) registry: String,
    _dir: tempfile::TempDir,
}

impl RemoteSetup {
    /// The processes moving its bytes: the executor and the rendezvous.
    pub(crate) fn pids(&self) -> [u32; 2] {
        [self.executor.pid(), self.rendezvous.pid()]
    }
}

pub(crate) async fn remote_setup() -> RemoteSetup {
    let dir = tempfile::tempdir().unwrap();
    let credentials = write_credentials(dir.path());
    let rendezvous = start_with_registry_token(
        "exec-rendezvous",
        &[
            "--listen",
            "127.0.0.1:0",
            "--credentials",
            credentials.to_str().unwrap(),
        ],
    );
    let registry = rendezvous.url.clone();
    let executor = start_registered_executor(&registry, &registry, dir.path()).await;
    RemoteSetup {
        rendezvous,
        executor,
        registry,
        _dir: dir,
    }
}

/// The rendezvous credentials file of the bench (one executor and one harness credential for
/// [`BENCH_ENVIRONMENT`]), written in `dir`.
pub(crate) fn write_credentials(dir: &std::path::Path) -> std::path::PathBuf {
    let credentials = dir.join("credentials.toml");
    std::fs::write(
        &credentials,
        format!(
            "[[executor]]\ntoken = \"{BENCH_EXECUTOR_TOKEN}\"\nenvironments = [\"{BENCH_ENVIRONMENT}\"]\n\n[[harness]]\ntoken = \"{BENCH_REGISTRY_TOKEN}\"\nenvironments = [\"{BENCH_ENVIRONMENT}\"]\n"
        ),
    )
    .unwrap();
    credentials
}

/// An executor that registers through `register_at` (its identity kept in `dir`), returned
/// once a harness can connect to it through `connect_at`.
pub(crate) async fn start_registered_executor(
    register_at: &str,
    connect_at: &str,
    dir: &std::path::Path,
) -> Server {
    let identity = dir.join("identity");
    let executor = start_with_registry_token(
        "exec-server",
        &[
            "--listen",
            "ws://127.0.0.1:0",
            "--remote",
            register_at,
            "--environment-id",
            BENCH_ENVIRONMENT,
            "--identity-file",
            identity.to_str().unwrap(),
            // Both ciphers, so that each has its row whatever this CPU prefers.
            "--relay-ciphers",
            "any",
        ],
    );
    let tls = supervisor::relay::tls::client_config_for(connect_at, None).unwrap();
    let client = supervisor::relay::registry::RegistryClient::new(connect_at, &tls).unwrap();
    let deadline = Instant::now() + REGISTRATION_DEADLINE;
    while client
        .connect(BENCH_ENVIRONMENT, BENCH_REGISTRY_TOKEN)
        .await
        .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "the executor did not register within {REGISTRATION_DEADLINE:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    executor
}

/// A harness's library client connected to [`BENCH_ENVIRONMENT`] through the rendezvous (or
/// cluster node) at `registry`.
pub(crate) async fn relay_client(registry: &str, name: &str) -> supervisor::ExecServerClient {
    relay_client_with(registry, name, proto::relay::CipherChoice::Auto).await
}

/// [`relay_client`] whose streams use `cipher`.
async fn relay_client_with(
    registry: &str,
    name: &str,
    cipher: proto::relay::CipherChoice,
) -> supervisor::ExecServerClient {
    supervisor::ExecServerClient::connect_remote(
        supervisor::RemoteExecServerConnectArgs::new(
            registry,
            BENCH_ENVIRONMENT,
            BENCH_REGISTRY_TOKEN,
        )
        .with_client_name(name)
        .with_cipher(cipher),
    )
    .await
    .unwrap()
}

/// (relay client, local websocket client) of the same executor; the relay streams in `cipher`
/// (`Auto`: this machine's preference).
async fn relay_and_local_clients(
    setup: &RemoteSetup,
    cipher: proto::relay::CipherChoice,
) -> (supervisor::ExecServerClient, supervisor::ExecServerClient) {
    let relay = relay_client_with(&setup.registry, "bench-relay", cipher).await;
    let local = supervisor::ExecServerClient::connect(
        supervisor::ExecServerClientConnectOptions::new(&setup.executor.url)
            .with_client_name("bench-local"),
    )
    .await
    .unwrap();
    (relay, local)
}

/// Run `argv` through the library client; the output bytes received by `closed`.
async fn library_output_bytes(
    client: &supervisor::ExecServerClient,
    process_id: &str,
    argv: &[&str],
) -> u64 {
    let mut params = tests::start_params(process_id, argv);
    params.cwd = supervisor::FileUri::from_path(std::path::Path::new("/tmp")).unwrap();
    let (_process, mut events) = client.start_process(params).await.unwrap().into_parts();
    let mut bytes = 0u64;
    while let Some(event) = events.next().await {
        match event {
            supervisor::ProcessEvent::Output { data, .. } => bytes += data.len() as u64,
            supervisor::ProcessEvent::Closed { .. } => return bytes,
            supervisor::ProcessEvent::Failed { error } => panic!("{process_id} failed: {error}"),
            _ => {}
        }
    }
    panic!("the events of {process_id} ended without closed");
}

/// MiB/s of `head -c MIB /dev/zero` through `ours` and through `baseline` (each named for its
/// process ids and messages), `runs` times each, alternating which goes first so neither always
/// runs on a warmer machine; every byte must arrive.
pub(crate) async fn alternating_output(
    ours: (&supervisor::ExecServerClient, &str),
    baseline: (&supervisor::ExecServerClient, &str),
    mib: u64,
    runs: usize,
) -> (Vec<f64>, Vec<f64>) {
    let [ours, baseline] = alternating_output_cpu(
        [(ours.0, ours.1, &[]), (baseline.0, baseline.1, &[])],
        mib,
        runs,
    )
    .await;
    (ours.rates, baseline.rates)
}

/// One side of [`alternating_output_cpu`]: its rates, and the CPU seconds per GiB its processes
/// and this one (the harness) used during its runs.
pub(crate) struct OutputSide {
    pub(crate) rates: Vec<f64>,
    pub(crate) cpu_per_gib: f64,
}

/// [`alternating_output`] for two sides, each a client, its name and the process ids doing its
/// work besides this process; also what CPU each side cost.
pub(crate) async fn alternating_output_cpu(
    sides: [(&supervisor::ExecServerClient, &str, &[u32]); 2],
    mib: u64,
    runs: usize,
) -> [OutputSide; 2] {
    let count = format!("{}", mib * 1024 * 1024);
    let argv = ["head", "-c", count.as_str(), "/dev/zero"];
    let cpu_of = |pids: &[u32]| {
        pids.iter()
            .chain([&std::process::id()])
            .map(|pid| cpu_seconds(*pid))
            .sum::<f64>()
    };
    let mut measured = [(Vec::new(), 0.0), (Vec::new(), 0.0)];
    for run in 0..runs {
        let order = if run % 2 == 0 { [0, 1] } else { [1, 0] };
        for side in order {
            let (client, name, pids) = sides[side];
            let (rates, cpu) = &mut measured[side];
            let (started, cpu_before) = (Instant::now(), cpu_of(pids));
            let bytes = library_output_bytes(client, &format!("{name}-head-{run}"), &argv).await;
            assert_eq!(bytes, mib * 1024 * 1024, "every byte must arrive ({name})");
            rates.push(mib as f64 / started.elapsed().as_secs_f64());
            *cpu += cpu_of(pids) - cpu_before;
        }
    }
    let gib = (mib * runs as u64) as f64 / 1024.0;
    measured.map(|(rates, cpu)| OutputSide {
        rates,
        cpu_per_gib: cpu / gib,
    })
}

/// Output through the relay (binary output frames, which the library client asks for) against
/// the local websocket (binary frames too) of the same executor, with the relay in `cipher`.
async fn relay_output_throughput(
    rows: &mut Vec<Row>,
    setup: &RemoteSetup,
    mib: u64,
    runs: usize,
    cipher: proto::relay::Cipher,
) {
    let choice = proto::relay::CipherChoice::Only(cipher);
    let (relay, local) = relay_and_local_clients(setup, choice).await;
    let (ours, baseline) =
        alternating_output((&relay, "relay"), (&local, "local"), mib, runs).await;
    rows.push(throughput_row(
        format!(
            "remote mode: output throughput, head -c {mib}M /dev/zero, library client, binary frames, {cipher} ({runs} runs)"
        ),
        (ours, " relay"),
        (baseline, " local websocket"),
        60.0,
    ));
    relay.close();
    local.close();
}

/// Milliseconds of `runs` `fs/getMetadata` round trips through `ours` and through `baseline`,
/// taken in pairs (after 10 unmeasured pairs of warm-up).
pub(crate) async fn paired_round_trips(
    ours: &supervisor::ExecServerClient,
    baseline: &supervisor::ExecServerClient,
    runs: usize,
) -> (Vec<f64>, Vec<f64>) {
    let path = supervisor::FileUri::from_path(std::path::Path::new("/tmp")).unwrap();
    let mut ours_samples = Vec::new();
    let mut baseline_samples = Vec::new();
    for run in 0..runs + 10 {
        for (client, samples) in [(ours, &mut ours_samples), (baseline, &mut baseline_samples)] {
            let started = Instant::now();
            let metadata = client
                .fs_get_metadata(proto::methods::fs::PathParams {
                    path: path.clone(),
                    sandbox: None,
                })
                .await
                .unwrap();
            assert!(metadata.is_directory);
            if run >= 10 {
                samples.push(started.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    (ours_samples, baseline_samples)
}

pub(crate) async fn relay_request_latency(rows: &mut Vec<Row>, setup: &RemoteSetup, runs: usize) {
    let (relay, local) = relay_and_local_clients(setup, proto::relay::CipherChoice::Auto).await;
    let (ours, baseline) = paired_round_trips(&relay, &local, runs).await;
    let (ours_median, ours_text) = summary_with_p99(ours);
    let (baseline_median, baseline_text) = summary_with_p99(baseline);
    rows.push(Row {
        figure: format!("remote mode: fs/getMetadata round trip, library client ({runs} runs)"),
        ours: format!("{ours_text} relay"),
        baseline: format!("{baseline_text} local websocket"),
        ratio: format!("{:.2}x", ours_median / baseline_median),
        target: "reported (no target)".into(),
        holds: None,
    });
    relay.close();
    local.close();
}

pub(crate) async fn remote_mode(rows: &mut Vec<Row>, quick: bool) {
    let setup = remote_setup().await;
    for cipher in proto::relay::Cipher::ALL {
        relay_output_throughput(
            rows,
            &setup,
            if quick { 256 } else { 1024 },
            if quick { 2 } else { 3 },
            cipher,
        )
        .await;
    }
    relay_request_latency(rows, &setup, if quick { 200 } else { 1000 }).await;
}
