//! Tests with real processes: ranks are children of this test binary (re-run in "child" mode),
//! so the environment is really read and a rank can really be SIGKILLed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]
mod common;

use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::children::*;
use common::*;

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

/// Starts `size` ranks looping on `op` (`all_reduce`, `broadcast` or `all_to_all`: large and
/// small ones) over `transport`, waits until all are in the loop, then signals `victim` with
/// `signal`. Returns the survivors' results (by rank, the
/// victim's empty) and when each arrived, and when the signal was sent.
fn signal_mid(
    op: &str,
    transport: &str,
    size: usize,
    victim: usize,
    signal: rustix::process::Signal,
    extra_env: &[(&str, &str)],
) -> (Vec<(usize, String, Instant)>, Instant) {
    let env = [net_env(transport), extra_env, &[("LOOP_OP", op)]].concat();
    let (mut children, rx) = spawn_ranks("loop", size, &env);
    wait_ready(&rx, size);
    let pid = rustix::process::Pid::from_raw(children[victim].id() as i32).unwrap();
    rustix::process::kill_process(pid, signal).unwrap();
    let signalled = Instant::now();
    let got = results_at(&mut children, &rx, Duration::from_secs(60), &[victim]);
    let survivors = got
        .into_iter()
        .enumerate()
        .filter(|(r, _)| *r != victim)
        .map(|(r, (line, at))| (r, line, at))
        .collect();
    (survivors, signalled)
}

#[test]
fn sigkill_of_a_rank_mid_collective_fails_the_others_promptly() {
    let before = (leftovers("/dev/shm"), leftovers("/tmp"));
    for op in ["all_reduce", "broadcast", "all_to_all"] {
        for transport in transports() {
            let victim = 2;
            // A generous timeout: the others must notice the death at once, not time out.
            let (survivors, killed) =
                signal_mid(op, transport, 4, victim, rustix::process::Signal::KILL, &[]);
            for (rank, line, at) in survivors {
                let after = at.duration_since(killed);
                eprintln!("{op} {transport}: rank {rank} failed {after:?} after the kill: {line}");
                assert!(
                    line.starts_with("PeerLost"),
                    "{op} {transport} rank {rank}: {line:?}"
                );
                // Every survivor names the victim: the rank it lost, or (when a rank's loss
                // travelled along the ring first) the first cause it passes on.
                assert!(
                    line.contains(&format!("peer: {victim}"))
                        || line.contains(&format!("lost rank {victim}")),
                    "{op} {transport} rank {rank}: {line}"
                );
                // The bound (5 s), far above the measured figures printed above.
                assert!(
                    after < Duration::from_secs(5),
                    "{op} {transport} rank {rank}: {after:?}"
                );
            }
        }
    }
    assert_eq!(
        (leftovers("/dev/shm"), leftovers("/tmp")),
        before,
        "files left behind"
    );
}

