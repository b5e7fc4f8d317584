//! Which transport each of a rank's links uses, decided from what every rank published: a
//! pure function of [`Facts`] that every rank knows alike, so both ends of each pair choose
//! the same (unit tests below). A ring pair uses shared memory when its ranks share a host,
//! RDMA when both have a device that reaches the other (on one host only if RDMA is forced),
//! TCP otherwise; a pair that RDMA could not connect falls back to TCP under `auto`. The
//! links to other ranks are shared memory on this host and, with the mesh, TCP elsewhere.

use crate::algo::geometry::Geometry;
use crate::config::{Topology, Transport};
use crate::error::{Error, Result};
use crate::transport::connector::{End, Want};
use crate::transport::shm::machine_of;

/// What the choice depends on, the same on every rank once all have published (but `rank`).
#[derive(Debug, Clone)]
pub(crate) struct Facts {
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) wires: usize,
    /// The transport the configuration asks for (`Auto` or one forced).
    pub(crate) transport: Transport,
    pub(crate) topology: Topology,
    /// The distinct host identities.
    pub(crate) hosts: Vec<String>,
    /// Each rank's host, an index into `hosts`.
    pub(crate) host_of: Vec<usize>,
    /// Whether ranks `p` and `p + 1` (ring pair `p`) share memory.
    pub(crate) ring_shares_memory: Vec<bool>,
    /// Whether this rank shares memory with each rank.
    pub(crate) local: Vec<bool>,
    /// Whether both ranks of ring pair `p` have an RDMA device that reaches the other.
    pub(crate) ring_rdma: Vec<bool>,
    /// The first rank whose RDMA is unusable, and why.
    pub(crate) rdma_unusable: Option<(usize, String)>,
}

/// What a rank asks of RDMA, and the shape of its group, chosen before any link opens.
#[derive(Debug)]
pub(crate) struct Choice {
    /// The ring and, decided here, whether the mesh's links open at start-up.
    pub(crate) geometry: Geometry,
    /// Whether some ring pair uses RDMA: known alike to every rank (unlike which of this
    /// rank's own RDMA links opened), so the algorithms choose alike.
    pub(crate) any_rdma: bool,
    /// The RDMA links this rank wants: to each neighbour over a ring pair that uses RDMA.
    pub(crate) rdma: Vec<Want>,
}

/// This rank's other links, once RDMA opened what it could.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Links {
    pub(crate) to_left: Transport,
    pub(crate) to_right: Transport,
    /// The ring's links not taken by another transport, and the mesh's to other hosts.
    pub(crate) tcp: Vec<Want>,
    /// The ring's links on this host, and one to each other rank on it.
    pub(crate) shm: Vec<Want>,
}

/// The most ranks for which `auto` builds the mesh: each rank opens `size − 3` more TCP
/// connections, and a one-step exchange sends `size − 1` messages at once.
const AUTO_MESH_MAX: usize = 16;

impl Facts {
    /// Whether every other rank of the group shares memory with this one.
    pub(crate) fn all_here(&self) -> bool {
        (0..self.size).all(|r| r == self.rank || self.local[r])
    }

    /// How many ranks run on this rank's machine (its kernel: the boot id of the host
    /// identities), so share its CPUs: those of this host, and of the other hosts that are
    /// namespaces or containers on the same machine (pretend hosts).
    pub(crate) fn ranks_on_this_machine(&self) -> usize {
        let machine = |r: usize| self.hosts.get(self.host_of[r]).map(|h| machine_of(h));
        let mine = machine(self.rank);
        (0..self.size).filter(|&r| machine(r) == mine).count()
    }

