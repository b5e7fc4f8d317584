//! Elastic groups with real processes: a rank SIGKILLed (or stopped) at a random point of a
//! random collective, rank 0 included; the survivors shrink and go on, checked against a
//! plain reference and across ranks. The trials that measure how fast (docs/elastic.md) are
//! the ignored `elastic_trials`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]
mod common;

use std::time::{Duration, Instant};

use common::children::*;
use common::*;
use jaccl::{Error, Group, ReduceOp};

/// Verified steps each survivor runs after its last shrink before it reports.
const STEPS_AFTER: u64 = 40;

/// One trial: `size` ranks loop on random collectives over `transport`; once all are in the
/// loop, the `victims` are signalled with `signal`, one after the other (each after any
/// survivor has started to shrink from the previous one). Returns each rank's report (the
/// victims' empty) and, in Unix microseconds, when the first victim was signalled.
fn trial(
    transport: &str,
    size: usize,
    victims: &[usize],
    signal: rustix::process::Signal,
    seed: u64,
    extra: &[(&str, &str)],
) -> (Vec<String>, u128) {
    let seed = seed.to_string();
    let window = format!("{}ms", liveness_window().as_millis());
    let env = [
        net_env(transport),
        extra,
        &[
            ("TRIAL_SEED", seed.as_str()),
            ("JACCL_LIVENESS", window.as_str()),
        ],
    ]
    .concat();
    let (mut children, rx) = spawn_ranks("elastic", size, &env);
    wait_ready(&rx, size);
    // A random point of the loop.
    std::thread::sleep(Duration::from_millis(mix(size, seed.len()) % 50));
    let mut first = 0;
    for (i, &victim) in victims.iter().enumerate() {
        if i > 0 {
            // The next victim goes while the others shrink from the last.
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                let (_, line) = rx.recv_timeout(left).expect("nobody began to shrink");
                if line.contains("SHRINKING") {
                    break;
                }
            }
        }
        let pid = rustix::process::Pid::from_raw(children[victim].id() as i32).unwrap();
        rustix::process::kill_process(pid, signal).unwrap();
        if i == 0 {
            first = unix_micros();
        }
    }
    let got = results_at(&mut children, &rx, Duration::from_secs(120), victims);
    (got.into_iter().map(|(line, _)| line).collect(), first)
}

/// A survivor's report: `ok old R new N size S failed_us F first_us T digest D`.
#[derive(Debug)]
struct Report {
    new_rank: usize,
    size: usize,
    /// When its first call failed, and when its first call on the shrunk group succeeded.
    failed_us: u128,
    first_us: u128,
    digest: String,
}

fn parse(line: &str) -> Report {
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words.first(), Some(&"ok"), "a survivor failed: {line}");
    let after = |key: &str| {
        let at = words.iter().position(|w| *w == key).expect(key);
        words[at + 1]
    };
    Report {
        new_rank: after("new").parse().unwrap(),
        size: after("size").parse().unwrap(),
        failed_us: after("failed_us").parse().unwrap(),
        first_us: after("first_us").parse().unwrap(),
        digest: after("digest").to_string(),
    }
}

/// Checks a trial: every survivor went on in one group of the survivors, renumbered in
/// order, with the same results; returns how long after the signal each survivor's first
/// collective on that group succeeded.
fn check(lines: &[String], victims: &[usize], signalled_us: u128) -> Vec<Duration> {
    timed(lines, victims, signalled_us)
        .into_iter()
        .map(|(_, first)| first)
        .collect()
}

/// [`check`], with how long after the signal each survivor's call failed too.
fn timed(lines: &[String], victims: &[usize], signalled_us: u128) -> Vec<(Duration, Duration)> {
    let survivors: Vec<usize> = (0..lines.len()).filter(|r| !victims.contains(r)).collect();
    let reports: Vec<Report> = survivors.iter().map(|&r| parse(&lines[r])).collect();
    for (place, (report, &old)) in reports.iter().zip(&survivors).enumerate() {
        assert_eq!(report.size, survivors.len(), "rank {old}: {report:?}");
        assert_eq!(report.new_rank, place, "rank {old} renumbered out of order");
        assert_eq!(
            report.digest, reports[0].digest,
            "rank {old}'s results differ"
        );
    }
    let since = |us: u128| Duration::from_micros(us.saturating_sub(signalled_us) as u64);
    reports
        .iter()
        .map(|r| (since(r.failed_us), since(r.first_us)))
        .collect()
}