/// A rank SIGKILLed during all-reduces that go in two levels (2 pretend hosts × 4 ranks, 16
/// MiB: the host's group, then the group across hosts): every survivor, on either host, fails
/// with `PeerLost` naming it by its rank in the job.
#[test]
fn sigkill_mid_two_level_all_reduce_is_named_on_every_host() {
    let victim = 6;
    let env = [("PRETEND_HOSTS", "2"), ("LOOP_OP", "all_reduce")];
    let (mut children, rx) = spawn_ranks("loop", 8, &env);
    wait_ready(&rx, 8);
    let pid = rustix::process::Pid::from_raw(children[victim].id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
    let got = results_at(&mut children, &rx, Duration::from_secs(60), &[victim]);
    for (rank, (line, _)) in got.iter().enumerate().filter(|(r, _)| *r != victim) {
        eprintln!("two levels: rank {rank}: {line}");
        assert!(line.starts_with("PeerLost"), "rank {rank}: {line:?}");
        assert!(
            line.contains(&format!("peer: {victim},"))
                || line.contains(&format!("lost rank {victim}")),
            "rank {rank}: {line}"
        );
    }
}

/// A rank SIGKILLed while each rank uses three groups from three threads (the job's, a
/// tensor-parallel pair of ranks `2k, 2k + 1` and a data-parallel pair of ranks of the same
/// parity): every survivor fails, in every group it shares with the dead rank, with
/// `PeerLost` naming it by its rank in that group.
#[test]
fn sigkill_while_three_groups_are_in_use_is_named_in_every_group() {
    for transport in transports() {
        let victim = 2;
        let (survivors, killed) = signal_mid(
            "groups",
            transport,
            4,
            victim,
            rustix::process::Signal::KILL,
            &[],
        );
        for (rank, line, at) in survivors {
            eprintln!(
                "groups {transport}: rank {rank} after {:?}: {line}",
                at.duration_since(killed)
            );
            let groups: Vec<&str> = line.split(" | ").collect();
            assert_eq!(groups.len(), 3, "{transport} rank {rank}: {line}");
            // (the group, whether it holds the victim, the victim's rank in it)
            let shared = [
                ("world", true, victim),
                ("tp", rank / 2 == victim / 2, victim % 2),
                ("dp", rank % 2 == victim % 2, victim / 2),
            ];
            for ((name, holds, peer), got) in shared.into_iter().zip(groups) {
                if !holds {
                    continue;
                }
                assert!(
                    got.starts_with(&format!("{name}: PeerLost"))
                        && (got.contains(&format!("peer: {peer},"))
                            || got.contains(&format!("lost rank {peer}"))),
                    "{transport} rank {rank}, group {name} (victim is its rank {peer}): {got}"
                );
            }
        }
    }
}

#[test]
fn a_stopped_rank_is_named_by_every_other_rank_within_the_liveness_window() {
    let cases = [
        ("tcp", 1),
        ("shm", 2),
        ("tcp", 0),
        ("rdma", 1),
        ("rdma", 0),
        ("mesh", 2),
    ];
    let chosen = transports();
    for (transport, victim) in cases.into_iter().filter(|(t, _)| chosen.contains(t)) {
        let (survivors, stopped) = signal_mid(
            "all_reduce",
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

/// A connection made on first use (rank 0 to rank 2 of 4 over TCP: not ring neighbours) to a
/// rank that is stopped: its kernel accepts, its process never answers the handshake. The
/// wait ends by liveness (`PeerLost` naming it), or, with liveness off and a long operation
/// timeout, by an abort from another thread (`Aborted`, not a `Timeout`).
#[test]
fn a_connection_made_on_first_use_to_a_stopped_rank_ends_by_liveness_or_abort() {
    for (liveness, expect) in [("1", "PeerLost"), ("off", "Aborted")] {
        // Not named "jaccl": a test looks for jaccl's leftovers in the temporary directory.
        let trigger = std::env::temp_dir().join(format!("stopped-rank-{}", random_u64()));
        let trigger = trigger.to_string_lossy().into_owned();
        let env = [
            ("JACCL_TRANSPORT", "tcp"),
            ("JACCL_LIVENESS", liveness),
            ("JACCL_TIMEOUT", "120"),
            ("TRIGGER_FILE", trigger.as_str()),
        ];
        let (mut children, rx) = spawn_ranks("lazystop", 4, &env);
        wait_ready(&rx, 4);
        let pid = rustix::process::Pid::from_raw(children[2].id() as i32).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::STOP).unwrap();
        std::fs::write(&trigger, b"").unwrap();
        let got = results_at(&mut children, &rx, Duration::from_secs(60), &[2]);
        let line = &got[0].0;
        eprintln!("liveness {liveness}: rank 0: {line}");
        assert!(
            line.starts_with(expect) && (expect != "PeerLost" || line.contains("peer: 2,")),
            "liveness {liveness}: rank 0: {line:?}"
        );
        let _ = std::fs::remove_file(&trigger);
    }
}

/// A job of 256 ranks over TCP (`JACCL_TEST_RANKS` for another count) starts, runs every
/// collective once against references, idles, and then names a SIGKILLed rank on each of the
/// others. Prints start-up time, file descriptors, threads and memory per rank, and rank 0's
/// share of a core while the job idles (the figures of docs and README come from here).
#[test]
fn a_job_of_256_ranks_checks_every_collective_and_names_a_killed_rank_everywhere() {
    let size: usize = std::env::var("JACCL_TEST_RANKS").map_or(256, |n| n.parse().unwrap());
    let trigger = std::env::temp_dir().join(format!("scale-go-{}", random_u64()));
    let trigger = trigger.to_string_lossy().into_owned();
    let env = [
        ("JACCL_TRANSPORT", "tcp"),
        ("TRIGGER_FILE", trigger.as_str()),
    ];
    let spawned = Instant::now();
    let (mut children, rx) = spawn_ranks("scale", size, &env);
    let mut stats: Vec<Option<String>> = vec![None; size];
    let deadline = spawned + Duration::from_secs(600);
    while stats.iter().any(Option::is_none) {
        let Ok((rank, line)) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
        else {
            let missing: Vec<usize> = (0..size).filter(|&r| stats[r].is_none()).collect();
            panic!("ranks {missing:?} did not check every collective within 10 minutes");
        };
        assert!(!line.contains("RESULT"), "rank {rank}: {line}");
        // libtest may print "test child ... " on the same line first.
        if let Some((_, words)) = line.split_once("STATS ") {
            stats[rank] = Some(words.trim_end_matches(" READY").to_owned());
        }
    }
    let all_ready = spawned.elapsed();
    let figure = |key: &str| -> Vec<u64> {
        let mut values: Vec<u64> = stats
            .iter()
            .flatten()
            .filter_map(|s| s.split(' ').find_map(|w| w.strip_prefix(key)))
            .map(|v| v.parse().unwrap())
            .collect();
        values.sort_unstable();
        values
    };
    let cpu: u64 = figure("cpu_us=").iter().sum();
    eprintln!("{size} ranks: CPU of all ranks in init: {} ms", cpu / 1000);
    for key in [
        "init_ms=",
        "cpu_us=",
        "checked_ms=",
        "fds=",
        "threads=",
        "rss_kb=",
    ] {
        let v = figure(key);
        eprintln!(
            "{size} ranks: {key} min {} median {} max {}",
            v[0],
            v[v.len() / 2],
            v[v.len() - 1]
        );
    }
    // jaccl's own share of start-up: from the last rank's call of `init` (once every process
    // has started) to the last return from it.
    let (called, returned) = (figure("called_us="), figure("returned_us="));
    eprintln!(
        "{size} ranks: from the last call of init to the last return: {} ms; \
         every rank checked every collective {all_ready:?} after the first was started",
        returned[size - 1].saturating_sub(called[size - 1]) / 1000
    );
    eprintln!(
        "{size} ranks: rank 0: {}",
        stats[0].as_deref().unwrap_or("")
    );
    // Idle: the heartbeat alone (and each rank's look for the trigger file every 100 ms).
    let cpu = |pid: u32| -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
    };
    let ticks_per_s = rustix::param::clock_ticks_per_second();
    let idle = Duration::from_secs(5);
    let before: Vec<u64> = children.iter().map(|c| cpu(c.id())).collect();
    std::thread::sleep(idle);
    let after: Vec<u64> = children.iter().map(|c| cpu(c.id())).collect();
    let share = |ticks: u64| ticks as f64 / ticks_per_s as f64 / idle.as_secs_f64() * 100.0;
    let others: u64 = (1..size).map(|r| after[r] - before[r]).sum();
    eprintln!(
        "{size} ranks idle: rank 0 uses {:.1}% of a core, the other {} together {:.1}%",
        share(after[0] - before[0]),
        size - 1,
        share(others)
    );
    std::fs::write(&trigger, b"").unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let victim = size * 2 / 3 + 1;
    let pid = rustix::process::Pid::from_raw(children[victim].id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
    let killed = Instant::now();
    let got = results_at(&mut children, &rx, Duration::from_secs(120), &[victim]);
    let _ = std::fs::remove_file(&trigger);
    let mut slowest = Duration::ZERO;
    for (rank, (line, at)) in got.iter().enumerate().filter(|(r, _)| *r != victim) {
        assert!(
            line.starts_with("PeerLost")
                && (line.contains(&format!("peer: {victim},"))
                    || line.contains(&format!("lost rank {victim}"))),
            "rank {rank} of {size}: {line:?}"
        );
        slowest = slowest.max(at.duration_since(killed));
    }
    eprintln!(
        "{size} ranks: all {} others named the killed rank {victim} within {slowest:?}",
        size - 1
    );
}

/// The judged case, with every default: a rank busy for 75 s in its own code is not an error.
/// 75 s long, so on demand: `cargo test -p jaccl --test processes -- --ignored busy_for_75`.
#[test]
#[ignore = "takes 75 s; run on demand"]
fn a_rank_busy_for_75_s_with_the_defaults_succeeds() {
    let (mut children, rx) = spawn_ranks("late", 3, &[]);
    for (rank, line) in results(&mut children, &rx, Duration::from_secs(150))
        .iter()
        .enumerate()
    {
        assert_eq!(line, "sum 3", "rank {rank}");
    }
}

#[test]
fn the_operation_timeout_still_ends_a_wait() {
    // Liveness off: a stopped rank is only found by the operation timeout.
    for transport in transports() {
        let (survivors, _) = signal_mid(
            "all_reduce",
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

/// `JACCL_IBV_DEVICES` as a file (upstream's matrix): two wires per neighbour, each on the
/// named device, so the ring has two wires; a name that is not a device fails every rank
/// naming it.
#[test]
fn a_device_file_from_the_environment_chooses_each_pairs_devices() {
    if !rdma_or_skip("a_device_file_from_the_environment_chooses_each_pairs_devices") {
        return;
    }
    let device = jaccl::probe::rdma(None).unwrap()[0].name.clone();
    let dir = std::env::temp_dir().join(format!("jaccl-devices-{}", random_u64()));
    std::fs::create_dir_all(&dir).unwrap();
    let size = 3;
    for (name, expect) in [(device.as_str(), "right"), ("mlx5_nope", "mlx5_nope")] {
        let cell = format!("[\"{name}\", \"{name}\"]");
        let rows: Vec<String> = (0..size)
            .map(|i| {
                let cells: Vec<&str> = (0..size)
                    .map(|j| if i == j { "null" } else { cell.as_str() })
                    .collect();
                format!("[{}]", cells.join(", "))
            })
            .collect();
        let file = dir.join(format!("{name}.json"));
        std::fs::write(&file, format!("[{}]", rows.join(",\n"))).unwrap();
        let file = file.display().to_string();
        let env = [
            ("JACCL_TRANSPORT", "rdma"),
            ("JACCL_IBV_DEVICES", file.as_str()),
        ];
        let (mut children, rx) = spawn_ranks("bigsums", size, &env);
        for (rank, line) in results(&mut children, &rx, Duration::from_secs(120))
            .iter()
            .enumerate()
        {
            if expect == "right" {
                assert_eq!(line, "right", "rank {rank}");
            } else {
                assert!(
                    line.starts_with("Unsupported") && line.contains(expect),
                    "rank {rank}: {line}"
                );
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
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
fn bad_sizes_and_durations_are_config_errors_at_once() {
    for (var, value, says) in [
        ("JACCL_SIZE", "1000000000", "largest group"),
        ("JACCL_SIZE", "4294967297", "largest group"),
        ("JACCL_TIMEOUT", "-3", "positive"),
        ("JACCL_LIVENESS", "soon", "not a duration"),
    ] {
        let (tx, rx) = mpsc::channel();
        let mut env = vec![("JACCL_RANK".to_string(), "0".to_string())];
        env.push(("JACCL_SIZE".into(), "2".into()));
        env.retain(|(k, _)| k != var);
        env.push((var.into(), value.into()));
        let started = Instant::now();
        let mut c = vec![spawn_child("alone", &env, 0, &tx)];
        let got = results(&mut c, &rx, Duration::from_secs(60));
        assert!(
            got[0].starts_with("Config") && got[0].contains(says) && got[0].contains(value),
            "{var}={value}: {}",
            got[0]
        );
        assert!(started.elapsed() < Duration::from_secs(30), "{var}={value}");
    }
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
        // Large all-reduces (the ring), medium ones (64 KiB: recursive doubling with 4 ranks)
        // and small ones (with the mesh, one step to every rank).
        // Large collectives (the ring, the direct ones in rounds), medium ones (64 KiB:
        // recursive doubling with 4 ranks) and small ones (with the mesh, one step to every
        // rank), of `LOOP_OP`.
        "loop" if std::env::var("LOOP_OP").is_ok_and(|op| op == "groups") => {
            jaccl::init().and_then(three_groups_until_one_fails)
        }
        "loop" => init_on_pretend_host().and_then(|mut g| {
            let input = vec![1f32; 4 << 20];
            let mut out = vec![0f32; input.len()];
            let op = std::env::var("LOOP_OP").unwrap_or_else(|_| "all_reduce".into());
            let mut one = |g: &mut jaccl::Group, len: usize| match op.as_str() {
                "broadcast" => g.broadcast(&mut out[..len], 1),
                "all_to_all" => g.all_to_all(&input[..len], &mut out[..len]),
                _ => g.all_sum(&input[..len], &mut out[..len]),
            };
            one(&mut g, 4 << 20)?;
            println!("READY");
            // On pretend hosts, only all-reduces that go in two levels.
            let large_only = std::env::var("PRETEND_HOSTS").is_ok();
            loop {
                one(&mut g, 4 << 20)?;
                if !large_only {
                    one(&mut g, 16 << 10)?;
                    one(&mut g, 8)?;
                }
            }
        }),
        // Rank 0 sends to rank 2 (a connection made on first use) once the test has stopped
        // rank 2; with liveness off, another thread aborts the group a second later.
        "lazystop" => jaccl::init().and_then(|mut g| {
            println!("READY");
            let trigger = std::env::var("TRIGGER_FILE").unwrap();
            while std::fs::metadata(&trigger).is_err() {
                std::thread::sleep(Duration::from_millis(10));
            }
            if g.rank() != 0 {
                std::thread::sleep(Duration::from_secs(3));
                return Ok("idle".into());
            }
            if std::env::var("JACCL_LIVENESS").is_ok_and(|l| l == "off") {
                let abort = g.abort_handle();
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_secs(1));
                    abort.abort();
                });
            }
            let started = Instant::now();
            let sent = g.send(&[1u8], 2);
            eprintln!("lazystop: the send ended after {:?}", started.elapsed());
            sent.map(|()| "sent".into())
        }),
        // Every collective once, checked; then, once the test says so, small all-reduces
        // until one fails.
        "scale" => {
            let started = Instant::now();
            let called_at = unix_micros();
            let cpu_at_call = process_cpu_micros();
            jaccl::init().and_then(|mut g| {
                let init = started.elapsed();
                let returned_at = unix_micros();
                let cpu_us = process_cpu_micros() - cpu_at_call;
                let n = g.size();
                let roots = [n - 1, n / 2, 1 % n, 0];
                if let Some(wrong) = every_collective_once(&mut g, &roots)? {
                    return Ok(format!("wrong: {wrong}"));
                }
                println!(
                    "STATS init_ms={} checked_ms={} called_us={called_at} returned_us={returned_at} cpu_us={cpu_us} {} READY",
                    init.as_millis(),
                    started.elapsed().as_millis(),
                    own_resources()
                );
                let trigger = std::env::var("TRIGGER_FILE").unwrap();
                while std::fs::metadata(&trigger).is_err() {
                    std::thread::sleep(Duration::from_millis(100));
                }
                let mut out = [0u64; 1];
                loop {
                    g.all_sum(&[1], &mut out)?;
                }
            })
        }
        "sums" => jaccl::init().and_then(|mut g| {
            let mut out = [0u64; 1];
            for _ in 0..50 {
                g.all_sum(&[g.rank() as u64 + 1], &mut out)?;
            }
            Ok(format!("sum {} of {}", out[0], g.size()))
        }),
        "late" => jaccl::init().and_then(|mut g| {
            if g.rank() == 1 {
                std::thread::sleep(Duration::from_secs(75)); // a checkpoint, say
            }
            let mut out = [0u64; 1];
            g.all_sum(&[1], &mut out)?;
            Ok(format!("sum {}", out[0]))
        }),
        "bigsums" => jaccl::init().and_then(|mut g| {
            let n = g.size() as f32;
            let input = vec![g.rank() as f32 + 1.0; 1 << 18];
            let mut out = vec![0f32; input.len()];
            for _ in 0..4 {
                g.all_sum(&input, &mut out)?;
                let wrong = out.iter().filter(|&&v| v != n * (n + 1.0) / 2.0).count();
                if wrong > 0 {
                    return Ok(format!("{wrong} wrong"));
                }
            }
            Ok("right".into())
        }),
        "stranger" => {
            let (tcp, unix) = stranger(Duration::from_secs(6));
            Ok(format!("stranger reached {tcp} tcp {unix} unix"))
        }
        "flood" => {
            let coordinator: u16 = std::env::var("FLOOD_COORDINATOR").unwrap().parse().unwrap();
            let counts = flood(coordinator, FLOOD, Duration::from_secs(30));
            Ok(format!("flooded {counts:?}"))
        }
        other => panic!("unknown child mode {other}"),
    };
    match outcome {
        Ok(line) => println!("RESULT {line}"),
        Err(e) => println!("RESULT {e:?}"),
    }
}

/// `jaccl::init`, on a pretend host when `PRETEND_HOSTS` says how many (the ranks in runs of
/// equal length: with 2 hosts of 8 ranks, ranks 0-3 on one, 4-7 on the other).
fn init_on_pretend_host() -> jaccl::Result<jaccl::Group> {
    let Ok(hosts) = std::env::var("PRETEND_HOSTS") else {
        return jaccl::init();
    };
    let config = jaccl::Config::from_env()?;
    let host = config.rank * hosts.parse::<usize>().unwrap() / config.size;
    jaccl::init_with(config.host_id(format!("host{host}")))
}

/// The CPU time this process has used, in microseconds.
fn process_cpu_micros() -> i64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec * 1_000_000 + t.tv_nsec / 1000
}

/// This process's open file descriptors, threads and resident memory, as `key=value` words.
fn own_resources() -> String {
    let fds = std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count);
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map_or(String::new(), |v| {
                v.trim().trim_end_matches(" kB").to_owned()
            })
    };
    format!(
        "fds={fds} threads={} rss_kb={}",
        field("Threads:"),
        field("VmRSS:")
    )
}

/// The job's group `g`, a tensor-parallel group (ranks `2k, 2k + 1`) and a data-parallel one
/// (ranks of one parity), each looping all-reduces on a thread of its own until it fails, or
/// for a second after another one failed (so that every group that holds a lost rank finds
/// out); says `READY` once every group has made its first call. Returns each group's first
/// error.
fn three_groups_until_one_fails(mut g: jaccl::Group) -> jaccl::Result<String> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Mutex, PoisonError};
    let rank = g.rank();
    let tp = g.split(Some((rank / 2) as u32), 0)?.expect("a color");
    let dp = g.split(Some((rank % 2) as u32), 0)?.expect("a color");
    let started = AtomicUsize::new(0);
    let first_failure: Mutex<Option<Instant>> = Mutex::new(None);
    let outcomes: Vec<String> = std::thread::scope(|s| {
        let runs: Vec<_> = [("world", g), ("tp", tp), ("dp", dp)]
            .into_iter()
            .map(|(name, mut group)| {
                let (started, first_failure) = (&started, &first_failure);
                s.spawn(move || {
                    let input = vec![1f32; 1 << 18];
                    let mut out = vec![0f32; input.len()];
                    let mut first = true;
                    let failed_long_ago = || {
                        let failed = *first_failure.lock().unwrap_or_else(PoisonError::into_inner);
                        failed.is_some_and(|t| t.elapsed() > Duration::from_secs(1))
                    };
                    while !failed_long_ago() {
                        for len in [1 << 18, 8] {
                            if let Err(e) = group.all_sum(&input[..len], &mut out[..len]) {
                                let mut failed =
                                    first_failure.lock().unwrap_or_else(PoisonError::into_inner);
                                failed.get_or_insert_with(Instant::now);
                                return format!("{name}: {e:?}");
                            }
                        }
                        if std::mem::take(&mut first)
                            && started.fetch_add(1, Ordering::Relaxed) == 2
                        {
                            println!("READY");
                        }
                    }
                    format!("{name}: -")
                })
            })
            .collect();
        runs.into_iter()
            .map(|r| r.join().expect("a group's thread"))
            .collect()
    });
    Ok(outcomes.join(" | "))
}

/// A stranger in the job's network: for `how_long`, connects to every listening TCP port and
/// every abstract Unix socket it can see, and holds idle connections, sends garbage, and sends
/// jaccl hellos (valid magic and version) followed by proofs it cannot know.
fn stranger(how_long: Duration) -> (usize, usize) {
    use std::io::Write;
    use std::net::TcpStream;
    let (mut tcp, mut unix) = (0, 0);
    let until = Instant::now() + how_long;
    let mut idle: Vec<TcpStream> = Vec::new();
    let mut round = 0u64;
    while Instant::now() < until {
        round += 1;
        for port in listening_tcp_ports() {
            let addr = ("127.0.0.1", port);
            let timeout = Duration::from_millis(200);
            let connect = |a: (&str, u16)| {
                std::net::ToSocketAddrs::to_socket_addrs(&a)
                    .ok()
                    .and_then(|mut i| i.next())
                    .and_then(|sa| TcpStream::connect_timeout(&sa, timeout).ok())
            };
            if let Some(s) = connect(addr) {
                tcp += 1;
                if idle.len() < 40 {
                    idle.push(s); // holds a handshake slot until it is dropped
                }
            }
            if let Some(mut s) = connect(addr) {
                let _ = s.write_all(b"GET / HTTP/1.1\r\n\r\n\x00\xff garbage");
            }
            if let Some(mut s) = connect(addr) {
                let _ = s.write_all(&fake_hello(round));
                let _ = s.set_read_timeout(Some(timeout));
                let _ = std::io::Read::read(&mut s, &mut [0u8; 64]);
                let _ = s.write_all(&[0x5a; 32]); // a proof without the key
            }
        }
        for name in abstract_sockets() {
            if let Ok(fd) = rustix::net::socket(
                rustix::net::AddressFamily::UNIX,
                rustix::net::SocketType::SEQPACKET,
                None,
            ) && let Ok(addr) = rustix::net::SocketAddrUnix::new_abstract_name(name.as_bytes())
                && rustix::net::connect(&fd, &addr).is_ok()
            {
                unix += 1;
                let _ =
                    rustix::net::send(&fd, &fake_hello(round), rustix::net::SendFlags::NOSIGNAL);
                let _ = rustix::net::send(&fd, b"garbage", rustix::net::SendFlags::NOSIGNAL);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    (tcp, unix)
}

/// Connections of each kind (idle, garbage) a flood opens to each port it floods.
const FLOOD: usize = 1000;

/// A flood of strangers: `each` idle connections (saying nothing) and `each` connections that
/// send garbage, to the coordinator's port and to the first data port that appears, held open
/// and opened again as soon as the other side closes one, as fast as it can, for at most
/// `how_long` (it prints `FLOODING` once it holds them all at the coordinator). Returns, per
/// port flooded, (port, connections opened).
fn flood(coordinator: u16, each: usize, how_long: Duration) -> Vec<(u16, usize)> {
    use std::io::Write;
    use std::net::TcpStream;
    // 4 × `each` descriptors and some: root may raise its own limit.
    let want = (4 * each + 256) as u64;
    let _ = rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: Some(want),
            maximum: Some(want.max(1 << 16)),
        },
    );
    let open = |s: &TcpStream| {
        let mut b = [0u8; 1];
        let _ = s.set_nonblocking(true);
        matches!(
            rustix::net::recv(s, &mut b, rustix::net::RecvFlags::PEEK),
            Err(rustix::io::Errno::AGAIN)
        )
    };
    let until = Instant::now() + how_long;
    let mut ports = vec![coordinator];
    // Per port: its idle and garbage connections, and how many were opened.
    let mut held: Vec<(u16, Vec<TcpStream>, Vec<TcpStream>, usize)> = Vec::new();
    let mut announced = false;
    while Instant::now() < until {
        if ports.len() == 1
            && let Some(data) = listening_tcp_ports()
                .into_iter()
                .find(|&p| p != coordinator)
        {
            ports.push(data);
        }
        for &port in &ports {
            if !held.iter().any(|h| h.0 == port) {
                held.push((port, Vec::new(), Vec::new(), 0));
            }
            let (_, idle, garbage, opened) = held.iter_mut().find(|h| h.0 == port).unwrap();
            idle.retain(open);
            garbage.retain(open);
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            let timeout = Duration::from_millis(100);
            for _ in 0..64 {
                if idle.len() < each
                    && let Ok(s) = TcpStream::connect_timeout(&addr, timeout)
                {
                    idle.push(s);
                    *opened += 1;
                }
                if garbage.len() < each
                    && let Ok(mut s) = TcpStream::connect_timeout(&addr, timeout)
                {
                    let _ = s.write_all(b"\x16\x03\x01 not jaccl at all \xff\xfe garbage");
                    garbage.push(s);
                    *opened += 1;
                }
            }
        }
        if !announced && held.first().is_some_and(|h| h.3 >= 2 * each) {
            println!("FLOODING");
            announced = true;
        }
    }
    held.iter().map(|h| (h.0, h.3)).collect()
}

/// A hello with jaccl's magic and version, claiming rank 1 of 4, with a made-up nonce.
fn fake_hello(seed: u64) -> Vec<u8> {
    let mut b = b"JCAU".to_vec();
    b.extend_from_slice(&2u16.to_le_bytes());
    b.extend_from_slice(&[1, 0]);
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&4u32.to_le_bytes());
    b.extend_from_slice(&[0; 4]);
    b.extend((0..32).map(|i| (seed as u8).wrapping_mul(31).wrapping_add(i)));
    b
}

/// Ports in LISTEN state in this network namespace.
fn listening_tcp_ports() -> Vec<u16> {
    let text = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(3) == Some(&"0A"))
                .then(|| f.get(1).and_then(|a| a.rsplit(':').next()))
                .flatten()
                .and_then(|p| u16::from_str_radix(p, 16).ok())
        })
        .collect()
}

