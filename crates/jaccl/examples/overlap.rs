//! How much of the communication nonblocking operations hide behind computation.
//!
//! ```sh
//! cargo run --release --example overlap -- [RANKS] [tcp|shm|auto]    # default: 4 shm
//! ```
//!
//! Starts RANKS processes of itself on this machine. Each starts 16 nonblocking all-reduces of
//! 4 MiB (`Group::start`, the sum of f32 vectors) and meanwhile multiplies matrices for about
//! as long as those all-reduces take alone, then waits for them. It times, as the slowest
//! rank sees them (median of 5 rounds): the all-reduces alone, the computation alone, and both
//! together; overlap is perfect at `both / (alone + alone) = 0.5` and absent at 1. It also
//! reports how much longer the computation takes while the all-reduces run beside it (what the
//! progress thread and the copies cost the computing thread).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::process::Command;
use std::time::{Duration, Instant};

use jaccl::{Config, Group, JobToken, ReduceOp, Transport};

const OPS: usize = 16;
const ELEMENTS: usize = 1 << 20; // 4 MiB of f32
const ROUNDS: usize = 5;
const MATRIX: usize = 128;

fn main() {
    if std::env::var("OVERLAP_RANK").is_ok() {
        return rank();
    }
    let mut args = std::env::args().skip(1);
    let ranks: usize = args
        .next()
        .map_or(4, |n| n.parse().expect("RANKS: a number"));
    let transport = args.next().unwrap_or_else(|| "shm".into());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let token = JobToken::generate().expect("random bytes");
    let children: Vec<_> = (0..ranks)
        .map(|r| {
            Command::new(std::env::current_exe().expect("this program"))
                .env("OVERLAP_RANK", r.to_string())
                .env("OVERLAP_SIZE", ranks.to_string())
                .env("OVERLAP_COORDINATOR", format!("127.0.0.1:{port}"))
                .env("OVERLAP_TOKEN", &token)
                .env("OVERLAP_TRANSPORT", &transport)
                .spawn()
                .expect("starting a rank")
        })
        .collect();
    for mut child in children {
        assert!(child.wait().expect("a rank").success(), "a rank failed");
    }
}

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"))
}

fn rank() {
    let (rank, size): (usize, usize) = (
        var("OVERLAP_RANK").parse().unwrap(),
        var("OVERLAP_SIZE").parse().unwrap(),
    );
    let transport: Transport = var("OVERLAP_TRANSPORT").parse().unwrap();
    let config = Config::new(rank, size)
        .coordinator(var("OVERLAP_COORDINATOR"))
        .job_token(JobToken::new(var("OVERLAP_TOKEN")).unwrap())
        .transport(transport);
    let mut g = jaccl::init_with(config).expect("joining the group");
    let mut buffers: Vec<Vec<f32>> = (0..OPS)
        .map(|k| vec![(rank + k) as f32; ELEMENTS])
        .collect();
    let (a, b) = (matrix(1.0), matrix(2.0));
    let mut c = vec![0f32; MATRIX * MATRIX];

    // Warm up, then calibrate the computation to the communication's time.
    buffers = communicate(&mut g, buffers).1;
    let (comm, back) = communicate(&mut g, buffers);
    buffers = back;
    let twenty = slowest(
        &mut g,
        timed(|| (0..20).for_each(|_| multiply(&a, &b, &mut c))),
    );
    let reps = ((20.0 * comm.as_secs_f64() / twenty.as_secs_f64()).round() as usize).max(1);

    // Per phase (communication, computation, both): the slowest rank's times, and the CPU
    // time of all ranks with the wall time, summed over the rounds.
    let mut times: [Vec<Duration>; 3] = Default::default();
    let mut computing_beside = Vec::new();
    let mut cpu = [(0.0, 0.0); 3];
    for _ in 0..ROUNDS {
        let used = cpu_seconds();
        let (t, back) = communicate(&mut g, buffers);
        buffers = back;
        record(&mut g, (&mut times[0], &mut cpu[0]), used, t);
        g.barrier().unwrap();
        let used = cpu_seconds();
        let t = slowest(
            &mut g,
            timed(|| (0..reps).for_each(|_| multiply(&a, &b, &mut c))),
        );
        record(&mut g, (&mut times[1], &mut cpu[1]), used, t);
        // Both: start the all-reduces, compute, then wait for them.
        g.barrier().unwrap();
        let used = cpu_seconds();
        let start = Instant::now();
        let requests = start_all(&mut g, buffers);
        (0..reps).for_each(|_| multiply(&a, &b, &mut c));
        let computed = start.elapsed();
        buffers = requests.into_iter().map(|r| r.wait().unwrap()).collect();
        let t = slowest(&mut g, start.elapsed());
        record(&mut g, (&mut times[2], &mut cpu[2]), used, t);
        computing_beside.push(slowest(&mut g, computed));
    }
    check(&g, &buffers);
    if rank == 0 {
        let [m, c, b] = times.map(median);
        let cb = median(computing_beside);
        let on = g
            .transport()
            .first()
            .map_or("nothing".into(), |(_, t)| t.to_string());
        println!(
            "# overlap: {size} ranks over {on}, {OPS} nonblocking all-reduces of 4 MiB and {reps} \
             matrix products ({MATRIX}x{MATRIX}), median of {ROUNDS} rounds, slowest rank"
        );
        println!("communication alone  {:8.1} ms", ms(m));
        println!("computation alone    {:8.1} ms", ms(c));
        println!("both, overlapped     {:8.1} ms", ms(b));
        let ratio = b.as_secs_f64() / (m + c).as_secs_f64();
        println!("ratio both / (communication + computation) = {ratio:.3}");
        let slower = cb.as_secs_f64() / c.as_secs_f64();
        println!(
            "computation beside the all-reduces: {:8.1} ms ({slower:.2}x alone)",
            ms(cb)
        );
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get) as f64;
        let busy = |(used, wall): (f64, f64)| 100.0 * used / (wall * cores);
        println!(
            "CPUs busy (all ranks' CPU time / (wall time x {cores} cores)): communication {:.0}%, \
             computation {:.0}%, both {:.0}%",
            busy(cpu[0]),
            busy(cpu[1]),
            busy(cpu[2])
        );
        // However well they overlap, the two phases cannot take less than their CPU time
        // spread over every core, nor less than the longer of them.
        let work = (cpu[0].0 + cpu[1].0) / ROUNDS as f64;
        let floor = (work / cores).max(m.max(c).as_secs_f64());
        println!(
            "best overlap these CPUs allow: {:.1} ms, a ratio of {:.3}",
            floor * 1e3,
            floor / (m + c).as_secs_f64()
        );
    }
}

