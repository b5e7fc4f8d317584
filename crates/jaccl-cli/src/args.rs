//! The command line: every subcommand's arguments, parsed by clap.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use jaccl::{Config, Dtype, ReduceOp, Topology, Transport};
use serde::Serialize;

use crate::hostfile;

#[derive(Debug, Parser)]
#[command(
    name = "jaccl",
    version,
    about = "Collective communication for distributed ML: launch ranks, benchmark, check the machine"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Start N ranks of a program, on this machine or on hosts over ssh.
    Launch(LaunchArgs),
    /// Measure a collective over a range of sizes (nccl-tests style), checking the results.
    Bench(BenchArgs),
    /// Predict what a collective costs on a cluster (any number of ranks, links of given
    /// bandwidth and latency): every algorithm's plan, built and timed, and jaccl's choice.
    Plan(PlanArgs),
    /// Show what this machine offers (transports, interfaces, RDMA devices, limits) and check a
    /// hostfile or device file.
    Doctor(DoctorArgs),
    /// Internal: how `jaccl launch` starts a local rank, so that it dies with the launcher.
    #[command(hide = true)]
    ExecRank {
        /// The launcher's PID.
        #[arg(long)]
        parent: u32,
        /// The rank's program and arguments.
        #[arg(required = true, allow_hyphen_values = true, num_args = 1.., last = true)]
        program: Vec<String>,
    },
}

/// Options of `jaccl launch`.
#[derive(Debug, clap::Args)]
#[command(trailing_var_arg = true)]
pub(crate) struct LaunchArgs {
    /// Ranks on this machine; with --hosts or --hostfile, ranks per host.
    #[arg(short = 'n', long = "ranks", value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) ranks: Option<u16>,
    /// Comma-separated hosts to start ranks on over ssh (host or user@host); rank order follows.
    #[arg(long, value_delimiter = ',', conflicts_with = "hostfile")]
    pub(crate) hosts: Vec<String>,
    /// JSON hostfile in the format of mlx.launch.
    #[arg(long, value_name = "FILE")]
    pub(crate) hostfile: Option<PathBuf>,
    /// Extra environment variable for every rank (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = hostfile::parse_env)]
    pub(crate) env: Vec<(String, String)>,
    /// Working directory of every rank [default: the current one, where it exists].
    #[arg(long, value_name = "DIR")]
    pub(crate) cwd: Option<PathBuf>,
    /// Do not prefix each output line with the rank.
    #[arg(long)]
    pub(crate) no_prefix: bool,
    /// Print what is started and stopped.
    #[arg(short = 'v', long)]
    pub(crate) verbose: bool,
    /// Port of the coordinator on rank 0's host [default: a free port].
    #[arg(long)]
    pub(crate) port: Option<u16>,
    /// Keep the job going when a rank dies of a signal (killed, crashed; a remote rank's exit
    /// code 129 to 192 counts as one): the others are not stopped (they shrink their groups
    /// and go on); the job succeeds if the ranks that were not lost all succeed. A rank that
    /// exits with an error still fails the job.
    #[arg(long)]
    pub(crate) elastic: bool,
    #[command(flatten)]
    pub(crate) group: GroupArgs,
    /// The program to run and its arguments.
    #[arg(required = true, allow_hyphen_values = true, num_args = 1.., value_name = "PROGRAM")]
    pub(crate) program: Vec<String>,
}

/// Options of `jaccl doctor`.
#[derive(Debug, clap::Args)]
pub(crate) struct DoctorArgs {
    /// A hostfile or device file (MLX_IBV_DEVICES) to check.
    pub(crate) file: Option<PathBuf>,
    /// Also check that every host of the hostfile is reachable with ssh.
    #[arg(long)]
    pub(crate) ssh: bool,
}

/// Group settings shared by `launch` and `bench`; passed to the ranks as `JACCL_*` variables.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct GroupArgs {
    /// Transport: auto, tcp, shm or rdma.
    #[arg(long, value_parser = clap::value_parser!(Transport))]
    pub(crate) transport: Option<Transport>,
    /// Parallel connections per ring neighbour, 1 to 4.
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=4))]
    pub(crate) wires: Option<u8>,
    /// Topology: auto, ring or mesh.
    #[arg(long, value_parser = clap::value_parser!(Topology))]
    pub(crate) topology: Option<Topology>,
    /// Longest wait without progress before an operation fails (30, 2.5, 500ms, 5m).
    #[arg(long, value_parser = jaccl::config::parse_duration)]
    pub(crate) timeout: Option<Duration>,
}

