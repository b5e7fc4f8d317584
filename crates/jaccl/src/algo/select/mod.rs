//! The one place that decides, per call, which algorithm runs: from the message size and the
//! group's [`Shape`], which every rank knows alike (so every rank chooses alike, and the
//! plans of one call match). Every threshold is named and measured here; the plans
//! themselves (`super::ring`, `super::mesh`, `super::doubling`, `super::host_doubling`,
//! `super::rabenseifner`, `super::bruck`, `super::shared_memory`) choose nothing. The one
//! exception: a group given its links' figures (`Config::link`) takes the all-reduce the cost
//! model prices least (`super::pricing::ByModel`), over the network where these thresholds
//! would pick among doubling, Rabenseifner's, the ring and the gather.
//!
//! Adding a collective: its plan in the file of its family, one function here that picks
//! among its algorithms, the [`crate::Group`] method, tests.

use super::hosts::ALL_REDUCE_TWO_LEVEL_MIN;
use crate::transport::shm::EAGER_DATA_BYTES;

/// What the choice depends on besides the size: the same on every rank of a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    pub(crate) size: usize,
    /// Every rank has a channel to every other one.
    pub(crate) mesh: bool,
    /// The ranks pair up for recursive doubling (`super::geometry::Geometry::doubling_partners`).
    pub(crate) pairs: bool,
    /// Some pair of ring neighbours uses RDMA, where bytes cost more against hops.
    pub(crate) rdma: bool,
    /// Every rank shares memory with every other: the direct collectives.
    pub(crate) direct: bool,
    /// The ranks are on several hosts, each holding as many of them, 2 or more
    /// (`super::hosts::HostLayout::even`): where the all-reduce, the reduce, the all-gather and
    /// the reduce-scatter go in two levels from their sizes (`super::hosts::two_levels_from`),
    /// the all-reduce below takes Rabenseifner's rather than the ring
    /// ([`Shape::rabenseifner_max`]) and the reduce the trees ([`Shape::reduce`]).
    pub(crate) on_hosts: bool,
    /// Ranks per host where hosts hold them in blocks of rank order, a power of two of them
    /// on each of a power of two of hosts (`super::hosts::HostLayout::blocks`): small
    /// all-reduces double within hosts and swap slices across ([`Shape::doubling`]).
    pub(crate) host_blocks: Option<usize>,
    /// The ranks are on several hosts, some of whose ranks are not consecutive in rank order
    /// (`super::hosts::HostLayout::contiguous`), so the ring crosses between hosts more often
    /// than once per host: broadcasts and reduces take trees, which cross to each host once,
    /// at every size below the two levels' ([`Shape::broadcast`], [`Shape::reduce`]).
    pub(crate) scattered_hosts: bool,
    /// The ranks are on more than one host and some host holds several: the ring's hops
    /// between hosts carry what its hops within a host do.
    pub(crate) shared_hosts: bool,
}

/// Messages up to this many bytes use one direction on one wire (as upstream).
const SMALL_MESSAGE: usize = 32 * 1024;

/// Broadcasts among ranks that all share memory of at most `EAGER_DATA_BYTES` (40) go in the
/// root's eager lines (`Broadcast::Eager`): the root posts them and goes on, up to 256 calls
/// ahead, and each other rank fetches the one cache line. Measured against the choices below
/// (`jaccl bench --op broadcast --transport shm`, 8 B, µs, 4 runs, with Open MPI's `MPI_Bcast`
/// in the same minutes): 2 ranks 0.08-0.13 against 0.12-0.15 direct (MPI 0.13-0.14), 4 ranks
/// 0.15-0.31 against 0.42-0.53 flat (MPI 0.29-0.62); 16 and 64 lines gave 0.48-0.71 and
/// 0.20-0.47 at 4 ranks (a root that runs further ahead makes fewer trips through the
/// scheduler when ranks share cores), 1024 no better than 256.
///
/// Broadcasts among more than 2 ranks that all share memory, of at most this many bytes, go
/// from the root over its rings to every rank (`Broadcast::Flat`): the root hands them over
/// and goes on, where the direct broadcast waits for every rank at each call. Measured
/// (`jaccl bench --op broadcast --transport shm`, µs, direct against flat): 4 ranks 8 B 4.2-5.3
/// against 0.74, 512 B 5.0 against 1.05, 4 KiB 4.6-6.0 against 5.2, 32 KiB 7.3-10.9 against
/// 33; 2 ranks 8 B 0.17 against 0.20 (a rank each per core: the direct wait is a cache-line
/// round trip).
const FLAT_BROADCAST_MAX: usize = 2048;

/// Broadcasts of at most this many bytes among 4 or more ranks go down a binomial tree
/// (`Broadcast::Tree`: ⌈log2 N⌉ rounds, the links to ranks that are not ring neighbours made
/// on first use and kept), larger ones along the ring (`Broadcast::Chain`: N − 1 hops, but
/// every rank sends the data once). Not without the mesh where the ring uses RDMA, whose
/// neighbours' links are faster than the TCP links the tree would add. Measured over TCP on
/// loopback (`jaccl bench --op broadcast`, µs, chain against tree, 3-4 runs): 4 ranks 64 KiB
/// 122-178 against 51-64, 128 KiB 156-215 against 95-185, 512 KiB 411-481 against 243-675,
/// 2 MiB 1478-2090 against 1931-2361; 6 ranks 64 KiB 255-346 against 77-133; 8 ranks 256 KiB
/// 789-829 against 360-427; 8 B alike (4 ranks 12-13 against 10-12). The limit stays below
/// where loopback's ties begin, as on a real link the root's ⌈log2 N⌉ sends cost bandwidth
/// that loopback does not show.
const TREE_BROADCAST_MAX: usize = 256 * 1024;