#[test]
fn a_rank_killed_mid_collective_is_left_out_and_the_survivors_go_on() {
    for transport in ["tcp", "shm"] {
        // Rank 0 (the coordinator and heartbeat hub), a middle rank, the last.
        for (victim, seed) in [(0, 11), (2, 12), (3, 13)] {
            let (lines, at) = trial(
                transport,
                4,
                &[victim],
                rustix::process::Signal::KILL,
                seed,
                &[],
            );
            let after = check(&lines, &[victim], at);
            eprintln!("{transport}: rank {victim} killed; the survivors went on after {after:?}");
        }
    }
}

#[test]
fn a_rank_killed_while_the_others_shrink_is_left_out_too() {
    let victims = [1, 0];
    let (lines, at) = trial("tcp", 5, &victims, rustix::process::Signal::KILL, 21, &[]);
    let after = check(&lines, &victims, at);
    eprintln!("ranks 1 then 0 killed; the survivors went on after {after:?}");
}

#[test]
fn a_stopped_rank_is_left_out_after_the_liveness_window() {
    let (lines, at) = trial("shm", 4, &[1], rustix::process::Signal::STOP, 31, &[]);
    let after = check(&lines, &[1], at);
    eprintln!("rank 1 stopped; the survivors went on after {after:?}");
}

#[test]
fn a_coordinator_stopped_while_the_others_went_on_finds_itself_left_out() {
    use rustix::process::{Pid, Signal, kill_process};
    let signal = |c: &std::process::Child, s: Signal| {
        kill_process(Pid::from_raw(c.id() as i32).unwrap(), s).unwrap();
    };
    let window = format!("{}ms", liveness_window().as_millis());
    let env = [
        ("JACCL_LIVENESS", window.as_str()),
        ("JACCL_TRANSPORT", "tcp"),
    ];
    let (mut children, rx) = spawn_ranks("agree", 5, &env);
    wait_ready(&rx, 5);
    // Rank 4 stops: rank 0 coordinates the others' agreement and waits for it...
    signal(&children[4], Signal::STOP);
    std::thread::sleep(liveness_window() * 3 / 4);
    // ... and stops too, until the others have gone on without both.
    signal(&children[0], Signal::STOP);
    let mut got = vec![String::new(); 5];
    while got[1..4].iter().any(String::is_empty) {
        let (tag, line) = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("1-3 did not agree");
        if let Some((_, rest)) = line.split_once("RESULT ") {
            got[tag] = rest.to_string();
        }
    }
    signal(&children[0], Signal::CONT);
    while got[0].is_empty() {
        let (tag, line) = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("0 did not answer");
        if let Some((_, rest)) = line.split_once("RESULT ") {
            got[tag] = rest.to_string();
        }
    }
    for c in &mut children {
        let _ = c.kill();
        let _ = c.wait();
    }
    for line in &got[1..4] {
        assert_eq!(line, "ok alive [1, 2, 3]");
    }
    assert!(got[0].contains("went on without this rank"), "{}", got[0]);
}

/// The measurement of docs/elastic.md: `TRIALS` (default 100) kills of a random rank at each
/// of `SIZES` (default 4,16) ranks over `NETS` (default tcp,shm); prints the median and
/// worst time from the kill to each survivor's first collective on the shrunk group.
#[test]
#[ignore = "a measurement: minutes; run by hand (docs/elastic.md)"]
fn elastic_trials() {
    let env = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.into());
    let trials: usize = env("TRIALS", "100").parse().unwrap();
    for transport in env("NETS", "tcp,shm").split(',') {
        for size in env("SIZES", "4,16")
            .split(',')
            .map(|s| s.parse::<usize>().unwrap())
        {
            let (mut times, mut failed) = (Vec::new(), Vec::new());
            let mut zero = 0;
            for t in 0..trials {
                let seed = random_u64();
                let victim = (seed % size as u64) as usize;
                zero += usize::from(victim == 0);
                let kill = rustix::process::Signal::KILL;
                let (lines, at) = trial(transport, size, &[victim], kill, seed, &[]);
                let after = timed(&lines, &[victim], at);
                let worst = after.iter().map(|t| t.1).max().unwrap_or_default();
                eprintln!(
                    "{transport} {size} ranks, trial {t}: rank {victim} killed, worst {worst:?}"
                );
                failed.extend(after.iter().map(|t| t.0));
                times.extend(after.iter().map(|t| t.1));
            }
            let (median, worst) = median_and_worst(&mut times);
            let (failed_median, failed_worst) = median_and_worst(&mut failed);
            println!(
                "ELASTIC {transport} {size} ranks: {trials} kills ({zero} of rank 0), {} survivors: \
                 first collective on the shrunk group after median {median:?}, worst {worst:?} \
                 (their calls failed after median {failed_median:?}, worst {failed_worst:?})",
                times.len()
            );
        }
    }
}

