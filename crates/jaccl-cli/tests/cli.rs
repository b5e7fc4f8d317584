//! The `jaccl` command as a user runs it: real processes, real sockets, ssh to 127.0.0.1 and
//! mpirun where available (scripts/test.sh sets them up).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const JACCL: &str = env!("CARGO_BIN_EXE_jaccl");

fn jaccl(args: &[&str]) -> Output {
    Command::new(JACCL)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Few iterations: these tests check behaviour, not speed.
const QUICK: [&str; 4] = ["--iters", "3", "--warmup", "1"];

/// `jaccl bench` with `args` and [`QUICK`].
fn bench(args: &[&str]) -> Output {
    jaccl(&[&["bench"], args, &QUICK[..]].concat())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `jaccl bench` with the words of `args` and `--check`: it must succeed with every value
/// right. Returns what it printed.
fn checked_bench(args: &str) -> String {
    let args: Vec<&str> = args.split_whitespace().chain(["--check"]).collect();
    let out = bench(&args);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "{args:?}: {stdout}{}",
        text(&out.stderr)
    );
    assert!(
        stdout.contains("# Wrong values: 0 OK"),
        "{args:?}: {stdout}"
    );
    stdout
}

/// Whether an optional prerequisite is there; with JACCL_REQUIRE_ALL=1 (CI) it must be.
fn available(what: &str, present: bool) -> bool {
    if !present {
        assert!(
            std::env::var("JACCL_REQUIRE_ALL").is_err(),
            "{what} is required (JACCL_REQUIRE_ALL is set)"
        );
        eprintln!("skipping: {what} is not available (run scripts/test.sh as root)");
    }
    present
}

fn ssh_ready() -> bool {
    available("ssh to 127.0.0.1", std::env::var("JACCL_TEST_SSH").is_ok())
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("jaccl-cli-test-{}-{name}", std::process::id()))
}

/// The `sleep <duration>` processes running (the duration is unique to a test).
fn sleeping(duration: &str) -> Vec<String> {
    let wanted = format!("sleep {duration} ");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| text(&c).replace('\0', " "))
        .filter(|c| c.starts_with(&wanted))
        .collect()
}

fn command_lines_containing(what: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| text(&c).replace('\0', " "))
        .filter(|c| c.contains(what))
        .collect()
}

fn sorted_lines(b: &[u8]) -> Vec<String> {
    let mut v: Vec<String> = text(b).lines().map(str::to_string).collect();
    v.sort();
    v
}