/// From this many ranks (all on one host, or each on its own), broadcasts of more than
/// [`MANY_RANKS_TREE_BROADCAST_MAX`] go along the ring with all of the data each way, each
/// direction to half the ranks (`Broadcast::WholeChains`), up to [`WHOLE_CHAINS_PER_HOP`] ×
/// (N − 1) bytes; the ring's halves of the data each all the way round (`Broadcast::Chain`)
/// above. The pipeline fills in a hop per rank: whole chains halve the hops and double the
/// bytes each link carries, which pays while a hop costs more than moving the other half
/// (about `(N − 1) × per-hop` bytes, the hop's cost as bytes of transfer; 128 KiB here).
/// Measured over TCP on loopback after connections within the host were unpaced (`jaccl bench
/// --op broadcast --dtype u8`, µs, 2 runs, 2026-12-07, the whole chains against the tree up to
/// 256 KiB and the split chain above): 16 ranks 16 KiB 55-61 against 45-46, 64 KiB 108-123
/// against 128-133, 256 KiB 369-463 against 410-495, 1 MiB 1760-1778 against 2342-2379, 4 MiB
/// 9971-10 054 against 9549-10 710; 32 ranks 64 KiB 224-226 against 300-330, 1 MiB 3828-4021
/// against 4584-4822, 4 MiB 25.1-28.8 ms against 28.8-32.4; 64 ranks 64 KiB 482-524 against
/// 606-608, 256 KiB 1709-1765 against 2097-2256, 4 MiB 58.5-64.9 ms against 63.5-64.9. Not on
/// hosts of several ranks each, where the whole chains would cross between hosts with all of
/// the data one way where the split chain crosses with half each way.
const MANY_RANKS: usize = 16;
const MANY_RANKS_TREE_BROADCAST_MAX: usize = 32 * 1024;
const WHOLE_CHAINS_PER_HOP: usize = 128 * 1024;

/// Reduces of at most this many bytes per rank of the group, and of at least
/// [`TREE_REDUCE_MIN_MAX`], go up a binomial tree (`Rooted::Tree`) rather than through an
/// all-reduce: ⌈log2 N⌉ rounds in which every other rank sends once and is done, where the
/// all-reduce makes every rank wait for the result; with more ranks the ring's steps grow, the
/// tree's rounds hardly. Measured over TCP on loopback since the tree's edges send headers one
/// way (`jaccl bench --op reduce`, µs, 2 runs, the tree against the all-reduce): 4 ranks 512 KiB
/// 252-315 / 365-401, 1 MiB 643-748 / 737-793, 2 MiB 1403-1579 / 1464-1546; 8 ranks 512 KiB
/// 1110-1184 / 1298-1408, 1 MiB 1752-2265 / 1742-1886; 16 ranks 1 MiB 4747-5448 / 5052-5363,
/// 2 MiB 9991-11 345 / 7868-9281; 32 ranks 2 MiB 20 408-22 703 / 28 507-28 960, 4 MiB
/// 51 472-54 302 / 46 801-50 905; 64 ranks 4 MiB 97 191-108 929 / 119 012-128 586, 8 MiB
/// 251 662-335 218 / 204 350-211 808.
const TREE_REDUCE_PER_RANK: usize = 64 * 1024;

/// The tree's reach for reduces among few ranks ([`TREE_REDUCE_PER_RANK`]).
const TREE_REDUCE_MIN_MAX: usize = 512 * 1024;

/// Gathers of at most this many bytes per rank go up a binomial tree (`Rooted::Tree`); larger
/// ones along the ring from both sides, where the root takes blocks over its two links at once
/// (and, with 2 ranks, two connections). Measured over TCP on loopback (`jaccl bench --op
/// gather --dtype u8`, the root's buffer, µs, the tree against the chain): 2 ranks 8 B 5.1
/// against 4.7, 64 KiB 17.8 against 18.0, 1 MiB 315 against 191; 4 ranks 64 KiB 18.5-18.8
/// against 17.6-18.8, 256 KiB 37-67 against 39-41, 1 MiB 215-227 against 142; 8 ranks 64 KiB
/// 36-98 against 40-44, 512 KiB 147 against 144, 1 MiB 311-334 against 223-242.
const TREE_GATHER_PER_RANK: usize = 64 * 1024;

/// Among [`MANY_RANKS`] or more (`Shape::many_ranks_alike`), gathers of at most this many
/// bytes per rank go up the tree:
/// the chain's hops grow with the ranks. Measured as above (2 runs): 16 ranks 4 MiB 1517-1527
/// against 2255-2391, 8 MiB 2882 against 4119, 16 MiB 10 755-12 485 against 9975-10 207; 32
/// ranks 4 MiB 1870-1898 against 4798-4990, 16 MiB 10 724-11 244 against 20 847-21 177; 64
/// ranks 16 MiB 14 582-15 300 against 43 061-44 835, 32 MiB 35 749 against 86 564.
const MANY_RANKS_TREE_GATHER_PER_RANK: usize = 512 * 1024;

/// All-reduce and all-gather gather whole blocks both ways while `size × block` is at most
/// this: fewer hops beat fewer bytes up to there (measured on loopback at 2, 4 and 8 ranks:
/// e.g. 64 KiB at 4 ranks took 290-350 µs gathered, 490 µs by the ring).
const GATHER_LIMIT: usize = 512 * 1024;