    /// The choice, or an error when the transport forced cannot serve every ring pair: every
    /// rank checks every pair, so all fail at once instead of waiting for the ones that
    /// noticed.
    pub(crate) fn choose(&self) -> Result<Choice> {
        let (rank, size) = (self.rank, self.size);
        if self.transport == Transport::Shm
            && let Some(r) = (0..size).find(|&r| self.host_of[r] != self.host_of[(r + 1) % size])
        {
            let next = (r + 1) % size;
            return Err(Error::Unsupported(format!(
                "rank {rank}: the shm transport needs all ranks on one host, but ring neighbours \
                 {r} ({}) and {next} ({}) are not; use auto or tcp",
                self.hosts[self.host_of[r]], self.hosts[self.host_of[next]]
            )));
        }
        if self.transport == Transport::Rdma
            && let Some((r, why)) = &self.rdma_unusable
        {
            return Err(Error::Unsupported(format!(
                "rank {rank}: the rdma transport is unavailable on rank {r}: {why}"
            )));
        }
        let rdma_pairs: Vec<bool> = (0..size)
            .map(|p| {
                self.ring_rdma[p]
                    && (self.transport == Transport::Rdma || !self.ring_shares_memory[p])
            })
            .collect();
        let any_rdma = rdma_pairs.contains(&true);
        let mut geometry = Geometry {
            rank,
            size,
            wires: self.wires,
            mesh: false,
        };
        let (left, right) = (geometry.left(), geometry.right());
        // Ring pair p is (p, p + 1): this rank's left side is pair `left`, its right side `rank`.
        let rdma = [
            (rdma_pairs[left], left, End::Left),
            (rdma_pairs[rank], right, End::Right),
        ]
        .into_iter()
        .filter(|(wanted, _, _)| *wanted)
        .map(|(_, peer, end)| Want {
            peer,
            wires: self.wires,
            end,
        })
        .collect();
        geometry.mesh = uses_mesh(self.topology, size, self.hosts.len() == size, any_rdma);
        Ok(Choice {
            geometry,
            any_rdma,
            rdma,
        })
    }
}

impl Choice {
    /// The transport to each neighbour and what TCP and shared memory open, given whether
    /// RDMA opened the links to the left and to the right neighbour.
    pub(crate) fn links(&self, facts: &Facts, rdma_left: bool, rdma_right: bool) -> Links {
        let g = &self.geometry;
        let (left, right, wires) = (g.left(), g.right(), g.wires);
        let transport_to = |peer: usize, rdma: bool| match () {
            () if facts.local[peer] => Transport::Shm,
            () if rdma => Transport::Rdma,
            () => Transport::Tcp,
        };
        let (to_left, to_right) = (
            transport_to(left, rdma_left),
            transport_to(right, rdma_right),
        );
        let wants = |transport: Transport| -> Vec<Want> {
            let ring = [(to_left, left, End::Left), (to_right, right, End::Right)]
                .into_iter()
                .filter(|(t, _, _)| *t == transport)
                .map(|(_, peer, end)| Want { peer, wires, end });
            let wanted = |p: usize| match transport {
                Transport::Shm => facts.local[p],
                _ => g.mesh && !facts.local[p],
            };
            let others = g.non_neighbours().filter(|&p| wanted(p)).map(|peer| Want {
                peer,
                wires: 1,
                end: End::Other,
            });
            ring.chain(others).collect()
        };
        Links {
            to_left,
            to_right,
            tcp: wants(Transport::Tcp),
            shm: wants(Transport::Shm),
        }
    }
}