#[test]
fn launch_prefixes_lines_and_gives_each_rank_its_identity() {
    let out = jaccl(&[
        "launch",
        "-n",
        "3",
        "--",
        "sh",
        "-c",
        "echo \"r=$JACCL_RANK n=$JACCL_SIZE\"; echo e >&2",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        sorted_lines(&out.stdout),
        ["[0] r=0 n=3", "[1] r=1 n=3", "[2] r=2 n=3"]
    );
    assert_eq!(sorted_lines(&out.stderr), ["[0] e", "[1] e", "[2] e"]);
}

#[test]
fn launch_env_cwd_and_no_prefix() {
    let out = jaccl(&[
        "launch",
        "-n",
        "2",
        "--no-prefix",
        "--env",
        "A=b c",
        "--cwd",
        "/tmp",
        "sh",
        "-c",
        "echo \"$A $(pwd)\"",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(sorted_lines(&out.stdout), ["b c /tmp", "b c /tmp"]);
    let out = jaccl(&["launch", "--env", "1A=x", "true"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("1A=x"), "{}", text(&out.stderr));
}

#[test]
fn launch_forwards_stdin_to_rank_0_only() {
    let mut child = Command::new(JACCL)
        .args(["launch", "-n", "2", "sh", "-c", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"one\ntwo\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(text(&out.stdout), "[0] one\n[0] two\n");
}

#[test]
fn a_failing_rank_stops_the_others_and_the_launcher_names_it() {
    let out = jaccl(&[
        "launch",
        "-n",
        "3",
        "sh",
        "-c",
        "[ $JACCL_RANK = 1 ] && exit 3; sleep 60",
    ]);
    assert_eq!(out.status.code(), Some(3));
    let err = text(&out.stderr);
    assert!(
        err.contains("rank 1") && err.contains("exited with code 3"),
        "{err}"
    );
    let out = jaccl(&[
        "launch",
        "-n",
        "2",
        "sh",
        "-c",
        "[ $JACCL_RANK = 0 ] && kill -9 $$; sleep 60",
    ]);
    assert_eq!(out.status.code(), Some(137));
    assert!(text(&out.stderr).contains("SIGKILL"));
}

/// Starts a launcher whose ranks print READY then sleep for a duration unique to this test;
/// interrupts it once all are ready and checks that it exits with 128 + signal and leaves no
/// rank behind.
fn interrupt_leaves_nothing(launch_args: Vec<String>, ranks: usize, salt: u32) {
    signal_leaves_nothing(launch_args, ranks, salt, rustix::process::Signal::INT);
}

/// As [`interrupt_leaves_nothing`], with `signal` (SIGKILL: the launcher cannot clean up; the
/// ranks must die with it). Also checks that no command line carries the job token.
fn signal_leaves_nothing(
    mut launch_args: Vec<String>,
    ranks: usize,
    salt: u32,
    signal: rustix::process::Signal,
) {
    let marker = format!("3600.{}{salt}", std::process::id());
    launch_args.extend([
        "sh".into(),
        "-c".into(),
        format!("echo READY; exec sleep {marker}"),
    ]);
    let mut child = Command::new(JACCL)
        .args(&launch_args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for _ in 0..ranks {
        assert!(lines.next().unwrap().unwrap().ends_with("READY"));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while sleeping(&marker).len() < ranks && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(sleeping(&marker).len(), ranks, "{:?}", sleeping(&marker));
    let on_command_lines = command_lines_containing("JACCL_JOB_TOKEN");
    assert!(on_command_lines.is_empty(), "{on_command_lines:?}");
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, signal).unwrap();
    let status = child.wait().unwrap();
    if signal == rustix::process::Signal::INT {
        assert_eq!(status.code(), Some(130));
    }
    // The ranks are gone soon after the launcher (remote ones may take a moment).
    let deadline = Instant::now() + Duration::from_secs(5);
    while !sleeping(&marker).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(sleeping(&marker), Vec::<String>::new());
}

#[test]
fn ctrl_c_stops_every_local_rank() {
    interrupt_leaves_nothing(vec!["launch".into(), "-n".into(), "3".into()], 3, 1);
}

#[test]
fn local_ranks_die_with_a_killed_launcher() {
    let args = vec!["launch".into(), "-n".into(), "3".into()];
    signal_leaves_nothing(args, 3, 3, rustix::process::Signal::KILL);
}

#[test]
fn bench_runs_every_op_with_checks() {
    for op in [
        "all-reduce",
        "all-gather",
        "reduce-scatter",
        "send-recv",
        "barrier",
    ] {
        // The default smallest size: 8 bytes, or one element per rank.
        let stdout = checked_bench(&format!("-n 3 --op {op} -e 256K -f 8"));
        assert!(stdout.contains(&format!("jaccl bench: {op}")), "{stdout}");
        // The mesh over TCP: small sizes in one step, larger ones around the ring.
        let mesh = "--transport tcp --topology mesh";
        let stdout = checked_bench(&format!("-n 4 --op {op} -e 256K -f 8 {mesh}"));
        assert!(stdout.contains("mesh over tcp"), "{op}: {stdout}");
    }
    for (dtype, reduce) in [
        ("bf16", "max"),
        ("bool", "sum"),
        ("c64", "min"),
        ("u8", "sum"),
        ("f64", "min"),
    ] {
        checked_bench(&format!(
            "-n 2 --dtype {dtype} --reduce {reduce} -b 8 -e 64K -f 16"
        ));
    }
}

/// Over RDMA where there is an active port (scripts/test.sh runs this inside the RDMA VM with
/// JACCL_REQUIRE_RDMA=1): bench on 2 and 4 ranks with checks, every op on 3 ranks with 2
/// wires, and doctor's device listing. Elsewhere: `--transport rdma` fails saying why.
#[test]
fn bench_and_doctor_over_rdma() {
    let port = jaccl::probe::rdma(None).ok().and_then(|devices| {
        devices.into_iter().find_map(|d| {
            let active = d
                .ports
                .iter()
                .any(|p| p.state == "ACTIVE" && p.chosen_gid.is_some());
            active.then_some(d.name)
        })
    });
    let Some(device) = port else {
        assert!(
            std::env::var("JACCL_REQUIRE_RDMA").is_err(),
            "JACCL_REQUIRE_RDMA is set but there is no active RDMA port"
        );
        let out = bench(&["-n", "2", "--transport", "rdma", "-b", "8", "-e", "8"]);
        let stderr = text(&out.stderr);
        assert!(!out.status.success());
        assert!(
            stderr.contains("the rdma transport is unavailable on rank"),
            "{stderr}"
        );
        return;
    };
    for ranks in [2, 4] {
        let stdout = checked_bench(&format!("-n {ranks} --transport rdma -e 1M -f 16"));
        assert!(stdout.contains("ring over rdma"), "{stdout}");
    }
    for op in ["all-gather", "reduce-scatter", "send-recv", "barrier"] {
        checked_bench(&format!(
            "-n 3 --transport rdma --wires 2 --op {op} -e 256K -f 64"
        ));
    }
    // Under a small locked-memory limit, without CAP_IPC_LOCK (which lifts it): `rdma` is
    // unsupported, saying so, before any memory is registered.
    let script = format!(
        "ulimit -l 1024 && exec setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock \
         {JACCL} bench -n 2 --transport rdma -b 8 -e 8 --iters 1"
    );
    let out = Command::new("sh").args(["-c", &script]).output().unwrap();
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("unavailable on rank") && stderr.contains("locked-memory limit"),
        "{stderr}"
    );

    let out = jaccl(&["doctor"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    for needle in [
        format!("rdma  available: {device} port 1"),
        format!("{device} port 1: ACTIVE"),
        "active MTU".into(),
        "RoCE v2".into(),
        "<- jaccl uses this one".into(),
    ] {
        assert!(stdout.contains(&needle), "{needle}: {stdout}");
    }
}

/// Pretend hosts made by scripts/pretend-hosts.sh for one test, removed when dropped (a
/// failed test too).
struct PretendHosts {
    name: String,
    file: PathBuf,
}

impl PretendHosts {
    fn up(hosts: usize, rate: &str) -> PretendHosts {
        let made = PretendHosts {
            name: format!("jcli{}", std::process::id() % 100_000),
            file: temp("pretend-hosts.json"),
        };
        let file = made.file.to_str().unwrap();
        assert!(
            made.script(&["up", &hosts.to_string(), rate, file]),
            "pretend-hosts.sh up"
        );
        made
    }

    fn script(&self, args: &[&str]) -> bool {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scripts/pretend-hosts.sh"
        );
        Command::new(script)
            .args(args)
            .env("PRETEND_HOSTS_NAME", &self.name)
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for PretendHosts {
    fn drop(&mut self) {
        self.script(&["down"]);
        let _ = std::fs::remove_file(&self.file);
    }
}

/// `jaccl launch` over a hostfile of pretend hosts (network namespaces joined at 1 Gbit/s,
/// made by scripts/pretend-hosts.sh): 2 hosts × 2 ranks, shared memory inside each, TCP
/// between, every value right (the all-reduce of 1 MiB in two levels), and the route names
/// the hosts.
#[test]
fn launch_runs_ranks_on_pretend_hosts() {
    let root = rustix::process::geteuid().is_root();
    let ip = Command::new("ip").args(["netns", "list"]).output();
    if !available(
        "network namespaces (root, iproute2)",
        root && ip.is_ok_and(|o| o.status.success()),
    ) {
        return;
    }
    let hosts = PretendHosts::up(2, "1gbit");
    let hostfile = hosts.file.to_str().unwrap();
    let out = jaccl(&[
        "launch",
        "--hostfile",
        hostfile,
        "-n",
        "2",
        "--",
        JACCL,
        "bench",
        "-b",
        "32",
        "-e",
        "1M",
        "-f",
        "32",
        "--check",
        "--iters",
        "3",
        "--warmup",
        "1",
    ]);
    drop(hosts);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("# Wrong values: 0 OK"), "{stdout}");
    assert!(
        stdout.contains("over shm+tcp") && stdout.contains("2 hosts × 2 ranks"),
        "{stdout}"
    );
    // 1 MiB, the largest size, went in two levels (checked as every size is): each rank sent
    // its half of the message to the other host once (0.5 × size, and the headers), where the
    // flat ring's boundary ranks send 0.75 × size.
    assert!(
        stdout.contains("in two levels: all-reduce and reduce from 512 KiB, all-gather and reduce-scatter from 1 MiB"),
        "{stdout}"
    );
    let sent: f64 = stdout
        .lines()
        .filter_map(|l| l.split_once('#').map(|(_, rest)| rest))
        .find(|l| l.trim_start().starts_with("1 MiB ") && l.contains(" x size"))
        .and_then(|l| l.split_once('('))
        .and_then(|(_, rest)| rest.split_once(" x size"))
        .and_then(|(ratio, _)| ratio.parse().ok())
        .unwrap_or(f64::NAN);
    assert!((0.5..0.55).contains(&sent), "{stdout}");
}

#[test]
fn bench_writes_json_lines_and_a_plot() {
    let (json, svg) = (temp("rows.jsonl"), temp("plot.svg"));
    let out = bench(&[
        "-n",
        "2",
        "-b",
        "1K",
        "-e",
        "1M",
        "-f",
        "32",
        "--json",
        json.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(&json)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 3);
    for r in &rows {
        for key in [
            "peer",
            "transport",
            "n",
            "bytes",
            "time_us",
            "algbw_gbs",
            "busbw_gbs",
            "ok",
        ] {
            assert!(r.get(key).is_some(), "{key} missing in {r}");
        }
        assert_eq!(r["peer"], "jaccl");
        assert_eq!(r["ok"], true);
        assert_eq!(r["n"], 2);
    }
    assert_eq!(rows[2]["bytes"], 1 << 20);
    let svg_text = std::fs::read_to_string(&svg).unwrap();
    assert!(svg_text.starts_with("<svg") && svg_text.trim_end().ends_with("</svg>"));
    assert_eq!(
        svg_text.matches("<polyline").count(),
        4,
        "two panels, two series each"
    );
    let _ = std::fs::remove_file(json);
    let _ = std::fs::remove_file(svg);
}

#[test]
fn plan_times_every_algorithm_at_4096_ranks_and_marks_the_choice() {
    let svg = temp("plan.svg");
    let out = jaccl(&[
        "plan",
        "-n",
        "4096",
        "--link",
        "100Gb/s,2us",
        "-b",
        "16K",
        "-e",
        "1G",
        "-f",
        "32",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let rows: Vec<&str> = stdout.lines().filter(|l| !l.starts_with('#')).collect();
    let algorithms = [
        "recursive doubling",
        "ring",
        "gather and reduce",
        "Rabenseifner",
    ];
    // 16 KiB, 512 KiB, 16 MiB, 512 MiB: a row per algorithm each, one chosen, one least.
    assert_eq!(rows.len(), 4 * algorithms.len(), "{stdout}");
    for size in rows.chunks(algorithms.len()) {
        for (row, name) in size.iter().zip(algorithms) {
            assert!(row.contains(name), "{row}");
        }
        assert_eq!(size.iter().filter(|r| r.contains("chosen")).count(), 1);
        assert_eq!(size.iter().filter(|r| r.contains("least")).count(), 1);
    }
    // At 16 KiB among 4096 ranks recursive doubling's 12 rounds are the least.
    assert!(rows[0].contains(" 12 ") && rows[0].contains("chosen, least"));
    let svg_text = std::fs::read_to_string(&svg).unwrap();
    assert_eq!(svg_text.matches("<polyline").count(), 2 * algorithms.len());
    let _ = std::fs::remove_file(svg);
    // This machine's figures, another operation.
    let out = jaccl(&["plan", "-n", "17", "--op", "all-to-all", "-e", "1M"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("this machine's TCP") && stdout.contains("Bruck"));
    // Two hosts of 4 ranks: from 1 MiB (all-reduces from 512 KiB) jaccl goes in two levels, which carry each byte out of
    // a host once where the flat ring carries it 1.75 times.
    let out = jaccl(&[
        "plan",
        "-n",
        "8",
        "--hosts",
        "2",
        "--cores",
        "0.5",
        "--link",
        "1Gb/s,6us",
        "-b",
        "256K",
        "-e",
        "4M",
        "-f",
        "16",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let rows: Vec<&str> = stdout.lines().filter(|l| !l.starts_with('#')).collect();
    let two_levels: Vec<&&str> = rows.iter().filter(|r| r.contains("two levels")).collect();
    assert_eq!(two_levels.len(), 2, "{stdout}");
    assert!(!two_levels[0].contains("chosen") && two_levels[1].contains("chosen"));
    assert!(stdout.contains("0.5 cores per host") && stdout.contains("within a host"));
    for (args, says) in [
        (&["plan", "--cores", "0"][..], "positive number of cores"),
        (&["plan", "--cores", "1e-300"][..], "from 0.001"),
        (&["plan", "--within-host", "fast"][..], "BANDWIDTH,LATENCY"),
        (&["plan", "--link", "fast"][..], "BANDWIDTH,LATENCY"),
        (&["plan", "--link", "10Gb/s,5"][..], "unit"),
        (&["plan", "-n", "8", "--hosts", "9"][..], "more hosts"),
        (&["plan", "-n", "8", "-b", "1M", "-e", "1K"][..], "no sizes"),
        (&["plan", "--op", "broadcast"][..], "plan knows"),
    ] {
        let out = jaccl(args);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            text(&out.stderr).contains(says),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn bench_fails_when_values_are_wrong() {
    let out = bench(&["-n", "2", "-b", "64", "-e", "64", "--inject-fault"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stdout).contains("FAILED"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn bench_under_torchrun_style_variables() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let children: Vec<_> = (0..3)
        .map(|r| {
            Command::new(JACCL)
                .args([
                    "bench", "-b", "8", "-e", "8K", "-f", "32", "--iters", "2", "--warmup", "1",
                    "--check",
                ])
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", "3")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<Output> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    for (r, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "rank {r}: {}", text(&o.stderr));
    }
    assert!(text(&outs[0].stdout).contains("on 3 ranks"));
    assert!(outs[1].stdout.is_empty(), "only rank 0 reports");
}

#[test]
fn bench_under_mpirun() {
    let has_mpirun = Command::new("mpirun")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !available("mpirun (Open MPI)", has_mpirun) {
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-n", "4"])
        .args(["-x", "MASTER_ADDR=127.0.0.1", "-x"])
        .arg(format!("MASTER_PORT={port}"))
        .args([
            JACCL, "bench", "--check", "-b", "8", "-e", "256K", "-f", "16", "--iters", "3",
            "--warmup", "1",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("on 4 ranks") && stdout.contains("Wrong values: 0 OK"),
        "{stdout}"
    );
}

#[test]
fn doctor_reports_the_machine_and_checks_files() {
    let out = jaccl(&["doctor"]);
    assert!(out.status.success());
    let stdout = text(&out.stdout);
    for needle in [
        "tcp   available",
        "network interfaces:",
        "lo ",
        "locked-memory limit",
        "rdma",
    ] {
        assert!(stdout.contains(needle), "{needle}: {stdout}");
    }
    let bad = temp("bad-hosts.json");
    std::fs::write(
        &bad,
        r#"[{"ssh": "a", "ips": ["10.0.0.1"]}, {"ips": ["nope"]}]"#,
    )
    .unwrap();
    let out = jaccl(&["doctor", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("host 1: \"ssh\" is missing")
            && stdout.contains("\"nope\" is not an IP address"),
        "{stdout}"
    );
    let out = jaccl(&["launch", "--hostfile", bad.to_str().unwrap(), "true"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("host 1"),
        "{}",
        text(&out.stderr)
    );
    let devices = temp("devices.json");
    std::fs::write(&devices, r#"[[null, "rdma_en1"], ["rdma_en2", null]]"#).unwrap();
    let out = jaccl(&["doctor", devices.to_str().unwrap()]);
    assert!(out.status.success());
    assert!(text(&out.stdout).contains("usable as: mesh"));
    let _ = std::fs::remove_file(bad);
    let _ = std::fs::remove_file(devices);
}

#[test]
fn launch_over_ssh_to_localhost() {
    if !ssh_ready() {
        return;
    }
    let out = jaccl(&[
        "launch",
        "--hosts",
        "127.0.0.1,127.0.0.1",
        "-n",
        "2",
        "--",
        "sh",
        "-c",
        "echo \"r=$JACCL_RANK $JACCL_COORDINATOR\"",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines = sorted_lines(&out.stdout);
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert!(lines[0].starts_with("[0] r=0 127.0.0.1:"), "{lines:?}");

    // A real group of ranks started over ssh.
    let out = jaccl(&[
        "launch",
        "--hosts",
        "127.0.0.1",
        "-n",
        "3",
        "--",
        JACCL,
        "bench",
        "--check",
        "-b",
        "8",
        "-e",
        "1M",
        "-f",
        "32",
        "--iters",
        "3",
        "--warmup",
        "1",
    ]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        text(&out.stdout).contains("[0] # Wrong values: 0 OK"),
        "{}",
        text(&out.stdout)
    );

    // The same through a hostfile.
    let file = temp("hosts.json");
    std::fs::write(&file, r#"{"backend": "jaccl-ring", "envs": ["GREETING=hi"], "hosts": [{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}]}"#).unwrap();
    let out = jaccl(&[
        "launch",
        "--hostfile",
        file.to_str().unwrap(),
        "-n",
        "2",
        "sh",
        "-c",
        "echo $GREETING $JACCL_TOPOLOGY",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(sorted_lines(&out.stdout), ["[0] hi ring", "[1] hi ring"]);

    // The hosts' "rdma" lists become every rank's device matrix (JACCL_IBV_DEVICES).
    std::fs::write(
        &file,
        r#"[{"ssh": "127.0.0.1", "ips": ["127.0.0.1"], "rdma": [null, "rxe_a"]},
            {"ssh": "127.0.0.1", "ips": ["127.0.0.1"], "rdma": ["rxe_b", null]}]"#,
    )
    .unwrap();
    let out = jaccl(&[
        "launch",
        "--hostfile",
        file.to_str().unwrap(),
        "sh",
        "-c",
        "echo \"$JACCL_IBV_DEVICES\"",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for line in sorted_lines(&out.stdout) {
        let json = line.split_once(' ').unwrap().1;
        let matrix: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(
            matrix,
            serde_json::json!([[null, "rxe_a"], ["rxe_b", null]]),
            "{line}"
        );
    }
    let _ = std::fs::remove_file(file);

    // A remote rank that fails stops the others.
    let out = jaccl(&[
        "launch",
        "--hosts",
        "127.0.0.1",
        "-n",
        "3",
        "sh",
        "-c",
        "[ $JACCL_RANK = 2 ] && exit 5; sleep 60",
    ]);
    assert_eq!(out.status.code(), Some(5), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("rank 2 (127.0.0.1) exited with code 5"));
}

/// `jaccl launch` of 2 ranks on this machine over ssh, where ssh to it works.
fn launch_over_ssh() -> Option<Vec<String>> {
    let args = ["launch", "--hosts", "127.0.0.1", "-n", "2"];
    ssh_ready().then(|| args.map(String::from).to_vec())
}

#[test]
fn ctrl_c_stops_every_remote_rank() {
    if let Some(args) = launch_over_ssh() {
        interrupt_leaves_nothing(args, 2, 2);
    }
}

#[test]
fn remote_ranks_die_with_a_killed_launcher() {
    if let Some(args) = launch_over_ssh() {
        signal_leaves_nothing(args, 2, 4, rustix::process::Signal::KILL);
    }
}

#[test]
fn bench_refuses_sweeps_that_cannot_run() {
    for (args, says) in [
        (vec!["-b", "18446744073709551615"], "no sizes"),
        (vec!["-b", "64", "-e", "8"], "no sizes"),
        (
            vec!["--op", "all-gather", "-b", "4", "-e", "4"],
            "less than one f32 element",
        ),
        (vec!["-e", "1G", "-n", "64"], "MiB of buffers"),
    ] {
        let out = bench(&args);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            text(&out.stderr).contains(says),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    let out = bench(&["--iters", "0"]);
    assert!(!out.status.success());
}

#[test]
fn with_elastic_a_killed_rank_does_not_stop_the_others() {
    let out = jaccl(&[
        "launch",
        "--elastic",
        "-n",
        "3",
        "sh",
        "-c",
        "[ $JACCL_RANK = 0 ] && kill -9 $$; sleep 1; echo finished",
    ]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(text(&out.stdout).matches("finished").count(), 2);
    assert!(
        err.contains("rank 0") && err.contains("the others go on"),
        "{err}"
    );
    // A rank that exits with an error still fails the job, with its code.
    let out = jaccl(&[
        "launch",
        "--elastic",
        "-n",
        "3",
        "sh",
        "-c",
        "[ $JACCL_RANK = 0 ] && kill -9 $$; [ $JACCL_RANK = 1 ] && exit 4; sleep 1",
    ]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
}
