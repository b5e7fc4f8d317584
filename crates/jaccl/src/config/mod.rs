//! Group configuration: the [`Config`] builder (here), [`Config::from_env`] (`env`), and the
//! parsers of their values (`parse`).
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
//! | link speed | `JACCL_LINK` (`BANDWIDTH,LATENCY`: `100Gb/s,2us`; [`LinkSpeed`]): the all-reduce is chosen by the cost model for these figures | unset: thresholds measured on loopback |
//! | operation timeout | `JACCL_TIMEOUT` (seconds, `2.5`, with a unit: `500ms`, `30s`, `5m`, or `off`) | [`Config::DEFAULT_TIMEOUT`] |
//! | start-up timeout | `JACCL_STARTUP_TIMEOUT` (as above) | [`Config::DEFAULT_STARTUP_TIMEOUT`] |
//! | liveness window | `JACCL_LIVENESS` (as above) | [`Config::DEFAULT_LIVENESS`] |
//! | joining a running group | `JACCL_JOIN` (an [`Invitation`], from [`crate::Group::invitation`]): the process joins that group when its members call [`crate::Group::grow`]; its rank, size and coordinator variables are not read | unset: start-up |
//! | job token | `JACCL_JOB_TOKEN` (a secret of at least 16 bytes; set by `jaccl launch`), or `JACCL_JOB_TOKEN_FILE` (a file holding it) | derived from the launcher's job identity (see [`Config::job_token`](#structfield.job_token)) |
//!
//! Durations saturate: `off` (or a duration too long to count) means "no timeout".
//!
//! With nothing set, [`crate::init`] gives a group of size 1 that needs no network. A rank
//! without a size (or the reverse) is an error, as is any value that does not parse: the error
//! names the variable and the value.

mod devices;
mod env;
mod invitation;
mod link_speed;
mod parse;

pub use devices::DeviceMatrix;
pub use env::{JOB_ID_VARIABLES, RANK_VARIABLES, SIZE_VARIABLES};
pub use invitation::Invitation;
pub use link_speed::{LinkSpeed, parse_latency, parse_rate};
pub use parse::parse_duration;
pub(crate) use parse::split_host_port;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::token::JobToken;
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
    /// The speed of the links between hosts. Set, the all-reduce over the network (not the
    /// one among ranks that all share memory, nor over RDMA) is the algorithm the cost model
    /// predicts fastest for these figures (`jaccl plan --link` shows its predictions).
    /// `None`: the thresholds measured on loopback at 2–64 ranks (setting
    /// [`LinkSpeed::MEASURED_LOOPBACK`] does not give them: the model disagrees with them
    /// there, see docs/algorithms.md). Every rank must set the same.
    pub link: Option<LinkSpeed>,
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
    /// derived from the launcher's job identity ([`Config::launcher_job`](#structfield.launcher_job))
    /// and the coordinator address, which keeps jobs apart but is no secret.
    pub job_token: Option<JobToken>,
    /// The launcher's identity of this job, as [`Config::from_env`] found it in the
    /// [`JOB_ID_VARIABLES`] (torchrun's run id and restart count, Slurm's job and step ids, the
    /// PMIx namespace, Open MPI's job id): mixed into the token derived when none is set, so
    /// that two jobs on one coordinator address stay apart. `None` with [`Config::new`].
    pub launcher_job: Option<String>,
    /// How to wait for peers; `None` means [`WaitPolicy::auto`] for the ranks
    /// and CPUs of this host. Nonblocking operations never spin and yield for at most 50 µs
    /// before they sleep, whatever this says (the caller computes beside them).
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
    /// Join a running group instead of starting one: [`crate::init_with`] then waits (up to
    /// the start-up timeout) until the group's members call [`crate::Group::grow`], and
    /// returns the grown group; `rank`, `size` and `coordinator` are not used. The other
    /// settings, the job token first, must be the job's.
    pub join: Option<Invitation>,
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
            link: None,
            timeout: Config::DEFAULT_TIMEOUT,
            startup_timeout: Config::DEFAULT_STARTUP_TIMEOUT,
            liveness: Config::DEFAULT_LIVENESS,
            job_token: None,
            launcher_job: None,
            wait: None,
            host_id: None,
            devices: None,
            rdma_library: None,
            join: None,
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

    /// Sets the speed of the links between hosts (see [`Config::link`](#structfield.link)).
    pub fn link(mut self, link: LinkSpeed) -> Config {
        self.link = Some(link);
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
    /// ([`Config::launcher_job`](#structfield.launcher_job)) and the coordinator address.
    pub(crate) fn token(&self) -> JobToken {
        if let Some(t) = &self.job_token {
            return t.clone();
        }
        let identity = format!(
            "size {} coordinator {}{}",
            self.size,
            self.coordinator.as_deref().unwrap_or(""),
            self.launcher_job.as_deref().unwrap_or("")
        );
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
                        "the RDMA device matrix names {wires} device(s) per neighbour but the wires are set to {}",
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
