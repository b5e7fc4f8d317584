//! What a collective will cost on a cluster you may not have: the plans jaccl would run there,
//! every algorithm it has for the collective, built for real and counted (rounds, bytes per
//! rank, bytes reduced), then timed with the latency–bandwidth–reduction model (α, β, γ). This
//! is `jaccl plan`.
//!
//! Each rank's plans are tallied as it runs them: a message costs the latency of its link, a
//! byte sent or received (whichever is more: one port each way) the inverse bandwidth, a byte
//! reduced the inverse reduction rate; the slowest rank sets the time (every rank where there
//! are at most 64, else those of every role). Where ranks share hosts, the ranks of a host
//! share its port to the network (its bytes to other hosts add up), and talk to each other
//! through shared memory ([`Cluster::within_host`]); the port and the cores work at once, the
//! slower sets the pace. Where more ranks share a host than it has cores, they take turns: each
//! round also waits for the others on its core, and the bytes they copy cost as many times
//! more ([`Cluster::cpu_per_message`], [`Cluster::network_copy_rate`]). On hosts of equal size,
//! two ranks or more each, the two-level algorithms are priced too, as jaccl runs them
//! (docs/algorithms.md, "Across hosts: two levels").
//!
//! ```
//! use jaccl::planner::{Cluster, Collective, LinkSpeed, predict};
//! let link: LinkSpeed = "100Gb/s,2us".parse().unwrap();
//! let cluster = Cluster::new(1024, link);
//! let choices = predict(Collective::AllReduce, 64 << 20, &cluster);
//! let chosen = choices.iter().find(|p| p.chosen).unwrap();
//! assert!(chosen.seconds > 0.0);
//! ```

use std::collections::HashMap;

pub use crate::config::LinkSpeed;

use crate::algo::cost::{self, Rates, Spread, Tally};
use crate::algo::geometry::Geometry;
use crate::algo::hosts::{self, ALL_REDUCE_CHUNK_MIN, GATHER_CHUNK_MIN, two_level_chunks};
use crate::algo::pricing::{
    Algorithm, ByModel, all_gather_algorithm, all_reduce_algorithm, ranks_to_price,
};
use crate::algo::select::{AllGather, AllReduce, AllToAll, Shape};
use crate::error::Op;

/// The cluster a plan is for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cluster {
    /// Ranks in the job.
    pub ranks: usize,
    /// Hosts, the ranks spread evenly over them in rank order (a rank each by default).
    pub hosts: usize,
    /// Cores of each host, when its ranks may outnumber them (`None`: never); a fraction
    /// where hosts share a machine's cores (4 pretend hosts on 2 cores: 0.5).
    pub cores: Option<f64>,
    /// Seconds of a core that one message costs a rank (system calls, waking up): where a
    /// host's ranks outnumber its cores, each round waits for the other ranks sharing a core
    /// to make theirs.
    pub cpu_per_message: f64,
    /// How much more [`Cluster::cpu_per_message`] costs each time the ranks per core double
    /// (0.8: 1.8 times at 2 a core, 5 times at 32): the more processes take turns on a core,
    /// the less of each one's memory is still in the caches when its turn comes.
    pub cpu_per_message_growth: f64,
    /// The link between hosts: each host's port, each way, which its ranks share (with a
    /// host per rank, the link between any two ranks).
    pub link: LinkSpeed,
    /// The link between the ranks of one host, as the flat algorithms use it: shared memory,
    /// whose bandwidth is a rank's copies into and out of the areas between two ranks.
    pub within_host: LinkSpeed,
    /// Bytes per second a rank copies in the direct collectives of a host's ranks (the two
    /// levels' level within a host), which read the peers' buffers in shared memory.
    pub direct_copy_rate: f64,
    /// Bytes per second a core moves through the kernel for TCP: where a host's ranks
    /// outnumber its cores, the bytes they send to other hosts cost the cores this too.
    pub network_copy_rate: f64,
    /// Whether the job gives jaccl the links' figures (`JACCL_LINK`, [`crate::Config::link`]),
    /// so that it chooses the all-reduce by this model (with the link alone: the job knows
    /// neither [`Cluster::cores`] nor [`Cluster::reduce_rate`], and prices reductions at
    /// [`Cluster::DEFAULT_REDUCE_RATE`]); else by the thresholds measured on loopback.
    pub chooses_by_model: bool,
    /// Bytes per second one rank reduces (1/γ), for f32 sums.
    pub reduce_rate: f64,
    /// Wires (connections) per ring neighbour, as [`crate::Config::wires`].
    pub wires: usize,
}

