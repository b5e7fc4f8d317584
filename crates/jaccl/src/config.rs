//! Group configuration: the [`Config`] builder and [`Config::from_env`].
//!
//! # Environment
//!
//! Each setting is read from the first variable of its row that is set to a non-empty value.
//! jaccl's own names come first, then MLX's, torchrun's, Open MPI's, PMI's and Slurm's, so a
//! program runs unchanged under `jaccl launch`, `mlx.launch`, `torchrun`, `mpirun` or `srun`.
//!
//! | setting | variables, first set wins | default |
//! |---|---|---|
//! | rank | `JACCL_RANK`, `MLX_RANK`, `RANK`, `OMPI_COMM_WORLD_RANK`, `PMI_RANK`, `SLURM_PROCID` | 0 when no size is set either |
//! | size | `JACCL_SIZE`, `WORLD_SIZE`, `OMPI_COMM_WORLD_SIZE`, `PMI_SIZE`, `SLURM_NTASKS` | 1 when no rank is set either |
//! | coordinator | `JACCL_COORDINATOR`, `MLX_JACCL_COORDINATOR`, `MASTER_ADDR` with `MASTER_PORT` (plus one under torchrun, whose agent serves its own store on `MASTER_PORT`) | required when size > 1 |
//! | topology | `JACCL_TOPOLOGY` (`auto`, `ring`, `mesh`); else `ring` if `JACCL_RING` or `MLX_JACCL_RING` is set | `auto` |
//! | transport | `JACCL_TRANSPORT` (`auto`, `tcp`, `shm`, `rdma`) | `auto`: shared memory with ranks on this host, RDMA with others a device reaches, TCP with the rest |
//! | RDMA devices | `JACCL_IBV_DEVICES`, `MLX_IBV_DEVICES`: a device file ([`DeviceMatrix`]: the path, or the JSON itself) | the first active port of the first device |
//! | RDMA library | `JACCL_IBVERBS` (a path or library name) | `libibverbs.so.1` |
//! | waiting for peers | `JACCL_WAIT` (`auto`, `sleep`, `spin=50us,yield=2ms`) | `auto`: [`WaitPolicy::auto`] |
//! | host identity | `JACCL_HOST_ID` (any string; ranks with different ones never share memory, so one machine can play several hosts in tests) | unset |
//! | wires | `JACCL_WIRES` (1 to 4) | measured default, [`Config::DEFAULT_WIRES`] |
//! | operation timeout | `JACCL_TIMEOUT` (seconds, `2.5`, with a unit: `500ms`, `30s`, `5m`, or `off`) | [`Config::DEFAULT_TIMEOUT`] |
//! | start-up timeout | `JACCL_STARTUP_TIMEOUT` (as above) | [`Config::DEFAULT_STARTUP_TIMEOUT`] |
//! | liveness window | `JACCL_LIVENESS` (as above) | [`Config::DEFAULT_LIVENESS`] |
//! | job token | `JACCL_JOB_TOKEN` (a secret of at least 16 bytes; set by `jaccl launch`), or `JACCL_JOB_TOKEN_FILE` (a file holding it) | derived from the launcher's job identity (see [`Config::job_token`](#structfield.job_token)) |
//!
//! Durations saturate: `off` (or a duration too long to count) means "no timeout".
//!
//! With nothing set, [`crate::init`] gives a group of size 1 that needs no network. A rank
//! without a size (or the reverse) is an error, as is any value that does not parse: the error
//! names the variable and the value.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::auth::JobToken;
use crate::devices::DeviceMatrix;
use crate::error::{Error, Result};
use crate::wait::WaitPolicy;

/// Which transport carries data between two ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Transport {
    /// The best transport for each peer: shared memory with ranks on this host, RDMA with
    /// ranks an active RDMA port reaches (checked at start-up), TCP with the others.
    #[default]
    Auto,
    /// TCP sockets: works everywhere, across machines.
    Tcp,
    /// Shared memory: every ring neighbour must be on this host (start-up fails otherwise).
    Shm,
    /// RDMA verbs: InfiniBand, RoCE, Thunderbolt. Every ring neighbour must be reachable
    /// over an active RDMA port (start-up fails otherwise, saying why).
    Rdma,
}

