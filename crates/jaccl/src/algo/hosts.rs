//! Which ranks of a group share a host ([`HostLayout`]), as every rank of it knows alike: from
//! the host identities its ranks published at start-up (`crate::connect`), not from the
//! environment. The two-level collectives work inside each host, then across hosts.

use crate::error::Op;

/// From this many bytes (the all-gather's output, the reduce-scatter's input, the broadcast's
/// message) an all-gather, a reduce-scatter or (on hosts whose ranks are not consecutive) a
/// broadcast goes in two levels. Measured on pretend hosts, 2 × 4 ranks, against
/// the flat algorithms (`jaccl bench --dtype u8`, µs, two levels against flat): at 1 Gbit/s
/// two levels win from 4 KiB (all-gather 64 KiB 281 against 1454, 256 KiB 1104 against
/// 1926; reduce-scatter 256 KiB 1101 against 1930), but at 10 Gbit/s, where this machine's 2
/// cores set the pace, they lose up to 1 MiB (all-gather 512 KiB 701 against 443,
/// reduce-scatter 524 KiB 771 against 491; 1 MiB 1440 against 1343 and 1460 against 1337)
/// and tie at 2 MiB.
pub(crate) const GATHER_TWO_LEVEL_MIN: usize = 1 << 20;

/// From this many bytes (the message) an all-reduce or a reduce goes in two levels: below, on
/// hosts, the all-reduce takes Rabenseifner's algorithm (`super::select::Shape::rabenseifner_max`),
/// which crosses the hosts' ports with about the message as two levels do. Measured there (µs, out of
/// place / in place): at 1 Gbit/s 512 KiB 4507 / 4556 in two levels, Rabenseifner's
/// 4608–13 978 / 4608–6394 in 7 runs (its traffic across comes in bursts that the port's
/// queue does not take evenly), the ring's 7722 / 7681; 1 MiB 9.1–9.4 ms / 9.0–9.1 against
/// the ring's 15.4 / 15.4, 4 MiB 36.2–36.6 / 36.2 against 61.5–61.9 / 61.5–62.3; at 10 Gbit/s
/// 512 KiB 1155 / 1108 against Rabenseifner's 1105–1166 / 1163–1200.
pub(crate) const ALL_REDUCE_TWO_LEVEL_MIN: usize = 512 << 10;

/// From how many bytes `op` goes in two levels on hosts of equal size (`None`: never), but for
/// broadcasts, which do only where some host's ranks are not consecutive
/// ([`HostLayout::two_levels_from`]).
pub(crate) fn two_levels_from(op: Op) -> Option<usize> {
    match op {
        Op::AllReduce | Op::Reduce => Some(ALL_REDUCE_TWO_LEVEL_MIN),
        Op::AllGather | Op::ReduceScatter | Op::Broadcast => Some(GATHER_TWO_LEVEL_MIN),
        _ => None,
    }
}

/// The least bytes of a chunk of a two-level all-reduce (of its message).
pub(crate) const ALL_REDUCE_CHUNK_MIN: usize = 512 << 10;

/// The least bytes of a chunk of a two-level all-gather (of its output), reduce-scatter (of
/// its input) or broadcast (whose host part is an all-gather). Chunks of 512 KiB made them uneven, often slower than none, on 2 pretend hosts ×
/// 4 ranks at 1 Gbit/s (all-gather of 4 MiB: 18.2–41.9 ms in three runs, reduce-scatter
/// 24.8–36.5, against 23.7–25.9 and 25.3–25.7 in one piece); of 2 MiB: 19.5–19.8 and
/// 22.5–23.5, and 16 MiB in 75–79 ms against 103–116.
pub(crate) const GATHER_CHUNK_MIN: usize = 2 << 20;

/// The chunks a two-level collective of `bytes` goes in, one on the network while the host
/// works on the next: as many as make chunks of `least` bytes or more, up to 8.
pub(crate) fn two_level_chunks(bytes: usize, least: usize) -> usize {
    (bytes / least.max(1)).clamp(1, 8)
}

/// Bytes one rank sent to and received from ranks on other hosts, over the network
/// ([`crate::Group::bytes_across_hosts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AcrossHosts {
    /// Bytes sent to ranks on other hosts.
    pub sent: u64,
    /// Bytes received from ranks on other hosts.
    pub received: u64,
}

impl std::ops::Add for AcrossHosts {
    type Output = AcrossHosts;
    fn add(self, other: AcrossHosts) -> AcrossHosts {
        AcrossHosts {
            sent: self.sent.saturating_add(other.sent),
            received: self.received.saturating_add(other.received),
        }
    }
}