/// With the mesh, collectives whose vectors together are at most this many bytes take one step
/// to every rank; larger ones go around the ring. Measured with 1 ms per packet on loopback
/// (../shared/rdma-vm): one step won up to 4 KiB per rank at 4 and at 8 ranks, and lost or tied
/// at 32 KiB, where sending every vector `size − 1` times costs more than the ring's hops.
const MESH_LIMIT: usize = 64 * 1024;

/// All-reduces up to this many bytes per rank (over TCP and shared memory; [`DOUBLING_MAX_RDMA`]
/// with RDMA) use recursive doubling where it is chosen ([`Shape::doubles`]: where the ranks
/// pair up, and among 5 or more) and the mesh does not take them in one step: log2(size) steps, each swapping the whole partial result with one rank, so fewer
/// hops than the ring, fewer bytes than the gather and, with 4 ranks, fewer messages than
/// either (2 per rank against the gather's 3). Among 3 or more ranks Rabenseifner's algorithm
/// takes over above [`RABENSEIFNER_MIN`]; this limit is for two ranks, where one swap of the
/// whole vector beat the ring up to 256 KiB (`jaccl bench -n 2`, µs: 128 KiB 50 against 59,
/// 256 KiB 83 against 85, 512 KiB 182 against 143).
const DOUBLING_MAX: usize = 384 * 1024;

/// The limit when ring neighbours use RDMA: with Soft-RoCE in ../shared/rdma-vm (4 ranks),
/// doubling took 13.1-14.6 ms against the gather's 21.4-24.3 ms at 128 KiB, but 20.3-22.5 ms
/// against the ring's 16.8-18.1 ms at 192 KiB.
const DOUBLING_MAX_RDMA: usize = 128 * 1024;

/// Recursive doubling on hosts that hold the ranks in blocks ([`Shape::host_blocks`]) goes
/// within hosts and sends slices across (`super::host_doubling`) from this many bytes: plain
/// doubling sends the whole vector of every rank of a host across at once (L times the
/// message through the host's port), the hosts' way 1/L of it per rank, for two more rounds
/// within the host. Measured on pretend hosts (`jaccl bench --dtype u8`, µs, two runs, the
/// hosts' way against plain doubling): 2 × 4 at 1 Gbit/s 8-512 B 46-54 against 37-45, 2 KiB
/// 57-63 against 76-78, 8 KiB 79-82 against 281, 32 KiB 281 against 1103 (Open MPI in the
/// same minutes: 38-60 at 8 B, 102-156 at 8 KiB and 280 at 32 KiB); at 10 Gbit/s, where this machine's
/// 2 cores shared by 8 ranks make every round dear, 0.75-0.88x plain doubling's speed at
/// every size (2 KiB 55-63 against 48-53, 32 KiB 146-155 against 111-129), and 0.69-0.90x on
/// 4 × 2. With 2 ranks per host, at 1 Gbit/s, 2 × 2: 2 KiB 22-28 against 37, 8 KiB 73 against
/// 139, 32 KiB 279 against 551; 4 × 2: 2 KiB 69-72 against 76-81, 8 KiB 144 against 281; at 10
/// Gbit/s 0.59-0.97x on 2 × 2, 0.90-1.22x on 4 × 2. Hosts of their own cores pay less for the
/// rounds within, and more ranks per host pay more for plain doubling's bytes, so the hosts'
/// way is the default where bytes count. (Measured before the pretend hosts' ranks stopped
/// spinning on shared cores, `crate::wait::WaitPolicy::auto`, 2 × 2 had lost 0.42-0.52x.)
const HOST_DOUBLING_MIN: usize = 2048;

/// All-reduces of more than this many bytes per rank (up to [`rabenseifner_max`]) among 3 or
/// more ranks over TCP and shared memory take Rabenseifner's halving then doubling instead
/// of recursive doubling or the gather: they move 2(p−1)/p of the vector per rank in 2·log2 p
/// rounds, where doubling moves the whole vector log2 p times. Measured over TCP on loopback
/// (`jaccl bench`, all-reduce f32, µs, doubling against Rabenseifner): 4 ranks 32 KiB 43
/// against 56, 64 KiB 88 against 69; 8 ranks 32 KiB 180 against 179, 64 KiB 655 against 215;
/// 16 ranks 32 KiB 699 against 504, 64 KiB 2119 against 784; 64 ranks 64 KiB 14 308 against
/// 9231. With RDMA, unmeasured: the doubling and ring choices stay.
const RABENSEIFNER_MIN: usize = 32 * 1024;

/// All-reduces up to this many bytes per rank among `ranks` ranks take Rabenseifner's
/// algorithm rather than the ring, whose 2(N − 1) rounds cost more the more ranks there are:
/// 384 KiB up to 8 ranks, 48 KiB per rank beyond. Measured over TCP on loopback (`jaccl bench
/// --dtype u8`, µs, Rabenseifner against the ring, 2 runs each, 2026-12-07, connections within
/// the host unpaced: `crate::transport::tcp::congestion`): 4 ranks 128 KiB 98 against 236-253,
/// 256 KiB 188-202 against 211-214, 512 KiB 381-430 against 364-386; 8 ranks 256 KiB 581
/// against 819-872, 512 KiB and 1 MiB alike; 16 ranks 512 KiB 2443-2744 against 3477-3668,
/// 1 MiB 4545-5074 against 4858-5515, 2 MiB 10 308-11 187 against 8807-10 526; 32 ranks 1 MiB
/// 12.8-14.1 ms against 17.3-19.4, 2 MiB 32.6-33.4 against 29.9-31.3; 64 ranks 2 MiB 79.5-83.9
/// against 89.2-90.7, 4 MiB 154-163 against 135-145; 128 ranks 4 MiB 342-355 against 368-378.
/// (Measured with paced connections, the limit had been 24 KiB per rank.)
fn rabenseifner_max(ranks: usize) -> usize {
    48 * 1024 * ranks.max(8)
}

