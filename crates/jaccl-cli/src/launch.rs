//! Starting ranks: locally as child processes (in a network namespace for a pretend host), or
//! on other hosts over `ssh`.
//!
//! Each local rank runs in its own process group, so stopping it also stops what it started,
//! and dies with the launcher however the launcher ends: it is started through `jaccl
//! exec-rank`, which asks the kernel for `SIGKILL` when its parent dies
//! (`PR_SET_PDEATHSIG`) before it `exec`s the program. A remote rank is run by an `sh` script
//! that ssh's standard input carries, with the rank's environment, so the job token and
//! `--env` values never appear on a command line (`ps`); the script reports its PID, starts the
//! program, and kills it when its standard input ends, which happens when the launcher (or its
//! local `ssh`, which dies with it) is gone. Stopping a remote rank runs `kill` on its host.
//!
//! Every line a rank prints reaches our stdout or stderr whole, prefixed with the rank. When a
//! rank fails, the others are stopped and the launcher exits non-zero naming it (with
//! `--elastic`, a rank that dies of a signal is only reported: the others go on); SIGINT,
//! SIGTERM and SIGHUP are forwarded to every rank, and after a grace period the stragglers are
//! killed.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

/// How long ranks get to exit after being asked to stop before they are killed.
const GRACE: Duration = Duration::from_secs(3);
/// The line a remote rank's script prints on stderr before the program starts.
const PID_MARKER: &str = "JACCL_LAUNCH_PID ";

/// Where a rank runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Host {
    /// A child process of the launcher.
    Local,
    /// Over `ssh` to this destination (`host` or `user@host`).
    Ssh(String),
    /// A child process of the launcher inside this network namespace (a pretend host).
    Netns(String),
}

impl Host {
    fn name(&self) -> &str {
        match self {
            Host::Local => "local",
            Host::Ssh(h) | Host::Netns(h) => h,
        }
    }

    /// Whether the rank runs on this machine (its environment and working directory set on
    /// its command, not sent over ssh).
    fn runs_here(&self) -> bool {
        !matches!(self, Host::Ssh(_))
    }
}

/// Everything needed to start a job.
#[derive(Debug, Clone)]
pub(crate) struct Job {
    /// The program and its arguments.
    pub(crate) program: Vec<String>,
    /// Where each rank runs, in rank order.
    pub(crate) hosts: Vec<Host>,
    /// `host:port` of rank 0's coordinator.
    pub(crate) coordinator: String,
    /// Extra environment of every rank (after the jaccl variables, so it can override them).
    pub(crate) env: Vec<(String, String)>,
    /// Working directory of every rank.
    pub(crate) cwd: Option<PathBuf>,
    /// Prefix every output line with `[rank]`.
    pub(crate) prefix: bool,
    /// Print what is started and stopped.
    pub(crate) verbose: bool,
    /// A rank that dies of a signal does not stop the others (`--elastic`).
    pub(crate) elastic: bool,
    /// Rank 0 (local) uses the launcher's own terminal: its progress bars stay live.
    pub(crate) rank0_inherits_terminal: bool,
    /// The ssh command (program and options).
    pub(crate) ssh: Vec<String>,
}

/// The environment every rank gets: who it is and how to find the others.
pub(crate) fn rank_env(job: &Job, rank: usize, token: &str) -> Vec<(String, String)> {
    let mut env = vec![
        ("JACCL_RANK".to_string(), rank.to_string()),
        ("JACCL_SIZE".to_string(), job.hosts.len().to_string()),
        ("JACCL_COORDINATOR".to_string(), job.coordinator.clone()),
        ("JACCL_JOB_TOKEN".to_string(), token.to_string()),
    ];
    env.extend(job.env.iter().cloned());
    env
}

/// A number that differs from run to run (for ports and file names; not a secret).
pub(crate) fn random_number() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one((std::process::id(), Instant::now()))
}