impl GroupArgs {
    /// The settings as environment variables for ranks.
    pub(crate) fn env(&self) -> Vec<(String, String)> {
        let mut env = Vec::new();
        if let Some(t) = self.transport {
            env.push(("JACCL_TRANSPORT".into(), t.to_string()));
        }
        if let Some(w) = self.wires {
            env.push(("JACCL_WIRES".into(), w.to_string()));
        }
        if let Some(t) = self.topology {
            env.push(("JACCL_TOPOLOGY".into(), t.to_string()));
        }
        if let Some(t) = self.timeout {
            env.push(("JACCL_TIMEOUT".into(), format!("{}", t.as_secs_f64())));
        }
        env
    }

    /// Overrides `config` with the settings given on the command line.
    pub(crate) fn apply(&self, config: &mut Config) -> Result<(), String> {
        if let Some(t) = self.transport {
            config.transport = t;
        }
        if let Some(w) = self.wires {
            config.wires = Some(usize::from(w));
        }
        if let Some(t) = self.topology {
            config.topology = t;
        }
        if let Some(t) = self.timeout {
            config.timeout = t;
        }
        Ok(())
    }
}

/// The operation to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum BenchOp {
    /// All-reduce; size = the message on each rank.
    AllReduce,
    /// All-gather; size = the gathered output (size / ranks from each rank).
    AllGather,
    /// Reduce-scatter; size = the input of each rank (size / ranks comes out).
    ReduceScatter,
    /// Broadcast from --root; size = the message.
    Broadcast,
    /// Reduce to --root; size = the message on each rank.
    Reduce,
    /// Gather to --root; size = the root's output (size / ranks from each rank).
    Gather,
    /// Scatter from --root; size = the root's input (size / ranks to each rank).
    Scatter,
    /// All-to-all; size = each rank's input (size / ranks to each rank).
    AllToAll,
    /// All-gather of uneven blocks (sizes drawn from --seed, some empty); size = the output.
    AllGatherV,
    /// Every rank sends size bytes to its right neighbour and receives from its left.
    SendRecv,
    /// Barrier; one row, no data.
    Barrier,
}

impl BenchOp {
    pub(crate) fn name(self) -> &'static str {
        match self {
            BenchOp::AllReduce => "all-reduce",
            BenchOp::AllGather => "all-gather",
            BenchOp::ReduceScatter => "reduce-scatter",
            BenchOp::Broadcast => "broadcast",
            BenchOp::Reduce => "reduce",
            BenchOp::Gather => "gather",
            BenchOp::Scatter => "scatter",
            BenchOp::AllToAll => "all-to-all",
            BenchOp::AllGatherV => "all-gather-v",
            BenchOp::SendRecv => "send-recv",
            BenchOp::Barrier => "barrier",
        }
    }

    /// nccl-tests' bus bandwidth factor: busbw = algbw × factor.
    pub(crate) fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            BenchOp::AllReduce => 2.0 * (n - 1.0) / n,
            BenchOp::AllGather
            | BenchOp::ReduceScatter
            | BenchOp::Gather
            | BenchOp::Scatter
            | BenchOp::AllToAll
            | BenchOp::AllGatherV => (n - 1.0) / n,
            BenchOp::Broadcast | BenchOp::Reduce | BenchOp::SendRecv => 1.0,
            BenchOp::Barrier => 0.0,
        }
    }

    pub(crate) fn reduces(self) -> bool {
        matches!(
            self,
            BenchOp::AllReduce | BenchOp::ReduceScatter | BenchOp::Reduce
        )
    }

    /// Whether the operation has a root (`--root`).
    pub(crate) fn rooted(self) -> bool {
        matches!(
            self,
            BenchOp::Broadcast | BenchOp::Reduce | BenchOp::Gather | BenchOp::Scatter
        )
    }

    /// Whether a size is cut into a block per rank, so it needs an element per rank.
    pub(crate) fn per_rank(self) -> bool {
        matches!(
            self,
            BenchOp::AllGather
                | BenchOp::ReduceScatter
                | BenchOp::Gather
                | BenchOp::Scatter
                | BenchOp::AllToAll
                | BenchOp::AllGatherV
        )
    }
}