/// Names of listening abstract Unix sockets (`@name` in /proc/net/unix).
fn abstract_sockets() -> Vec<String> {
    let text = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split_whitespace().nth(7))
        .filter_map(|p| p.strip_prefix('@'))
        .map(str::to_string)
        .collect()
}

/// A network namespace made for one test, deleted when dropped.
struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!("jaccl-{tag}-{}", std::process::id());
        let _ = ip(&["netns", "del", &name]);
        assert!(ip(&["netns", "add", &name]), "ip netns add {name}");
        assert!(ip(&["-n", &name, "link", "set", "lo", "up"]));
        Netns(name)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.0]);
    }
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether network namespaces can be made here (root and iproute2). Without, the tests that
/// need them are skipped, saying so, unless JACCL_REQUIRE_ALL=1 (CI).
fn namespaces_available() -> bool {
    let root = rustix::process::geteuid().is_root();
    let ok = root && ip(&["netns", "list"]);
    if !ok {
        assert!(
            std::env::var("JACCL_REQUIRE_ALL").is_err(),
            "network namespaces are required (run as root with iproute2)"
        );
        eprintln!("skipped: network namespaces need root and iproute2");
    }
    ok
}

#[test]
fn strangers_at_every_port_during_start_up_do_not_stop_the_job() {
    if !namespaces_available() {
        return;
    }
    let ns = Netns::new("strangers");
    let (tx, rx) = mpsc::channel();
    let size = 4;
    // Strangers first, then the ranks, the last one late, so start-up waits among strangers.
    let stranger = spawn_child_in(Some(&ns.0), "stranger", &[], size, &tx);
    std::thread::sleep(Duration::from_millis(300));
    let coordinator = format!("127.0.0.1:{}", 20_000 + (random_u64() % 10_000) as u16);
    let token = random_token();
    let started = Instant::now();
    let mut children: Vec<Child> = (0..size)
        .map(|r| {
            if r == size - 1 {
                std::thread::sleep(Duration::from_secs(2));
            }
            spawn_child_in(
                Some(&ns.0),
                "sums",
                &rank_env(r, size, &coordinator, &token),
                r,
                &tx,
            )
        })
        .collect();
    children.push(stranger);
    let got = results(&mut children, &rx, Duration::from_secs(60));
    eprintln!("job with strangers took {:?}: {got:?}", started.elapsed());
    for (rank, line) in got[..size].iter().enumerate() {
        assert_eq!(line, "sum 10 of 4", "rank {rank}");
    }
    // It did meet the job: the coordinator, data ports and shared-memory sockets.
    let counts: Vec<usize> = got[size]
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert!(
        counts.len() == 2 && counts[0] > 0 && counts[1] > 0,
        "{}",
        got[size]
    );
}