impl Cluster {
    /// `ranks` ranks on hosts of their own over `link`, reducing at
    /// [`Cluster::DEFAULT_REDUCE_RATE`], with the default wires, the job given the link's
    /// figures.
    pub fn new(ranks: usize, link: LinkSpeed) -> Cluster {
        Cluster {
            ranks,
            hosts: ranks,
            cores: None,
            cpu_per_message: Cluster::DEFAULT_CPU_PER_MESSAGE,
            cpu_per_message_growth: Cluster::DEFAULT_CPU_PER_MESSAGE_GROWTH,
            link,
            within_host: LinkSpeed::MEASURED_SHARED_MEMORY,
            direct_copy_rate: Cluster::DEFAULT_DIRECT_COPY_RATE,
            network_copy_rate: Cluster::DEFAULT_NETWORK_COPY_RATE,
            chooses_by_model: true,
            reduce_rate: Cluster::DEFAULT_REDUCE_RATE,
            wires: crate::Config::DEFAULT_WIRES,
        }
    }

    /// f32 sums per second of one core of the machine jaccl is measured on (bytes of input
    /// reduced: 18–25 GB/s over 8 MiB, 35–45 GB/s within the cache); a group given its links'
    /// figures prices reductions at this rate.
    pub const DEFAULT_REDUCE_RATE: f64 = cost::DEFAULT_REDUCE_RATE;

    /// What a rank copies per second there in the direct collectives: it reads (L − 1)/L of a
    /// 4 MiB reduce-scatter's input at 5.6 GB/s, of an all-gather's output at 3.2 GB/s, among
    /// 2 ranks (8 ranks on the 2 cores: 4.7 and 7.2 GB/s, counted per core).
    pub const DEFAULT_DIRECT_COPY_RATE: f64 = 4e9;

    /// A core's time per message there when ranks share cores (docs/algorithms.md, "The cost
    /// model").
    pub const DEFAULT_CPU_PER_MESSAGE: f64 = 2e-6;

    /// What a core moves per second through the kernel to other hosts there (pretend hosts:
    /// veth pairs, a switch namespace, tc's token bucket): the figure the pretend-host tables
    /// of 2026-12-06 were predicted with (then also loopback's), kept when loopback's was
    /// fitted again, as those predictions were already 1.3-1.6 times low where 2 cores set
    /// the pace (docs/algorithms.md).
    pub const DEFAULT_NETWORK_COPY_RATE: f64 = 2.2e9;

    /// Its growth per doubling of the ranks per core there: fitted with
    /// [`Cluster::DEFAULT_CPU_PER_MESSAGE`] to 8-byte all-reduces among 2 to 64 ranks on 2
    /// cores (a round measured 3.6 to 9.4 µs for each rank on a core at 2 to 32 a core; the
    /// fit gives 3.6 to 10).
    pub const DEFAULT_CPU_PER_MESSAGE_GROWTH: f64 = 0.8;

    /// Ranks per core, where a host's ranks outnumber its cores (else 1).
    fn crowding(&self) -> f64 {
        let per_host = self.ranks.div_ceil(self.hosts.max(1)) as f64;
        match self.cores {
            Some(cores) if per_host > cores => per_host / cores.max(f64::MIN_POSITIVE),
            _ => 1.0,
        }
    }

    /// Where the ranks are.
    fn spread(&self) -> Spread {
        Spread {
            ranks: self.ranks,
            hosts: self.hosts.clamp(1, self.ranks.max(1)),
        }
    }

    /// Whether the ranks are on several hosts of equal size, 2 or more each (the two levels'
    /// layouts, `HostLayout::even`).
    fn even_hosts(&self) -> bool {
        let (n, h) = (self.ranks, self.hosts);
        h >= 2 && h < n && n % h == 0
    }

