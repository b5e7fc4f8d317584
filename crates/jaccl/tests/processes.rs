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

fn rank_env(rank: usize, size: usize, coordinator: &str, token: u64) -> Vec<(String, String)> {
    vec![
        ("JACCL_RANK".into(), rank.to_string()),
        ("JACCL_SIZE".into(), size.to_string()),
        ("JACCL_COORDINATOR".into(), coordinator.into()),
        ("JACCL_JOB_TOKEN".into(), token.to_string()),
    ]
}

/// Collects the `RESULT ...` line of each child, killing everything after `limit`.
fn results(
    children: &mut [Child],
    rx: &mpsc::Receiver<(usize, String)>,
    limit: Duration,
) -> Vec<String> {
    let deadline = Instant::now() + limit;
    let mut out = vec![String::new(); children.len()];
    while out.iter().any(String::is_empty) {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok((tag, line)) => {
                // libtest may print "test child ... " on the same line first.
                if let Some((_, rest)) = line.split_once("RESULT ") {
                    out[tag] = rest.to_string();
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

#[test]
fn sigkill_of_a_rank_mid_all_reduce_fails_the_others_promptly() {
    let size = 4;
    let coordinator = free_coordinator();
    let token = random_u64();
    let (tx, rx) = mpsc::channel();
    let mut children: Vec<Child> = (0..size)
        .map(|r| {
            let mut env = rank_env(r, size, &coordinator, token);
            // A generous timeout: the others must notice the death at once, not time out.
            env.push(("JACCL_TIMEOUT".into(), "120".into()));
            spawn_child("loop", &env, r, &tx)
        })
        .collect();
    // Wait until every rank is inside the all-reduce loop.
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
    let victim = 2;
    children[victim].kill().unwrap(); // SIGKILL
    children[victim].wait().unwrap();
    let mut others: Vec<Child> = Vec::new();
    let mut tags = Vec::new();
    for (r, c) in children.into_iter().enumerate() {
        if r != victim {
            others.push(c);
            tags.push(r);
        }
    }
    // Re-tag lines for the remaining children.
    let (tx2, rx2) = mpsc::channel();
    std::thread::spawn(move || {
        while let Ok((tag, line)) = rx.recv() {
            if let Some(i) = tags.iter().position(|&t| t == tag) {
                let _ = tx2.send((i, line));
            }
        }
    });
    let got = results(&mut others, &rx2, Duration::from_secs(60));
    for (i, line) in got.iter().enumerate() {
        assert!(
            line.starts_with("PeerLost"),
            "surviving child {i}: {line:?}"
        );
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