/// Runs the 4 ranks of a job in `ns` whose coordinator listens on `port`: rank 0 first, then,
/// once `meanwhile` returns, the others. Returns how long those took to form the group with
/// rank 0 and sum, and every rank's line.
fn timed_job(ns: &Netns, port: u16, meanwhile: impl FnOnce()) -> (Duration, Vec<String>) {
    let size = 4;
    let (tx, rx) = mpsc::channel();
    let coordinator = format!("127.0.0.1:{port}");
    let token = random_token();
    let env = |r| rank_env(r, size, &coordinator, &token);
    let mut children = vec![spawn_child_in(Some(&ns.0), "sum", &env(0), 0, &tx)];
    meanwhile();
    let started = Instant::now();
    children.extend((1..size).map(|r| spawn_child_in(Some(&ns.0), "sum", &env(r), r, &tx)));
    let got = results(&mut children, &rx, Duration::from_secs(60));
    (started.elapsed(), got)
}

#[test]
fn a_flood_of_idle_and_garbage_connections_delays_start_up_by_less_than_5_s() {
    if !namespaces_available() {
        return;
    }
    let ns = Netns::new("flood");
    let port = 20_000 + (random_u64() % 10_000) as u16;
    let pause = || std::thread::sleep(Duration::from_millis(500));
    let (normal, got) = timed_job(&ns, port, pause);
    assert!(got.iter().all(|l| l == "sum 10 of 4"), "{got:?}");
    // The flood: 1000 idle and 1000 garbage connections at the coordinator, held, before the
    // other ranks come; then as many at the first data port that listens, during start-up.
    let port = port + 1;
    let (tx, rx) = mpsc::channel();
    let env = [("FLOOD_COORDINATOR".to_string(), port.to_string())];
    let mut flooder = spawn_child_in(Some(&ns.0), "flood", &env, 0, &tx);
    let wait_for_flood = || {
        let deadline = Instant::now() + Duration::from_secs(30);
        while let Ok((_, line)) =
            rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            if line.contains("FLOODING") {
                return;
            }
        }
        panic!("the flood did not reach the coordinator");
    };
    let (flooded, got) = timed_job(&ns, port, wait_for_flood);
    let _ = flooder.kill();
    let _ = flooder.wait();
    eprintln!("start-up of ranks 1-3 with rank 0: {normal:?} alone, {flooded:?} flooded");
    assert!(got.iter().all(|l| l == "sum 10 of 4"), "{got:?}");
    assert!(
        flooded < normal + Duration::from_secs(5),
        "flooded start-up took {flooded:?}, {normal:?} without the flood"
    );
}

