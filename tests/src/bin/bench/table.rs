//! The report: a table row per figure, the statistics each figure is summarised with (medians
//! with p10-p90 or p99 spreads, throughput ratios) and the rendered markdown table.

pub(crate) struct Row {
    pub(crate) figure: String,
    pub(crate) ours: String,
    pub(crate) baseline: String,
    pub(crate) ratio: String,
    pub(crate) target: String,
    /// Whether the figure meets its target; `None` for a row reported without one.
    pub(crate) holds: Option<bool>,
}

/// The median of `samples` (any order).
pub(crate) fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    percentile(&sorted, 0.5)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

pub(crate) fn summary_ms(mut samples: Vec<f64>) -> (f64, String) {
    samples.sort_by(f64::total_cmp);
    let median = percentile(&samples, 0.5);
    (
        median,
        format!(
            "{:.2} ms (p10 {:.2}, p90 {:.2})",
            median,
            percentile(&samples, 0.1),
            percentile(&samples, 0.9)
        ),
    )
}
pub(crate) fn summary_with_p99(mut samples: Vec<f64>) -> (f64, String) {
    samples.sort_by(f64::total_cmp);
    let median = percentile(&samples, 0.5);
    (
        median,
        format!("{:.3} ms (p99 {:.3})", median, percentile(&samples, 0.99)),
    )
}
/// A throughput row: medians with min-max ranges, ratio as a percentage of the baseline, whose
/// target is at least `min_percent` of it.
pub(crate) fn throughput_row(
    figure: String,
    ours: (Vec<f64>, &str),
    baseline: (Vec<f64>, &str),
    min_percent: f64,
) -> Row {
    let summary = |(mut samples, label): (Vec<f64>, &str)| {
        samples.sort_by(f64::total_cmp);
        let median = percentile(&samples, 0.5);
        let text = format!(
            "{median:.0} MiB/s (range {:.0}-{:.0}){label}",
            samples[0],
            samples[samples.len() - 1]
        );
        (median, text)
    };
    let (ours_median, ours) = summary(ours);
    let (baseline_median, baseline) = summary(baseline);
    let percent = 100.0 * ours_median / baseline_median;
    Row {
        figure,
        ours,
        baseline,
        ratio: format!("{percent:.0}%"),
        target: format!(">= {min_percent:.0}%"),
        holds: Some(percent >= min_percent),
    }
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cpu}, {cores} cores, Linux {}", kernel.trim())
}
pub(crate) fn render(rows: &[Row], command: &str) -> String {
    let mut out = String::from(
        "| figure | ours | baseline | ratio | target | holds |\n|---|---|---|---|---|---|\n",
    );
    for row in rows {
        let holds = match row.holds {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "-",
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {holds} |\n",
            row.figure, row.ours, row.baseline, row.ratio, row.target
        ));
    }
    format!(
        "# Benchmarks\n\nMachine: {}.\nCommand: `{command}`.\n\n{out}",
        machine()
    )
}