impl Transport {
    /// `auto`, `tcp`, `shm` or `rdma`.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Auto => "auto",
            Transport::Tcp => "tcp",
            Transport::Shm => "shm",
            Transport::Rdma => "rdma",
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Transport {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Transport::Auto),
            "tcp" => Ok(Transport::Tcp),
            "shm" => Ok(Transport::Shm),
            "rdma" => Ok(Transport::Rdma),
            _ => Err(format!(
                "unknown transport '{s}' (expected auto, tcp, shm or rdma)"
            )),
        }
    }
}

/// How ranks are connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Topology {
    /// The best topology for the job (today: the ring; see docs/algorithms.md, "Mesh").
    #[default]
    Auto,
    /// Each rank talks to its two neighbours over 1 to 4 wires.
    Ring,
    /// The ring, plus one link from each rank to every other rank: [`crate::Group::send`] and
    /// [`crate::Group::recv`] between any two ranks, and small collectives in one step (every
    /// rank sends its data straight to all others, which reduce in rank order). Large messages
    /// still go around the ring.
    Mesh,
}

impl Topology {
    /// `auto`, `ring` or `mesh`.
    pub fn name(self) -> &'static str {
        match self {
            Topology::Auto => "auto",
            Topology::Ring => "ring",
            Topology::Mesh => "mesh",
        }
    }
}

impl fmt::Display for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Topology {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Topology::Auto),
            "ring" => Ok(Topology::Ring),
            "mesh" => Ok(Topology::Mesh),
            _ => Err(format!(
                "unknown topology '{s}' (expected auto, ring or mesh)"
            )),
        }
    }
}

/// Everything a rank needs to join a group. Build it with [`Config::new`] and the chainable
/// setters, or read it from the environment with [`Config::from_env`]; the fields are public for
/// reading. [`crate::init_with`] validates it.
///
/// ```
/// use std::time::Duration;
/// let cfg = jaccl::Config::new(0, 4)
///     .coordinator("127.0.0.1:29500")
///     .wires(2)
///     .timeout(Duration::from_secs(30));
/// assert_eq!(cfg.size, 4);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// This process's rank, `0..size`.
    pub rank: usize,
    /// The number of ranks.
    pub size: usize,
    /// `host:port` where rank 0 listens for the others at start-up (`[v6]:port` for IPv6).
    pub coordinator: Option<String>,
    /// The transport; [`Transport::Auto`] picks per peer.
    pub transport: Transport,
    /// The topology; [`Topology::Auto`] picks for the job.
    pub topology: Topology,
    /// Parallel connections to each ring neighbour, 1 to 4; `None` means
    /// [`Config::DEFAULT_WIRES`].
    pub wires: Option<usize>,
    /// How long an operation may wait without progress before it fails with
    /// [`Error::Timeout`]. Long by default: a peer that is stopped, hung or gone is found by
    /// liveness ([`Config::liveness`](#structfield.liveness)) instead, and a peer that is only
    /// busy (writing a checkpoint) is not an error. `Duration::MAX`: no timeout.
    pub timeout: Duration,
    /// How long start-up (joining the coordinator, opening the links) may take.
    pub startup_timeout: Duration,
    /// How long a rank may be silent (its heartbeat thread, which beats while the application
    /// computes, stopped: the process is stopped or hung, or its host or link is gone) before
    /// every other rank fails with [`Error::PeerLost`] naming it. The same heartbeat finds
    /// deadlocks ([`Error::Deadlock`]) within about two beats (a fifth of the window, at most
    /// a second, each). `Duration::MAX`: off, and deadlocks wait for the timeout.
    pub liveness: Duration,
    /// The job's secret: every connection proves knowledge of it (see [`JobToken`]). `None`:
    /// derived from the launcher's job identity (torchrun's run id and restart count, Slurm's
    /// job and step ids, the PMIx namespace, Open MPI's job id, if set) and the coordinator
    /// address, which keeps jobs apart but is no secret.
    pub job_token: Option<JobToken>,
    /// How to wait for peers; `None` means [`WaitPolicy::auto`] for the ranks
    /// and CPUs of this host.
    pub wait: Option<WaitPolicy>,
    /// Extra host identity: ranks share memory only when their hosts are the same and these
    /// are equal, so tests can play several hosts on one machine. `None` for real jobs.
    pub host_id: Option<String>,
    /// The RDMA device each rank uses to reach each other rank (upstream's device file). `None`:
    /// every rank uses the first active port of the first device. With a matrix, the ring
    /// uses as many wires as it names devices towards each neighbour.
    pub devices: Option<DeviceMatrix>,
    /// Where to load libibverbs from; `None`: `libibverbs.so.1` from the usual search path.
    pub rdma_library: Option<String>,
}

