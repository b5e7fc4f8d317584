//! What `jaccl bench` prints and writes: the nccl-tests-style table, JSON lines and an SVG plot
//! ([`crate::plot`]).
//! Only rank 0 reports.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};
use jaccl::{Group, Op};
use serde::Serialize;

use crate::plot::{Panel, Series, svg};

/// What a run measures, as the report shows it.
#[derive(Debug, Clone)]
pub(crate) struct Setup {
    /// The operation's name (`all-reduce`).
    pub(crate) op: &'static str,
    /// nccl-tests' bus bandwidth factor: busbw = algbw × factor.
    pub(crate) bus_factor: f64,
    pub(crate) dtype: String,
    /// The reduction, for operations that reduce.
    pub(crate) reduce: Option<String>,
    /// The sweep: smallest and largest size, factor between sizes.
    pub(crate) min_bytes: usize,
    pub(crate) max_bytes: usize,
    pub(crate) factor: u64,
    /// Timed and warm-up operations per size, when fixed.
    pub(crate) iters: Option<u64>,
    pub(crate) warmup: Option<u64>,
    /// Whether every result is checked (else the first and the last).
    pub(crate) check: bool,
    /// Where to write JSON lines and the plot.
    pub(crate) json: Option<PathBuf>,
    pub(crate) plot: Option<PathBuf>,
    /// `--split`: how many sub-groups the ranks were split into (the first reports).
    pub(crate) split: Option<usize>,
}

/// Writes one line to stdout (whole, so it is not mixed with other ranks' lines).
pub(crate) fn print_line(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// The measurement of one loop (out of place or in place).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    /// Slowest rank's mean time per operation.
    pub(crate) time_us: f64,
    pub(crate) iters: usize,
    /// Wrong elements over all ranks and checks.
    pub(crate) wrong: u64,
    /// Where the ranks span hosts: the bytes a rank sent to other hosts per operation, the
    /// most of any rank.
    pub(crate) across_hosts: Option<f64>,
}

/// One size of the sweep.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Row {
    /// The size column: bytes of the message (all-gather: of the output; reduce-scatter: of
    /// the input), as in nccl-tests.
    pub(crate) bytes: usize,
    /// Elements of the message (all-gather: sent by each rank).
    pub(crate) count: usize,
    pub(crate) out_of_place: Timing,
    pub(crate) in_place: Option<Timing>,
}

impl Row {
    pub(crate) fn wrong(&self) -> u64 {
        self.out_of_place.wrong + self.in_place.map_or(0, |t| t.wrong)
    }
}

/// GB/s (10^9 bytes per second) of `bytes` in `time_us`.
pub(crate) fn gbs(bytes: usize, time_us: f64) -> f64 {
    if time_us > 0.0 {
        bytes as f64 / time_us / 1e3
    } else {
        0.0
    }
}

#[derive(Serialize)]
struct JsonTiming {
    time_us: f64,
    algbw_gbs: f64,
    busbw_gbs: f64,
    iters: usize,
    wrong: u64,
    across_hosts_bytes: Option<f64>,
}

/// One JSON line: the fields of ../shared/bench's harness (`peer`, `transport`, `n`, `bytes`,
/// `time_us`, `algbw_gbs`, `busbw_gbs`, `ok`) and more.
#[derive(Serialize)]
struct JsonRow<'a> {
    peer: &'a str,
    op: &'a str,
    dtype: String,
    reduce: Option<String>,
    transport: String,
    topology: String,
    route: String,
    wires: usize,
    n: usize,
    bytes: usize,
    count: usize,
    time_us: f64,
    algbw_gbs: f64,
    busbw_gbs: f64,
    iters: usize,
    wrong: u64,
    ok: bool,
    /// Where the ranks span hosts: bytes a rank sent to other hosts per operation (the most).
    across_hosts_bytes: Option<f64>,
    in_place: Option<JsonTiming>,
}

/// Rank 0's output of one run.
pub(crate) struct Report<'a> {
    setup: &'a Setup,
    leader: bool,
    n: usize,
    transport: String,
    topology: String,
    /// How the collectives move data (see [`route`]).
    route: String,
    wires: usize,
    json: Option<BufWriter<File>>,
    rows: Vec<Row>,
    progress: Option<ProgressBar>,
}

