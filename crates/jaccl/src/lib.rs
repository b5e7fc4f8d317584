//! # jaccl: collective communication for machine-learning processes
//!
//! All-reduce, all-gather, reduce-scatter, broadcast, reduce, gather, scatter, all-to-all
//! (equal and uneven), the variable-size all-gather and reduce-scatter, send/recv between any
//! two ranks and barrier, between processes on one or many machines, after the design of Apple
//! MLX's JACCL: a bidirectional, multi-wire, pipelined ring over TCP or RDMA verbs
//! (InfiniBand, RoCE, Thunderbolt; libibverbs is loaded at run time), shared memory between
//! the ranks of one host, and direct collectives over it when all ranks share a host. Groups
//! split into sub-groups ([`Group::split`], [`Group::subgroup`]), and every operation can run
//! on a group's progress thread while the caller computes ([`Group::start`]).
//!
//! ```no_run
//! # fn main() -> jaccl::Result<()> {
//! let mut group = jaccl::init()?; // rank and size from the environment (jaccl launch, torchrun, mpirun...)
//! let grads = vec![group.rank() as f32; 1024];
//! let mut sum = vec![0.0f32; 1024];
//! group.all_sum(&grads, &mut sum)?;
//! # Ok(())
//! # }
//! ```
//!
//! # Semantics
//!
//! - **Every rank calls the same operations in the same order**, with the same element type,
//!   reduction and lengths. Each operation sends a small header first, so a rank that calls
//!   something else fails with [`Error::Mismatch`] instead of receiving garbage or hanging.
//!   Comparisons are exact (tags, counts and sub-group requests whole, or by SHA-256). A rank
//!   whose part of a call only sends (a broadcast's or scatter's root, a reduce's or gather's
//!   leaf) cannot tell at once that no one receives it: ranks that disagree on the root may
//!   all go on, and it shows at a later call (over shared memory, the next one that waits for
//!   every rank; over the network, the next that reads the connection where the unread
//!   message waits, which the header's number of the call in the group tells from its own, or
//!   any in which two ranks that saw the group's rooted calls otherwise exchange a header: the
//!   headers of every collective but `all_gather_v` and `reduce_scatter_v` carry their
//!   SHA-256 digest, those of send and receive none), or, if no such call comes, not at all.
//! - **Bit-identical results.** Every rank ends an all-reduce with the same bits, and the same
//!   inputs give the same output on every run: each element's values are combined in an order the
//!   algorithm fixes (which every rank picks alike from the size, the group's shape and, with
//!   [`Config::link`](config::Config#structfield.link), the element size and the links' figures:
//!   setting `JACCL_LINK` may change the algorithm, and so a float sum's last bits), and every rank
//!   either builds that same expression or receives its result. The ring: around the ring from the
//!   rank after the one that completes the chunk, reduced once and copied; the small gathers: `((a0
//!   ⊕ a1) ⊕ a2) ⊕ …`; recursive doubling: pairs, then pairs of pairs, `((a0 ⊕ a1) ⊕ (a2 ⊕ a3)) ⊕
//!   …`; Rabenseifner's halving then doubling: each block reduced once, on the rank that owns it,
//!   its own partial first in each halving step, and copied (docs/algorithms.md, per algorithm). A
//!   reduce-scatter's block takes the ring's order, rank order (the mesh's one step), or halving's:
//!   the input of the rank that halves, its extra rank's, then each partner's partial sum in step
//!   order. A reduce of up to 64 KiB per rank of the group, at least 512 KiB, over the network (at
//!   every size below the two levels' on hosts of equal size or whose ranks are not consecutive)
//!   goes up a binomial tree, `((v0 ⊕ v1) ⊕ (v2 ⊕ v3)) ⊕ …` by distance `v` from the root (on
//!   several hosts, each host's ranks so by distance from the host's head, then the heads' results
//!   by distance from the root's host): the same from run to run for the same root, not always the
//!   bits of an all-reduce of the same inputs. An all-reduce or reduce of 512 KiB or more, or a
//!   reduce-scatter of 1 MiB or more, among hosts that each hold the same number of ranks, at least
//!   2 ([`Group::hosts`]), goes in two levels: each element reduced within its host first (the
//!   host's reduce-scatter), then across hosts (the all-reduce, reduce or reduce-scatter of the
//!   ranks of one local rank), in those algorithms' orders.
//! - **Integers** wrap on overflow. **`bool`** travels as one byte: sum and max are OR, min is
//!   AND; received bytes are normalised, never turned into an invalid `bool`.
//! - **Floats**: max and min propagate NaN (like `numpy.maximum`), and order `-0 < +0`, so the
//!   result does not depend on the order ranks are combined in. **f16 and bf16** arithmetic is
//!   done in f32 and rounded back after each step, as upstream does. **Complex** max and min
//!   compare (re, im) lexicographically.
//! - **Any length works**, including 0 and lengths not divisible by anything; a group of size 1
//!   needs no network and its collectives are copies.
//! - **Nothing blocks forever, and busy is not dead.** A heartbeat thread per rank makes every
//!   rank fail with [`Error::PeerLost`] naming a rank that died (within milliseconds) or fell
//!   silent (stopped, hung, its host or network gone: within the liveness window,
//!   [`Config::liveness`](Config#structfield.liveness), 10 s). A rank that is only busy in its
//!   own code keeps beating. Calls that wait for one another with no data on its way (both
//!   ranks of a pair call `recv` first) fail with [`Error::Deadlock`] within about two beats
//!   of that heartbeat. Waits nothing explains end with [`Error::Timeout`] after the
//!   operation timeout ([`Config::timeout`](Config#structfield.timeout), 30 min); start-up has
//!   its own.
//! - **Only the job's ranks take part.** Every connection is mutually authenticated against the
//!   job's secret ([`JobToken`]), which never crosses the network.
//! - **Failure poisons the group.** After an error while data was moving, the group closes its
//!   connections (so the failure reaches every rank promptly) and every later call returns the
//!   same error. The others hear why through the heartbeat: a rank that fails because its peer
//!   did names the first cause, not just a closed connection. Argument errors
//!   ([`Error::InvalidArgument`]) are found before this rank sends anything and leave the
//!   group usable; the other ranks' part of that call may be under way (a leaf's part of a
//!   reduce is sent at once), so a rank refused alone must call it again, corrected, as its
//!   next call, which they take as that call.
//! - **A lost rank need not end the job.** The survivors call [`Group::shrink`] and go on
//!   with a new group of the ranks alive (any rank may be the one lost, rank 0 included);
//!   [`Group::agree`] agrees on a flag and on the ranks alive; [`Group::revoke`] stops every
//!   member's operations. They agree through the job's listeners, without the failed group
//!   (the guarantees and their limits: [`Group::shrink`], docs/elastic.md). [`Group::grow`]
//!   takes in new processes, which join with the group's [`Group::invitation`].
//! - `send`/`recv` reach any other rank (a connection off the ring is made on first use).
//!   Sends may come before receives, even in a cycle of ranks: a rank blocked sending reads
//!   ahead what its peers send it ([`Group::send`]).
//! - **Reductions** ([`ReduceOp`]): sum, max, min and product for every type; average for
//!   numbers (the sum in rank order, then divided by the number of ranks: floats in their own
//!   type, integers toward zero); bitwise and, or, xor for integers and `bool`.
//! - **Nonblocking operations** ([`Group::start`]) of one group run in the order they were
//!   started, blocking calls included; each owns its buffers until its [`Request`] gives them
//!   back.
//!
//! # Configuration
//!
//! [`init`] reads the environment (see [`config`] for the variables: `JACCL_*`, MLX's,
//! torchrun's, Open MPI's, PMI's and Slurm's); [`init_with`] takes a [`Config`].