impl Config {
    /// The default of [`Config::timeout`](#structfield.timeout): 30 minutes, like PyTorch's
    /// distributed default; dead and stopped peers are found by liveness long before.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);
    /// The default of [`Config::startup_timeout`](#structfield.startup_timeout).
    pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(120);
    /// The default of [`Config::liveness`](#structfield.liveness).
    pub const DEFAULT_LIVENESS: Duration = Duration::from_secs(10);
    /// The largest group. Rank 0 keeps a connection per rank open, so jobs near it need an
    /// open-file limit (`ulimit -n`) above the size on rank 0's host.
    pub const MAX_SIZE: usize = 16384;
    /// The default number of wires per ring neighbour, chosen by measurement (`jaccl bench`
    /// with `--wires 1,2,4`; see docs/algorithms.md).
    pub const DEFAULT_WIRES: usize = 1;
    /// The most wires per ring neighbour.
    pub const MAX_WIRES: usize = 4;

    /// A configuration for `rank` of `size` with every other setting at its default.
    pub fn new(rank: usize, size: usize) -> Config {
        Config {
            rank,
            size,
            coordinator: None,
            transport: Transport::Auto,
            topology: Topology::Auto,
            wires: None,
            timeout: Config::DEFAULT_TIMEOUT,
            startup_timeout: Config::DEFAULT_STARTUP_TIMEOUT,
            liveness: Config::DEFAULT_LIVENESS,
            job_token: None,
            wait: None,
            host_id: None,
            devices: None,
            rdma_library: None,
        }
    }

    /// Sets the coordinator address, `host:port`.
    pub fn coordinator(mut self, addr: impl Into<String>) -> Config {
        self.coordinator = Some(addr.into());
        self
    }

    /// Sets the transport.
    pub fn transport(mut self, transport: Transport) -> Config {
        self.transport = transport;
        self
    }

    /// Sets the topology.
    pub fn topology(mut self, topology: Topology) -> Config {
        self.topology = topology;
        self
    }

    /// Sets the number of wires (parallel connections) per ring neighbour, 1 to 4.
    pub fn wires(mut self, wires: usize) -> Config {
        self.wires = Some(wires);
        self
    }

    /// Sets the operation timeout: the longest an operation waits without progress.
    pub fn timeout(mut self, timeout: Duration) -> Config {
        self.timeout = timeout;
        self
    }

    /// Sets the start-up timeout.
    pub fn startup_timeout(mut self, timeout: Duration) -> Config {
        self.startup_timeout = timeout;
        self
    }

    /// Sets the liveness window (see [`Config::liveness`](#structfield.liveness)).
    pub fn liveness(mut self, window: Duration) -> Config {
        self.liveness = window;
        self
    }

    /// Sets the job token (see [`JobToken`]).
    pub fn job_token(mut self, token: JobToken) -> Config {
        self.job_token = Some(token);
        self
    }

    /// The token in use: the configured one, or one derived from the launcher's job identity
    /// (read from the environment) and the coordinator address.
    pub(crate) fn token(&self) -> JobToken {
        if let Some(t) = &self.job_token {
            return t.clone();
        }
        let mut identity = format!(
            "size {} coordinator {}",
            self.size,
            self.coordinator.as_deref().unwrap_or("")
        );
        for var in JOB_ID_VARIABLES {
            if let Ok(v) = std::env::var(var) {
                identity += &format!(" {var}={v}");
            }
        }
        JobToken::derived(&identity)
    }

    /// Sets how ranks wait for their peers (see [`WaitPolicy`]).
    pub fn wait(mut self, policy: WaitPolicy) -> Config {
        self.wait = Some(policy);
        self
    }

    /// Sets an extra host identity (see [`Config::host_id`](#structfield.host_id)): ranks with
    /// different ones use TCP between them even on one machine.
    pub fn host_id(mut self, id: impl Into<String>) -> Config {
        self.host_id = Some(id.into());
        self
    }

    /// Sets the RDMA device matrix (see [`Config::devices`](#structfield.devices)).
    pub fn devices(mut self, devices: DeviceMatrix) -> Config {
        self.devices = Some(devices);
        self
    }

    /// Sets where libibverbs is loaded from.
    pub fn rdma_library(mut self, path: impl Into<String>) -> Config {
        self.rdma_library = Some(path.into());
        self
    }