/// The median and the largest of `times`.
fn median_and_worst(times: &mut [Duration]) -> (Duration, Duration) {
    times.sort();
    let median = times.get(times.len() / 2).copied().unwrap_or_default();
    (median, times.last().copied().unwrap_or_default())
}

/// A rank of [`trial`]: loops on random collectives until one fails; then shrinks (again
/// whenever a collective fails), and runs [`STEPS_AFTER`] checked ones on its last group.
fn elastic_rank() -> jaccl::Result<String> {
    let seed: u64 = std::env::var("TRIAL_SEED").map_or(0, |s| s.parse().unwrap_or(0));
    let mut g = jaccl::init()?;
    let old = g.rank();
    one_step(&mut g, seed, 0)?;
    println!("READY");
    let mut step = 1;
    while one_step(&mut g, seed, step).is_ok() {
        step += 1;
    }
    let failed_us = unix_micros();
    loop {
        println!("SHRINKING");
        g = g.shrink()?;
        let (mut first_us, mut digest, mut done) = (None, 0u64, 0);
        while done < STEPS_AFTER {
            match one_step(&mut g, seed ^ 0x5eed, done) {
                Ok(d) => {
                    digest = digest.rotate_left(7) ^ d;
                    first_us.get_or_insert_with(unix_micros);
                    done += 1;
                }
                Err(Error::PeerLost { .. } | Error::Revoked { .. }) => break,
                Err(e) => return Err(e),
            }
        }
        if done == STEPS_AFTER {
            return Ok(format!(
                "ok old {old} new {} size {} failed_us {failed_us} first_us {} digest {digest:x}",
                g.rank(),
                g.size(),
                first_us.unwrap_or_default()
            ));
        }
    }
}

/// One collective, chosen and sized by `(seed, step)`, whose result is checked against a
/// plain reference; returns a digest of it.
fn one_step(g: &mut Group, seed: u64, step: u64) -> jaccl::Result<u64> {
    let (rank, size) = (g.rank(), g.size());
    let pick = mix(seed as usize, step as usize);
    let len = [1, 100, 4096, 32 << 10][(pick % 4) as usize];
    let value = |r: usize, i: usize| mix(r ^ (step as usize) << 20, i) % 1000;
    let input: Vec<u64> = (0..len).map(|i| value(rank, i)).collect();
    let out = match (pick >> 8) % 3 {
        0 => {
            let mut out = vec![0u64; len];
            g.all_reduce(&input, &mut out, ReduceOp::Sum)?;
            let expect: Vec<u64> = (0..len)
                .map(|i| (0..size).map(|r| value(r, i)).sum())
                .collect();
            assert_eq!(out, expect, "all_reduce");
            out
        }
        1 => {
            let root = (pick as usize >> 16) % size;
            let mut out = if rank == root { input } else { vec![0; len] };
            g.broadcast(&mut out, root)?;
            assert!(
                out.iter().enumerate().all(|(i, &x)| x == value(root, i)),
                "broadcast"
            );
            out
        }
        _ => {
            let mut out = vec![0u64; len * size];
            g.all_gather(&input, &mut out)?;
            let expect: Vec<u64> = (0..size)
                .flat_map(|r| (0..len).map(move |i| value(r, i)))
                .collect();
            assert_eq!(out, expect, "all_gather");
            out
        }
    };
    Ok(out.iter().fold(step, |d, &x| d.rotate_left(5) ^ x))
}

