//! `jaccl plan`: what a collective would cost on a cluster, per algorithm and size, from the
//! plans jaccl would run there ([`jaccl::planner`]); a table, and optionally an SVG plot.

use jaccl::planner::{Cluster, Collective, LinkSpeed, Prediction, predict};

use crate::args::{BenchOp, PlanArgs, PlanLink, sweep};
use crate::plot::{Panel, Series, svg};
use crate::report::{gbs, human, print_line};

/// Runs `jaccl plan`: prints the table, writes the plot if asked.
pub(crate) fn run(args: &PlanArgs) -> Result<u8, String> {
    let ranks = args.ranks as usize;
    let here = args.link == PlanLink::Here;
    let collective = match args.op {
        BenchOp::AllReduce => Collective::AllReduce,
        BenchOp::AllGather => Collective::AllGather,
        BenchOp::AllToAll => Collective::AllToAll,
        other => {
            return Err(format!(
                "--op {}: plan knows all-reduce, all-gather and all-to-all",
                other.name()
            ));
        }
    };
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let link = match args.link {
        PlanLink::Here => LinkSpeed::MEASURED_LOOPBACK,
        PlanLink::Given(link) => link,
    };
    let cluster = Cluster {
        hosts: args
            .hosts
            .map_or(if here { 1 } else { ranks }, |h| h as usize),
        cores: args.cores.or(here.then_some(cores as f64)),
        within_host: args.within_host.unwrap_or(if here {
            link
        } else {
            LinkSpeed::MEASURED_SHARED_MEMORY
        }),
        chooses_by_model: !here,
        reduce_rate: args.reduce_rate.unwrap_or(Cluster::DEFAULT_REDUCE_RATE),
        wires: usize::from(args.wires),
        ..Cluster::new(ranks, link)
    };
    if cluster.hosts > ranks {
        return Err(format!(
            "--hosts {}: more hosts than the {ranks} ranks",
            cluster.hosts
        ));
    }
    let first = args.min_bytes.unwrap_or((4 * ranks).max(8));
    let sizes = sweep(first, args.max_bytes, args.factor);
    if sizes.is_empty() {
        return Err(format!(
            "no sizes to plan: -b {first} is larger than -e {}",
            args.max_bytes
        ));
    }
    let op = args.op;
    let factor = op.bus_factor(ranks);
    print_line(&heading(&cluster, op.name(), here));
    print_line(&format!(
        "# {:>10}  {:<20} {:>7} {:>12} {:>13} {:>12}",
        "size", "algorithm", "rounds", "bytes/rank", "time (us)", "busbw (GB/s)"
    ));
    let mut rows = Vec::new();
    for &bytes in &sizes {
        let predictions = predict(collective, bytes, &cluster);
        let least = predictions
            .iter()
            .map(|p| p.seconds)
            .fold(f64::INFINITY, f64::min);
        for p in &predictions {
            let mark = match (p.chosen, p.seconds <= least) {
                (true, true) => "  chosen, least",
                (true, false) => "  chosen",
                (false, true) => "  least",
                (false, false) => "",
            };
            print_line(&format!(
                "  {:>10}  {:<20} {:>7} {:>12} {:>13.1} {:>12.2}{mark}",
                human(bytes),
                p.algorithm,
                p.rounds,
                human(p.bytes_per_rank),
                p.seconds * 1e6,
                gbs(bytes, p.seconds * 1e6) * factor
            ));
        }
        rows.push((bytes, predictions));
    }
    print_line(&match here {
        true => {
            "# chosen: what jaccl runs for this call here; least: the least predicted time".into()
        }
        false => format!(
            "# chosen: what jaccl runs for this call with JACCL_LINK={}; least: the least \
             predicted time",
            cluster.link
        ),
    });
    if let Some(path) = &args.plot {
        let title = format!("jaccl plan: {} among {ranks} ranks", op.name());
        std::fs::write(path, plot(&title, &rows, factor))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(0)
}

/// The first line: what was planned, on what.
fn heading(cluster: &Cluster, op: &str, here: bool) -> String {
    let link = &cluster.link;
    let cores = cluster
        .cores
        .map_or(String::new(), |c| format!(", {c} cores per host"));
    let within = &cluster.within_host;
    let source = if here {
        " (this machine's TCP, measured)"
    } else {
        ""
    };
    format!(
        "# jaccl plan: {op} among {} ranks on {} host(s){cores}; links {:.3} GB/s and {:.2} us{source}, \
         within a host {:.3} GB/s and {:.2} us; reductions {:.2} GB/s per rank",
        cluster.ranks,
        cluster.hosts,
        link.bytes_per_second() / 1e9,
        link.latency_seconds() * 1e6,
        within.bytes_per_second() / 1e9,
        within.latency_seconds() * 1e6,
        cluster.reduce_rate / 1e9
    )
}

/// Each algorithm's bus bandwidth and time against size.
fn plot(title: &str, rows: &[(usize, Vec<Prediction>)], factor: f64) -> String {
    let names: Vec<&str> = rows
        .first()
        .map(|(_, p)| p.iter().map(|p| p.algorithm).collect())
        .unwrap_or_default();
    let series = |busbw: bool| -> Vec<Series> {
        names
            .iter()
            .map(|&name| Series {
                name: name.to_string(),
                points: rows
                    .iter()
                    .filter_map(|(bytes, ps)| {
                        let p = ps.iter().find(|p| p.algorithm == name)?;
                        let us = p.seconds * 1e6;
                        let y = if busbw { gbs(*bytes, us) * factor } else { us };
                        Some((*bytes as f64, y))
                    })
                    .collect(),
            })
            .collect()
    };
    svg(
        title,
        &[
            Panel {
                label: "bus bandwidth (GB/s)",
                series: series(true),
            },
            Panel {
                label: "time per operation (µs)",
                series: series(false),
            },
        ],
    )
}