    /// The wires in use: the configured number, else as many as the device matrix names
    /// towards each neighbour, else the default.
    pub fn wire_count(&self) -> usize {
        let from_devices = self.devices.as_ref().and_then(|m| m.ring_wires().ok());
        self.wires.or(from_devices).unwrap_or(Config::DEFAULT_WIRES)
    }

    /// Reads the configuration from the environment; see the [module docs](self) for the
    /// variables and their precedence.
    ///
    /// # Errors
    /// [`Error::Config`] naming the variable and value when a value does not parse, or when a
    /// rank is set without a size (or the reverse).
    pub fn from_env() -> Result<Config> {
        Config::from_lookup(env_var)
    }

    /// [`Config::from_env`], where `overrides` (variable name → value, e.g. `JACCL_WIRES` →
    /// `2`) take precedence over the environment: settings given in code, read with the
    /// environment's rules and errors (the Python bindings' `jaccl.init(wires=2)`).
    ///
    /// # Errors
    /// As [`Config::from_env`].
    pub fn from_env_with(overrides: &std::collections::HashMap<String, String>) -> Result<Config> {
        Config::from_lookup(|name| match overrides.get(name) {
            Some(value) => Ok(Some(value.clone())),
            None => env_var(name),
        })
    }

    /// [`Config::from_env`] over any variable lookup (tests use a map).
    pub(crate) fn from_lookup(lookup: impl Fn(&str) -> Result<Option<String>>) -> Result<Config> {
        let env = Env { lookup };
        let rank = env.first(&RANK_VARIABLES)?;
        let size = env.first(&SIZE_VARIABLES)?;
        let (rank, size) = match (rank, size) {
            (None, None) => (0, 1),
            (Some((var, value)), None) => {
                return Err(Error::Config(format!(
                    "{var}={value} sets a rank but no variable sets the size; set JACCL_SIZE \
                     (or WORLD_SIZE)"
                )));
            }
            (None, Some((var, value))) => {
                return Err(Error::Config(format!(
                    "{var}={value} sets a size but no variable sets the rank; set JACCL_RANK \
                     (or RANK)"
                )));
            }
            (Some((rvar, rval)), Some((svar, sval))) => {
                let size: usize = parse_number(svar, &sval, "a size")?;
                if size > Config::MAX_SIZE {
                    return Err(Error::Config(format!(
                        "{svar}={sval}: above the largest group jaccl supports ({})",
                        Config::MAX_SIZE
                    )));
                }
                (parse_number(rvar, &rval, "a rank")?, size)
            }
        };
        let mut cfg = Config::new(rank, size);
        cfg.coordinator = match env.first(&["JACCL_COORDINATOR", "MLX_JACCL_COORDINATOR"])? {
            Some((_, addr)) => Some(addr),
            None => match (env.get("MASTER_ADDR")?, env.get("MASTER_PORT")?) {
                (Some(host), Some(port)) => {
                    let mut port = parse_number::<u16>("MASTER_PORT", &port, "a port")?;
                    // Under torchrun, its agent serves its own store on MASTER_PORT.
                    if env
                        .get("TORCHELASTIC_USE_AGENT_STORE")?
                        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
                    {
                        port = port.checked_add(1).ok_or_else(|| {
                            Error::Config(format!(
                                "MASTER_PORT={port} is torchrun's and jaccl uses the next port, \
                                 but there is none; set JACCL_COORDINATOR"
                            ))
                        })?;
                    }
                    Some(join_host_port(&host, &port.to_string()))
                }
                (Some(host), None) => {
                    return Err(Error::Config(format!(
                        "MASTER_ADDR={host} is set but MASTER_PORT is not"
                    )));
                }
                (None, Some(port)) => {
                    return Err(Error::Config(format!(
                        "MASTER_PORT={port} is set but MASTER_ADDR is not"
                    )));
                }
                (None, None) => None,
            },
        };
        if let Some(value) = env.get("JACCL_TOPOLOGY")? {
            cfg.topology = parse_with("JACCL_TOPOLOGY", &value)?;
        } else if env.present("JACCL_RING")? || env.present("MLX_JACCL_RING")? {
            cfg.topology = Topology::Ring;
        }
        if let Some(value) = env.get("JACCL_TRANSPORT")? {
            cfg.transport = parse_with("JACCL_TRANSPORT", &value)?;
        }
        if let Some(value) = env.get("JACCL_WIRES")? {
            let wires = parse_number("JACCL_WIRES", &value, "a number of wires")?;
            if !(1..=Config::MAX_WIRES).contains(&wires) {
                return Err(Error::Config(format!(
                    "JACCL_WIRES={value}: must be 1 to {}",
                    Config::MAX_WIRES
                )));
            }
            cfg.wires = Some(wires);
        }
        for (var, field) in [
            ("JACCL_TIMEOUT", &mut cfg.timeout),
            ("JACCL_STARTUP_TIMEOUT", &mut cfg.startup_timeout),
            ("JACCL_LIVENESS", &mut cfg.liveness),
        ] {
            if let Some(value) = env.get(var)? {
                *field = parse_duration(&value)
                    .map_err(|why| Error::Config(format!("{var}={value}: {why}")))?;
            }
        }
        if let Some(value) = env.get("JACCL_WAIT")?
            && !value.eq_ignore_ascii_case("auto")
        {
            cfg.wait = Some(parse_with("JACCL_WAIT", &value)?);
        }
        cfg.host_id = env.get("JACCL_HOST_ID")?;
        cfg.rdma_library = env.get("JACCL_IBVERBS")?;
        if let Some((var, value)) = env.first(&["JACCL_IBV_DEVICES", "MLX_IBV_DEVICES"])? {
            let text = if value.starts_with('[') {
                value.clone()
            } else {
                std::fs::read_to_string(&value).map_err(|e| {
                    Error::Config(format!("{var}={value}: cannot read the device file: {e}"))
                })?
            };
            let matrix = DeviceMatrix::from_json(&text)
                .map_err(|errors| Error::Config(format!("{var}={value}: {}", errors.join("; "))))?;
            cfg.devices = Some(matrix);
        }
        // The token's value never appears in an error.
        if let Some(value) = env.get("JACCL_JOB_TOKEN")? {
            cfg.job_token = Some(
                JobToken::new(&value)
                    .map_err(|e| Error::Config(format!("JACCL_JOB_TOKEN: {}", e.detail())))?,
            );
        } else if let Some(path) = env.get("JACCL_JOB_TOKEN_FILE")? {
            let secret = std::fs::read_to_string(&path).map_err(|e| {
                Error::Config(format!("JACCL_JOB_TOKEN_FILE={path}: cannot read it: {e}"))
            })?;
            cfg.job_token = Some(JobToken::new(secret.trim_end()).map_err(|e| {
                Error::Config(format!("JACCL_JOB_TOKEN_FILE={path}: {}", e.detail()))
            })?);
        }
        Ok(cfg)
    }