/// One running rank.
struct Running {
    host: Host,
    child: Child,
    /// The remote PID, once the remote script reported it.
    remote_pid: Arc<Mutex<Option<u32>>>,
    status: Option<ExitStatus>,
}

/// Runs the job to the end. Returns the exit code the launcher should exit with: 0 if every
/// rank succeeded, else the first failing rank's code (128 + signal if it died of one). With
/// `--elastic`, ranks lost to a signal do not count while another rank succeeded.
///
/// # Errors
/// A message when a rank cannot be started at all.
pub(crate) fn run(job: &Job) -> Result<u8, String> {
    let signal = Arc::new(AtomicUsize::new(0));
    for sig in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        signal_hook::flag::register_usize(sig, Arc::clone(&signal), sig as usize)
            .map_err(|e| format!("cannot handle signal {sig}: {e}"))?;
    }

    let token = jaccl::JobToken::generate().map_err(|e| e.to_string())?;
    let width = (job.hosts.len().saturating_sub(1)).to_string().len();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let mut pipes: Vec<JoinHandle<()>> = Vec::new();
    let mut ranks: Vec<Running> = Vec::with_capacity(job.hosts.len());
    for (rank, host) in job.hosts.iter().enumerate() {
        let env = rank_env(job, rank, &token);
        let inherit = rank == 0 && job.rank0_inherits_terminal && *host == Host::Local;
        let mut cmd = command(job, host, &env, rank == 0);
        if inherit {
            cmd.stdin(Stdio::inherit())
                .stdout(Stdio::inherit())
                .stderr(Stdio::inherit());
        }
        if job.verbose {
            eprintln!(
                "jaccl launch: rank {rank} on {}: {}",
                host.name(),
                describe(&cmd)
            );
        }
        let mut child = match cmd.spawn() {
            Ok(child) => child,
            Err(e) => {
                let started: Vec<usize> = (0..ranks.len()).collect();
                stop(&mut ranks, &started, Signal::TERM, job);
                return Err(format!(
                    "cannot start rank {rank} on {}: {}: {e}",
                    host.name(),
                    cmd.get_program().to_string_lossy()
                ));
            }
        };
        let remote_pid = Arc::new(Mutex::new(None));
        if !inherit {
            let label = job.prefix.then(|| format!("[{rank:>width$}] "));
            if let Some(out) = child.stdout.take() {
                pipes.push(relay(out, label.clone(), false, None, done_tx.clone()));
            }
            if let Some(err) = child.stderr.take() {
                let pid = matches!(host, Host::Ssh(_)).then(|| Arc::clone(&remote_pid));
                pipes.push(relay(err, label, true, pid, done_tx.clone()));
            }
            if let Some(stdin) = child.stdin.take() {
                match host {
                    Host::Local | Host::Netns(_) => forward_stdin(stdin),
                    Host::Ssh(_) => hand_over_script(stdin, remote_script(job, &env)),
                }
            }
        }
        ranks.push(Running {
            host: host.clone(),
            child,
            remote_pid,
            status: None,
        });
    }
    drop(done_tx);

    let mut failure: Option<(usize, ExitStatus)> = None;
    let mut lost: Vec<usize> = Vec::new();
    let mut interrupted: Option<i32> = None;
    let mut kill_at: Option<Instant> = None;
    loop {
        let sig = signal.swap(0, Ordering::SeqCst);
        if sig != 0 && interrupted.is_none() {
            interrupted = Some(sig as i32);
            eprintln!(
                "jaccl launch: {}; stopping every rank",
                signal_name(sig as i32)
            );
            let all: Vec<usize> = (0..ranks.len()).collect();
            stop(&mut ranks, &all, to_signal(sig as i32), job);
            kill_at = Some(Instant::now() + GRACE);
        }
        for i in 0..ranks.len() {
            if ranks[i].status.is_some() {
                continue;
            }
            let status = ranks[i]
                .child
                .try_wait()
                .map_err(|e| format!("cannot watch rank {i}: {e}"))?;
            let Some(status) = status else { continue };
            ranks[i].status = Some(status);
            let remote = matches!(ranks[i].host, Host::Ssh(_));
            if job.elastic && lost_to_a_signal(status, remote) && interrupted.is_none() {
                lost.push(i);
                eprintln!(
                    "jaccl launch: rank {i} ({}) {}; the others go on (--elastic)",
                    ranks[i].host.name(),
                    describe_status(status)
                );
                continue;
            }
            if !status.success() && failure.is_none() && interrupted.is_none() && kill_at.is_none()
            {
                failure = Some((i, status));
                eprintln!(
                    "jaccl launch: rank {i} ({}) {}; stopping the other ranks",
                    ranks[i].host.name(),
                    describe_status(status)
                );
                let others: Vec<usize> = (0..ranks.len()).filter(|&j| j != i).collect();
                stop(&mut ranks, &others, Signal::TERM, job);
                kill_at = Some(Instant::now() + GRACE);
            }
        }
        if ranks.iter().all(|r| r.status.is_some()) {
            break;
        }
        if let Some(at) = kill_at
            && Instant::now() >= at
        {
            let left: Vec<usize> = (0..ranks.len())
                .filter(|&j| ranks[j].status.is_none())
                .collect();
            if job.verbose {
                eprintln!("jaccl launch: killing ranks {left:?} that did not stop in time");
            }
            stop(&mut ranks, &left, Signal::KILL, job);
            kill_at = Some(Instant::now() + GRACE * 10);
        }
        std::thread::sleep(Duration::from_millis(20));
    }

    // Let the relays print what the ranks wrote last (they end when the pipes close; a
    // grandchild still holding one must not keep us waiting forever).
    let deadline = Instant::now() + Duration::from_secs(2);
    for _ in 0..pipes.len() {
        if done_rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .is_err()
        {
            break;
        }
    }

    if let Some(sig) = interrupted {
        return Ok(128u8.saturating_add(sig as u8));
    }
    if let Some((_, status)) = failure {
        return Ok(exit_code(status));
    }
    // A rank may also have failed while we were stopping for another reason.
    let counted = |i: &usize| !lost.contains(i) || lost.len() == ranks.len();
    if !lost.is_empty() && lost.len() < ranks.len() {
        eprintln!("jaccl launch: ranks {lost:?} were lost; the others finished");
    }
    Ok((0..ranks.len())
        .filter(counted)
        .filter_map(|i| ranks[i].status)
        .find(|s| !s.success())
        .map_or(0, exit_code))
}