/// How a group's collectives move data: `direct over shm` when every rank shares memory,
/// else the topology over its peers' transports (`ring over shm+tcp (left 3 shm, right 1
/// tcp)`; with the mesh, `mesh over tcp (left 3 tcp, right 1 tcp, 2 more ranks)`), then the
/// hosts when there are several (`, 2 hosts × 4 ranks`) and where collectives go in two
/// levels (`; in two levels: all-reduce and reduce from 512 KiB, all-gather and
/// reduce-scatter from 1 MiB`).
pub(crate) fn route(g: &Group) -> String {
    format!("{}{}", links(g), hosts(g))
}

/// The hosts of a group on more than one (`, 2 hosts × 4 ranks`, `, 3 hosts of 4 + 3 + 2
/// ranks`) and from which sizes collectives go in two levels, else nothing.
fn hosts(g: &Group) -> String {
    // The operations that go in two levels, those from the same size together.
    let mut from: Vec<(usize, Vec<String>)> = Vec::new();
    for op in [
        Op::AllReduce,
        Op::Reduce,
        Op::AllGather,
        Op::ReduceScatter,
        Op::Broadcast,
    ] {
        let Some(min) = g.two_levels_from(op) else {
            continue;
        };
        // As `bench --op` names it (`all-reduce`).
        let name = op.to_string().replace('_', "-");
        match from.iter_mut().find(|(size, _)| *size == min) {
            Some((_, ops)) => ops.push(name),
            None => from.push((min, vec![name])),
        }
    }
    let from: Vec<String> = from
        .iter()
        .map(|(min, ops)| format!("{} from {}", in_words(ops), human(*min)))
        .collect();
    match from.is_empty() {
        true => host_sizes(g),
        false => format!("{}; in two levels: {}", host_sizes(g), from.join(", ")),
    }
}