/// All-gathers of at most this many bytes in all among `ranks` ranks take Bruck's ⌈log2 N⌉
/// rounds (from 6 ranks, where they are no more than the both-ways gather's ⌈(N − 1)/2⌉ hops,
/// unless the ranks pair up for recursive doubling): 16 KiB per rank. Larger ones take the
/// gather's and the ring's pipelined lanes, which send both ways. Measured over TCP on
/// loopback (`jaccl bench --op all-gather`, µs, the output's size, Bruck against the both-ways
/// gather and the ring, best of 2, 2026-12-07): 6 ranks 96 KiB 85 against 90 and 160; 8 ranks
/// 128 KiB 185 against 203 and 311, 256 KiB 313 against 257 and 506; 12 ranks 192 KiB 500
/// against 544 and 617; 16 ranks 128 KiB 528 against 654 and 714, 256 KiB 845 against 912 and
/// 975, 512 KiB 1319 against 1346 and 1567; 32 ranks 256 KiB 1978 against 3386 and 3461,
/// 512 KiB 3103 against 4165 and 4296, 1 MiB 6122 against 5654 and 6353; 64 ranks 512 KiB 9315
/// against 16 301 and 14 068, 1 MiB 18 903 against 21 572 and 20 396, 2 MiB 37 347 against
/// 30 403 and 30 429. (Measured while TCP within a host was paced, 2026-12-05, the crossing
/// was at 4 KiB per rank: docs/algorithms.md, "All-gather".) Where several hosts each hold
/// several ranks (`shared_hosts`), 512 B per rank (4 KiB at 8 ranks, where it was measured):
/// Bruck's partners at distances 2, 4, … are on other hosts far more often than the gather's
/// ring neighbours where hosts hold ranks in blocks, so its rounds cross the hosts' ports with
/// several times the bytes. On 2 × 4 pretend hosts at 1 Gbit/s (Bruck against the gather,
/// µs): 512 B 61 against 49, 2 KiB 56 against 58, 8 KiB 189 against 63, 64 KiB 1448 against
/// 486; on 4 × 2 at 1 Gbit/s 16 KiB 237 against 128, 64 KiB 898 against 512; at 10 Gbit/s the
/// two within 15% of each other from 512 B to 64 KiB.
fn bruck_max(ranks: usize, shared_hosts: bool) -> usize {
    let per_rank = if shared_hosts { 512 } else { 16 * 1024 };
    per_rank * ranks
}

/// All-to-alls among at least this many ranks take Bruck's rounds for small blocks: among
/// fewer, its rounds are no fewer messages than the pairwise exchange sends at once.
/// Measured over TCP on loopback (`jaccl bench --op all-to-all`, µs, Bruck's against
/// pairwise, two runs each): 4 ranks 32 B 27-31 against 26-30, 8 KiB 36-43 against 30-33;
/// 6 ranks 48 B 58-68 against 71-82, 12 KiB 77-79 against 74-83; 8 ranks 64 B 89 against 129.
const BRUCK_ALL_TO_ALL_MIN_RANKS: usize = 8;

/// All-to-alls of less than this many bytes per rank (all its blocks, each padded to the
/// largest of any rank) among `ranks` ranks take Bruck's rounds, 4 KiB × N, where the two
/// tie or Bruck's begins to lose: each round moves half the blocks, `⌈log2 N⌉·N/2` in all against
/// the pairwise exchange's N − 1, so past that the bytes cost more than the messages saved.
/// Measured (as [`BRUCK_ALL_TO_ALL_MIN_RANKS`], each rank's input, best of 2, 2026-12-07):
/// 8 ranks 16 KiB 80 against 134, 32 KiB 121 against 142, 64 KiB 275 against 145; 16 ranks
/// 32 KiB 470 against 558, 64 KiB 708 against 688, 128 KiB 1142 against 803; 32 ranks 64 KiB
/// 1845 against 2431, 128 KiB 3036 against 2697; 64 ranks 128 KiB 9294 against 11 740, 256
/// KiB 15 638 against 18 454, 512 KiB 39 056 against 23 793. (While TCP within a host was
/// paced, 2026-12-05, the two tied at 2 KiB × N.) Where several hosts each hold several ranks
/// (`shared_hosts`), 2 KiB × N: Bruck's extra bytes share each host's port, and on 2 × 4
/// pretend hosts at 1 Gbit/s its rounds took 490 µs at 16 KiB and 738 at 24 KiB against the
/// pairwise exchange's 298 and 443 (on 4 × 2 at 10 Gbit/s, 105-118 and 135-136 against 175
/// and 189-207: there the saved messages win, but the job cannot tell its link's speed).
fn bruck_all_to_all_max(ranks: usize, shared_hosts: bool) -> usize {
    let per_block = if shared_hosts { 2 * 1024 } else { 4 * 1024 };
    per_block * ranks
}