#[test]
#[ignore = "run by the tests above as a rank"]
fn child() {
    let Ok(mode) = std::env::var(MODE) else {
        return;
    };
    let outcome = match mode.as_str() {
        "elastic" => elastic_rank(),
        "agree" => jaccl::init().and_then(|mut g| {
            g.barrier()?;
            println!("READY");
            // The last rank, which the test stops, never comes (were it to come first, the
            // others would take it into their decision before it stops).
            let last = g.rank() + 1 == g.size();
            std::thread::sleep(Duration::from_millis(if last { 60_000 } else { 300 }));
            let agreed = g.agree(true);
            let line = agreed.map_or_else(
                |e| format!("err {e}"),
                |a| format!("ok alive {:?}", a.alive),
            );
            // The process lives on, as a survivor's does, answering questions.
            println!("RESULT {line}");
            std::thread::sleep(Duration::from_secs(60));
            Ok(line)
        }),
        other => panic!("unknown mode {other}"),
    };
    match outcome {
        Ok(line) => println!("RESULT {line}"),
        Err(e) => println!("RESULT err {e}"),
    }
}

/// Leaves the group as a rank that ends would: drops it (a group of one takes its place).
fn leave(g: &mut Group) {
    let alone = jaccl::init_with(jaccl::Config::new(0, 1)).unwrap();
    drop(std::mem::replace(g, alone));
}

/// The sum of every rank's `rank + 1` over `g`, checked.
fn check_sum(g: &mut Group) {
    let mut out = [0u64];
    g.all_sum(&[g.rank() as u64 + 1], &mut out).unwrap();
    let n = g.size() as u64;
    assert_eq!(out[0], n * (n + 1) / 2);
}

#[test]
fn revoking_stops_every_member_and_the_group_can_still_shrink() {
    for net in [Net::Tcp, Net::Shm] {
        let out = with_group(net, 4, 1, |g| {
            let error = if g.rank() == 1 {
                std::thread::sleep(Duration::from_millis(200));
                g.revoke();
                g.revoke(); // idempotent
                g.barrier().unwrap_err()
            } else {
                // Rank 1 never comes: only the revocation ends the wait.
                g.barrier().unwrap_err()
            };
            assert!(matches!(error, Error::Revoked { by: 1, .. }), "{error}");
            let mut fresh = g.shrink().unwrap();
            check_sum(&mut fresh);
            (fresh.rank(), fresh.size())
        });
        assert_eq!(out, vec![(0, 4), (1, 4), (2, 4), (3, 4)], "{net:?}");
    }
}

#[test]
fn a_revocation_from_another_thread_stops_a_blocked_call() {
    let out = with_group(Net::Tcp, 3, 1, |g| {
        if g.rank() != 0 {
            // Computing (not waiting in a call, so no deadlock is declared), then calling.
            std::thread::sleep(Duration::from_secs(1));
            return g.barrier().unwrap_err().to_string();
        }
        let handle = g.abort_handle();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(200));
                handle.revoke();
            });
            // Rank 1 never sends.
            g.recv(&mut [0u8; 8], 1).unwrap_err().to_string()
        })
    });
    for line in out {
        assert!(line.contains("revoked by rank 0"), "{line}");
    }
}

#[test]
fn agreeing_gives_every_survivor_the_same_flag_and_lost_ranks() {
    for net in [Net::Tcp, Net::Shm] {
        let out = with_group(net, 4, 1, |g| {
            g.barrier().unwrap();
            if g.rank() == 3 {
                leave(g);
                return None;
            }
            let first = g.agree(g.rank() != 1).unwrap();
            let second = g.agree(true).unwrap();
            Some((first, second))
        });
        for (rank, got) in out.into_iter().enumerate().take(3) {
            let (first, second) = got.unwrap();
            assert_eq!(
                (first.flag, second.flag),
                (false, true),
                "rank {rank} on {net:?}"
            );
            assert_eq!(first.alive, [0, 1, 2]);
            assert_eq!(first.lost, [3]);
            assert_eq!(second.lost, [3]);
        }
    }
}

#[test]
fn shrinking_excluding_leaves_out_the_listed_ranks_alive_or_not() {
    let out = with_group(Net::Tcp, 4, 1, |g| {
        if g.rank() == 2 {
            // Alive, listed, and not calling: it is not waited for.
            std::thread::sleep(Duration::from_secs(1));
            return None;
        }
        let mut fresh = g.shrink_excluding(&[2, 2]).unwrap();
        check_sum(&mut fresh);
        Some((fresh.rank(), fresh.size()))
    });
    assert_eq!(out, vec![Some((0, 3)), Some((1, 3)), None, Some((2, 3))]);
}

