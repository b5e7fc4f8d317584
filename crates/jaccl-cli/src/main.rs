//! The `jaccl` command: start ranks (`launch`), measure collectives (`bench`), predict them on
//! a cluster (`plan`), check a machine and its files (`doctor`).

mod args;
mod bench;
mod doctor;
mod hostfile;
mod launch;
mod plan;
mod plot;
mod report;

use std::process::ExitCode;

use clap::Parser;

use crate::args::{BenchArgs, Cli, Command, LaunchArgs};
use crate::hostfile::{HostEntry, Place};
use crate::launch::{Host, Job};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Launch(args) => launch_main(&args),
        Command::Bench(args) => bench_main(&args),
        Command::Plan(args) => plan::run(&args),
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
        let first = file.hosts.first().map(coordinator_host);
        let hosts = file
            .hosts
            .iter()
            .flat_map(|h| std::iter::repeat_n(Host::from(&h.place), per_host))
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
        elastic: args.elastic,
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

/// Where a hostfile's host runs its ranks, as the launcher starts them.
impl From<&Place> for Host {
    fn from(place: &Place) -> Host {
        match place {
            Place::Ssh(dest) => Host::Ssh(dest.clone()),
            Place::Netns(name) => Host::Netns(name.clone()),
        }
    }
}

/// Where the other hosts reach `host` (rank 0's coordinator): its first address, else its
/// ssh destination's host name.
pub(crate) fn coordinator_host(host: &HostEntry) -> String {
    match (host.ips.first(), &host.place) {
        (Some(ip), _) => ip.clone(),
        (None, Place::Ssh(dest) | Place::Netns(dest)) => ssh_host_name(dest).to_string(),
    }
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
        elastic: false,
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