    /// Checks the values that do not need the network.
    ///
    /// # Errors
    /// [`Error::Config`] naming the setting and value.
    pub fn validate(&self) -> Result<()> {
        if self.size == 0 {
            return Err(Error::Config("size must be at least 1, got 0".into()));
        }
        if self.size > Config::MAX_SIZE {
            return Err(Error::Config(format!(
                "size {} is above the largest group jaccl supports ({})",
                self.size,
                Config::MAX_SIZE
            )));
        }
        if self.rank >= self.size {
            return Err(Error::Config(format!(
                "rank {} is out of range for size {} (ranks are 0..{})",
                self.rank, self.size, self.size
            )));
        }
        if let Some(wires) = self.wires
            && !(1..=Config::MAX_WIRES).contains(&wires)
        {
            return Err(Error::Config(format!(
                "wires must be 1 to {}, got {wires}",
                Config::MAX_WIRES
            )));
        }
        for (name, d) in [
            ("timeout", self.timeout),
            ("startup timeout", self.startup_timeout),
            ("liveness window", self.liveness),
        ] {
            if d.is_zero() {
                return Err(Error::Config(format!(
                    "the {name} must be greater than zero"
                )));
            }
        }
        if let Some(matrix) = &self.devices {
            if matrix.size() != self.size {
                return Err(Error::Config(format!(
                    "the RDMA device matrix is {n} × {n} but the group has {} ranks",
                    self.size,
                    n = matrix.size()
                )));
            }
            if self.size > 1 {
                let wires = matrix
                    .ring_wires()
                    .map_err(|why| Error::Config(format!("the RDMA device matrix: {why}")))?;
                if wires > Config::MAX_WIRES {
                    return Err(Error::Config(format!(
                        "the RDMA device matrix names {wires} devices per neighbour; at most {} \
                         wires are supported",
                        Config::MAX_WIRES
                    )));
                }
                if self.wires.is_some_and(|w| w != wires) {
                    return Err(Error::Config(format!(
                        "the RDMA device matrix names {wires} device(s) per neighbour but the                          wires are set to {}",
                        self.wire_count()
                    )));
                }
            }
        }
        if self.size > 1 {
            let Some(addr) = &self.coordinator else {
                return Err(Error::Config(format!(
                    "rank {} of {}: a group of more than one rank needs a coordinator address \
                     (Config::coordinator, JACCL_COORDINATOR or MASTER_ADDR/MASTER_PORT)",
                    self.rank, self.size
                )));
            };
            split_host_port(addr)
                .map_err(|why| Error::Config(format!("coordinator '{addr}': {why}")))?;
        }
        Ok(())
    }
}