/// Starts the all-reduces of `buffers`, one request each.
fn start_all(g: &mut Group, buffers: Vec<Vec<f32>>) -> Vec<jaccl::Request<Vec<f32>>> {
    buffers
        .into_iter()
        .map(|mut data| {
            g.start(move |g| {
                g.all_reduce_in_place(&mut data, ReduceOp::Avg)?;
                Ok(data)
            })
        })
        .collect()
}

/// The all-reduces alone: the slowest rank's time, and the buffers back.
fn communicate(g: &mut Group, buffers: Vec<Vec<f32>>) -> (Duration, Vec<Vec<f32>>) {
    g.barrier().unwrap();
    let start = Instant::now();
    let back: Vec<Vec<f32>> = start_all(g, buffers)
        .into_iter()
        .map(|r| r.wait().unwrap())
        .collect();
    (slowest(g, start.elapsed()), back)
}

/// The averages keep every buffer at the mean of the ranks' first values.
fn check(g: &Group, buffers: &[Vec<f32>]) {
    let n = g.size() as f32;
    for (k, data) in buffers.iter().enumerate() {
        let expect = (0..g.size()).map(|r| (r + k) as f32).sum::<f32>() / n;
        assert!(
            data.iter().all(|v| (v - expect).abs() < 1e-3),
            "buffer {k}: {} vs {expect}",
            data[0]
        );
    }
}

/// This process's CPU time (every thread, user and system) so far, in seconds.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // utime and stime: the 14th and 15th fields, the 12th and 13th after the command name
    // (which may hold spaces).
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks: f64 = fields.get(11..13).map_or(0.0, |f| {
        f.iter().filter_map(|v| v.parse::<f64>().ok()).sum()
    });
    ticks / rustix::param::clock_ticks_per_second() as f64
}

/// Records the slowest rank's time `wall` of a phase, and adds the CPU time all ranks used
/// since `since` (this rank's [`cpu_seconds`] then), with the wall time, to the phase's total.
fn record(
    g: &mut Group,
    (times, cpu): (&mut Vec<Duration>, &mut (f64, f64)),
    since: f64,
    wall: Duration,
) {
    let mut all = [0f64];
    g.all_sum(&[cpu_seconds() - since], &mut all).unwrap();
    times.push(wall);
    cpu.0 += all[0];
    cpu.1 += wall.as_secs_f64();
}

fn slowest(g: &mut Group, t: Duration) -> Duration {
    let mut max = [0f64];
    g.all_max(&[t.as_secs_f64()], &mut max).unwrap();
    Duration::from_secs_f64(max[0])
}

fn timed(f: impl FnOnce()) -> Duration {
    let start = Instant::now();
    f();
    start.elapsed()
}

fn matrix(v: f32) -> Vec<f32> {
    (0..MATRIX * MATRIX)
        .map(|i| v + (i % 7) as f32 * 0.01)
        .collect()
}

/// `c = a × b`, the plain way (the compiler vectorises the inner loop).
fn multiply(a: &[f32], b: &[f32], c: &mut [f32]) {
    c.fill(0.0);
    for i in 0..MATRIX {
        for k in 0..MATRIX {
            let x = a[i * MATRIX + k];
            let row = &b[k * MATRIX..(k + 1) * MATRIX];
            for (out, y) in c[i * MATRIX..(i + 1) * MATRIX].iter_mut().zip(row) {
                *out += x * y;
            }
        }
    }
    std::hint::black_box(&c);
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