    /// The ranks per host where they fill hosts in blocks, a power of two of them on each of
    /// a power of two of hosts (`HostLayout::blocks`).
    fn host_blocks(&self) -> Option<usize> {
        let per_host = self.ranks / self.hosts.max(1);
        let powers = per_host.is_power_of_two() && self.hosts.is_power_of_two();
        (self.even_hosts() && powers).then_some(per_host)
    }

    /// Whether start-up builds the mesh among `ranks` ranks on `hosts` hosts
    /// (`Topology::Auto`: 4 to 16 ranks, a host each).
    fn mesh(ranks: usize, hosts: usize) -> bool {
        (4..=16).contains(&ranks) && hosts >= ranks
    }

    fn geometry(&self, rank: usize) -> Geometry {
        Geometry {
            rank,
            size: self.ranks,
            wires: self.wires.max(1),
            mesh: Cluster::mesh(self.ranks, self.hosts),
        }
    }

    /// What one of the other ranks on a core costs a round when `c` ranks share each core.
    fn turn(&self, c: f64) -> f64 {
        self.cpu_per_message * (1.0 + self.cpu_per_message_growth * c.log2())
    }

    /// What a rank's `tally` costs here, its host's ranks moving `host_remote` bytes through
    /// the host's port, its bytes within the host copied at `copy_rate`: with `c` ranks per
    /// core, a round also waits for the `c − 1` others on its core ([`Cluster::turn`]), and
    /// every byte copied or reduced costs `c` times (they take turns on the core).
    fn cost(&self, tally: &Tally, host_remote: usize, copy_rate: f64) -> Cost {
        let c = self.crowding();
        let local_rounds = tally.rounds.saturating_sub(tally.remote_rounds);
        let through_kernel = match c > 1.0 {
            true => tally.remote as f64 / self.network_copy_rate,
            false => 0.0,
        };
        let local = tally.bytes.saturating_sub(tally.remote) as f64;
        Cost {
            latency: tally.remote_rounds as f64 * self.link.latency_seconds()
                + local_rounds as f64 * self.within_host.latency_seconds()
                + tally.rounds as f64 * (c - 1.0) * self.turn(c),
            network: host_remote as f64 / self.link.bytes_per_second(),
            cores: c * (local / copy_rate.max(1.0) + through_kernel),
            reducing: c * tally.reduced as f64 / self.reduce_rate,
        }
    }

    /// What `algorithm` costs the slowest rank of a group laid out as `g` and spread as
    /// `spread`, where `sharing` such groups share each host's port (the two levels' groups
    /// across hosts, one per local rank).
    fn slowest(
        &self,
        algorithm: Algorithm,
        g: &Geometry,
        spread: &Spread,
        sharing: usize,
    ) -> (Tally, Cost) {
        let mut tallies = HashMap::new();
        let mut slowest = (Tally::default(), Cost::default());
        for rank in ranks_to_price(g.size) {
            let mine = tally_of(algorithm, g, spread, rank, &mut tallies);
            let host_remote = match mine.remote {
                0 => 0,
                _ => sharing.saturating_mul(host_remote(algorithm, g, spread, rank, &mut tallies)),
            };
            let cost = self.cost(&mine, host_remote, self.within_host.bytes_per_second());
            if cost.seconds() > slowest.1.seconds() {
                slowest = (mine, cost);
            }
        }
        slowest
    }