/// Ranks that do not pair up on the ring or the mesh (3 or more, over TCP, but 4) reduce-scatter up
/// to this many bytes of input by recursive halving over links made on first use (`super::halving`;
/// those beyond a power of two folded in): 16 KiB per rank, at most 512 KiB. With a fold (one run
/// each, 2026-12-07): 7 ranks 112 KiB 245 against 259, 12 ranks 192 KiB 697 against 744, 48 ranks
/// 512 KiB 6364 against 14 149. A power of two, measured over TCP on loopback (`jaccl bench --op
/// reduce-scatter`, the input, µs, halving against the ring, best of 3, 2026-12-07): 8 ranks 512 B
/// 54 against 91, 64 KiB 104 against 225, 128 KiB 185 against 303, 256 KiB 363 against 415, 512 KiB
/// 684 against 631; 16 ranks 1 KiB 165 against 327, 128 KiB 559 against 687, 256 KiB 931 against
/// 862, 512 KiB 1536 against 1190; best of 2: 32 ranks 2 KiB 507 against 1323, 64 KiB 1080 against
/// 1612, 512 KiB 3530 against 3745; 64 ranks 4 KiB 1683 against 5276, 256 KiB 5025 against 8081,
/// 512 KiB 8833 against 13 488.
fn halving_over_links_max(ranks: usize) -> usize {
    (16 * 1024 * ranks).min(GATHER_LIMIT)
}

/// Two ranks reduce-scatter up to this many bytes of input in one swap; larger inputs take the
/// ring's one step, which splits the data over both connections and reduces it as it arrives.
/// Measured on loopback (`jaccl bench -n 2 --op reduce-scatter`, medians): 8 B 11.7 µs against
/// the ring's 18.8, 128 KiB 46 against 60, 192 KiB 93 against 96, 256 KiB 132 against 78.
const PAIR_HALVING_MAX: usize = 192 * 1024;

/// Direct all-reduces of at most this many bytes take one round and reduce every vector on
/// every rank: the crossover with the two-synchronisation algorithm, measured at 2, 4 and 8
/// ranks (docs/algorithms.md, "Shared memory").
fn direct_one_round_max(ranks: usize) -> usize {
    if ranks <= 2 { 64 * 1024 } else { 8 * 1024 }
}

/// How many directions and wires a message uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lanes {
    pub(crate) dirs: usize,
    pub(crate) wires: usize,
}

impl Lanes {
    /// The number of lanes.
    pub(crate) fn count(self) -> usize {
        self.dirs * self.wires
    }
}

/// The lanes of a message of `bytes` in `units` indivisible units (elements) over a ring of
/// `ranks` blocks with `wires` wires: both directions on every wire, unless the message is too
/// small to split; then one direction on one wire.
pub(crate) fn lanes(bytes: usize, units: usize, ranks: usize, wires: usize) -> Lanes {
    if bytes <= SMALL_MESSAGE || units < ranks * 2 * wires {
        Lanes { dirs: 1, wires: 1 }
    } else {
        Lanes { dirs: 2, wires }
    }
}

/// How a small gather of whole blocks moves (all-reduce's gather, all-gather, barrier).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SmallGather {
    /// One step: every rank sends its block to every other (the mesh; two ranks).
    Exchange,
    /// Whole blocks forwarded both ways around the ring.
    BothWays,
}

/// The all-reduce of `bytes` per rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AllReduce {
    /// Through the ranks' shared segments ([`Shape::direct_all_reduce`] says how).
    Direct,
    /// Recursive doubling.
    Doubling,
    /// Recursive doubling within hosts of this many ranks, slices across hosts
    /// (`super::host_doubling`), from [`HOST_DOUBLING_MIN`].
    DoublingOnHosts(usize),
    /// Recursive halving then doubling (Rabenseifner's algorithm).
    Rabenseifner,
    /// Gather every vector, reduce locally in rank order.
    Gather(SmallGather),
    /// The ring's reduce-scatter then all-gather.
    Ring,
}

/// The direct all-reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DirectAllReduce {
    /// One round: every rank reduces every vector.
    OneRound,
    /// Rounds of an area each: every rank reduces its slice, then copies the others'.
    Sliced,
}

/// The all-gather (or barrier) of `block` bytes per rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AllGather {
    Direct,
    Doubling,
    /// Bruck's: ⌈log2 N⌉ rounds among any number of ranks.
    Bruck,
    Small(SmallGather),
    Ring,
}

/// The reduce-scatter of `block` bytes of output per rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReduceScatter {
    Direct,
    /// One step: each block straight to its rank, which reduces them in rank order.
    Exchange,
    /// Recursive halving.
    Halving,
    Ring,
}

/// The barrier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Barrier {
    /// The all-gather of one-byte tokens, by the all-gather's choice.
    Gather(AllGather),
    /// An all-reduce of one byte by recursive doubling among any number of ranks.
    Doubling,
}

/// The broadcast of `bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Broadcast {
    /// The root posts the data in a line of its shared memory and goes on; the others read it
    /// (`super::shared_memory::Direct::broadcast_eager`).
    Eager,
    /// Per round of an area, the root copies in and every other rank copies out.
    Direct,
    /// In one step from the root over its links to every rank (shared memory: the rings let
    /// the root run ahead, as an eager protocol does).
    Flat,
    /// Rounds of a binomial tree over the mesh's channels: ⌈log2 size⌉ messages deep.
    Tree,
    /// Pipelined along the ring from the root, half of the data each way all the way round
    /// ([`crate::algo::ring::broadcast_lanes`]).
    Chain,
    /// Pipelined along the ring from the root, all of the data each way, each direction to
    /// half the ranks.
    WholeChains,
}

/// A rooted collective (reduce, gather, scatter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rooted {
    Direct,
    /// The collective every rank takes part in (all-reduce, all-gather), its result kept on
    /// the root only: for small messages, the fast ways of those (doubling, gathers).
    ViaAll,
    /// Rounds of a binomial tree (`super::tree`): ⌈log2 N⌉ deep, over the mesh's channels or
    /// links made on first use; a rank that has handed its data up (or got its own) is done.
    Tree,
    /// Along the ring towards (or from) the root, from both sides.
    Chain,
}

