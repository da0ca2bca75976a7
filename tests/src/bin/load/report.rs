//! The report: one row per figure, checked against its bound where it has one, rendered as a
//! markdown table, with the notes on reading the figures and the machine it ran on.

/// One line of the report.
struct Row {
    scenario: &'static str,
    figure: String,
    value: String,
    bound: String,
    holds: Option<bool>,
}

#[derive(Default)]
pub(crate) struct Report {
    rows: Vec<Row>,
}

impl Report {
    pub(crate) fn figure(
        &mut self,
        scenario: &'static str,
        figure: impl Into<String>,
        value: impl Into<String>,
    ) {
        self.rows.push(Row {
            scenario,
            figure: figure.into(),
            value: value.into(),
            bound: String::new(),
            holds: None,
        });
    }

    pub(crate) fn check(
        &mut self,
        scenario: &'static str,
        figure: impl Into<String>,
        value: impl Into<String>,
        bound: impl Into<String>,
        holds: bool,
    ) {
        let row = Row {
            scenario,
            figure: figure.into(),
            value: value.into(),
            bound: bound.into(),
            holds: Some(holds),
        };
        println!(
            "  {} {}: {} (bound {}) {}",
            row.scenario,
            row.figure,
            row.value,
            row.bound,
            if holds { "ok" } else { "EXCEEDED" }
        );
        self.rows.push(row);
    }

    pub(crate) fn all_hold(&self) -> bool {
        self.rows.iter().all(|row| row.holds != Some(false))
    }

    pub(crate) fn table(&self) -> String {
        let mut out =
            String::from("| scenario | figure | value | bound | holds |\n|---|---|---|---|---|\n");
        for row in &self.rows {
            let holds = match row.holds {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "",
            };
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} |\n",
                row.scenario, row.figure, row.value, row.bound, holds
            ));
        }
        out
    }
}

pub(crate) fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// How to read the figures; appended to the written report.
pub(crate) const NOTES: &str = "## Reading the figures\n\n\
- **Live processes**: each running child costs the server three descriptors (stdout, stderr, \
pidfd) and about 11 KiB. Once closed, a process holds none while it stays readable for \
`CLOSED_PROCESS_RETENTION`.\n\
- **Concurrent sessions**: every `echo` is its own write, but the server reads whatever the pipe \
holds (up to `OUTPUT_READ_CHUNK_BYTES`), so there are fewer notifications than lines; every \
session must still receive every line in order.\n\
- **Start/stop cycles**: a closed process is retained (about 2.4 KiB) for 30 s, then forgotten. \
The soak check runs a second round after the first was forgotten: freed memory is reused, so RSS \
does not grow again (it need not shrink: the allocator keeps freed pages).\n\
- **Writer, no reader**: with an attached client that does not read, the outbound queue \
(`OUTBOUND_QUEUE_BYTES`, 8 MiB) fills and the child blocks on its pipe after about 10 MiB; the \
10 GB can only be written if someone reads. With the session detached, output is retained (newest \
`OUTPUT_RETENTION_BYTES`) and never sent, so the child runs at full speed and server memory stays \
flat.\n\
- **Hostile clients**: a neighbour session sends a request every 10 ms throughout; its p99 must \
stay under 50 ms (or twice its own p99 measured for 1 s before the attack, plus 25 ms, on a \
loaded host). Silent sockets are closed oldest first once the pending pool (256) is full; a \
writeId over `MAX_WRITE_ID_BYTES` is refused before any work.\n\
- **Rendezvous cluster**: three `exec-rendezvous --cluster` nodes on one `nats-server -js`; \
the executors are the real executor endpoint of in-process servers (200 environments each, \
under `MAX_RELAY_STREAMS`), every environment with its own key, registered through node i mod 3; \
each harness stream connects through the next node, so every frame crosses NATS, and makes a \
round trip every 500 ms. RSS and descriptors are per node; \"flat\" means the peak over the \
streaming phase stays within 1.25x (+16 MiB) and 1.05x of its first sample.\n";

pub(crate) fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
            })
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_owned();
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(String::new(), |kib| {
            format!(", {:.0} GiB RAM", kib as f64 / 1048576.0)
        });
    format!("{cpu}, {cores} cores{memory}, Linux {kernel}")
}
