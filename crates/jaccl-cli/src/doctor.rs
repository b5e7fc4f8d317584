//! `jaccl doctor`: what this machine offers jaccl, and whether a hostfile or device file is
//! valid. Observations about the machine are reported, not judged; problems in a file make the
//! command exit non-zero.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::hostfile::{self, Parsed, Place};

/// `println!` that ignores a closed standard output (`jaccl doctor | head`), where `println!`
/// would panic.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// Prints the report; returns the exit code.
pub(crate) fn run(file: Option<&Path>, check_ssh: bool) -> u8 {
    say!("jaccl {} doctor", env!("CARGO_PKG_VERSION"));
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    say!("host: {} ({cpus} CPUs)", host.trim());

    say!("\ntransports:");
    say!("  tcp   available");
    match jaccl::probe::shared_memory() {
        Ok(()) => say!(
            "  shm   available: ranks on this host use it (auto), host identity \"{}\"",
            jaccl::probe::host_identity()
        ),
        Err(why) => say!("  shm   not available: {why}; ranks on this host will use tcp"),
    }
    let rdma = jaccl::probe::rdma(None);
    say!("  rdma  {}", rdma_summary(&rdma));

    say!("\nnetwork interfaces:");
    match if_addrs::get_if_addrs() {
        Ok(ifs) => {
            let mut by_name: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for i in ifs {
                by_name
                    .entry(i.name.clone())
                    .or_default()
                    .push(i.ip().to_string());
            }
            for (name, ips) in by_name {
                say!("  {name:<12} {}", ips.join(", "));
            }
        }
        Err(e) => say!("  cannot list interfaces: {e}"),
    }

    say!("\nRDMA devices:");
    match &rdma {
        Err(why) => say!("  none: {why}"),
        Ok(devices) if devices.is_empty() => say!("  none"),
        Ok(devices) => {
            for d in devices {
                for p in &d.ports {
                    say!(
                        "  {} port {}: {}, {}, active MTU {}, LID {}",
                        d.name,
                        p.number,
                        p.state,
                        p.link_layer,
                        p.active_mtu,
                        p.lid
                    );
                    for g in &p.gids {
                        let chosen = if p.chosen_gid == Some(g.index) {
                            "  <- jaccl uses this one"
                        } else {
                            ""
                        };
                        say!("    GID {:<3} {:<8} {}{chosen}", g.index, g.kind, g.address);
                    }
                }
                if d.ports.is_empty() {
                    say!("  {}: cannot be opened", d.name);
                }
            }
        }
    }

    match rustix::process::getrlimit(rustix::process::Resource::Memlock).current {
        Some(bytes) => say!(
            "\nlocked-memory limit (ulimit -l): {} KiB{}",
            bytes / 1024,
            if bytes < 16 * jaccl::probe::RDMA_BYTES_PER_LINK as u64 {
                format!(
                    " — RDMA registers {} KiB per wire and ring neighbour; raise it with \
                     `ulimit -l unlimited` before using RDMA (processes with CAP_IPC_LOCK, as \
                     root's, are exempt)",
                    jaccl::probe::RDMA_BYTES_PER_LINK / 1024
                )
            } else {
                String::new()
            }
        ),
        None => say!("\nlocked-memory limit (ulimit -l): unlimited"),
    }

    let Some(path) = file else { return 0 };
    say!("\n{}:", path.display());
    match hostfile::read(path) {
        Err(problems) => {
            for p in &problems {
                say!("  problem: {p}");
            }
            say!("  {} problem(s)", problems.len());
            1
        }
        Ok(Parsed::Devices(matrix)) => {
            say!("  device matrix for {} ranks", matrix.size());
            match matrix.topology() {
                Ok(topology) => {
                    say!("  usable as: {topology}");
                    0
                }
                Err(why) => {
                    say!("  problem: {why}");
                    1
                }
            }
        }
        Ok(Parsed::Hostfile(h)) => {
            say!("  hostfile with {} host(s)", h.hosts.len());
            for (i, entry) in h.hosts.iter().enumerate() {
                say!(
                    "  host {i}: {}, ips [{}]",
                    entry.place,
                    entry.ips.join(", ")
                );
            }
            if let Some(b) = &h.backend {
                say!("  backend: {b}");
            }
            let mut problems = 0;
            if h.hosts.len() > 1 && h.hosts[0].ips.is_empty() {
                say!(
                    "  note: host 0 has no \"ips\"; the others will reach the coordinator at \"{}\"",
                    crate::coordinator_host(&h.hosts[0])
                );
            }
            if check_ssh {
                let by_ssh: Vec<String> = h
                    .hosts
                    .iter()
                    .filter_map(|e| match &e.place {
                        Place::Ssh(dest) => Some(dest.clone()),
                        Place::Netns(_) => None,
                    })
                    .collect();
                for (host, result) in ssh_reachable(&by_ssh) {
                    match result {
                        Ok(()) => say!("  ssh {host}: ok"),
                        Err(why) => {
                            problems += 1;
                            say!("  problem: ssh {host}: {why}");
                        }
                    }
                }
            }
            u8::from(problems > 0)
        }
    }
}

/// One line on whether RDMA can be used here.
fn rdma_summary(probe: &Result<Vec<jaccl::probe::RdmaDevice>, String>) -> String {
    let devices = match probe {
        Err(why) => return format!("not available: {why}"),
        Ok(d) if d.is_empty() => return "not available: no RDMA device".into(),
        Ok(d) => d,
    };
    let usable = devices.iter().find_map(|d| {
        let p = d
            .ports
            .iter()
            .find(|p| p.state == "ACTIVE" && p.chosen_gid.is_some())?;
        let gid = p.gids.iter().find(|g| Some(g.index) == p.chosen_gid)?;
        Some(format!(
            "available: {} port {} ({}, GID {} {})",
            d.name, p.number, p.link_layer, gid.index, gid.address
        ))
    });
    usable.unwrap_or_else(|| "not available: no active port with a usable GID".into())
}

/// `ssh -o BatchMode=yes host true` for every host, in parallel.
fn ssh_reachable(hosts: &[String]) -> Vec<(String, Result<(), String>)> {
    let ssh = crate::ssh_command();
    let handles: Vec<_> = hosts
        .iter()
        .map(|host| {
            let (host, ssh) = (host.clone(), ssh.clone());
            std::thread::spawn(move || {
                let out = Command::new(&ssh[0])
                    .args(&ssh[1..])
                    .args(["-o", "ConnectTimeout=5", "--", &host, "true"])
                    .stdin(Stdio::null())
                    .output();
                let result = match out {
                    Ok(o) if o.status.success() => Ok(()),
                    Ok(o) => Err(String::from_utf8_lossy(&o.stderr).trim().to_string()),
                    Err(e) => Err(format!("cannot run {}: {e}", ssh[0])),
                };
                (host, result)
            })
        })
        .collect();
    handles.into_iter().filter_map(|h| h.join().ok()).collect()
}