/// The all-to-all (any counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AllToAll {
    Direct,
    /// Bruck's ⌈log2 N⌉ rounds, every block padded to the largest.
    Bruck,
    /// Every pair at once, each over a connection of its own (the mesh's, or made on first
    /// use).
    Pairwise,
}

/// The all-gather with blocks of different lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AllGatherV {
    Direct,
    /// Every block padded to the longest, then the all-gather of equal blocks (and its fast
    /// ways): when padding costs less than half again.
    Padded,
    /// Around the ring, each block at its own length.
    Ring,
}

/// The reduce-scatter with parts of different lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReduceScatterV {
    /// Every part padded to the longest, then the reduce-scatter of equal parts.
    Padded,
    /// An all-reduce of the whole input, each rank keeping its part: when parts are so
    /// uneven that padding would cost more than the all-reduce's second pass.
    AllReduce,
}

impl Shape {
    /// Whether a collective whose vectors together take `total` bytes goes to every rank in
    /// one step. Two ranks instead swap their vectors (doubling): the same messages, without
    /// copying both vectors into one buffer first.
    pub(crate) fn in_one_step(&self, total: usize) -> bool {
        self.mesh && self.size > 2 && total <= MESH_LIMIT
    }

    /// Whether a small all-reduce doubles: where the ranks pair up, and among 5 or more ranks
    /// (with hand-overs before and after where they are no power of two), where it beat the
    /// ring's both-ways gather at every size; 3 ranks gather in one hop each way. Measured
    /// over TCP on loopback (`jaccl bench`, 8 B, µs, doubling against the gather): 3 ranks
    /// 17.3 against 16.2, 5 ranks 34.5 against 40.9, 7 ranks 48 against 78, 11 ranks 124
    /// against 189; 5 ranks 8 KiB 46 against 89. Where the ring uses RDMA (unmeasured), only
    /// where it takes fewer rounds than the gather takes hops (8 ranks, 12 or more): its links
    /// beyond the ring are TCP.
    pub(crate) fn doubles(&self) -> bool {
        let n = self.size;
        let rounds =
            n.checked_ilog2().unwrap_or(0) as usize + 2 * usize::from(!n.is_power_of_two());
        match self.rdma {
            false => self.pairs || n >= 5,
            true => self.pairs || rounds < n.saturating_sub(1).div_ceil(2),
        }
    }

    /// Whether the gather of whole vectors may carry `total` bytes in all (every rank holds
    /// all of them).
    pub(crate) fn gathers(&self, total: usize) -> bool {
        total <= GATHER_LIMIT
    }

    /// How a small gather of `total` bytes in all moves.
    pub(crate) fn small_gather(&self, total: usize) -> SmallGather {
        if self.size <= 2 || self.in_one_step(total) {
            SmallGather::Exchange
        } else {
            SmallGather::BothWays
        }
    }

    /// All-reduce of `bytes` per rank. An empty all-reduce only exchanges headers: the
    /// gather's one step does that.
    pub(crate) fn all_reduce(&self, bytes: usize) -> AllReduce {
        if self.direct {
            return AllReduce::Direct;
        }
        let total = bytes.saturating_mul(self.size);
        let doubling_max = if self.rdma {
            DOUBLING_MAX_RDMA
        } else if self.size > 2 {
            RABENSEIFNER_MIN
        } else {
            DOUBLING_MAX
        };
        let halving = !self.rdma && self.size > 2 && !self.in_one_step(total);
        if self.doubles() && !self.in_one_step(total) && (1..=doubling_max).contains(&bytes) {
            self.doubling(bytes)
        } else if halving && bytes > RABENSEIFNER_MIN && bytes <= self.rabenseifner_max() {
            AllReduce::Rabenseifner
        } else if !self.gathers(total) {
            AllReduce::Ring
        } else {
            AllReduce::Gather(self.small_gather(total))
        }
    }

    /// Recursive doubling of `bytes` per rank: within hosts and across in slices on hosts in
    /// blocks ([`Shape::host_blocks`]), from [`HOST_DOUBLING_MIN`] (not
    /// where the ring uses RDMA: unmeasured), else plain.
    pub(crate) fn doubling(&self, bytes: usize) -> AllReduce {
        match self.host_blocks {
            Some(per_host) if !self.rdma && bytes >= HOST_DOUBLING_MIN => {
                AllReduce::DoublingOnHosts(per_host)
            }
            _ => AllReduce::Doubling,
        }
    }

    /// The largest all-reduce (bytes per rank) that takes Rabenseifner's algorithm rather than
    /// the ring: [`rabenseifner_max`], or on hosts up to the two levels
    /// ([`ALL_REDUCE_TWO_LEVEL_MIN`]).
    /// Where hosts hold the ranks in blocks, the ring crosses each host's port with 7/4 of the
    /// message each way (2 × 4 ranks), Rabenseifner's with about the message once: measured on
    /// 2 pretend hosts × 4 ranks (`jaccl bench --dtype u8`, µs, best of 2 runs, Rabenseifner's
    /// against the ring): at 1 Gbit/s 256 KiB 2206 against 3847, 512 KiB 4507 against 7681
    /// (Open MPI in the same minutes: 2199 and 7012); at 10 Gbit/s 256 KiB 521 against 748,
    /// 512 KiB 1113 against 1063.
    fn rabenseifner_max(&self) -> usize {
        match self.on_hosts {
            true => rabenseifner_max(self.size).max(ALL_REDUCE_TWO_LEVEL_MIN),
            false => rabenseifner_max(self.size),
        }
    }