/// Whether a rank ended by a signal (killed, crashed), as a lost rank does. A remote rank's
/// script reports that as its shell does, with the code 128 + the signal.
fn lost_to_a_signal(status: ExitStatus, remote: bool) -> bool {
    use std::os::unix::process::ExitStatusExt;
    let by_shell = remote && status.code().is_some_and(|c| (129..=128 + 64).contains(&c));
    status.signal().is_some() || by_shell
}

/// The command that starts `host`'s rank with `env` (a remote rank's script and environment
/// go to its standard input, see [`remote_script`]).
fn command(job: &Job, host: &Host, env: &[(String, String)], rank0: bool) -> Command {
    let (program, args): (&str, Vec<String>) = match host {
        Host::Local => (&job.program[0], job.program[1..].to_vec()),
        Host::Netns(name) => {
            let mut args: Vec<String> = ["netns", "exec", name].map(String::from).to_vec();
            args.extend(job.program.iter().cloned());
            ("ip", args)
        }
        Host::Ssh(dest) => {
            let mut args = job.ssh[1..].to_vec();
            // `--`: a host name that starts with `-` is not an option.
            args.extend(["--".into(), dest.clone(), "sh -s".into()]);
            (&job.ssh[0], args)
        }
    };
    let mut cmd = dying_with_us(program, &args);
    if host.runs_here() {
        cmd.envs(env.iter().cloned());
        if let Some(cwd) = &job.cwd {
            cmd.current_dir(cwd);
        }
    }
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let stdin = rank0 || matches!(host, Host::Ssh(_));
    cmd.stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// `program args`, started through `jaccl exec-rank` so that it dies with the launcher.
pub(crate) fn dying_with_us(program: &str, args: &[String]) -> Command {
    let Ok(me) = std::env::current_exe() else {
        let mut cmd = Command::new(program);
        cmd.args(args);
        return cmd;
    };
    let mut cmd = Command::new(me);
    cmd.args([
        "exec-rank",
        "--parent",
        &std::process::id().to_string(),
        "--",
        program,
    ])
    .args(args);
    cmd
}

/// `jaccl exec-rank`: asks for `SIGKILL` when the launcher dies, checks it has not already,
/// and becomes `program`. Returns only on failure.
pub(crate) fn exec_rank(parent: u32, program: &[String]) -> String {
    use std::os::unix::process::CommandExt;
    if let Err(e) = rustix::process::set_parent_process_death_signal(Some(Signal::KILL)) {
        return format!("cannot tie this rank to its launcher: {e}");
    }
    // The launcher may have died before the line above: then nobody would kill us.
    if rustix::process::getppid()
        .map(Pid::as_raw_nonzero)
        .map(|p| p.get() as u32)
        != Some(parent)
    {
        return "the launcher is gone".into();
    }
    let Some((first, rest)) = program.split_first() else {
        return "no program to run".into();
    };
    let err = Command::new(first).args(rest).exec();
    format!("cannot run {first}: {err}")
}

/// The `sh` script a remote rank reads from its standard input: report the PID, set the
/// environment, change directory, run the program, and kill it if the input ends (the launcher
/// is gone) before it exits. The launcher keeps the input open until the rank has ended.
pub(crate) fn remote_script(job: &Job, env: &[(String, String)]) -> String {
    let mut script = format!("printf '{PID_MARKER}%s\\n' $$ >&2\n");
    for (k, v) in env {
        script += &format!("export {}\n", shell_words::quote(&format!("{k}={v}")));
    }
    match &job.cwd {
        Some(dir) => {
            let dir = shell_words::quote(&dir.to_string_lossy()).into_owned();
            script += &format!(
                "cd {dir} || {{ echo \"jaccl launch: cannot cd to {}\" >&2; exit 126; }}\n",
                dir.replace('"', "'")
            );
        }
        None => {
            // Like mlx.launch: try the launcher's directory, quietly.
            if let Ok(here) = std::env::current_dir() {
                script += &format!(
                    "cd {} 2>/dev/null\n",
                    shell_words::quote(&here.to_string_lossy())
                );
            }
        }
    }
    let program: Vec<String> = job
        .program
        .iter()
        .map(|a| shell_words::quote(a).into_owned())
        .collect();
    // A background job's standard input is /dev/null unless redirected, hence fd 3.
    script += "exec 3<&0\n";
    script += &format!("{} </dev/null 3<&- &\n", program.join(" "));
    script += "pid=$!\n";
    script += "(cat <&3 >/dev/null 2>&1; kill -KILL \"$pid\" 2>/dev/null) &\n";
    script += "exec 3<&-\nwait \"$pid\"\nexit $?\n";
    script
}

/// Writes a remote rank's script to its ssh's standard input, and keeps that open.
fn hand_over_script(mut to: std::process::ChildStdin, script: String) {
    std::thread::spawn(move || {
        if to
            .write_all(script.as_bytes())
            .and_then(|()| to.flush())
            .is_ok()
        {
            // Held open until the launcher exits: its end tells the rank the launcher is gone.
            std::mem::forget(to);
        }
    });
}

/// Copies one output pipe of a rank to ours, a whole line at a time.
fn relay(
    pipe: impl Read + Send + 'static,
    label: Option<String>,
    to_stderr: bool,
    remote_pid: Option<Arc<Mutex<Option<u32>>>>,
    done: mpsc::Sender<()>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut line = Vec::new();
        let mut first = true;
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            if first && let Some(pid) = &remote_pid {
                first = false;
                let text = String::from_utf8_lossy(&line);
                if let Some(n) = text.trim().strip_prefix(PID_MARKER.trim_end())
                    && let Ok(n) = n.trim().parse::<u32>()
                {
                    if let Ok(mut slot) = pid.lock() {
                        *slot = Some(n);
                    }
                    continue;
                }
            }
            if !line.ends_with(b"\n") {
                line.push(b'\n');
            }
            let mut whole = Vec::with_capacity(line.len() + 8);
            if let Some(label) = &label {
                whole.extend_from_slice(label.as_bytes());
            }
            whole.extend_from_slice(&line);
            // One write per line under the lock: lines of different ranks never mix.
            let _ = if to_stderr {
                std::io::stderr().lock().write_all(&whole)
            } else {
                let mut out = std::io::stdout().lock();
                out.write_all(&whole).and_then(|()| out.flush())
            };
        }
        let _ = done.send(());
    })
}