/// The variables that give a process its rank, in order of precedence. A process where one of
/// them is set was started by a launcher.
pub const RANK_VARIABLES: [&str; 6] = [
    "JACCL_RANK",
    "MLX_RANK",
    "RANK",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "SLURM_PROCID",
];
/// The variables that give the group size, in order of precedence.
pub const SIZE_VARIABLES: [&str; 5] = [
    "JACCL_SIZE",
    "WORLD_SIZE",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_SIZE",
    "SLURM_NTASKS",
];

/// Variable lookup where an empty value counts as unset.
/// The environment variable `name`, if set.
fn env_var(name: &str) -> Result<Option<String>> {
    match std::env::var(name) {
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => Err(Error::Config(format!(
            "{name}={} is not valid UTF-8",
            v.to_string_lossy()
        ))),
    }
}

struct Env<F> {
    lookup: F,
}

impl<F: Fn(&str) -> Result<Option<String>>> Env<F> {
    fn get(&self, name: &str) -> Result<Option<String>> {
        Ok((self.lookup)(name)?
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty()))
    }

    /// Set at all, even to an empty value (MLX's `MLX_JACCL_RING` convention).
    fn present(&self, name: &str) -> Result<bool> {
        Ok((self.lookup)(name)?.is_some())
    }

    fn first<'a>(&self, names: &[&'a str]) -> Result<Option<(&'a str, String)>> {
        for name in names {
            if let Some(value) = self.get(name)? {
                return Ok(Some((name, value)));
            }
        }
        Ok(None)
    }
}

fn parse_number<T: FromStr>(var: &str, value: &str, what: &str) -> Result<T> {
    value.parse().map_err(|_| {
        Error::Config(format!(
            "{var}={value} is not {what} (expected a non-negative integer)"
        ))
    })
}

fn parse_with<T: FromStr<Err = String>>(var: &str, value: &str) -> Result<T> {
    value
        .parse()
        .map_err(|why| Error::Config(format!("{var}={value}: {why}")))
}

/// Variables that identify a launcher's job, mixed into the token derived when none is set.
pub const JOB_ID_VARIABLES: [&str; 6] = [
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "PMIX_NAMESPACE",
    "OMPI_MCA_ess_base_jobid",
];

/// Parses a duration variable: seconds as a plain number (`30`, `2.5`), a duration with units
/// (`500ms`, `1m 30s`), or `off` / `none` / `never` for no limit (`Duration::MAX`). A number too
/// large to count also means no limit.
///
/// # Errors
/// A message saying why the value is not a positive duration.
pub fn parse_duration(value: &str) -> std::result::Result<Duration, String> {
    let value = value.trim();
    if ["off", "none", "never"]
        .iter()
        .any(|w| value.eq_ignore_ascii_case(w))
    {
        return Ok(Duration::MAX);
    }
    let duration = match value.parse::<f64>() {
        Ok(secs) if secs > 0.0 => Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX),
        Ok(_) => return Err("must be a positive number of seconds".into()),
        Err(_) => match humantime::parse_duration(value) {
            Ok(d) => d,
            Err(humantime::DurationError::NumberOverflow) => Duration::MAX,
            Err(e) => {
                return Err(format!(
                    "not a duration ({e}); use seconds (30, 2.5), units (500ms, 30s, 5m) or off"
                ));
            }
        },
    };
    if duration.is_zero() {
        return Err("must be greater than zero".into());
    }
    Ok(duration)
}