    /// The direct all-reduce of `bytes` when a round moves at most `area` bytes.
    pub(crate) fn direct_all_reduce(&self, bytes: usize, area: usize) -> DirectAllReduce {
        if bytes <= direct_one_round_max(self.size).min(area) {
            DirectAllReduce::OneRound
        } else {
            DirectAllReduce::Sliced
        }
    }

    /// All-gather of `block` bytes per rank (a barrier gathers one byte).
    pub(crate) fn all_gather(&self, block: usize) -> AllGather {
        let total = block.saturating_mul(self.size);
        // Not over links made on first use (TCP) where the ring uses RDMA (unmeasured).
        let links = self.mesh || !self.rdma;
        let bruck = links && !self.pairs && self.size >= 6 && block > 0 && !self.in_one_step(total);
        if self.direct {
            AllGather::Direct
        } else if bruck && total <= bruck_max(self.size, self.shared_hosts) {
            AllGather::Bruck
        } else if total > GATHER_LIMIT {
            AllGather::Ring
        } else if self.pairs && block > 0 && !self.in_one_step(total) {
            AllGather::Doubling
        } else {
            AllGather::Small(self.small_gather(total))
        }
    }

    /// The barrier: the all-gather of one-byte tokens, unless that goes both ways around the
    /// ring or by Bruck's rounds where recursive doubling among any number of ranks doubles
    /// ([`Shape::doubles`]). Doubling swaps with one partner per round, where Bruck's
    /// dissemination sends to one rank and receives from another, each connection one way
    /// (a bare acknowledgement per message): measured over TCP on loopback (`jaccl bench --op
    /// barrier`, µs, doubling against Bruck), 5 ranks 38 against 58, 8 ranks 83 against 85,
    /// 16 ranks 254 against 280, 64 ranks 3415 against 3963.
    pub(crate) fn barrier(&self) -> Barrier {
        match self.all_gather(1) {
            AllGather::Small(SmallGather::BothWays) | AllGather::Bruck if self.doubles() => {
                Barrier::Doubling
            }
            choice => Barrier::Gather(choice),
        }
    }

    /// Broadcast of `bytes`: on hosts whose ranks the ring visits in turns
    /// ([`Shape::scattered_hosts`]) down the tree at every size, as the chain would cross
    /// between hosts at most hops (2 pretend hosts × 4 ranks, alternating, at 1 Gbit/s: 512
    /// KiB 17.6 ms along the chain, 4 times what the tree takes to cross once).
    pub(crate) fn broadcast(&self, bytes: usize) -> Broadcast {
        if self.direct && bytes <= EAGER_DATA_BYTES {
            Broadcast::Eager
        } else if self.direct && self.size > 2 && bytes <= FLAT_BROADCAST_MAX {
            Broadcast::Flat
        } else if self.direct {
            Broadcast::Direct
        } else if (self.mesh || !self.rdma)
            && self.size > 3
            && (bytes <= self.tree_broadcast_max() || self.scattered_hosts)
        {
            Broadcast::Tree
        } else if self.many_ranks_alike()
            && bytes <= WHOLE_CHAINS_PER_HOP.saturating_mul(self.size - 1)
        {
            Broadcast::WholeChains
        } else {
            Broadcast::Chain
        }
    }

    /// Whether the choices for many ranks apply: [`MANY_RANKS`] or more over TCP, all on one
    /// host or each on its own.
    fn many_ranks_alike(&self) -> bool {
        self.size >= MANY_RANKS && !self.rdma && !self.shared_hosts && !self.scattered_hosts
    }

    /// The largest broadcast that goes down the tree.
    fn tree_broadcast_max(&self) -> usize {
        match self.many_ranks_alike() {
            true => MANY_RANKS_TREE_BROADCAST_MAX,
            false => TREE_BROADCAST_MAX,
        }
    }

    /// Whether the rooted collectives may take a binomial tree: over links made on first use
    /// or the mesh's, not where the ring uses RDMA (its links beyond the ring are TCP;
    /// unmeasured).
    fn trees(&self) -> bool {
        !self.direct && (self.mesh || !self.rdma)
    }

    /// Reduce of `bytes` to a root: up a binomial tree up to [`TREE_REDUCE_PER_RANK`] per rank
    /// of the group, at least [`TREE_REDUCE_MIN_MAX`] (at every size
    /// on hosts the ring visits in turns, [`Shape::scattered_hosts`], and on even hosts, where
    /// it crosses to each host once as the two levels above do: 2 pretend hosts × 4 ranks,
    /// against the flat all-reduce, at 1 Gbit/s 1.00–1.02×, at 10 Gbit/s 128 KiB 1.56–1.63×,
    /// 256 KiB 1.23–1.32×), else as an
    /// all-reduce (the ring's reduce-scatter and all-gather: twice the bytes a reduce-scatter
    /// then gather would move; docs/algorithms.md, "Reduce").
    pub(crate) fn reduce(&self, bytes: usize) -> Rooted {
        if self.direct {
            Rooted::Direct
        } else if self.trees()
            && (bytes <= self.tree_reduce_max() || self.on_hosts || self.scattered_hosts)
        {
            Rooted::Tree
        } else {
            Rooted::ViaAll
        }
    }

    /// The largest reduce that goes up the tree.
    fn tree_reduce_max(&self) -> usize {
        TREE_REDUCE_PER_RANK
            .saturating_mul(self.size)
            .max(TREE_REDUCE_MIN_MAX)
    }

