//! What a collective will cost on a cluster you may not have: the plans jaccl would run there,
//! every algorithm it has for the collective, built for real and counted (rounds, bytes per
//! rank, bytes reduced), then timed with the latency–bandwidth–reduction model (α, β, γ). This
//! is `jaccl plan`.
//!
//! Every link is alike (one kind, given by [`LinkSpeed`]): the flat algorithms of today, not yet
//! the two-level ones that reduce inside a host first. Each rank's plans are tallied as it
//! runs them: a message costs the latency, a byte sent or received (whichever is more: one port
//! each way) the inverse bandwidth, a byte reduced the inverse reduction rate; the slowest rank
//! sets the time (every rank where there are at most 64, else those of every role). Where more
//! ranks share a host than it has cores, they take turns: each round also waits for the others
//! on its core, and bytes cost as many times more ([`Cluster::cpu_per_message`]).
//!
//! ```
//! use jaccl::planner::{Cluster, Collective, LinkSpeed, predict};
//! let link: LinkSpeed = "100Gb/s,2us".parse().unwrap();
//! let cluster = Cluster::new(1024, link);
//! let choices = predict(Collective::AllReduce, 64 << 20, &cluster);
//! let chosen = choices.iter().find(|p| p.chosen).unwrap();
//! assert!(chosen.seconds > 0.0);
//! ```

pub use crate::config::LinkSpeed;

use crate::algo::cost::{self, Rates};
use crate::algo::geometry::Geometry;
use crate::algo::pricing::{Algorithm, ByModel, all_reduce_algorithm};
use crate::algo::select::{AllGather, AllReduce, AllToAll};

/// The cluster a plan is for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cluster {
    /// Ranks in the job.
    pub ranks: usize,
    /// Hosts, the ranks spread evenly over them in rank order (a rank each by default).
    pub hosts: usize,
    /// Cores of each host, when its ranks may outnumber them (`None`: never).
    pub cores: Option<usize>,
    /// Seconds of a core that one message costs a rank (system calls, waking up): where a
    /// host's ranks outnumber its cores, each round waits for the other ranks sharing a core
    /// to make theirs.
    pub cpu_per_message: f64,
    /// Every link between two ranks.
    pub link: LinkSpeed,
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
            link,
            chooses_by_model: true,
            reduce_rate: Cluster::DEFAULT_REDUCE_RATE,
            wires: crate::Config::DEFAULT_WIRES,
        }
    }

    /// f32 sums per second of one core of the machine jaccl is measured on (bytes of input
    /// reduced: 18–25 GB/s over 8 MiB, 35–45 GB/s within the cache); a group given its links'
    /// figures prices reductions at this rate.
    pub const DEFAULT_REDUCE_RATE: f64 = cost::DEFAULT_REDUCE_RATE;

    /// A core's time per message there when ranks share cores (docs/algorithms.md, "The cost
    /// model").
    pub const DEFAULT_CPU_PER_MESSAGE: f64 = 12e-6;

    /// Ranks per core, where a host's ranks outnumber its cores (else 1).
    fn crowding(&self) -> f64 {
        let per_host = self.ranks.div_ceil(self.hosts.max(1));
        match self.cores {
            Some(cores) if per_host > cores => per_host as f64 / cores.max(1) as f64,
            _ => 1.0,
        }
    }

    /// The model's rates here: with `c` ranks per core, a round waits for the `c − 1` others
    /// on its core besides the link's latency, and every byte moved or reduced costs `c`
    /// times (the ranks take turns on the core that copies and reduces).
    fn rates(&self) -> Rates {
        let c = self.crowding();
        Rates {
            latency: self.link.latency_seconds() + (c - 1.0) * self.cpu_per_message,
            per_byte: c / self.link.bytes_per_second(),
            per_reduced_byte: c / self.reduce_rate,
        }
    }

    /// Whether start-up builds the mesh here (`Topology::Auto`: 4 to 16 ranks, a host each).
    fn mesh(&self) -> bool {
        (4..=16).contains(&self.ranks) && self.hosts >= self.ranks
    }

    fn geometry(&self, rank: usize) -> Geometry {
        Geometry {
            rank,
            size: self.ranks,
            wires: self.wires.max(1),
            mesh: self.mesh(),
        }
    }
}

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
    let shape = g.shape(false, false);
    let rates = cluster.rates();
    let block = bytes / n;
    let candidates: Vec<(&'static str, bool, Algorithm)> = match op {
        Collective::AllReduce => {
            let count = bytes / ELEM;
            // What a job given the link's figures runs: it knows neither the crowding nor
            // another reduction rate.
            let job_rates = Rates::of_link(&cluster.link, cost::DEFAULT_REDUCE_RATE);
            let chosen = match cluster.chooses_by_model {
                true => ByModel::new(job_rates).all_reduce(&shape, &g, count * ELEM, ELEM),
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
                (
                    "Bruck",
                    chosen == AllGather::Bruck,
                    Algorithm::BruckAllGather(block),
                ),
                (
                    "ring",
                    chosen == AllGather::Ring,
                    Algorithm::RingAllGather(block),
                ),
                (
                    "gather",
                    matches!(chosen, AllGather::Small(_)),
                    Algorithm::Gather {
                        block,
                        how: shape.small_gather(block * n),
                        reduce: false,
                    },
                ),
            ];
            if shape.pairs {
                list.push((
                    "recursive doubling",
                    chosen == AllGather::Doubling,
                    Algorithm::DoublingAllGather(block),
                ));
            }
            list
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
    candidates
        .into_iter()
        .map(|(algorithm, chosen, how)| {
            let slowest = how.slowest(&g, &rates);
            Prediction {
                algorithm,
                rounds: slowest.rounds,
                bytes_per_rank: slowest.bytes,
                bytes_reduced: slowest.reduced,
                seconds: slowest.seconds(&rates),
                chosen,
            }
        })
        .collect()
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
}