    /// The two-level algorithm of `op` of `bytes` where jaccl has one for this cluster (hosts
    /// of equal size, 2 ranks or more each), as `group/levels/` runs it: its tally per rank
    /// and its time.
    fn two_levels(&self, op: Collective, bytes: usize) -> Option<(Tally, f64)> {
        let (n, h) = (self.ranks, self.hosts);
        if !self.even_hosts() {
            return None;
        }
        let here = n / h;
        let cross = Geometry {
            rank: 0,
            size: h,
            wires: self.wires.max(1),
            mesh: Cluster::mesh(h, h),
        };
        let shape = cross.shape(false, false);
        let apart = Spread::apart(h);
        // The host's direct collectives: each rank reads the others' parts.
        let shared = |bytes: usize| (here - 1).saturating_mul(bytes) / here;
        match op {
            Collective::AllReduce => {
                let chunks = two_level_chunks(bytes, ALL_REDUCE_CHUNK_MIN);
                let chunk = bytes / chunks;
                let slice = chunk / here / ELEM * ELEM;
                // Each chunk: the host reduce-scatters it, then all-gathers the slices.
                let in_host = Tally {
                    rounds: 2,
                    bytes: 2 * shared(chunk),
                    reduced: shared(chunk),
                    ..Tally::default()
                };
                let choice = match self.chooses_by_model {
                    true => ByModel::new(self.job_rates()).all_reduce(&shape, &cross, slice, ELEM),
                    false => shape.all_reduce(slice),
                };
                let algorithm = all_reduce_algorithm(choice, slice / ELEM, ELEM)?;
                let across = self.slowest(algorithm, &cross, &apart, here);
                Some(self.in_chunks(chunks, in_host, across))
            }
            Collective::AllGather => {
                let chunks = two_level_chunks(bytes, GATHER_CHUNK_MIN);
                let (chunk, block) = (bytes / chunks, bytes / n / chunks);
                let algorithm = all_gather_algorithm(shape.all_gather(block), block)?;
                let across = self.slowest(algorithm, &cross, &apart, here);
                // Each chunk: the host gathers what its ranks got, then puts it in rank order.
                let in_host = Tally {
                    rounds: 1,
                    bytes: shared(chunk).saturating_add(chunk),
                    ..Tally::default()
                };
                Some(self.in_chunks(chunks, in_host, across))
            }
            Collective::AllToAll => None,
        }
    }

    /// A two-level collective in `chunks` chunks, each taking `in_host` on the host's level
    /// (the direct collectives) and `across` (tally and cost) across hosts: one chunk on the
    /// network while the host works on the next; where ranks outnumber cores, the two share
    /// them. Its tally per rank and its time.
    fn in_chunks(&self, chunks: usize, in_host: Tally, across: (Tally, Cost)) -> (Tally, f64) {
        let (across, across_cost) = across;
        let host_cost = self.cost(&in_host, 0, self.direct_copy_rate);
        let (a, b) = (host_cost.seconds(), across_cost.seconds());
        let mut each = a.max(b);
        if self.crowding() > 1.0 {
            each = each.max(host_cost.cpu() + across_cost.cpu());
        }
        let seconds = a + b + (chunks - 1) as f64 * each;
        (in_host.then(across).times(chunks), seconds)
    }

    /// The rates a job given the link's figures prices with: it knows neither the crowding nor
    /// another reduction rate.
    fn job_rates(&self) -> Rates {
        Rates::of_link(&self.link, cost::DEFAULT_REDUCE_RATE)
    }
}

/// What a rank's tally costs, part by part.
#[derive(Debug, Clone, Copy, Default)]
struct Cost {
    /// Its messages' latencies, and the turns it waits for on a shared core.
    latency: f64,
    /// Its host's bytes to other hosts through the host's port.
    network: f64,
    /// Its copies: through shared memory, and through the kernel where cores are shared.
    cores: f64,
    /// Its reductions.
    reducing: f64,
}

impl Cost {
    /// The port and the cores work at once: the slower sets the pace.
    fn seconds(&self) -> f64 {
        self.latency + self.network.max(self.cores) + self.reducing
    }

    /// What takes the cores.
    fn cpu(&self) -> f64 {
        self.cores + self.reducing
    }
}

/// The tally of `rank` (kept in `tallies`).
fn tally_of(
    algorithm: Algorithm,
    g: &Geometry,
    spread: &Spread,
    rank: usize,
    tallies: &mut HashMap<usize, Tally>,
) -> Tally {
    *tallies
        .entry(rank)
        .or_insert_with(|| algorithm.tally(&Geometry { rank, ..*g }, spread))
}