/// Two pretend hosts (network namespaces) joined by a veth pair: (host a, host b, a's end of
/// the pair, b's end, the coordinator address on a).
fn two_hosts(tag: &str) -> (Netns, Netns, String, String, String) {
    let (a, b) = (
        Netns::new(&format!("{tag}-a")),
        Netns::new(&format!("{tag}-b")),
    );
    let id = std::process::id() % 100_000;
    let net = 100 + (id % 150);
    // Interface names have at most 15 bytes.
    let (va, vb) = (
        format!("jv{id}{}a", &tag[..1]),
        format!("jv{id}{}b", &tag[..1]),
    );
    assert!(ip(&[
        "link", "add", "name", &va, "netns", &a.0, "type", "veth", "peer", "name", &vb, "netns",
        &b.0
    ]));
    for (ns, dev, host) in [(&a.0, &va, 1), (&b.0, &vb, 2)] {
        let addr = format!("10.231.{net}.{host}/24");
        assert!(ip(&["-n", ns, "addr", "add", &addr, "dev", dev]));
        assert!(ip(&["-n", ns, "link", "set", dev, "up"]));
    }
    let coordinator = format!("10.231.{net}.1:{}", 20_000 + (random_u64() % 10_000) as u16);
    (a, b, va, vb, coordinator)
}