    /// Gather of `block` bytes per rank to a root: up a binomial tree where it may take one,
    /// up to [`TREE_GATHER_PER_RANK`] per rank ([`MANY_RANKS_TREE_GATHER_PER_RANK`] where the
    /// choices for many ranks apply; the root receives every block once, in ⌈log2 N⌉
    /// messages), else as an all-gather while small, along the ring above.
    pub(crate) fn gather(&self, block: usize) -> Rooted {
        let tree_max = match self.many_ranks_alike() {
            true => MANY_RANKS_TREE_GATHER_PER_RANK,
            false => TREE_GATHER_PER_RANK,
        };
        if self.direct {
            Rooted::Direct
        } else if self.trees() && block <= tree_max {
            Rooted::Tree
        } else if block.saturating_mul(self.size) <= GATHER_LIMIT {
            Rooted::ViaAll
        } else {
            Rooted::Chain
        }
    }

    /// Scatter of `block` bytes per rank from a root: down a binomial tree where it may take
    /// one among more than 4 ranks, else along the ring. Measured over TCP on loopback
    /// (`jaccl bench --op scatter --dtype u8`, the root's buffer, µs, best of 2, tree against
    /// chain, while the tree's edges exchanged headers both ways): 2 ranks 8 B 4.0 against 3.2,
    /// 1 MiB 182 against 130; 4 ranks 8 B 13.5 against 6.7, 64 KiB 30 against 29; 8 ranks 8 B
    /// 27.7 against 27.1, 64 KiB 53 against 62, 1 MiB 493 against 539; 64 ranks 4 MiB 2503
    /// against 12 430. With headers one way, at 3 and 4 ranks the tree was 1-6 µs faster up to
    /// 32 KiB and slower from 256 KiB (4 ranks 256 KiB 47-51 against 35-38): left as it was.
    pub(crate) fn scatter(&self, _block: usize) -> Rooted {
        if self.direct {
            Rooted::Direct
        } else if self.trees() && self.size > 4 {
            Rooted::Tree
        } else {
            Rooted::Chain
        }
    }

    /// All-to-all whose largest block of any rank has `largest` bytes (Bruck's rounds pad
    /// every block to it).
    pub(crate) fn all_to_all(&self, largest: usize) -> AllToAll {
        // Not over links made on first use (TCP) where the ring uses RDMA (unmeasured).
        let links = self.mesh || !self.rdma;
        if self.direct {
            AllToAll::Direct
        } else if links
            && self.size >= BRUCK_ALL_TO_ALL_MIN_RANKS
            && largest > 0
            && largest.saturating_mul(self.size)
                < bruck_all_to_all_max(self.size, self.shared_hosts)
        {
            AllToAll::Bruck
        } else {
            AllToAll::Pairwise
        }
    }

    /// Whether a pairwise all-to-all first exchanges headers with its ring neighbours: where
    /// another rank may have taken Bruck's rounds (it passed blocks of another length, or
    /// called something else), and so never dials the links this rank would wait for, the
    /// neighbours see the `Mismatch` at once instead of a timeout. With the mesh every link
    /// exists and the pairwise exchange's own headers show it. Below 8 ranks it would cost a
    /// round trip (4 ranks over TCP, 64 B: 72 µs against 48) for a better name only: a rank
    /// making its links may hear of another's failure (the mismatch behind it) before it
    /// reads the odd rank's header.
    pub(crate) fn pairwise_announces(&self) -> bool {
        !self.mesh && !self.rdma && self.size >= BRUCK_ALL_TO_ALL_MIN_RANKS
    }

    /// All-gather of blocks of at most `largest` bytes, `total` in all.
    pub(crate) fn all_gather_v(&self, largest: usize, total: usize) -> AllGatherV {
        let padded = largest.saturating_mul(self.size);
        if self.direct {
            AllGatherV::Direct
        } else if padded <= GATHER_LIMIT || padded <= total.saturating_mul(3) / 2 {
            AllGatherV::Padded
        } else {
            AllGatherV::Ring
        }
    }

    /// Reduce-scatter of parts of at most `largest` bytes, `total` in all.
    pub(crate) fn reduce_scatter_v(&self, largest: usize, total: usize) -> ReduceScatterV {
        match largest.saturating_mul(self.size) <= total.saturating_mul(2) {
            true => ReduceScatterV::Padded,
            false => ReduceScatterV::AllReduce,
        }
    }

    /// Reduce-scatter of `block` bytes of output per rank.
    pub(crate) fn reduce_scatter(&self, block: usize) -> ReduceScatter {
        let total = block.saturating_mul(self.size);
        let halving_max = if self.size == 2 {
            PAIR_HALVING_MAX
        } else {
            GATHER_LIMIT
        };
        if self.direct {
            ReduceScatter::Direct
        } else if self.in_one_step(total) {
            ReduceScatter::Exchange
        } else if block > 0
            && ((self.pairs && total <= halving_max)
                || (self.halves_over_links() && total <= halving_over_links_max(self.size)))
        {
            ReduceScatter::Halving
        } else {
            ReduceScatter::Ring
        }
    }

    /// Whether ranks that do not pair up on the ring or the mesh halve over links made on first
    /// use ([`halving_over_links_max`]; those beyond a power of two folded in). Not where
    /// several hosts each hold several ranks: the first steps send half the input across from
    /// every rank of a host.
    fn halves_over_links(&self) -> bool {
        !self.rdma && !self.shared_hosts
    }
}

#[cfg(test)]
mod tests;
