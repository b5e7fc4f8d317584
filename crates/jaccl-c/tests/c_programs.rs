//! C programs against the built library: tests/c/check.c as every rank of real jobs (every
//! collective against a reference, started operations, batches, sub-communicators, misuse,
//! a disagreement, a killed rank), under AddressSanitizer too; the examples under
//! `jaccl launch` and `mpirun`; and the installed files (scripts/install-c.sh, pkg-config).
//!
//! Each test builds `libjaccl.so` and the `jaccl` command first (`cargo build`: cargo test
//! does not build a crate's C libraries).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The target directory's profile directory (`target/debug`), with the library and the
/// `jaccl` command built.
fn built() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test's path");
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("target/<profile>/deps");
        let target_dir = profile_dir.parent().expect("target/");
        let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cargo.args([
            "build",
            "-q",
            "-p",
            "jaccl-c",
            "-p",
            "jaccl-cli",
            "--target-dir",
        ]);
        cargo.arg(target_dir);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cargo.arg("--release");
        }
        let status = cargo.status().expect("cargo runs");
        assert!(status.success(), "cargo build -p jaccl-c -p jaccl-cli");
        profile_dir.to_path_buf()
    })
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A temporary directory, removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(name: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("jaccl-c-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    Scratch(dir)
}

/// Compiles `sources` with `compiler` into `out` against the built library.
fn compile(compiler: &str, sources: &[PathBuf], out: &Path, extra: &[&str]) {
    let lib = built();
    let std = if compiler == "c++" {
        "-std=c++11"
    } else {
        "-std=c99"
    };
    let output = Command::new(compiler)
        .args([
            std,
            "-D_POSIX_C_SOURCE=200809L",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-g",
        ])
        .args(extra)
        .arg("-I")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("include"))
        .args(sources)
        .arg("-o")
        .arg(out)
        .arg(format!("-L{}", lib.display()))
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-ljaccl", "-lm", "-pthread"])
        .output()
        .unwrap_or_else(|e| panic!("{compiler} runs: {e}"));
    assert!(
        output.status.success(),
        "{compiler} {sources:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").port()
}

/// Waits for `child` up to `limit`, killing it past that (no test hangs).
fn finish(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    child.wait_with_output().expect("the child's output")
}