/// Forwards the launcher's stdin to rank 0 until end of input.
fn forward_stdin(mut to: std::process::ChildStdin) {
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut to);
    });
}

/// Sends `sig` to ranks `which`: to the process group of local ones, and over ssh to the
/// remote program and then to the local ssh client.
fn stop(ranks: &mut [Running], which: &[usize], sig: Signal, job: &Job) {
    let mut remote_kills = Vec::new();
    for &i in which {
        let r = &mut ranks[i];
        if r.status.is_some() {
            continue;
        }
        if let Host::Ssh(dest) = &r.host {
            let pid = r.remote_pid.lock().ok().and_then(|p| *p);
            if let Some(pid) = pid {
                let name = signal_short_name(sig);
                let script =
                    format!("kill -{name} -- -{pid} 2>/dev/null || kill -{name} {pid} 2>/dev/null");
                let mut cmd = Command::new(&job.ssh[0]);
                cmd.args(&job.ssh[1..])
                    .arg("-n")
                    .arg("--")
                    .arg(dest)
                    .arg(script)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null());
                if let Ok(child) = cmd.spawn() {
                    remote_kills.push(child);
                }
            }
        }
    }
    // Give the remote kills a moment before the ssh clients go (which closes their sessions).
    let deadline = Instant::now() + Duration::from_secs(10);
    for mut k in remote_kills {
        while Instant::now() < deadline {
            if let Ok(Some(_)) = k.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = k.kill();
        let _ = k.wait();
    }
    for &i in which {
        let r = &ranks[i];
        if r.status.is_none()
            && let Some(pid) = Pid::from_raw(r.child.id() as i32)
        {
            let _ = rustix::process::kill_process_group(pid, sig);
        }
    }
}