fn join_host_port(host: &str, port: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Splits `host:port` (or `[v6]:port`) into its parts, checking the port.
pub(crate) fn split_host_port(addr: &str) -> std::result::Result<(&str, u16), String> {
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or("expected host:port, e.g. 127.0.0.1:29500")?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err("the host is empty (expected host:port)".into());
    }
    let port = port
        .parse::<u16>()
        .map_err(|_| format!("'{port}' is not a port number (0 to 65535)"))?;
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn from(vars: &[(&str, &str)]) -> Result<Config> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|name| Ok(map.get(name).cloned()))
    }

    fn config_error(vars: &[(&str, &str)]) -> String {
        match from(vars) {
            Err(Error::Config(msg)) => msg,
            other => panic!("expected a Config error, got {other:?}"),
        }
    }

    #[test]
    fn nothing_set_is_a_single_rank() {
        let cfg = from(&[]).unwrap();
        assert_eq!((cfg.rank, cfg.size), (0, 1));
        cfg.validate().unwrap();
    }

    #[test]
    fn jaccl_names_win_over_mlx_torch_and_mpi() {
        let cfg = from(&[
            ("JACCL_RANK", "2"),
            ("MLX_RANK", "3"),
            ("RANK", "1"),
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("JACCL_SIZE", "4"),
            ("WORLD_SIZE", "8"),
            ("JACCL_COORDINATOR", "10.0.0.1:5000"),
            ("MLX_JACCL_COORDINATOR", "10.0.0.2:5000"),
            ("MASTER_ADDR", "10.0.0.3"),
            ("MASTER_PORT", "6000"),
        ])
        .unwrap();
        assert_eq!((cfg.rank, cfg.size), (2, 4));
        assert_eq!(cfg.coordinator.as_deref(), Some("10.0.0.1:5000"));
    }

    #[test]
    fn torchrun_mpi_pmi_slurm_variables() {
        let cfg = from(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "::1"),
            ("MASTER_PORT", "29500"),
        ])
        .unwrap();
        assert_eq!((cfg.rank, cfg.size), (1, 2));
        assert_eq!(cfg.coordinator.as_deref(), Some("[::1]:29500"));
        cfg.validate().unwrap();
        for (r, s) in [
            ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
            ("PMI_RANK", "PMI_SIZE"),
            ("SLURM_PROCID", "SLURM_NTASKS"),
        ] {
            let cfg = from(&[(r, "3"), (s, "5")]).unwrap();
            assert_eq!((cfg.rank, cfg.size), (3, 5), "{r}/{s}");
        }
    }

    #[test]
    fn under_torchrun_the_coordinator_is_the_port_after_its_store() {
        let cfg = from(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "localhost"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ])
        .unwrap();
        assert_eq!(cfg.coordinator.as_deref(), Some("localhost:29501"));
        let msg = config_error(&[
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "65535"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ]);
        assert!(msg.contains("MASTER_PORT=65535"), "{msg}");
    }

    #[test]
    fn mlx_names() {
        let cfg = from(&[
            ("MLX_RANK", "1"),
            ("JACCL_SIZE", "3"),
            ("MLX_JACCL_COORDINATOR", "127.0.0.1:7"),
            ("MLX_JACCL_RING", ""),
        ])
        .unwrap();
        assert_eq!((cfg.rank, cfg.size), (1, 3));
        assert_eq!(cfg.topology, Topology::Ring);
        assert_eq!(cfg.coordinator.as_deref(), Some("127.0.0.1:7"));
    }

    #[test]
    fn bad_values_name_the_variable_and_value() {
        let msg = config_error(&[("JACCL_RANK", "abc"), ("JACCL_SIZE", "2")]);
        assert!(msg.contains("JACCL_RANK=abc"), "{msg}");
        let msg = config_error(&[("JACCL_WIRES", "7")]);
        assert!(msg.contains("JACCL_WIRES=7"), "{msg}");
        let msg = config_error(&[("JACCL_TIMEOUT", "soon")]);
        assert!(msg.contains("JACCL_TIMEOUT=soon"), "{msg}");
        let msg = config_error(&[("JACCL_TIMEOUT", "-1")]);
        assert!(msg.contains("JACCL_TIMEOUT=-1"), "{msg}");
        let msg = config_error(&[("JACCL_TRANSPORT", "pigeon")]);
        assert!(msg.contains("JACCL_TRANSPORT=pigeon"), "{msg}");
        let msg = config_error(&[("JACCL_TOPOLOGY", "star")]);
        assert!(msg.contains("JACCL_TOPOLOGY=star"), "{msg}");
        let msg = config_error(&[("JACCL_RANK", "1")]);
        assert!(
            msg.contains("JACCL_RANK=1") && msg.contains("size"),
            "{msg}"
        );
        let msg = config_error(&[("WORLD_SIZE", "4")]);
        assert!(
            msg.contains("WORLD_SIZE=4") && msg.contains("rank"),
            "{msg}"
        );
        let msg = config_error(&[("MASTER_ADDR", "h")]);
        assert!(msg.contains("MASTER_PORT"), "{msg}");
        let msg = config_error(&[("MASTER_ADDR", "h"), ("MASTER_PORT", "x")]);
        assert!(msg.contains("MASTER_PORT=x"), "{msg}");
        let msg = config_error(&[("JACCL_WAIT", "fast")]);
        assert!(msg.contains("JACCL_WAIT=fast"), "{msg}");
        let msg = config_error(&[("JACCL_JOB_TOKEN", "0xzz")]);
        assert!(
            msg.contains("JACCL_JOB_TOKEN") && !msg.contains("0xzz"),
            "{msg}"
        );
        let msg = config_error(&[("JACCL_JOB_TOKEN_FILE", "/nonexistent/token")]);
        assert!(msg.contains("/nonexistent/token"), "{msg}");
        let msg = config_error(&[("JACCL_RANK", "0"), ("JACCL_SIZE", "4294967297")]);
        assert!(msg.contains("4294967297"), "{msg}");
    }

    #[test]
    fn settings_parse() {
        let cfg = from(&[
            ("JACCL_WIRES", "3"),
            ("JACCL_TIMEOUT", "1.5"),
            ("JACCL_TRANSPORT", "TCP"),
            ("JACCL_TOPOLOGY", "ring"),
            ("JACCL_JOB_TOKEN", "0123456789abcdef"),
            ("JACCL_STARTUP_TIMEOUT", "500000000000y"),
            ("JACCL_LIVENESS", "off"),
            ("JACCL_WAIT", "spin=5us,yield=1ms"),
            ("JACCL_HOST_ID", "node-b"),
        ])
        .unwrap();
        assert_eq!(
            cfg.wait,
            Some(WaitPolicy {
                spin: Duration::from_micros(5),
                yield_for: Duration::from_millis(1)
            })
        );
        assert_eq!(cfg.host_id.as_deref(), Some("node-b"));
        assert_eq!(from(&[("JACCL_WAIT", "auto")]).unwrap().wait, None);
        assert_eq!(cfg.wires, Some(3));
        assert_eq!(cfg.timeout, Duration::from_millis(1500));
        assert_eq!(cfg.transport, Transport::Tcp);
        assert_eq!(cfg.topology, Topology::Ring);
        assert_eq!(cfg.job_token, JobToken::new("0123456789abcdef").ok());
        assert!(cfg.startup_timeout > Duration::from_secs(1 << 60));
        assert_eq!(cfg.liveness, Duration::MAX);
        assert_eq!(parse_duration("1e30"), Ok(Duration::MAX));
        let cfg = from(&[("JACCL_TIMEOUT", "250ms")]).unwrap();
        assert_eq!(cfg.timeout, Duration::from_millis(250));
        let cfg = from(&[("JACCL_RANK", ""), ("JACCL_SIZE", " ")]).unwrap();
        assert_eq!(cfg.size, 1, "empty values count as unset");
    }

    #[test]
    fn validate_checks_ranges_and_coordinator() {
        let err = |cfg: Config| match cfg.validate() {
            Err(Error::Config(msg)) => msg,
            other => panic!("{other:?}"),
        };
        assert!(err(Config::new(4, 4)).contains("rank 4"));
        assert!(err(Config::new(0, 0)).contains("size"));
        assert!(err(Config::new(0, 2)).contains("coordinator"));
        assert!(err(Config::new(0, 2).coordinator("nohost")).contains("nohost"));
        assert!(err(Config::new(0, 2).coordinator("h:99999")).contains("99999"));
        assert!(err(Config::new(0, 1).wires(0)).contains("wires"));
        assert!(err(Config::new(0, 1).wires(5)).contains("wires"));
        assert!(err(Config::new(0, 1).timeout(Duration::ZERO)).contains("timeout"));
        Config::new(1, 2)
            .coordinator("[::1]:80")
            .wires(4)
            .validate()
            .unwrap();
    }

    #[test]
    fn host_port_split() {
        assert_eq!(split_host_port("a.b:1"), Ok(("a.b", 1)));
        assert_eq!(split_host_port("[fe80::1]:22"), Ok(("fe80::1", 22)));
        assert!(split_host_port(":22").is_err());
    }
}