/// Runs `program args` as every rank of a job of `n` (the environment `jaccl launch` sets,
/// plus `env`); each rank's output.
fn job(program: &Path, args: &[&str], n: usize, env: &[(&str, String)]) -> Vec<Output> {
    let coordinator = format!("127.0.0.1:{}", free_port());
    let children: Vec<Child> = (0..n)
        .map(|rank| {
            Command::new(program)
                .args(args)
                .env("JACCL_RANK", rank.to_string())
                .env("JACCL_SIZE", n.to_string())
                .env("JACCL_COORDINATOR", &coordinator)
                .env("JACCL_JOB_TOKEN", "c-programs-test-token-0123456789")
                .env("JACCL_TEST_RANK", rank.to_string())
                .env("JACCL_TEST_SIZE", n.to_string())
                .env("JACCL_TEST_COORDINATOR", &coordinator)
                .env("JACCL_TEST_TOKEN", "c-programs-test-token-0123456789")
                .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("the program starts")
        })
        .collect();
    children
        .into_iter()
        .map(|c| finish(c, Duration::from_secs(600)))
        .collect()
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Every rank exited 0 and said so.
fn all_ok(outputs: &[Output]) {
    for (rank, out) in outputs.iter().enumerate() {
        assert!(
            out.status.success() && text(out).contains(&format!("rank {rank}: ok")),
            "rank {rank}: {:?}: {}",
            out.status,
            text(out)
        );
    }
}

/// tests/c/check.c compiled (with `extra` flags) in a new scratch directory.
fn check_program(name: &str, extra: &[&str]) -> (Scratch, PathBuf) {
    let dir = scratch(name);
    let program = dir.0.join("check");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/check.c");
    compile("cc", &[source], &program, extra);
    (dir, program)
}

#[test]
fn every_call_on_four_ranks_over_shared_memory() {
    let (_dir, program) = check_program("shm", &[]);
    all_ok(&job(&program, &["all"], 4, &[]));
}

#[test]
fn every_call_on_three_ranks_over_tcp() {
    let (_dir, program) = check_program("tcp", &[]);
    all_ok(&job(
        &program,
        &["all"],
        3,
        &[("JACCL_TRANSPORT", "tcp".into())],
    ));
}

#[test]
fn every_call_in_a_group_of_one() {
    let (_dir, program) = check_program("one", &[]);
    let out = finish(
        Command::new(&program)
            .arg("all")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starts"),
        Duration::from_secs(300),
    );
    all_ok(&[out]);
}

#[test]
fn started_from_a_config_struct() {
    let (_dir, program) = check_program("config", &[]);
    all_ok(&job(&program, &["config"], 2, &[]));
}

#[test]
fn a_killed_rank_is_peer_lost_the_others_shrink_and_a_newcomer_joins() {
    let (dir, program) = check_program("kill", &[]);
    let invitation = dir.0.join("invitation");
    let env = [
        ("JACCL_TRANSPORT", "tcp".to_owned()),
        ("JACCL_TEST_INVITATION", invitation.display().to_string()),
    ];
    let newcomer = Command::new(&program)
        .arg("join")
        .env("JACCL_TEST_INVITATION", &invitation)
        .env("JACCL_TEST_TOKEN", "c-programs-test-token-0123456789")
        .env("JACCL_TRANSPORT", "tcp")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the newcomer starts");
    let outputs = job(&program, &["kill"], 4, &env);
    let newcomer = finish(newcomer, Duration::from_secs(120));
    for (rank, out) in outputs.iter().enumerate() {
        if rank == 1 {
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(
                out.status.signal(),
                Some(9),
                "rank 1 kills itself: {}",
                text(out)
            );
        } else {
            assert!(
                out.status.success() && text(out).contains(&format!("rank {rank}: ok")),
                "rank {rank}: {}",
                text(out)
            );
        }
    }
    assert!(
        newcomer.status.success() && text(&newcomer).contains("rank 3: ok"),
        "the newcomer: {}",
        text(&newcomer)
    );
}

#[test]
fn an_abort_reaches_the_other_ranks_at_once() {
    let (_dir, program) = check_program("abort", &[]);
    all_ok(&job(
        &program,
        &["abort"],
        3,
        &[("JACCL_TRANSPORT", "tcp".into())],
    ));
}

#[test]
fn under_address_sanitizer() {
    let (_dir, program) = check_program("asan", &["-fsanitize=address", "-fno-omit-frame-pointer"]);
    let env = [("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0".to_owned())];
    all_ok(&job(&program, &["all"], 2, &env));
}

/// Whether `what` is here; a missing one fails the test under `JACCL_REQUIRE_ALL` (CI).
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

fn runs(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// scripts/install-c.sh into a new prefix (`prefix` in a new scratch directory), from the
/// built library.
fn installed(name: &str) -> (Scratch, PathBuf) {
    let dir = scratch(name);
    let prefix = dir.0.join("prefix");
    let out = Command::new(repo().join("scripts/install-c.sh"))
        .arg("--from")
        .arg(built())
        .arg("--prefix")
        .arg(&prefix)
        .output()
        .expect("install-c.sh runs");
    assert!(out.status.success(), "install-c.sh: {}", text(&out));
    (dir, prefix)
}

/// Compiles an example as the README says: `CC example $(pkg-config --cflags --libs jaccl)`.
fn with_pkg_config(compiler: &str, example: &str, prefix: &Path, out: &Path) {
    let pc = prefix.join("lib/pkgconfig");
    let flags = Command::new("pkg-config")
        .args(["--cflags", "--libs", "jaccl"])
        .env("PKG_CONFIG_PATH", &pc)
        .output()
        .expect("pkg-config runs");
    assert!(flags.status.success(), "pkg-config: {}", text(&flags));
    let flags = String::from_utf8_lossy(&flags.stdout).into_owned();
    let std = if compiler == "c++" {
        "-std=c++11"
    } else {
        "-std=c99"
    };
    let built = Command::new(compiler)
        .args([std, "-Wall", "-Wextra", "-Werror"])
        .arg(repo().join("examples").join(example))
        .args(flags.split_whitespace())
        .arg("-o")
        .arg(out)
        .output()
        .expect("the compiler runs");
    assert!(
        built.status.success(),
        "{compiler} {example}: {}",
        text(&built)
    );
}

#[test]
fn examples_installed_and_run_under_jaccl_launch_and_mpirun() {
    let (scratch, prefix) = installed("examples");
    let dir = &scratch.0;
    let (c, cpp) = (dir.join("allreduce_c"), dir.join("allreduce_cpp"));
    with_pkg_config("cc", "c/allreduce.c", &prefix, &c);
    with_pkg_config("c++", "cpp/allreduce.cpp", &prefix, &cpp);
    let jaccl = prefix.join("bin/jaccl");
    for (program, says) in [
        (&c, "of 1048576 floats on 4 ranks: ok"),
        (&cpp, "on 4 ranks from C++: ok"),
    ] {
        let out = Command::new(&jaccl)
            .args(["launch", "-n", "4"])
            .arg(program)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("jaccl launch starts");
        let out = finish(out, Duration::from_secs(300));
        assert!(
            out.status.success() && text(&out).contains(says),
            "{}",
            text(&out)
        );
    }
    if available("mpirun (Open MPI)", runs("mpirun")) {
        let out = Command::new("mpirun")
            .args(["--allow-run-as-root", "--oversubscribe", "-n", "3"])
            .args(["-x", "MASTER_ADDR=127.0.0.1", "-x"])
            .arg(format!("MASTER_PORT={}", free_port()))
            .arg(&c)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("mpirun starts");
        let out = finish(out, Duration::from_secs(300));
        assert!(
            out.status.success() && text(&out).contains("on 3 ranks: ok"),
            "{}",
            text(&out)
        );
    }
}

#[test]
fn cmake_finds_the_installed_package() {
    if !available("cmake", runs("cmake")) {
        return;
    }
    let (scratch, prefix) = installed("cmake");
    let project = scratch.0.join("project");
    std::fs::create_dir_all(&project).expect("a project directory");
    let lists = format!(
        "cmake_minimum_required(VERSION 3.13)\nproject(uses_jaccl C CXX)\n\
         find_package(jaccl 0.1 REQUIRED)\n\
         add_executable(shared_cpp {cpp})\ntarget_link_libraries(shared_cpp PRIVATE jaccl::jaccl)\n\
         add_executable(static_c {c})\ntarget_link_libraries(static_c PRIVATE jaccl::jaccl_static)\n",
        cpp = repo().join("examples/cpp/allreduce.cpp").display(),
        c = repo().join("examples/c/allreduce.c").display(),
    );
    std::fs::write(project.join("CMakeLists.txt"), lists).expect("writable");
    let build = project.join("build");
    for args in [
        vec![
            "-S".into(),
            project.display().to_string(),
            "-B".into(),
            build.display().to_string(),
            format!("-DCMAKE_PREFIX_PATH={}", prefix.display()),
        ],
        vec!["--build".into(), build.display().to_string()],
    ] {
        let out = Command::new("cmake")
            .args(&args)
            .output()
            .expect("cmake runs");
        assert!(out.status.success(), "cmake {args:?}: {}", text(&out));
    }
    for program in ["shared_cpp", "static_c"] {
        let outputs = job(&build.join(program), &[], 2, &[]);
        let all = outputs.iter().map(text).collect::<String>();
        assert!(
            outputs.iter().all(|o| o.status.success()) && all.contains("on 2 ranks"),
            "{program}: {all}"
        );
    }
}
