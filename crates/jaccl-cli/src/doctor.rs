//! `jaccl doctor`: what this machine offers jaccl, and whether a hostfile or device file is
//! valid. Observations about the machine are reported, not judged; problems in a file make the
//! command exit non-zero.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::hostfile::{self, Parsed};

/// `println!` that ignores a closed standard output (`jaccl doctor | head`), where `println!`
/// would panic.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// Where the RDMA library is looked for (besides `LD_LIBRARY_PATH`).
const LIB_DIRS: [&str; 6] = [
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/lib/x86_64-linux-gnu",
    "/usr/local/lib",
];
const VERBS_LIB: &str = "libibverbs.so.1";
const RDMA_SYSFS: &str = "/sys/class/infiniband";

/// Prints the report; returns the exit code.
pub(crate) fn run(file: Option<&Path>, check_ssh: bool) -> u8 {
    say!("jaccl {} doctor", env!("CARGO_PKG_VERSION"));
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
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
    let devices = rdma_devices();
    let lib = find_verbs_lib();
    let rdma = match (&lib, devices.is_empty()) {
        (None, _) => format!(
            "not available: {VERBS_LIB} not found (install libibverbs1 and a provider, e.g. ibverbs-providers)"
        ),
        (Some(_), true) => format!("not available: no RDMA devices in {RDMA_SYSFS}"),
        (Some(_), false) => "devices present, but this build has no RDMA transport yet".into(),
    };
    say!("  rdma  {rdma}");

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
    if devices.is_empty() {
        say!("  none ({RDMA_SYSFS} is empty or missing)");
    }
    for (name, ports) in &devices {
        say!("  {name:<12} {}", ports.join("; "));
    }
    match &lib {
        Some(path) => say!("  {VERBS_LIB}: {}", path.display()),
        None => say!("  {VERBS_LIB}: not found"),
    }

    match rustix::process::getrlimit(rustix::process::Resource::Memlock).current {
        Some(bytes) => say!(
            "\nlocked-memory limit (ulimit -l): {} KiB{}",
            bytes / 1024,
            if bytes < 64 << 20 {
                " — RDMA registers its buffers (about 8 MiB per wire); raise it with \
                 `ulimit -l unlimited` before using RDMA"
            } else {
                ""
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
            say!("  device matrix for {} ranks", matrix.len());
            match hostfile::device_topology(&matrix) {
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
                    "  host {i}: ssh {}, ips [{}]",
                    entry.ssh,
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
                    crate::ssh_host_name(&h.hosts[0].ssh)
                );
            }
            if check_ssh {
                for (host, result) in
                    ssh_reachable(&h.hosts.iter().map(|e| e.ssh.clone()).collect::<Vec<_>>())
                {
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

/// RDMA devices and the state of their ports, from sysfs.
fn rdma_devices() -> Vec<(String, Vec<String>)> {
    let Ok(entries) = std::fs::read_dir(RDMA_SYSFS) else {
        return Vec::new();
    };
    let mut out: Vec<(String, Vec<String>)> = entries
        .flatten()
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let ports = std::fs::read_dir(e.path().join("ports"))
                .map(|ps| {
                    ps.flatten()
                        .map(|p| {
                            let read = |f: &str| {
                                std::fs::read_to_string(p.path().join(f))
                                    .map(|s| s.trim().to_string())
                                    .unwrap_or_else(|_| "?".into())
                            };
                            format!(
                                "port {}: {}, {}",
                                p.file_name().to_string_lossy(),
                                read("state"),
                                read("link_layer")
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            (name, ports)
        })
        .collect();
    out.sort();
    out
}

fn find_verbs_lib() -> Option<PathBuf> {
    let from_env = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    from_env
        .split(':')
        .filter(|d| !d.is_empty())
        .chain(LIB_DIRS)
        .map(|d| Path::new(d).join(VERBS_LIB))
        .find(|p| p.exists())
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