/// Whether a group builds the mesh's links: when asked to, or with `auto` where it pays. Small
/// collectives then take one step instead of ⌈(size − 1)/2⌉ around the ring, which pays when
/// each hop costs a network's latency (with 1 ms per packet, 4 ranks: 1.7 ms instead of 2.8 ms
/// per small all-reduce; docs/algorithms.md, "Mesh"). So `auto` builds it for 4 to
/// [`AUTO_MESH_MAX`] ranks that are each on a host of their own and talk TCP (the mesh's extra
/// links are TCP).
fn uses_mesh(topology: Topology, size: usize, one_rank_per_host: bool, rdma: bool) -> bool {
    match topology {
        Topology::Mesh => true,
        Topology::Auto => (4..=AUTO_MESH_MAX).contains(&size) && one_rank_per_host && !rdma,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The facts of rank `rank` of a group whose ranks sit on `hosts` (shared memory within a
    /// host), with RDMA on the ring pairs `rdma` names.
    fn facts(rank: usize, hosts: &[&str], rdma: &[bool], transport: Transport) -> Facts {
        let size = hosts.len();
        let (distinct, host_of) = crate::connect::published::distinct(hosts.to_vec());
        Facts {
            rank,
            size,
            wires: 2,
            transport,
            topology: Topology::Auto,
            hosts: distinct.iter().map(|h| (*h).to_owned()).collect(),
            host_of,
            ring_shares_memory: (0..size)
                .map(|p| hosts[p] == hosts[(p + 1) % size])
                .collect(),
            local: (0..size)
                .map(|p| p != rank && hosts[p] == hosts[rank])
                .collect(),
            ring_rdma: rdma.to_vec(),
            rdma_unusable: None,
        }
    }

    fn peers(wants: &[Want]) -> Vec<(usize, End, usize)> {
        wants.iter().map(|w| (w.peer, w.end, w.wires)).collect()
    }

    #[test]
    fn two_hosts_of_two_use_shared_memory_inside_and_tcp_between() {
        let hosts = ["a", "a", "b", "b"];
        let f = facts(1, &hosts, &[false; 4], Transport::Auto);
        let choice = f.choose().unwrap();
        assert!(!choice.any_rdma && choice.rdma.is_empty() && !choice.geometry.mesh);
        let links = choice.links(&f, false, false);
        assert_eq!(
            (links.to_left, links.to_right),
            (Transport::Shm, Transport::Tcp)
        );
        assert_eq!(peers(&links.shm), [(0, End::Left, 2)]);
        assert_eq!(peers(&links.tcp), [(2, End::Right, 2)]);
        assert!(!f.all_here());
        // Hosts without a boot id count as machines of their own.
        assert_eq!(f.ranks_on_this_machine(), 2);
    }

    #[test]
    fn hosts_on_one_machine_share_its_cpus() {
        // Pretend hosts: namespaces of one kernel (one boot id), and a host of another.
        let hosts = [
            "a boot 1 netns 10",
            "a boot 1 netns 10",
            "b boot 1 netns 11",
            "c boot 2 netns 10",
        ];
        let f = |rank| facts(rank, &hosts, &[false; 4], Transport::Auto);
        let seen: Vec<usize> = (0..4).map(|r| f(r).ranks_on_this_machine()).collect();
        assert_eq!(seen, [3, 3, 3, 1]);
    }

    #[test]
    fn every_rank_on_one_host_gets_shared_memory_to_every_other() {
        let hosts = ["h"; 5];
        let f = facts(0, &hosts, &[true; 5], Transport::Auto);
        let choice = f.choose().unwrap();
        // RDMA is not used between ranks that share memory, unless forced.
        assert!(!choice.any_rdma && choice.rdma.is_empty());
        let links = choice.links(&f, false, false);
        assert_eq!(
            peers(&links.shm),
            [
                (4, End::Left, 2),
                (1, End::Right, 2),
                (2, End::Other, 1),
                (3, End::Other, 1)
            ]
        );
        assert!(links.tcp.is_empty() && f.all_here());
    }

    #[test]
    fn rdma_is_wanted_where_both_ends_reach_and_falls_back_to_tcp() {
        let hosts = ["a", "b", "c"];
        // Pairs (0,1) and (2,0) have RDMA, pair (1,2) does not.
        let f = facts(0, &hosts, &[true, false, true], Transport::Auto);
        let choice = f.choose().unwrap();
        assert!(choice.any_rdma);
        assert_eq!(peers(&choice.rdma), [(2, End::Left, 2), (1, End::Right, 2)]);
        let opened = choice.links(&f, true, true);
        assert_eq!(
            (opened.to_left, opened.to_right),
            (Transport::Rdma, Transport::Rdma)
        );
        assert!(opened.tcp.is_empty());
        // The right neighbour's RDMA did not connect: TCP instead.
        let fallback = choice.links(&f, true, false);
        assert_eq!(fallback.to_right, Transport::Tcp);
        assert_eq!(peers(&fallback.tcp), [(1, End::Right, 2)]);
        // Rank 1's side of pair (1, 2) is TCP, as rank 2's is.
        let f1 = facts(1, &hosts, &[true, false, true], Transport::Auto);
        assert_eq!(peers(&f1.choose().unwrap().rdma), [(0, End::Left, 2)]);
        let f2 = facts(2, &hosts, &[true, false, true], Transport::Auto);
        assert_eq!(peers(&f2.choose().unwrap().rdma), [(0, End::Right, 2)]);
    }

    #[test]
    fn forced_rdma_serves_ranks_on_one_host_and_fails_where_unusable() {
        let hosts = ["h", "h"];
        let f = facts(0, &hosts, &[true, true], Transport::Rdma);
        assert!(f.choose().unwrap().any_rdma);
        let mut broken = f.clone();
        broken.rdma_unusable = Some((1, "no device".into()));
        let e = broken.choose().unwrap_err().to_string();
        assert!(e.contains("unavailable on rank 1: no device"), "{e}");
    }

    #[test]
    fn forced_shared_memory_across_hosts_fails_on_every_rank_alike() {
        let hosts = ["a", "a", "b"];
        for rank in 0..3 {
            let e = facts(rank, &hosts, &[false; 3], Transport::Shm)
                .choose()
                .unwrap_err()
                .to_string();
            assert!(e.contains("ring neighbours 1 (a) and 2 (b)"), "{e}");
        }
    }

    #[test]
    fn auto_builds_the_mesh_for_4_to_16_ranks_each_on_its_own_host_over_tcp() {
        let own = |n: usize| (0..n).map(|h| format!("h{h}")).collect::<Vec<_>>();
        let mesh = |hosts: &[String], rdma: bool| {
            let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
            facts(0, &hosts, &vec![rdma; hosts.len()], Transport::Auto)
                .choose()
                .unwrap()
                .geometry
                .mesh
        };
        assert!(!mesh(&own(3), false));
        assert!(mesh(&own(4), false) && mesh(&own(16), false));
        assert!(!mesh(&own(17), false));
        assert!(!mesh(&own(4), true));
        let shared = ["a", "a", "b", "c"].map(String::from);
        assert!(!mesh(&shared, false));
        // With the mesh, rank 0 of 5 opens TCP to its non-neighbours, one wire each.
        let hosts = ["a", "b", "c", "d", "e"];
        let f = facts(0, &hosts, &[false; 5], Transport::Auto);
        let links = f.choose().unwrap().links(&f, false, false);
        assert_eq!(
            peers(&links.tcp),
            [
                (4, End::Left, 2),
                (1, End::Right, 2),
                (2, End::Other, 1),
                (3, End::Other, 1)
            ]
        );
    }

    #[test]
    fn both_ends_of_every_pair_choose_the_same_transport() {
        let hosts = ["a", "a", "b", "c", "c", "c"];
        let rdma = [false, true, false, true, true, true];
        let links: Vec<Links> = (0..hosts.len())
            .map(|r| {
                let f = facts(r, &hosts, &rdma, Transport::Auto);
                let c = f.choose().unwrap();
                let (l, r) = (
                    c.rdma.iter().any(|w| w.end == End::Left),
                    c.rdma.iter().any(|w| w.end == End::Right),
                );
                c.links(&f, l, r)
            })
            .collect();
        for r in 0..hosts.len() {
            let right = (r + 1) % hosts.len();
            assert_eq!(
                links[r].to_right, links[right].to_left,
                "pair ({r}, {right})"
            );
        }
        assert_eq!(links[1].to_right, Transport::Rdma);
        assert_eq!(links[3].to_right, Transport::Shm);
    }
}