fn to_signal(sig: i32) -> Signal {
    match sig {
        signal_hook::consts::SIGINT => Signal::INT,
        signal_hook::consts::SIGHUP => Signal::HUP,
        _ => Signal::TERM,
    }
}

fn signal_short_name(sig: Signal) -> &'static str {
    if sig == Signal::KILL {
        "KILL"
    } else if sig == Signal::INT {
        "INT"
    } else if sig == Signal::HUP {
        "HUP"
    } else {
        "TERM"
    }
}

fn signal_name(sig: i32) -> String {
    match sig {
        signal_hook::consts::SIGINT => "interrupted (SIGINT)".into(),
        signal_hook::consts::SIGTERM => "terminated (SIGTERM)".into(),
        signal_hook::consts::SIGHUP => "hung up (SIGHUP)".into(),
        signal_hook::consts::SIGKILL => "killed (SIGKILL)".into(),
        signal_hook::consts::SIGSEGV => "crashed (SIGSEGV)".into(),
        signal_hook::consts::SIGABRT => "aborted (SIGABRT)".into(),
        other => format!("stopped by signal {other}"),
    }
}

/// "exited with code 3", "was killed by signal 9 (SIGKILL)".
pub(crate) fn describe_status(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(sig)) => format!("died: {}", signal_name(sig)),
        _ => format!("ended with {status}"),
    }
}

fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(0), _) => 0,
        (Some(code), _) => u8::try_from(code).ok().filter(|&c| c != 0).unwrap_or(1),
        (None, Some(sig)) => 128u8.saturating_add(u8::try_from(sig).unwrap_or(127)),
        _ => 1,
    }
}

/// The command as text for `--verbose`, the job token hidden.
fn describe(cmd: &Command) -> String {
    let mut parts: Vec<String> = cmd
        .get_envs()
        .filter_map(|(k, v)| {
            let k = k.to_string_lossy();
            let v = match (k.as_ref(), v) {
                ("JACCL_JOB_TOKEN", _) => "(hidden)".into(),
                (_, v) => v.map(|v| v.to_string_lossy()).unwrap_or_default(),
            };
            k.starts_with("JACCL_").then(|| format!("{k}={v}"))
        })
        .collect();
    parts.push(cmd.get_program().to_string_lossy().into_owned());
    parts.extend(
        cmd.get_args()
            .map(|a| shell_words::quote(&a.to_string_lossy()).into_owned()),
    );
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> Job {
        Job {
            program: vec!["my prog".into(), "it's".into()],
            hosts: vec![Host::Local, Host::Ssh("h".into())],
            coordinator: "10.0.0.1:5000".into(),
            env: vec![("A".into(), "x y".into())],
            cwd: Some("/tmp/a b".into()),
            prefix: true,
            verbose: false,
            elastic: false,
            rank0_inherits_terminal: false,
            ssh: vec!["ssh".into()],
        }
    }

    #[test]
    fn ranks_get_their_identity_and_the_extra_environment_last() {
        let env = rank_env(&job(), 1, "0123456789abcdef");
        assert_eq!(env[0], ("JACCL_RANK".into(), "1".into()));
        assert_eq!(env[1], ("JACCL_SIZE".into(), "2".into()));
        assert_eq!(env[2], ("JACCL_COORDINATOR".into(), "10.0.0.1:5000".into()));
        assert_eq!(
            env[3],
            ("JACCL_JOB_TOKEN".into(), "0123456789abcdef".into())
        );
        assert_eq!(env.last(), Some(&("A".into(), "x y".into())));
    }

    #[test]
    fn the_remote_script_quotes_everything_and_secrets_stay_off_command_lines() {
        let j = job();
        let env = rank_env(&j, 1, "the secret token");
        let script = remote_script(&j, &env);
        assert!(
            script.starts_with("printf 'JACCL_LAUNCH_PID %s\\n' $$ >&2\n"),
            "{script}"
        );
        assert!(
            script.contains("export 'JACCL_JOB_TOKEN=the secret token'\n"),
            "{script}"
        );
        assert!(script.contains("cd '/tmp/a b' ||"), "{script}");
        assert!(
            script.contains("'my prog' 'it'\\''s' </dev/null 3<&- &"),
            "{script}"
        );
        let cmd = command(&j, &Host::Ssh("-oProxyCommand=x".into()), &env, false);
        let args: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let dash = args.iter().rposition(|a| a == "--").unwrap();
        assert_eq!(args[dash + 1], "-oProxyCommand=x", "{args:?}");
        assert!(!args.iter().any(|a| a.contains("secret")), "{args:?}");
        assert!(!describe(&command(&j, &Host::Local, &env, false)).contains("secret"));
    }

    #[test]
    fn exit_codes() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(exit_code(ExitStatus::from_raw(0)), 0);
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(9)), 137);
        assert_eq!(
            describe_status(ExitStatus::from_raw(9)),
            "died: killed (SIGKILL)"
        );
    }
}
