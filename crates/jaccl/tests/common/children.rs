//! Ranks as child processes: the test binary re-runs itself in "child" mode (its `child`
//! test, which reads the mode from [`MODE`]), so the environment is really read and a rank
//! can really be SIGKILLed or stopped.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::{Net, free_coordinator, nets, random_token};

pub const MODE: &str = "JACCL_TEST_CHILD";

/// Starts this test binary in child `mode` with `env`; its stdout lines arrive on the channel,
/// tagged with `tag`.
pub fn spawn_child(
    mode: &str,
    env: &[(String, String)],
    tag: usize,
    lines: &mpsc::Sender<(usize, String)>,
) -> Child {
    spawn_child_in(None, mode, env, tag, lines)
}

/// [`spawn_child`] inside network namespace `netns`.
pub fn spawn_child_in(
    netns: Option<&str>,
    mode: &str,
    env: &[(String, String)],
    tag: usize,
    lines: &mpsc::Sender<(usize, String)>,
) -> Child {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    cmd.args([
        "--exact",
        "child",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env_clear()
    .env("PATH", std::env::var("PATH").unwrap_or_default())
    .env(MODE, mode)
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let out = child.stdout.take().unwrap();
    let tx = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send((tag, line));
        }
    });
    child
}

pub fn rank_env(rank: usize, size: usize, coordinator: &str, token: &str) -> Vec<(String, String)> {
    vec![
        ("JACCL_RANK".into(), rank.to_string()),
        ("JACCL_SIZE".into(), size.to_string()),
        ("JACCL_COORDINATOR".into(), coordinator.into()),
        ("JACCL_JOB_TOKEN".into(), token.into()),
    ]
}

/// Starts the `size` ranks of a new job in child `mode`, each with its `rank_env` and `extra`;
/// their lines arrive on the returned channel, tagged with the rank.
pub fn spawn_ranks(
    mode: &str,
    size: usize,
    extra: &[(&str, &str)],
) -> (Vec<Child>, mpsc::Receiver<(usize, String)>) {
    let coordinator = free_coordinator();
    let token = random_token();
    let (tx, rx) = mpsc::channel();
    let children = (0..size)
        .map(|r| {
            let mut env = rank_env(r, size, &coordinator, &token);
            env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
            spawn_child(mode, &env, r, &tx)
        })
        .collect();
    (children, rx)
}

/// Collects the `RESULT ...` line of each child and when it arrived, until every child but
/// those in `silent` has answered or `limit` passed; then kills them all.
pub fn results_at(
    children: &mut [Child],
    rx: &mpsc::Receiver<(usize, String)>,
    limit: Duration,
    silent: &[usize],
) -> Vec<(String, Instant)> {
    let deadline = Instant::now() + limit;
    let mut out = vec![(String::new(), deadline); children.len()];
    let waiting = |out: &[(String, Instant)]| {
        out.iter()
            .enumerate()
            .any(|(i, (l, _))| l.is_empty() && !silent.contains(&i))
    };
    while waiting(&out) {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok((tag, line)) => {
                // libtest may print "test child ... " on the same line first.
                if let Some((_, rest)) = line.split_once("RESULT ") {
                    out[tag] = (rest.to_string(), Instant::now());
                }
            }
            Err(_) => break,
        }
    }
    for c in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
    out
}

pub fn results(
    children: &mut [Child],
    rx: &mpsc::Receiver<(usize, String)>,
    limit: Duration,
) -> Vec<String> {
    results_at(children, rx, limit, &[])
        .into_iter()
        .map(|(l, _)| l)
        .collect()
}

/// Waits until each of `size` ranks has said `READY` (a minute at most).
pub fn wait_ready(rx: &mpsc::Receiver<(usize, String)>, size: usize) {
    let mut ready = vec![false; size];
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready.iter().all(|&r| r) {
        let (tag, line) = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("ranks did not start");
        ready[tag] |= line.ends_with("READY");
    }
}

/// The nets of `nets()` (see common) that a process can be told to use alone: `tcp`, `shm`,
/// `rdma`, `mesh` (the mesh topology over TCP), or `meshlocal` (the mesh with the default
/// transport).
pub fn transports() -> Vec<&'static str> {
    let names = nets().into_iter().filter_map(|net| match net {
        Net::Tcp => Some("tcp"),
        Net::Shm => Some("shm"),
        Net::Rdma => Some("rdma"),
        Net::Mesh => Some("mesh"),
        Net::MeshLocal => Some("meshlocal"),
        Net::Mixed => None,
    });
    names.collect()
}

/// The environment that selects one of [`transports`].
pub fn net_env(name: &str) -> &'static [(&'static str, &'static str)] {
    match name {
        "tcp" => &[("JACCL_TRANSPORT", "tcp")],
        "shm" => &[("JACCL_TRANSPORT", "shm")],
        "rdma" => &[("JACCL_TRANSPORT", "rdma")],
        "mesh" => &[("JACCL_TRANSPORT", "tcp"), ("JACCL_TOPOLOGY", "mesh")],
        "meshlocal" => &[("JACCL_TOPOLOGY", "mesh")],
        other => panic!("unknown net {other}"),
    }
}

/// Microseconds since the Unix epoch: a clock all the test's processes share.
pub fn unix_micros() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros())
}