/// Bytes the ranks of `rank`'s host move to other hosts: every rank's, on a host of up to 64;
/// beyond, those of the two ranks at each end (where a ring crosses) and of every `stride`-th
/// rank between them, scaled (an odd stride, so that the doubling algorithms' power-of-two
/// patterns do not fall on the samples alike).
fn host_remote(
    algorithm: Algorithm,
    g: &Geometry,
    spread: &Spread,
    rank: usize,
    tallies: &mut HashMap<usize, Tally>,
) -> usize {
    let ranks = spread.ranks_on(spread.host_of(rank));
    let mut remote = |r| tally_of(algorithm, g, spread, r, tallies).remote;
    if ranks.len() <= HOST_SAMPLES {
        return ranks.map(remote).fold(0, usize::saturating_add);
    }
    let (first, last) = (ranks.start, ranks.end - 1);
    let ends = [first, first + 1, last - 1, last]
        .map(&mut remote)
        .into_iter()
        .fold(0, usize::saturating_add);
    let inside = first + 2..last - 1;
    let stride = (inside.len() / HOST_SAMPLES) | 1;
    let (mut sum, mut samples) = (0usize, 0usize);
    for r in inside.clone().step_by(stride) {
        sum = sum.saturating_add(remote(r));
        samples += 1;
    }
    let scaled = sum as f64 * inside.len() as f64 / samples.max(1) as f64;
    ends.saturating_add(scaled as usize)
}

/// The most ranks of a host whose traffic across hosts is added up one by one.
const HOST_SAMPLES: usize = 64;

/// A collective `jaccl plan` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collective {
    /// Bytes: the message on each rank (f32).
    AllReduce,
    /// Bytes: the gathered output.
    AllGather,
    /// Bytes: each rank's input.
    AllToAll,
}

/// One algorithm's predicted cost for a call.
#[derive(Debug, Clone, PartialEq)]
pub struct Prediction {
    /// The algorithm's name.
    pub algorithm: &'static str,
    /// Messages in sequence on the slowest rank.
    pub rounds: usize,
    /// Bytes the slowest rank sends or receives, whichever is more.
    pub bytes_per_rank: usize,
    /// Bytes the slowest rank reduces.
    pub bytes_reduced: usize,
    /// Predicted time of one call.
    pub seconds: f64,
    /// The algorithm jaccl chooses for this call on this cluster.
    pub chosen: bool,
}

/// Elements of the all-reduce the planner times (f32).
const ELEM: usize = 4;

