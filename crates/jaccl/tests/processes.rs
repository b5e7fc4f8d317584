//! Tests with real processes: ranks are children of this test binary (re-run in "child" mode),
//! so the environment is really read and a rank can really be SIGKILLed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]
mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;

const MODE: &str = "JACCL_TEST_CHILD";

/// Starts this test binary in child `mode` with `env`; its stdout lines arrive on the channel,
/// tagged with `tag`.
fn spawn_child(
    mode: &str,
    env: &[(String, String)],
    tag: usize,
    lines: &mpsc::Sender<(usize, String)>,
) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
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

fn rank_env(rank: usize, size: usize, coordinator: &str, token: &str) -> Vec<(String, String)> {
    vec![
        ("JACCL_RANK".into(), rank.to_string()),
        ("JACCL_SIZE".into(), size.to_string()),
        ("JACCL_COORDINATOR".into(), coordinator.into()),
        ("JACCL_JOB_TOKEN".into(), token.into()),
    ]
}

/// Collects the `RESULT ...` line of each child and when it arrived, until every child but
/// `silent` has answered or `limit` passed; then kills them all.
fn results_at(
    children: &mut [Child],
    rx: &mpsc::Receiver<(usize, String)>,
    limit: Duration,
    silent: Option<usize>,
) -> Vec<(String, Instant)> {
    let deadline = Instant::now() + limit;
    let mut out = vec![(String::new(), deadline); children.len()];
    let waiting = |out: &[(String, Instant)]| {
        out.iter()
            .enumerate()
            .any(|(i, (l, _))| l.is_empty() && Some(i) != silent)
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

fn results(
    children: &mut [Child],
    rx: &mpsc::Receiver<(usize, String)>,
    limit: Duration,
) -> Vec<String> {
    results_at(children, rx, limit, None)
        .into_iter()
        .map(|(l, _)| l)
        .collect()
}

/// Names in `dir` that jaccl could have left behind (all of /dev/shm; jaccl's in /tmp).
fn leftovers(dir: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| dir == "/dev/shm" || n.contains("jaccl"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Starts `size` ranks looping on large all-reduces over `transport`, waits until all are in
/// the loop, then signals `victim` with `signal`. Returns the survivors' results (by rank, the
/// victim's empty) and when each arrived, and when the signal was sent.
fn signal_mid_all_reduce(
    transport: &str,
    size: usize,
    victim: usize,
    signal: rustix::process::Signal,
    extra_env: &[(&str, &str)],
) -> (Vec<(usize, String, Instant)>, Instant) {
    let coordinator = free_coordinator();
    let token = random_token();
    let (tx, rx) = mpsc::channel();
    let mut children: Vec<Child> = (0..size)
        .map(|r| {
            let mut env = rank_env(r, size, &coordinator, &token);
            env.push(("JACCL_TRANSPORT".into(), transport.into()));
            env.extend(
                extra_env
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string())),
            );
            spawn_child("loop", &env, r, &tx)
        })
        .collect();
    let mut ready = vec![false; size];
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready.iter().all(|&r| r) {
        let (tag, line) = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("ranks did not start");
        if line.ends_with("READY") {
            ready[tag] = true;
        }
    }
    let pid = rustix::process::Pid::from_raw(children[victim].id() as i32).unwrap();
    rustix::process::kill_process(pid, signal).unwrap();
    let signalled = Instant::now();
    let got = results_at(&mut children, &rx, Duration::from_secs(60), Some(victim));
    let survivors = got
        .into_iter()
        .enumerate()
        .filter(|(r, _)| *r != victim)
        .map(|(r, (line, at))| (r, line, at))
        .collect();
    (survivors, signalled)
}

#[test]
fn sigkill_of_a_rank_mid_all_reduce_fails_the_others_promptly() {
    let before = (leftovers("/dev/shm"), leftovers("/tmp"));
    for transport in ["tcp", "shm"] {
        let victim = 2;
        // A generous timeout: the others must notice the death at once, not time out.
        let (survivors, killed) =
            signal_mid_all_reduce(transport, 4, victim, rustix::process::Signal::KILL, &[]);
        for (rank, line, at) in survivors {
            let after = at.duration_since(killed);
            eprintln!("{transport}: rank {rank} failed {after:?} after the kill: {line}");
            assert!(
                line.starts_with("PeerLost"),
                "{transport} rank {rank}: {line:?}"
            );
            // Over shared memory every rank watches every other one; over TCP the failure
            // travels around the ring (and may reach even a neighbour of the victim first).
            if transport == "shm" {
                assert!(
                    line.contains(&format!("peer: {victim}")),
                    "{transport} rank {rank}: {line}"
                );
            }
            // The bound (5 s), far above the measured figures printed above.
            assert!(
                after < Duration::from_secs(5),
                "{transport} rank {rank}: {after:?}"
            );
        }
    }
    assert_eq!(
        (leftovers("/dev/shm"), leftovers("/tmp")),
        before,
        "files left behind"
    );
}

#[test]
fn a_stopped_rank_is_named_by_every_other_rank_within_the_liveness_window() {
    for (transport, victim) in [("tcp", 1), ("shm", 2), ("tcp", 0)] {
        let (survivors, stopped) = signal_mid_all_reduce(
            transport,
            4,
            victim,
            rustix::process::Signal::STOP,
            &[("JACCL_LIVENESS", "1")],
        );
        for (rank, line, at) in survivors {
            let after = at.duration_since(stopped);
            eprintln!(
                "{transport}: rank {rank} failed {after:?} after rank {victim} stopped: {line}"
            );
            assert!(
                line.starts_with("PeerLost") && line.contains(&format!("peer: {victim},")),
                "{transport} rank {rank}: {line:?}"
            );
            // The window (1 s) and a beat interval, far below this bound.
            assert!(
                after < Duration::from_secs(10),
                "{transport} rank {rank}: {after:?}"
            );
        }
    }
}

#[test]
fn the_operation_timeout_still_ends_a_wait() {
    // Liveness off: a stopped rank is only found by the operation timeout.
    for transport in ["tcp", "shm"] {
        let (survivors, _) = signal_mid_all_reduce(
            transport,
            3,
            1,
            rustix::process::Signal::STOP,
            &[("JACCL_TIMEOUT", "2"), ("JACCL_LIVENESS", "off")],
        );
        // Whoever times out first poisons its group; over TCP that closes its connections, so
        // a peer may see the closure before its own timeout.
        let timeouts = survivors
            .iter()
            .filter(|(_, l, _)| l.starts_with("Timeout"))
            .count();
        assert!(timeouts > 0, "{transport}: {survivors:?}");
        for (rank, line, _) in &survivors {
            assert!(
                line.starts_with("Timeout") || line.starts_with("PeerLost"),
                "{transport} rank {rank}: {line:?}"
            );
        }
    }
}

#[test]
fn init_with_an_empty_environment_is_a_group_of_one() {
    let (tx, rx) = mpsc::channel();
    let mut c = vec![spawn_child("alone", &[], 0, &tx)];
    let got = results(&mut c, &rx, Duration::from_secs(60));
    assert_eq!(got[0], "size 1 sum 6");
}

#[test]
fn a_bad_variable_is_a_config_error_naming_it() {
    let (tx, rx) = mpsc::channel();
    let env = vec![
        ("JACCL_RANK".into(), "abc".into()),
        ("JACCL_SIZE".into(), "2".into()),
    ];
    let mut c = vec![spawn_child("alone", &env, 0, &tx)];
    let got = results(&mut c, &rx, Duration::from_secs(60));
    assert!(
        got[0].starts_with("Config") && got[0].contains("JACCL_RANK=abc"),
        "{}",
        got[0]
    );
}

#[test]
fn torchrun_variables_form_a_group() {
    let size = 3;
    let coordinator = free_coordinator();
    let (host, port) = coordinator.rsplit_once(':').unwrap();
    let (tx, rx) = mpsc::channel();
    let mut children: Vec<Child> = (0..size)
        .map(|r| {
            let env = vec![
                ("RANK".to_string(), r.to_string()),
                ("WORLD_SIZE".to_string(), size.to_string()),
                ("MASTER_ADDR".to_string(), host.to_string()),
                ("MASTER_PORT".to_string(), port.to_string()),
            ];
            spawn_child("sum", &env, r, &tx)
        })
        .collect();
    let got = results(&mut children, &rx, Duration::from_secs(60));
    for line in got {
        assert_eq!(line, "sum 6 of 3");
    }
}

/// The child side: does what `JACCL_TEST_CHILD` says and prints one `RESULT` line.
#[test]
#[ignore = "run as a child process by the other tests of this file"]
fn child() {
    let Ok(mode) = std::env::var(MODE) else {
        return;
    };
    let outcome = match mode.as_str() {
        "alone" => jaccl::init().and_then(|mut g| {
            let mut out = [0i32; 1];
            g.all_sum(&[6], &mut out)?;
            Ok(format!("size {} sum {}", g.size(), out[0]))
        }),
        "sum" => jaccl::init().and_then(|mut g| {
            let mut out = [0u64; 1];
            g.all_sum(&[g.rank() as u64 + 1], &mut out)?;
            Ok(format!("sum {} of {}", out[0], g.size()))
        }),
        "loop" => jaccl::init().and_then(|mut g| {
            let input = vec![1f32; 4 << 20];
            let mut out = vec![0f32; input.len()];
            g.all_sum(&input, &mut out)?;
            println!("READY");
            loop {
                g.all_sum(&input, &mut out)?;
            }
        }),
        other => panic!("unknown child mode {other}"),
    };
    match outcome {
        Ok(line) => println!("RESULT {line}"),
        Err(e) => println!("RESULT {e:?}"),
    }
}