/// The hosts of a group's ranks, the same on every rank. Hosts are numbered in the order of
/// their lowest rank (rank 0's host is host 0), the ranks of a host in rank order; hosts may
/// hold different numbers of ranks. Ranks share a host when their host identities are equal:
/// the machine's (its boot, name and network namespace), refined by `JACCL_HOST_ID`, which
/// lets one machine play several hosts.
///
/// ```no_run
/// # fn main() -> jaccl::Result<()> {
/// let group = jaccl::init()?;
/// let hosts = group.hosts();
/// println!(
///     "rank {} is local rank {} of {} on host {} of {}",
///     group.rank(),
///     hosts.local_rank(),
///     hosts.ranks_on(hosts.host()).len(),
///     hosts.host(),
///     hosts.count()
/// );
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostLayout {
    rank: usize,
    /// This rank's place among the ranks of its host.
    local_rank: usize,
    /// Each rank's host.
    host_of: Vec<usize>,
    /// The ranks of each host, ascending.
    ranks: Vec<Vec<usize>>,
}

impl HostLayout {
    /// The layout seen by rank `rank` of a group whose rank `r` is on host `host_of[r]`, the
    /// hosts numbered in the order of their lowest rank.
    ///
    /// # Errors
    /// The hosts are not numbered so, or `rank` is not a rank of the group.
    pub(crate) fn new(rank: usize, host_of: Vec<usize>) -> Result<HostLayout, String> {
        let mut ranks: Vec<Vec<usize>> = Vec::new();
        for (r, &h) in host_of.iter().enumerate() {
            match h.cmp(&ranks.len()) {
                std::cmp::Ordering::Less => ranks[h].push(r),
                std::cmp::Ordering::Equal => ranks.push(vec![r]),
                std::cmp::Ordering::Greater => {
                    return Err(format!(
                        "rank {r}'s host {h} is numbered before host {}",
                        ranks.len()
                    ));
                }
            }
        }
        let Some(&host) = host_of.get(rank) else {
            return Err(format!("rank {rank} of {}", host_of.len()));
        };
        let local_rank = ranks[host].partition_point(|&r| r < rank);
        Ok(HostLayout {
            rank,
            local_rank,
            host_of,
            ranks,
        })
    }

    /// The layout of a group of one.
    pub(crate) fn alone() -> HostLayout {
        HostLayout {
            rank: 0,
            local_rank: 0,
            host_of: vec![0],
            ranks: vec![vec![0]],
        }
    }

    /// How many hosts the group's ranks are on.
    pub fn count(&self) -> usize {
        self.ranks.len()
    }

    /// This rank's host.
    pub fn host(&self) -> usize {
        self.host_of[self.rank]
    }

    /// The host of rank `rank`; `None` if the group has no such rank.
    pub fn host_of(&self, rank: usize) -> Option<usize> {
        self.host_of.get(rank).copied()
    }

    /// The host of rank `rank` and its place among that host's ranks; `None` if the group has
    /// no such rank.
    pub(crate) fn place_of(&self, rank: usize) -> Option<(usize, usize)> {
        let host = self.host_of(rank)?;
        Some((host, self.ranks[host].partition_point(|&r| r < rank)))
    }

    /// The ranks on host `host`, ascending (empty if there is no such host).
    pub fn ranks_on(&self, host: usize) -> &[usize] {
        self.ranks.get(host).map_or(&[], Vec::as_slice)
    }

    /// This rank's place among the ranks of its host (0 for the lowest rank there).
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// How many ranks share this rank's host (itself included).
    pub fn local_size(&self) -> usize {
        self.ranks[self.host()].len()
    }

    /// Whether the ranks are on several hosts that each hold the same number of them, 2 or
    /// more: the layouts the two-level collectives work on.
    pub(crate) fn even(&self) -> bool {
        let here = self.local_size();
        self.count() >= 2 && here >= 2 && self.ranks.iter().all(|r| r.len() == here)
    }

    /// From how many bytes `op` among these ranks goes in two levels: on several hosts, each
    /// with the same number of ranks, at least 2 ([`two_levels_from`]). Broadcasts only where
    /// some host's ranks are not consecutive: elsewhere the ring's chain already crosses to
    /// each host once, and two levels measured no faster (2 pretend hosts × 4 ranks at 1
    /// Gbit/s, 2–32 MiB: 0.99–1.02×; 4 × 2: 0.83–0.91×).
    pub(crate) fn two_levels_from(&self, op: Op) -> Option<usize> {
        let chain_crosses_once = op == Op::Broadcast && self.contiguous();
        let two_levels = self.even() && !chain_crosses_once;
        two_levels.then(|| two_levels_from(op)).flatten()
    }