/// Options of `jaccl bench`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct BenchArgs {
    /// Ranks to start on this machine when not run under a launcher.
    #[arg(short = 'n', long = "ranks", default_value_t = 4,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) ranks: u16,
    /// Operation to measure.
    #[arg(long, value_enum, default_value_t = BenchOp::AllReduce)]
    pub(crate) op: BenchOp,
    /// Element type: bool, i8, i16, i32, i64, u8, u16, u32, u64, f16, bf16, f32, f64, c64.
    #[arg(long, default_value = "f32", value_parser = clap::value_parser!(Dtype))]
    pub(crate) dtype: Dtype,
    /// Reduction of all-reduce, reduce-scatter and reduce: sum, max, min, prod, avg, band,
    /// bor, bxor.
    #[arg(long, default_value = "sum", value_parser = clap::value_parser!(ReduceOp))]
    pub(crate) reduce: ReduceOp,
    /// The root of broadcast, reduce, gather and scatter.
    #[arg(long, default_value_t = 0)]
    pub(crate) root: usize,
    /// Seed of all-gather-v's block sizes.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Smallest size in bytes (8, 64K, 32M...) [default: 8, or one element per rank if more].
    #[arg(short = 'b', long = "minbytes", value_parser = parse_size)]
    pub(crate) min_bytes: Option<usize>,
    /// Largest size in bytes.
    #[arg(short = 'e', long = "maxbytes", default_value = "32M", value_parser = parse_size)]
    pub(crate) max_bytes: usize,
    /// Factor between sizes.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2,
          value_parser = clap::value_parser!(u64).range(2..))]
    pub(crate) factor: u64,
    /// Timed operations per size [default: enough for about 0.3 s, at least 5].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..1_000_000_000))]
    pub(crate) iters: Option<u64>,
    /// Warm-up operations per size [default: rounds of 1, 2, 4... until one takes 50 ms].
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..1_000_000_000))]
    pub(crate) warmup: Option<u64>,
    /// Check the result of every timed operation, not only the first and the last.
    #[arg(long)]
    pub(crate) check: bool,
    /// Measure on sub-groups (`Group::split`): the ranks split into this many groups of
    /// consecutive ranks, which all run the sweep at once; the first reports. `--split 1`
    /// measures a sub-group of every rank, to compare with the group `init` makes.
    #[arg(long, value_name = "GROUPS", value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) split: Option<u16>,
    #[command(flatten)]
    pub(crate) group: GroupArgs,
    /// Also write one JSON object per size to this file (JSON lines).
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,
    /// Also draw bus bandwidth and latency against size into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub(crate) plot: Option<PathBuf>,
    /// Self-test of the checks: the last rank contributes wrong values, so checks must fail.
    #[arg(long, hide = true)]
    pub(crate) inject_fault: bool,
}

/// Options of `jaccl plan`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct PlanArgs {
    /// Ranks in the job (2 to 65536).
    #[arg(short = 'n', long = "ranks", default_value_t = 1024,
          value_parser = clap::value_parser!(u32).range(2..=1 << 16))]
    pub(crate) ranks: u32,
    /// Hosts the ranks are spread over, evenly in rank order [default: a host per rank; with
    /// `--link here`, one].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) hosts: Option<u32>,
    /// Cores per host: where a host's ranks outnumber them, every copy and reduction costs
    /// the ratio more; fractions where hosts share a machine (4 pretend hosts on 2 cores: 0.5)
    /// [default: as many as ranks; with `--link here`, this machine's].
    #[arg(long, value_parser = parse_cores)]
    pub(crate) cores: Option<f64>,
    /// The link between hosts: `BANDWIDTH,LATENCY` (`100Gb/s,2us`, `10GB/s,1.5us`; bandwidth
    /// each way, in bits (b) or bytes (B) per second), each host's port, which its ranks share
    /// (with a host per rank, between any two ranks), where jobs set `JACCL_LINK` to the same
    /// and jaccl chooses the all-reduce by this model; or `here`: TCP between the ranks of this
    /// machine, as measured (docs/algorithms.md, "The cost model"), jaccl choosing by its
    /// measured thresholds.
    #[arg(long, default_value = "here", value_parser = parse_link)]
    pub(crate) link: PlanLink,
    /// The link between the ranks of one host, as `--link` [default: shared memory as measured
    /// here, 1.3GB/s,1us; with `--link here`, the same as it].
    #[arg(long, value_parser = <jaccl::config::LinkSpeed as std::str::FromStr>::from_str)]
    pub(crate) within_host: Option<jaccl::config::LinkSpeed>,
    /// How fast one rank reduces f32 sums (bytes of input per second: `4GB/s`).
    #[arg(long, value_parser = jaccl::config::parse_rate)]
    pub(crate) reduce_rate: Option<f64>,
    /// Operation to plan: all-reduce (f32), all-gather or all-to-all (sizes as `bench`'s).
    #[arg(long, value_enum, default_value_t = BenchOp::AllReduce)]
    pub(crate) op: BenchOp,
    /// Smallest size in bytes (as `bench`) [default: 8, or 4 bytes per rank if more].
    #[arg(short = 'b', long = "minbytes", value_parser = parse_size)]
    pub(crate) min_bytes: Option<usize>,
    /// Largest size in bytes.
    #[arg(short = 'e', long = "maxbytes", default_value = "1G", value_parser = parse_size)]
    pub(crate) max_bytes: usize,
    /// Factor between sizes.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 4,
          value_parser = clap::value_parser!(u64).range(2..))]
    pub(crate) factor: u64,
    /// Parallel connections per ring neighbour, 1 to 4.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=4))]
    pub(crate) wires: u8,
    /// Also draw each algorithm's bus bandwidth and time against size into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub(crate) plot: Option<PathBuf>,
}