#[test]
fn delay_and_loss_between_pretend_hosts_keep_results_right() {
    if !namespaces_available() {
        return;
    }
    let (a, b, va, vb, coordinator) = two_hosts("lossy");
    // netem is not in every kernel (not in this VM's; in ../shared/rdma-vm's guest).
    let netem = |ns: &str, dev: &str| {
        Command::new("tc")
            .args(["-n", ns, "qdisc", "add", "dev", dev, "root", "netem"])
            .args(["delay", "5ms", "loss", "1%"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !(netem(&a.0, &va) && netem(&b.0, &vb)) {
        assert!(
            std::env::var("JACCL_REQUIRE_NETEM").is_err(),
            "tc netem is required here"
        );
        eprintln!("skipped: this kernel has no tc netem (CI runs this test in ../shared/rdma-vm)");
        return;
    }
    let token = random_token();
    let (tx, rx) = mpsc::channel();
    let size = 4;
    let mut children: Vec<Child> = (0..size)
        .map(|r| {
            let ns = if r < 2 { &a.0 } else { &b.0 };
            let env = rank_env(r, size, &coordinator, &token);
            spawn_child_in(Some(ns), "bigsums", &env, r, &tx)
        })
        .collect();
    let started = Instant::now();
    let got = results(&mut children, &rx, Duration::from_secs(300));
    eprintln!(
        "4 x 1 MiB all-reduces over 5 ms delay and 1% loss took {:?}",
        started.elapsed()
    );
    for (rank, line) in got.iter().enumerate() {
        assert_eq!(line, "right", "rank {rank}");
    }
}

#[test]
fn a_cut_link_fails_every_rank_within_the_liveness_window() {
    if !namespaces_available() {
        return;
    }
    // Two pretend hosts joined by a veth pair; ranks 0, 1 on one, 2, 3 on the other.
    let (a, b, va, _, coordinator) = two_hosts("cut");
    let token = random_token();
    let (tx, rx) = mpsc::channel();
    let size = 4;
    let mut children: Vec<Child> = (0..size)
        .map(|r| {
            let mut env = rank_env(r, size, &coordinator, &token);
            env.push(("JACCL_LIVENESS".into(), "2".into()));
            let ns = if r < 2 { &a.0 } else { &b.0 };
            spawn_child_in(Some(ns), "loop", &env, r, &tx)
        })
        .collect();
    wait_ready(&rx, size);
    assert!(ip(&["-n", &a.0, "link", "set", &va, "down"]));
    let cut = Instant::now();
    let got = results_at(&mut children, &rx, Duration::from_secs(60), &[]);
    for (rank, (line, at)) in got.iter().enumerate() {
        let after = at.duration_since(cut);
        eprintln!("rank {rank} failed {after:?} after the cut: {line}");
        // Each side names a rank on the other side of the cut.
        let other_side = if rank < 2 { [2, 3] } else { [0, 1] };
        assert!(
            line.starts_with("PeerLost")
                && other_side
                    .iter()
                    .any(|p| line.contains(&format!("peer: {p},"))),
            "rank {rank}: {line}"
        );
        assert!(after < Duration::from_secs(15), "rank {rank}: {after:?}");
    }
}