/// Every algorithm jaccl has for `op` of `bytes` on `cluster`, the one it chooses marked.
/// Fewer than 2 ranks (nothing moves), or more bytes on all ranks together than an address
/// space holds: no algorithm.
pub fn predict(op: Collective, bytes: usize, cluster: &Cluster) -> Vec<Prediction> {
    let n = cluster.ranks;
    if n < 2
        || bytes
            .checked_mul(n)
            .and_then(|b| b.checked_mul(2))
            .is_none()
    {
        return Vec::new();
    }
    let g = cluster.geometry(0);
    let shape = Shape {
        on_hosts: cluster.even_hosts(),
        host_blocks: cluster.host_blocks(),
        shared_hosts: cluster.hosts > 1 && cluster.hosts < n,
        ..g.shape(false, false)
    };
    let block = bytes / n;
    let two_levels = cluster.two_levels(op, bytes);
    let which = match op {
        Collective::AllReduce => Op::AllReduce,
        Collective::AllGather => Op::AllGather,
        Collective::AllToAll => Op::AllToAll,
    };
    let from = hosts::two_levels_from(which);
    let in_two_levels = two_levels.is_some() && from.is_some_and(|min| bytes >= min);
    let candidates: Vec<(&'static str, bool, Algorithm)> = match op {
        Collective::AllReduce => {
            let count = bytes / ELEM;
            let chosen = match cluster.chooses_by_model {
                true => {
                    ByModel::new(cluster.job_rates()).all_reduce(&shape, &g, count * ELEM, ELEM)
                }
                false => shape.all_reduce(count * ELEM),
            };
            let total = count * ELEM * n;
            let mut list = vec![
                ("recursive doubling", AllReduce::Doubling),
                ("ring", AllReduce::Ring),
                (
                    "gather and reduce",
                    AllReduce::Gather(shape.small_gather(total)),
                ),
            ];
            if n > 2 {
                list.push(("Rabenseifner", AllReduce::Rabenseifner));
            }
            // Where jaccl would double within hosts at some size (`Shape::doubling`).
            if let on_hosts @ AllReduce::DoublingOnHosts(_) = shape.doubling(usize::MAX) {
                list.push(("doubling in hosts", on_hosts));
            }
            list.into_iter()
                .filter_map(|(name, choice)| {
                    let algorithm = all_reduce_algorithm(choice, count, ELEM)?;
                    Some((name, choice == chosen, algorithm))
                })
                .collect()
        }
        Collective::AllGather => {
            let chosen = shape.all_gather(block);
            let mut list = vec![
                ("Bruck", AllGather::Bruck),
                ("ring", AllGather::Ring),
                ("gather", AllGather::Small(shape.small_gather(block * n))),
            ];
            if shape.pairs {
                list.push(("recursive doubling", AllGather::Doubling));
            }
            list.into_iter()
                .filter_map(|(name, choice)| {
                    let algorithm = all_gather_algorithm(choice, block)?;
                    let chosen = match choice {
                        AllGather::Small(_) => matches!(chosen, AllGather::Small(_)),
                        other => other == chosen,
                    };
                    Some((name, chosen, algorithm))
                })
                .collect()
        }
        Collective::AllToAll => {
            let chosen = shape.all_to_all(block);
            vec![
                (
                    "Bruck",
                    chosen == AllToAll::Bruck,
                    Algorithm::BruckAllToAll(block),
                ),
                (
                    "pairwise",
                    chosen == AllToAll::Pairwise,
                    Algorithm::Pairwise {
                        block,
                        announces: shape.pairwise_announces(),
                    },
                ),
            ]
        }
    };
    let spread = cluster.spread();
    let mut predictions: Vec<Prediction> = candidates
        .into_iter()
        .map(|(algorithm, chosen, how)| {
            let (slowest, cost) = cluster.slowest(how, &g, &spread, 1);
            Prediction {
                algorithm,
                rounds: slowest.rounds,
                bytes_per_rank: slowest.bytes,
                bytes_reduced: slowest.reduced,
                seconds: cost.seconds(),
                chosen: chosen && !in_two_levels,
            }
        })
        .collect();
    if let Some((tally, seconds)) = two_levels {
        predictions.push(Prediction {
            algorithm: "two levels",
            rounds: tally.rounds,
            bytes_per_rank: tally.bytes,
            bytes_reduced: tally.reduced,
            seconds,
            chosen: in_two_levels,
        });
    }
    predictions
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link_100g() -> LinkSpeed {
        "100Gb/s,2us".parse().unwrap()
    }

    /// The textbook costs of a power-of-two number of ranks (`lg` rounds), per algorithm.
    fn textbook(name: &str, n: usize, s: f64, c: &Cluster) -> f64 {
        let (a, b, g) = (
            c.link.latency_seconds(),
            1.0 / c.link.bytes_per_second(),
            1.0 / c.reduce_rate,
        );
        let (lg, n) = (n.ilog2() as f64, n as f64);
        match name {
            "recursive doubling" => lg * (a + s * b + s * g),
            "Rabenseifner" => 2.0 * lg * a + 2.0 * (n - 1.0) / n * s * b + (n - 1.0) / n * s * g,
            "ring" => 2.0 * (n - 1.0) * a + 2.0 * (n - 1.0) / n * s * b + (n - 1.0) / n * s * g,
            _ => f64::NAN,
        }
    }

    #[test]
    fn all_reduce_plans_cost_their_textbook_terms_at_a_power_of_two() {
        let cluster = Cluster::new(64, link_100g());
        for bytes in [64 << 10, 16 << 20] {
            for p in predict(Collective::AllReduce, bytes, &cluster) {
                let expect = textbook(p.algorithm, 64, bytes as f64, &cluster);
                if expect.is_nan() {
                    continue;
                }
                let ratio = p.seconds / expect;
                assert!(
                    (0.99..1.01).contains(&ratio),
                    "{} of {bytes}: {} s against {expect} s",
                    p.algorithm,
                    p.seconds
                );
            }
        }
    }

    #[test]
    fn the_least_of_1024_ranks_is_the_cheapest_textbook_cost() {
        // The cheapest of the textbook costs (recursive doubling, Rabenseifner, ring) at every
        // size: jaccl has each algorithm, so the least of its plans is as cheap.
        let cluster = Cluster::new(1024, link_100g());
        for bytes in (3..=30).map(|k| 1usize << k) {
            let predictions = predict(Collective::AllReduce, bytes, &cluster);
            let least = predictions
                .iter()
                .map(|p| p.seconds)
                .fold(f64::MAX, f64::min);
            let cheapest = ["recursive doubling", "Rabenseifner", "ring"]
                .map(|name| textbook(name, 1024, bytes as f64, &cluster))
                .into_iter()
                .fold(f64::MAX, f64::min);
            let ratio = least / cheapest;
            assert!((0.99..1.01).contains(&ratio), "{bytes} B: {ratio}");
        }
    }

    #[test]
    fn the_choice_at_1024_ranks_given_the_link_is_within_a_tenth_of_the_textbook_least() {
        // The issue's target: at every size, jaccl's choice within 10% of the cheapest of the
        // textbook costs, when the job gives jaccl its links' figures.
        let cluster = Cluster::new(1024, link_100g());
        let mut bytes = 8;
        while bytes <= 1 << 30 {
            let predictions = predict(Collective::AllReduce, bytes, &cluster);
            let chosen = predictions.iter().find(|p| p.chosen).unwrap();
            let cheapest = ["recursive doubling", "Rabenseifner", "ring"]
                .map(|name| textbook(name, 1024, bytes as f64, &cluster))
                .into_iter()
                .fold(f64::MAX, f64::min);
            let ratio = chosen.seconds / cheapest;
            assert!(ratio <= 1.10, "{bytes} B: {} {ratio}", chosen.algorithm);
            bytes = bytes * 3 / 2;
        }
    }

    fn on_hosts(ranks: usize, hosts: usize, link: &str) -> Cluster {
        Cluster {
            hosts,
            chooses_by_model: false,
            ..Cluster::new(ranks, link.parse().unwrap())
        }
    }

    fn seconds_of(predictions: &[Prediction], name: &str) -> f64 {
        predictions
            .iter()
            .find(|p| p.algorithm == name)
            .map_or(f64::NAN, |p| p.seconds)
    }

    #[test]
    fn two_levels_are_priced_on_even_hosts_and_chosen_from_their_sizes() {
        let two_levels = |c: &Cluster, op, bytes| {
            let predictions = predict(op, bytes, c);
            let chosen = predictions.iter().filter(|p| p.chosen).count();
            assert_eq!(chosen, 1, "{c:?} {bytes}: {predictions:?}");
            predictions
                .into_iter()
                .find(|p| p.algorithm == "two levels")
                .map(|p| p.chosen)
        };
        let even = on_hosts(8, 2, "1Gb/s,6us");
        for (op, from) in [
            (Collective::AllReduce, hosts::ALL_REDUCE_TWO_LEVEL_MIN),
            (Collective::AllGather, hosts::GATHER_TWO_LEVEL_MIN),
        ] {
            assert_eq!(two_levels(&even, op, from - 4), Some(false));
            assert_eq!(two_levels(&even, op, from), Some(true));
            assert_eq!(two_levels(&even, Collective::AllToAll, 1 << 20), None);
            // Uneven hosts, a rank per host, one host: the flat algorithms alone.
            for other in [(9, 2), (8, 8), (8, 1)] {
                let cluster = on_hosts(other.0, other.1, "1Gb/s,6us");
                assert_eq!(two_levels(&cluster, op, 4 << 20), None, "{other:?}");
            }
        }
    }

    #[test]
    fn across_two_hosts_the_ring_carries_7_eighths_more_than_two_levels() {
        // 2 hosts × 4 ranks: the flat ring's boundary ranks carry 1.75 S out of each host, the
        // two levels S; with bandwidth to spare within the hosts, the ratio of their times.
        let cluster = Cluster {
            within_host: "1000GB/s,1ns".parse().unwrap(),
            reduce_rate: 1e15,
            ..on_hosts(8, 2, "1Gb/s,1ns")
        };
        let bytes = 32 << 20;
        let predictions = predict(Collective::AllReduce, bytes, &cluster);
        let ring = seconds_of(&predictions, "ring");
        let two_levels = seconds_of(&predictions, "two levels");
        let at_link = bytes as f64 / cluster.link.bytes_per_second();
        assert!((ring / (1.75 * at_link) - 1.0).abs() < 0.01, "{ring} s");
        assert!((two_levels / at_link - 1.0).abs() < 0.01, "{two_levels} s");
    }

    #[test]
    fn ranks_that_outnumber_their_cores_pay_for_their_copies() {
        // The same job on hosts with a core for every rank, then on half a core per host:
        // where the link is fast, the cores set the pace.
        let roomy = on_hosts(8, 4, "10Gb/s,6us");
        let crowded = Cluster {
            cores: Some(0.5),
            ..roomy
        };
        for name in ["ring", "two levels"] {
            let time = |c: &Cluster| seconds_of(&predict(Collective::AllReduce, 4 << 20, c), name);
            let (fast, slow) = (time(&roomy), time(&crowded));
            assert!(slow > 1.5 * fast, "{name}: {fast} s, crowded {slow} s");
        }
    }

    #[test]
    fn a_large_hosts_traffic_is_sampled_within_a_twentieth() {
        // 150 ranks a host: the ends and every 3rd rank inside, against every rank's sum.
        let spread = Spread {
            ranks: 300,
            hosts: 2,
        };
        let g = Cluster::new(300, link_100g()).geometry(0);
        for algorithm in [
            Algorithm::Doubling(1 << 20),
            Algorithm::Rabenseifner {
                count: 1 << 18,
                elem: 4,
            },
            Algorithm::RingAllReduce {
                count: 1 << 18,
                elem: 4,
            },
            Algorithm::BruckAllToAll(1024),
        ] {
            let sampled = host_remote(algorithm, &g, &spread, 0, &mut HashMap::new());
            let every: usize = spread
                .ranks_on(0)
                .map(|rank| algorithm.tally(&Geometry { rank, ..g }, &spread).remote)
                .sum();
            let ratio = sampled as f64 / every as f64;
            assert!((0.95..1.05).contains(&ratio), "{algorithm:?}: {ratio}");
        }
    }

    #[test]
    fn every_rank_count_gets_a_prediction_for_every_algorithm_and_one_choice() {
        for (n, by_model) in [2, 3, 5, 17, 100, 1000, 16384]
            .into_iter()
            .flat_map(|n| [(n, true), (n, false)])
        {
            let cluster = Cluster {
                chooses_by_model: by_model,
                ..Cluster::new(n, link_100g())
            };
            for op in [
                Collective::AllReduce,
                Collective::AllGather,
                Collective::AllToAll,
            ] {
                for bytes in [8, 40 << 10, 4096 * n, 64 << 20] {
                    let predictions = predict(op, bytes, &cluster);
                    assert!(predictions.iter().all(|p| p.seconds.is_finite()));
                    let chosen = predictions.iter().filter(|p| p.chosen).count();
                    assert_eq!(chosen, 1, "{op:?} {bytes} among {n}: {predictions:?}");
                }
            }
        }
    }

    #[test]
    fn doubling_within_hosts_is_priced_on_hosts_in_blocks() {
        let has = |ranks, hosts| {
            predict(
                Collective::AllReduce,
                8 << 10,
                &on_hosts(ranks, hosts, "1Gb/s,6us"),
            )
            .iter()
            .any(|p| p.algorithm == "doubling in hosts")
        };
        assert!(has(8, 2));
        assert!(has(16, 4));
        assert!(has(8, 4));
        // 3 hosts, a rank per host.
        assert!(!has(12, 3));
        assert!(!has(8, 8));
    }
}