    /// Whether the ranks of every host are consecutive in rank order (the ring then crosses
    /// between hosts once per host each way).
    pub(crate) fn contiguous(&self) -> bool {
        self.host_of.windows(2).all(|w| w[0] <= w[1])
    }

    /// The ranks per host where the hosts hold them in blocks of rank order (`L` ranks per
    /// host, ranks `hL..(h + 1)L` on host `h`, as `jaccl launch` places them), both `L` and
    /// the number of hosts powers of two: the layouts `super::host_doubling` works on.
    pub(crate) fn blocks(&self) -> Option<usize> {
        let here = self.local_size();
        let in_order = self.host_of.iter().enumerate().all(|(r, &h)| h == r / here);
        let powers = here.is_power_of_two() && self.count().is_power_of_two();
        (self.even() && in_order && powers).then_some(here)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uneven_hosts_are_numbered_by_their_lowest_rank() {
        // Hosts of 4, 3 and 2 ranks, interleaved.
        let host_of = vec![0, 1, 0, 2, 1, 0, 2, 1, 0];
        let layouts: Vec<_> = (0..9)
            .map(|r| HostLayout::new(r, host_of.clone()).unwrap())
            .collect();
        let l = &layouts[4];
        assert_eq!(l.count(), 3);
        assert_eq!(
            (0..3).map(|h| l.ranks_on(h).to_vec()).collect::<Vec<_>>(),
            [vec![0, 2, 5, 8], vec![1, 4, 7], vec![3, 6]]
        );
        assert_eq!((l.host(), l.local_rank(), l.local_size()), (1, 1, 3));
        assert_eq!((layouts[8].local_rank(), layouts[8].local_size()), (3, 4));
        assert_eq!((layouts[6].host(), layouts[6].local_rank()), (2, 1));
        assert_eq!((l.host_of(3), l.host_of(9)), (Some(2), None));
        assert_eq!(
            (l.place_of(7), l.place_of(3), l.place_of(9)),
            (Some((1, 2)), Some((2, 0)), None)
        );
        assert!(!l.contiguous());
        assert!(l.ranks_on(3).is_empty());
        // Every rank holds the same layout but for its own place in it.
        for (r, layout) in layouts.iter().enumerate() {
            assert_eq!(layout.host_of, host_of, "rank {r}");
            assert_eq!(layout.ranks_on(layout.host())[layout.local_rank()], r);
        }
    }

    #[test]
    fn hosts_in_blocks_of_rank_order_and_powers_of_two() {
        let blocks = |host_of: Vec<usize>| HostLayout::new(0, host_of).unwrap().blocks();
        let contiguous = |host_of: Vec<usize>| HostLayout::new(0, host_of).unwrap().contiguous();
        assert!(contiguous(vec![0, 0, 0, 1, 1, 2]) && contiguous(vec![0, 1, 2]));
        assert!(!contiguous(vec![0, 0, 1, 0]) && !contiguous(vec![0, 1, 0, 1]));
        assert_eq!(blocks(vec![0, 0, 0, 0, 1, 1, 1, 1]), Some(4));
        assert_eq!(blocks(vec![0, 0, 1, 1, 2, 2, 3, 3]), Some(2));
        // Interleaved, 3 hosts, 3 ranks per host, uneven, one host, a rank per host: none.
        assert_eq!(blocks(vec![0, 1, 0, 1, 0, 1, 0, 1]), None);
        assert_eq!(blocks(vec![0, 0, 1, 1, 2, 2]), None);
        assert_eq!(blocks(vec![0, 0, 0, 1, 1, 1]), None);
        assert_eq!(blocks(vec![0, 0, 0, 0, 1, 1]), None);
        assert_eq!(blocks(vec![0, 0, 0, 0]), None);
        assert_eq!(blocks(vec![0, 1, 2, 3]), None);
    }

    #[test]
    fn hosts_numbered_out_of_order_or_a_rank_outside_are_refused() {
        assert!(HostLayout::new(0, vec![1, 0]).is_err());
        assert!(HostLayout::new(0, vec![0, 2, 1]).is_err());
        assert!(HostLayout::new(2, vec![0, 0]).is_err());
        assert_eq!(HostLayout::new(0, vec![0]).unwrap(), HostLayout::alone());
    }
}