#[test]
fn calls_that_differ_never_form_two_groups() {
    // Each keeps its group until all have their answer (see below).
    let all_done = std::sync::Barrier::new(4);
    let out = with_group(Net::Tcp, 4, 1, |g| {
        // Each half leaves the other out.
        let outcome = match g.rank() {
            0 | 1 => g.shrink_excluding(&[2, 3]),
            _ => g.shrink_excluding(&[0, 1]),
        };
        all_done.wait();
        outcome.map(|fresh| fresh.size()).map_err(|e| e.to_string())
    });
    let formed: Vec<usize> = (0..4).filter(|&r| out[r].is_ok()).collect();
    assert!(
        formed.is_empty() || formed == [0, 1] || formed == [2, 3],
        "{out:?}"
    );
    for (r, outcome) in out.iter().enumerate() {
        if let Err(e) = outcome {
            assert!(
                e.contains("disagrees") || e.contains("went on without"),
                "rank {r}: {e}"
            );
        }
    }
    // One rank agrees while the others shrink; one leaves out rank 0 while the others do not.
    for odd_one_out in [0, 2] {
        let all_done = std::sync::Barrier::new(3);
        let out = with_group(Net::Tcp, 3, 1, |g| {
            let error = match (g.rank() == 2, odd_one_out) {
                (true, 0) => g.agree(true).map(drop).unwrap_err(),
                (true, _) => g.shrink_excluding(&[0]).map(drop).unwrap_err(),
                (false, _) => g.shrink().map(drop).unwrap_err(),
            };
            all_done.wait();
            error
        });
        for error in out {
            assert!(matches!(error, Error::Mismatch { .. }), "{error}");
        }
    }
}

#[test]
fn shrinking_with_different_lists_or_bad_ranks_fails_on_every_rank() {
    // Each keeps its group until all have their answer: a rank whose group (and listener) is
    // gone counts as lost, and one that came late would shrink to itself.
    let all_done = std::sync::Barrier::new(3);
    let out = with_group(Net::Tcp, 4, 1, |g| {
        let own = g.shrink_excluding(&[g.rank()]).unwrap_err();
        assert!(matches!(own, Error::InvalidArgument(_)), "{own}");
        let far = g.shrink_excluding(&[4]).unwrap_err();
        assert!(matches!(far, Error::InvalidArgument(_)), "{far}");
        let error = match g.rank() {
            3 => return None,
            2 => g.shrink_excluding(&[1, 3]).unwrap_err(),
            _ => g.shrink_excluding(&[3]).unwrap_err(),
        };
        all_done.wait();
        Some(error)
    });
    for error in out.into_iter().flatten() {
        assert!(
            matches!(
                error,
                Error::Mismatch {
                    op: jaccl::Op::Shrink,
                    ..
                }
            ),
            "{error}"
        );
    }
}

#[test]
fn a_rank_whose_agreement_fails_is_not_waited_for() {
    let out = with_group_timeout(Net::Tcp, 4, 1, Duration::from_secs(20), |g| {
        match g.rank() {
            // Rank 3 lives for a second without calling, then ends (its group and listener go).
            3 => {
                std::thread::sleep(Duration::from_secs(1));
                leave(g);
                None
            }
            // Rank 0, the coordinator, is interrupted while it waits for rank 3.
            0 => {
                let asked = Instant::now();
                g.interrupt_when(move || asked.elapsed() > Duration::from_millis(300));
                let error = g.agree(true).unwrap_err();
                assert!(matches!(error, Error::Interrupted { .. }), "{error}");
                std::thread::sleep(Duration::from_secs(3)); // its listener answers meanwhile
                None
            }
            // The others go on without both, well within the operation timeout.
            _ => Some(g.agree(true).map(|a| a.alive).map_err(|e| e.to_string())),
        }
    });
    assert_eq!(out[1], Some(Ok(vec![1, 2])), "{out:?}");
    assert_eq!(out[2], Some(Ok(vec![1, 2])), "{out:?}");
}

#[test]
fn shrinking_to_oneself_when_every_other_rank_is_left_out_or_gone() {
    let out = with_group(Net::Tcp, 3, 1, |g| {
        if g.rank() != 0 {
            leave(g);
            return None;
        }
        std::thread::sleep(Duration::from_millis(500));
        Some(
            g.shrink_excluding(&[1, 2])
                .map(|fresh| fresh.size())
                .unwrap(),
        )
    });
    assert_eq!(out[0], Some(1));
}
