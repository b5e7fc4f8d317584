//! The `jaccl` command: start ranks (`launch`), measure collectives (`bench`), check a machine
//! and its files (`doctor`).

mod bench;
mod doctor;
mod hostfile;
mod launch;
mod report;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use jaccl::{Config, Topology, Transport};

use crate::bench::BenchArgs;
use crate::launch::{Host, Job};

#[derive(Debug, Parser)]
#[command(
    name = "jaccl",
    version,
    about = "Collective communication for distributed ML: launch ranks, benchmark, check the machine"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start N ranks of a program, on this machine or on hosts over ssh.
    Launch(LaunchArgs),
    /// Measure a collective over a range of sizes (nccl-tests style), checking the results.
    Bench(BenchArgs),
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
struct LaunchArgs {
    /// Ranks on this machine; with --hosts or --hostfile, ranks per host.
    #[arg(short = 'n', long = "ranks", value_parser = clap::value_parser!(u16).range(1..))]
    ranks: Option<u16>,
    /// Comma-separated hosts to start ranks on over ssh (host or user@host); rank order follows.
    #[arg(long, value_delimiter = ',', conflicts_with = "hostfile")]
    hosts: Vec<String>,
    /// JSON hostfile in the format of mlx.launch.
    #[arg(long, value_name = "FILE")]
    hostfile: Option<PathBuf>,
    /// Extra environment variable for every rank (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = hostfile::parse_env)]
    env: Vec<(String, String)>,
    /// Working directory of every rank [default: the current one, where it exists].
    #[arg(long, value_name = "DIR")]
    cwd: Option<PathBuf>,
    /// Do not prefix each output line with the rank.
    #[arg(long)]
    no_prefix: bool,
    /// Print what is started and stopped.
    #[arg(short = 'v', long)]
    verbose: bool,
    /// Port of the coordinator on rank 0's host [default: a free port].
    #[arg(long)]
    port: Option<u16>,
    #[command(flatten)]
    group: GroupArgs,
    /// The program to run and its arguments.
    #[arg(required = true, allow_hyphen_values = true, num_args = 1.., value_name = "PROGRAM")]
    program: Vec<String>,
}

/// Options of `jaccl doctor`.
#[derive(Debug, clap::Args)]
struct DoctorArgs {
    /// A hostfile or device file (MLX_IBV_DEVICES) to check.
    file: Option<PathBuf>,
    /// Also check that every host of the hostfile is reachable with ssh.
    #[arg(long)]
    ssh: bool,
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Launch(args) => launch_main(&args),
        Command::Bench(args) => bench_main(&args),
        Command::Doctor(args) => Ok(doctor::run(args.file.as_deref(), args.ssh)),
        Command::ExecRank { parent, program } => Err(launch::exec_rank(parent, &program)),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(msg) => {
            eprintln!("jaccl: {msg}");
            ExitCode::FAILURE
        }
    }
}

/// `jaccl launch`: builds the job from the options and runs it.
fn launch_main(args: &LaunchArgs) -> Result<u8, String> {
    let per_host = usize::from(args.ranks.unwrap_or(1));
    let mut env = Vec::new();
    let (hosts, coordinator_host): (Vec<Host>, Option<String>) = if let Some(path) = &args.hostfile
    {
        let file = hostfile::read_hostfile(path).map_err(|e| e.join("\n"))?;
        match file.backend.as_deref() {
            None | Some("jaccl") => {}
            Some("jaccl-ring" | "ring") => env.push(("JACCL_TOPOLOGY".into(), "ring".into())),
            Some(other) => {
                return Err(format!(
                    "{}: backend \"{other}\" is not one jaccl runs (use jaccl, jaccl-ring or ring)",
                    path.display()
                ));
            }
        }
        env.extend(file.envs);
        if let Some(devices) = &file.devices {
            if per_host != 1 {
                return Err(format!(
                    "{}: the hosts' \"rdma\" lists describe one rank per host; drop -n or the \
                     lists",
                    path.display()
                ));
            }
            // The matrix itself, not a path: remote hosts have no copy of a local file.
            env.push(("JACCL_IBV_DEVICES".into(), devices.to_string()));
        }
        let first = file.hosts.first().map(|h| {
            h.ips
                .first()
                .cloned()
                .unwrap_or_else(|| ssh_host_name(&h.ssh).to_string())
        });
        let hosts = file
            .hosts
            .iter()
            .flat_map(|h| std::iter::repeat_n(Host::Ssh(h.ssh.clone()), per_host))
            .collect();
        (hosts, first)
    } else if !args.hosts.is_empty() {
        if let Some(i) = args.hosts.iter().position(|h| h.trim().is_empty()) {
            return Err(format!("--hosts: entry {i} is empty"));
        }
        let hosts = args
            .hosts
            .iter()
            .flat_map(|h| std::iter::repeat_n(Host::Ssh(h.trim().to_string()), per_host))
            .collect();
        (hosts, Some(ssh_host_name(args.hosts[0].trim()).to_string()))
    } else {
        (vec![Host::Local; per_host], None)
    };
    let port = match (args.port, &coordinator_host) {
        (Some(p), _) => p,
        (None, None) => free_local_port()?,
        // Rank 0 is on another host: any port is a guess; pick one away from the ephemeral range.
        (None, Some(_)) => 20_000 + (launch::random_number() % 10_000) as u16,
    };
    let host = coordinator_host.unwrap_or_else(|| "127.0.0.1".into());
    let coordinator = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    env.extend(args.group.env());
    env.extend(args.env.iter().cloned());
    let job = Job {
        program: args.program.clone(),
        hosts,
        coordinator,
        env,
        cwd: args.cwd.clone(),
        prefix: !args.no_prefix,
        verbose: args.verbose,
        rank0_inherits_terminal: false,
        ssh: ssh_command(),
    };
    launch::run(&job)
}

/// The ssh command: `$JACCL_SSH` (e.g. `ssh -F ~/cluster.conf`) or `ssh`, never prompting.
pub(crate) fn ssh_command() -> Vec<String> {
    let mut cmd = std::env::var("JACCL_SSH")
        .ok()
        .and_then(|s| shell_words::split(&s).ok())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| vec!["ssh".into()]);
    cmd.extend(["-o", "BatchMode=yes", "-o", "LogLevel=ERROR"].map(String::from));
    cmd
}

/// `host` of `user@host`.
pub(crate) fn ssh_host_name(dest: &str) -> &str {
    dest.rsplit_once('@').map_or(dest, |(_, h)| h)
}

/// `jaccl bench`: one rank under a launcher, else a launcher of `-n` local ranks of itself.
fn bench_main(args: &BenchArgs) -> Result<u8, String> {
    if bench::under_launcher() {
        return match bench::run_rank(args)? {
            true => Ok(0),
            false => Err("some values were wrong (see #wrong)".into()),
        };
    }
    bench::check_sweep(args, usize::from(args.ranks))?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let mut program = vec![exe.to_string_lossy().into_owned()];
    program.extend(std::env::args().skip(1));
    let job = Job {
        program,
        hosts: vec![Host::Local; usize::from(args.ranks)],
        coordinator: format!("127.0.0.1:{}", free_local_port()?),
        env: args.group.env(),
        cwd: None,
        prefix: false,
        verbose: false,
        rank0_inherits_terminal: true,
        ssh: ssh_command(),
    };
    launch::run(&job)
}

/// A TCP port that is free on 127.0.0.1 right now.
pub(crate) fn free_local_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("cannot find a free port on 127.0.0.1: {e}"))
}