/// `a`, `a and b`, `a, b and c`.
fn in_words(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

fn host_sizes(g: &Group) -> String {
    let hosts = g.hosts();
    let sizes: Vec<usize> = (0..hosts.count())
        .map(|h| hosts.ranks_on(h).len())
        .collect();
    match sizes.as_slice() {
        [] | [_] => String::new(),
        [first, rest @ ..] if rest.iter().all(|s| s == first) => {
            format!(", {} hosts × {first} ranks", sizes.len())
        }
        _ => {
            let each: Vec<String> = sizes.iter().map(ToString::to_string).collect();
            format!(", {} hosts of {} ranks", sizes.len(), each.join(" + "))
        }
    }
}

/// The topology over the peers' transports.
fn links(g: &Group) -> String {
    let transports = g.transport();
    let topology = g.topology().map_or("ring", |t| t.name());
    match (g.shares_memory_with_all(), transports.as_slice()) {
        (_, []) => "no transport (one rank)".into(),
        (true, _) => "direct over shm".into(),
        (false, [(_, t)]) => format!("{topology} over {t}"),
        (false, [(l, lt), (r, rt)]) if lt == rt => {
            format!("{topology} over {lt} (ranks {l} and {r})")
        }
        (false, [(l, lt), (r, rt), others @ ..]) => {
            let more = match others.len() {
                0 => String::new(),
                1 => ", 1 more rank".into(),
                n => format!(", {n} more ranks"),
            };
            format!(
                "{topology} over {} (left {l} {lt}, right {r} {rt}{more})",
                transport_summary(g)
            )
        }
    }
}

/// What carries the data: the transports to the neighbours (`shm`, `tcp`, `shm+tcp`), or
/// `none` for a group of one.
pub(crate) fn transport_summary(g: &Group) -> String {
    let mut names: Vec<&str> = g.transport().iter().map(|(_, t)| t.name()).collect();
    names.sort_unstable();
    names.dedup();
    if names.is_empty() {
        "none".into()
    } else {
        names.join("+")
    }
}

impl<'a> Report<'a> {
    pub(crate) fn new(
        setup: &'a Setup,
        g: &Group,
        sizes: usize,
        leader: bool,
    ) -> Result<Report<'a>, String> {
        let transport = transport_summary(g);
        let topology = g.topology().map_or("none".to_string(), |t| t.to_string());
        let json = match (&setup.json, leader) {
            (Some(path), true) => {
                Some(BufWriter::new(File::create(path).map_err(|e| {
                    format!("cannot write {}: {e}", path.display())
                })?))
            }
            _ => None,
        };
        let report = Report {
            setup,
            leader,
            n: g.size(),
            transport,
            topology,
            route: route(g),
            wires: g.wires(),
            json,
            rows: Vec::new(),
            progress: None,
        };
        if !leader {
            return Ok(report);
        }
        let mut report = report;
        report.header();
        if sizes > 1 {
            let bar = ProgressBar::new(sizes as u64).with_style(
                ProgressStyle::with_template("{spinner} size {pos}/{len} {wide_bar} {elapsed}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            report.progress = Some(bar);
        }
        Ok(report)
    }

    fn header(&self) {
        let a = self.setup;
        let redop = a
            .reduce
            .as_ref()
            .map_or(String::new(), |r| format!(", {r}"));
        let wires = if self.wires == 1 { "wire" } else { "wires" };
        let split = a.split.map_or(String::new(), |k| {
            format!(" (a sub-group made by split, the first of {k})")
        });
        print_line(&format!(
            "# jaccl bench: {} ({}{redop}) on {} ranks{split}, {}, {} {wires}",
            a.op, a.dtype, self.n, self.route, self.wires
        ));
        let iters = a
            .iters
            .map_or("auto (about 0.3 s per size)".to_string(), |k| k.to_string());
        let warmup = a.warmup.map_or("auto".to_string(), |k| k.to_string());
        let checks = if a.check {
            "every result"
        } else {
            "first and last result"
        };
        print_line(&format!(
            "# sizes {} to {} (x{}); iterations {iters}; warm-up {warmup}; checked: {checks}",
            human(a.min_bytes),
            human(a.max_bytes),
            a.factor
        ));
        print_line("#");
        print_line(&format!(
            "# {:>10} {:>11} {:>5} {:>5}  {:^39}  {:^39}",
            "", "", "", "", "out-of-place", "in-place"
        ));
        print_line(&format!(
            "# {:>10} {:>11} {:>5} {:>5}  {:>10} {:>9} {:>9} {:>7}  {:>10} {:>9} {:>9} {:>7}",
            "size",
            "count",
            "type",
            "redop",
            "time",
            "algbw",
            "busbw",
            "#wrong",
            "time",
            "algbw",
            "busbw",
            "#wrong"
        ));
        print_line(&format!(
            "# {:>10} {:>11} {:>5} {:>5}  {:>10} {:>9} {:>9} {:>7}  {:>10} {:>9} {:>9} {:>7}",
            "(B)",
            "(elements)",
            "",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            ""
        ));
    }

    /// Reports one size.
    pub(crate) fn row(&mut self, row: Row) -> Result<(), String> {
        if !self.leader {
            return Ok(());
        }
        let factor = self.setup.bus_factor;
        let cols = |t: Option<Timing>| match t {
            Some(t) => {
                let alg = gbs(row.bytes, t.time_us);
                format!(
                    "{:>10.2} {:>9.3} {:>9.3} {:>7}",
                    t.time_us,
                    alg,
                    alg * factor,
                    t.wrong
                )
            }
            None => format!("{:>10} {:>9} {:>9} {:>7}", "N/A", "N/A", "N/A", "N/A"),
        };
        let redop = self.setup.reduce.as_deref().unwrap_or("-");
        let line = format!(
            "  {:>10} {:>11} {:>5} {:>5}  {}  {}",
            row.bytes,
            row.count,
            self.setup.dtype,
            redop,
            cols(Some(row.out_of_place)),
            cols(row.in_place)
        );
        match &self.progress {
            Some(bar) => bar.suspend(|| print_line(&line)),
            None => print_line(&line),
        }
        if let Some(bar) = &self.progress {
            bar.inc(1);
        }
        if let Some(json) = &mut self.json {
            let alg = gbs(row.bytes, row.out_of_place.time_us);
            let record = JsonRow {
                peer: "jaccl",
                op: self.setup.op,
                dtype: self.setup.dtype.clone(),
                reduce: self.setup.reduce.clone(),
                transport: self.transport.clone(),
                topology: self.topology.clone(),
                route: self.route.clone(),
                wires: self.wires,
                n: self.n,
                bytes: row.bytes,
                count: row.count,
                time_us: row.out_of_place.time_us,
                algbw_gbs: alg,
                busbw_gbs: alg * factor,
                iters: row.out_of_place.iters,
                wrong: row.wrong(),
                ok: row.wrong() == 0,
                across_hosts_bytes: row.out_of_place.across_hosts,
                in_place: row.in_place.map(|t| {
                    let alg = gbs(row.bytes, t.time_us);
                    JsonTiming {
                        time_us: t.time_us,
                        algbw_gbs: alg,
                        busbw_gbs: alg * factor,
                        iters: t.iters,
                        wrong: t.wrong,
                        across_hosts_bytes: t.across_hosts,
                    }
                }),
            };
            let line = serde_json::to_string(&record).map_err(|e| e.to_string())?;
            writeln!(json, "{line}").map_err(|e| format!("cannot write the JSON file: {e}"))?;
        }
        self.rows.push(row);
        Ok(())
    }

    /// The footer, and the plot.
    pub(crate) fn finish(mut self) -> Result<(), String> {
        if !self.leader {
            return Ok(());
        }
        if let Some(bar) = self.progress.take() {
            bar.finish_and_clear();
        }
        let factor = self.setup.bus_factor;
        let wrong: u64 = self.rows.iter().map(Row::wrong).sum();
        let busbws: Vec<f64> = self
            .rows
            .iter()
            .map(|r| gbs(r.bytes, r.out_of_place.time_us) * factor)
            .collect();
        let avg = busbws.iter().sum::<f64>() / busbws.len().max(1) as f64;
        print_line(&format!(
            "# Wrong values: {wrong} {}",
            if wrong == 0 { "OK" } else { "FAILED" }
        ));
        print_line(&format!("# Avg bus bandwidth: {avg:.4} GB/s"));
        self.across_hosts();
        if let Some(json) = &mut self.json {
            json.flush()
                .map_err(|e| format!("cannot write the JSON file: {e}"))?;
        }
        if let Some(path) = &self.setup.plot {
            let svg = plot(self.setup, self.n, &self.transport, &self.rows);
            std::fs::write(path, svg)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            print_line(&format!("# Plot: {}", path.display()));
        }
        Ok(())
    }
}

impl Report<'_> {
    /// Where the ranks span hosts: what a rank sent to other hosts per operation, by size.
    fn across_hosts(&self) {
        if self
            .rows
            .iter()
            .all(|r| r.out_of_place.across_hosts.is_none())
        {
            return;
        }
        print_line(
            "# Sent to other hosts per operation, the most of any rank (out of place / in place):",
        );
        let sent = |bytes: usize, t: Option<Timing>| match t.and_then(|t| t.across_hosts) {
            Some(sent) => format!(
                "{} ({:.2} x size)",
                human(sent.round() as usize),
                sent / bytes.max(1) as f64
            ),
            None => "N/A".into(),
        };
        for row in &self.rows {
            print_line(&format!(
                "#   {:>10}  {} / {}",
                human(row.bytes),
                sent(row.bytes, Some(row.out_of_place)),
                sent(row.bytes, row.in_place)
            ));
        }
    }
}

/// `8 B`, `64 KiB`, `32 MiB`.
pub(crate) fn human(bytes: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Two log-log panels: bus bandwidth and time against size, out of place and in place.
pub(crate) fn plot(setup: &Setup, n: usize, transport: &str, rows: &[Row]) -> String {
    let factor = setup.bus_factor;
    let series = |name: &str, pick: fn(&Row) -> Option<Timing>, busbw: bool| Series {
        name: name.to_string(),
        points: rows
            .iter()
            .filter_map(|r| pick(r).map(|t| (r.bytes, t.time_us)))
            .map(|(b, t)| (b as f64, if busbw { gbs(b, t) * factor } else { t }))
            .collect(),
    };
    let oop: fn(&Row) -> Option<Timing> = |r| Some(r.out_of_place);
    let inp: fn(&Row) -> Option<Timing> = |r| r.in_place;
    let panels = [true, false].map(|busbw| Panel {
        label: if busbw {
            "bus bandwidth (GB/s)"
        } else {
            "time per operation (µs)"
        },
        series: vec![
            series("out of place", oop, busbw),
            series("in place", inp, busbw),
        ],
    });
    let title = format!(
        "jaccl bench: {} {} on {n} ranks over {transport}",
        setup.op, setup.dtype
    );
    svg(&title, &panels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_sizes() {
        assert_eq!(human(8), "8 B");
        assert_eq!(human(64 << 10), "64 KiB");
        assert_eq!(human(33_554_432), "32 MiB");
        assert_eq!(human(1536), "1.5 KiB");
    }

    #[test]
    fn bandwidth_is_decimal_gb_per_second() {
        assert_eq!(gbs(4_000_000, 1000.0), 4.0);
        assert_eq!(gbs(8, 0.0), 0.0);
    }
}