/// A link for `jaccl plan`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum PlanLink {
    /// TCP between the ranks of this machine, as measured.
    Here,
    Given(jaccl::config::LinkSpeed),
}

/// Parses `here` or `BANDWIDTH,LATENCY` (`100Gb/s,2us`).
pub(crate) fn parse_link(s: &str) -> Result<PlanLink, String> {
    if s.trim().eq_ignore_ascii_case("here") {
        return Ok(PlanLink::Here);
    }
    s.parse()
        .map(PlanLink::Given)
        .map_err(|why| format!("{why}, or here"))
}

/// Parses a number of cores, whole or not (`0.5`), from 0.001 to 2^20.
fn parse_cores(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(cores) if (1e-3..=f64::from(1u32 << 20)).contains(&cores) => Ok(cores),
        _ => Err(format!(
            "{s:?}: expected a positive number of cores (2, 0.5), from 0.001 to 1048576"
        )),
    }
}

/// The sizes `first`, × `factor`, ... up to `last`.
pub(crate) fn sweep(first: usize, last: usize, factor: u64) -> Vec<usize> {
    let mut v = Vec::new();
    let mut s = first;
    while s <= last {
        v.push(s);
        match s.checked_mul(factor as usize) {
            Some(next) if next > s => s = next,
            _ => break,
        }
    }
    v
}

/// Parses `8`, `64K`, `32M`, `1G` (binary units; `KiB`, `KB` and a trailing `B` accepted).
pub(crate) fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim().to_ascii_uppercase();
    let t = t.strip_suffix("IB").map(ToString::to_string).unwrap_or(t);
    let t = t.strip_suffix('B').unwrap_or(&t);
    let (digits, shift) = match t.chars().last() {
        Some('K') => (&t[..t.len() - 1], 10),
        Some('M') => (&t[..t.len() - 1], 20),
        Some('G') => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    let n: usize = digits
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a size (examples: 8, 64K, 32M, 1G)"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("'{s}' is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("32M"), Ok(32 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("16B"), Ok(16));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn links_parse_in_bits_or_bytes() {
        let link = parse_link("100Gb/s, 2us").unwrap();
        let expect = jaccl::config::LinkSpeed {
            bandwidth: 12_500_000_000,
            latency: Duration::from_micros(2),
        };
        assert_eq!(link, PlanLink::Given(expect));
        assert_eq!(parse_link("here"), Ok(PlanLink::Here));
        assert!(parse_link("100Gb/s").is_err());
        assert_eq!(sweep(8, 100, 4), vec![8, 32]);
    }

    #[test]
    fn bus_factors_are_nccl_tests_ones() {
        assert_eq!(BenchOp::AllReduce.bus_factor(4), 1.5);
        assert_eq!(BenchOp::AllGather.bus_factor(4), 0.75);
        assert_eq!(BenchOp::ReduceScatter.bus_factor(2), 0.5);
        assert_eq!(BenchOp::SendRecv.bus_factor(8), 1.0);
        assert_eq!(BenchOp::Broadcast.bus_factor(8), 1.0);
        assert_eq!(BenchOp::AllToAll.bus_factor(4), 0.75);
    }
}