mod agreement;
mod algo;
mod auth;
mod bootstrap;
pub mod config;
mod connect;
mod dtype;
mod error;
mod group;
mod liveness;
mod op_header;
mod os;
pub mod planner;
mod reduce;
mod token;
mod transport;
mod wait;

pub use algo::hosts::{AcrossHosts, HostLayout};
pub use config::{Config, DeviceMatrix, Invitation, Topology, Transport};
pub use dtype::{Dtype, Element, ReduceOp};
pub use error::{Error, Op, Result};
pub use group::{AbortHandle, Agreed, Group, Request};
/// The crate providing [`half::f16`] and [`half::bf16`].
pub use half;
/// The crate providing [`num_complex::Complex32`].
pub use num_complex;
pub use token::JobToken;
pub use wait::WaitPolicy;

/// Entry points of the fuzz targets in `fuzz/` (the `fuzzing` feature; not a stable API).
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;

/// What this machine offers jaccl's transports, for diagnostics (`jaccl doctor`).
pub mod probe {
    /// This host as ranks compare it (boot id, host name, network namespace, and
    /// `JACCL_HOST_ID` if set): ranks with equal identities use shared memory between them
    /// unless told otherwise.
    pub fn host_identity() -> String {
        let pretend = std::env::var("JACCL_HOST_ID").ok();
        crate::transport::shm::host_identity(pretend.as_deref())
    }

    /// Checks that shared memory works here: creates, seals and maps a segment, a doorbell
    /// (eventfd) and an abstract Unix socket, and frees them.
    ///
    /// # Errors
    /// The step that failed, and why.
    pub fn shared_memory() -> Result<(), String> {
        crate::transport::shm::probe()
    }

    pub use crate::transport::rdma::{RdmaDevice, RdmaGid, RdmaPort};

    /// Memory each RDMA link registers (its two rings): a rank has one link per wire and
    /// ring neighbour, and the locked-memory limit (`ulimit -l`) must allow them all.
    pub const RDMA_BYTES_PER_LINK: usize = crate::transport::rdma::BYTES_PER_LINK;

    /// The RDMA devices, their ports and GID tables, loading libibverbs from `library` (a path
    /// or name; `None`: `JACCL_IBVERBS`, else `libibverbs.so.1`).
    ///
    /// # Errors
    /// Why RDMA is unavailable: the library is missing or too old, or cannot list devices.
    pub fn rdma(library: Option<&str>) -> Result<Vec<RdmaDevice>, String> {
        let configured = std::env::var("JACCL_IBVERBS").ok();
        crate::transport::rdma::probe(library.or(configured.as_deref()))
    }
}

/// Joins the group described by the environment; a group of size 1 when nothing is set.
///
/// # Errors
/// [`Error::Config`] for a bad environment, [`Error::Bootstrap`] when the other ranks cannot be
/// reached or disagree, [`Error::Unsupported`] for a transport or topology this build lacks.
pub fn init() -> Result<Group> {
    init_with(Config::from_env()?)
}

/// Joins the group described by `config`. Blocks until every rank has joined, or the timeout.
///
/// # Errors
/// As [`init`].
pub fn init_with(config: Config) -> Result<Group> {
    Group::new(config)
}
