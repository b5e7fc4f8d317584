//! Start-up of a group: every rank publishes through the side channel what its peers need (its
//! host, where it accepts TCP data connections, where it accepts shared-memory peers, whether
//! it can use RDMA), the ranks check that they agree on the settings, and each rank opens its
//! links. Each ring neighbour gets its own transport: shared memory when both ranks are on one
//! host, RDMA when both have a device that reaches the other ([`rdma`]), TCP otherwise; so 2
//! hosts × 4 ranks use shared memory inside each host and RDMA or TCP between them. When every
//! rank is on this host, each also maps every other rank's segment for the direct collectives
//! (`algo::direct`).

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Instant;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

mod rdma;

use crate::algo::collectives::Collectives;
use crate::algo::engine::Channel;
use crate::algo::geometry::Geometry;
use crate::auth::Identity;
use crate::bootstrap::SideChannel;
use crate::config::{Config, Topology, Transport};
use crate::error::{Error, Result};
use crate::liveness::{Heartbeat, Liveness};
use crate::os::deadline_after;
use crate::transport::rdma::link::RdmaLink;
use crate::transport::shm::{self, Board, Layout, PeerSpec, Shm, link::ShmLink};
use crate::transport::{Link, tcp};
use crate::wait::WaitPolicy;

/// What each rank publishes at start-up.
#[derive(Debug, Serialize, Deserialize)]
struct PeerInfo {
    /// Ranks with the same host share memory ([`shm::host_identity`]).
    host: String,
    /// Where this rank accepts TCP data connections.
    tcp: SocketAddr,
    /// Where this rank accepts shared-memory peers, when its transport allows it.
    shm: Option<String>,
    wires: usize,
    transport: String,
    topology: String,
    rdma: rdma::Availability,
}

/// A group's connections, ready for collectives.
pub(crate) struct Connected {
    pub(crate) collectives: Collectives,
    /// This rank's shared memory, if it has any peer on this host.
    pub(crate) shm: Option<Shm>,
    /// The transport to each peer this rank has links to: the left neighbour, the right one if
    /// different, then with the mesh every other rank in rank order.
    pub(crate) peers: Vec<(usize, Transport)>,
    pub(crate) wait: WaitPolicy,
    /// What the heartbeat found out (also held by the ring and the direct collectives).
    pub(crate) liveness: Arc<Liveness>,
    /// Beats while the group lives; says goodbye when it is dropped. `None`: liveness off.
    pub(crate) heartbeat: Option<Heartbeat>,
}

/// Joins the group of `config` (size > 1) and opens its links.
pub(crate) fn connect(config: &Config) -> Result<Connected> {
    let (rank, size) = (config.rank, config.size);
    let deadline = deadline_after(config.startup_timeout);
    let fail = |what: String| Error::Bootstrap(format!("rank {rank}: {what}"));
    let mut side = SideChannel::join(config, deadline)?;
    let listener = TcpListener::bind((side.local_ip(), 0))
        .map_err(|e| Error::io(rank, "listening for data connections", e))?;
    let shm_listener = match config.transport {
        Transport::Auto | Transport::Shm => match shm::Listener::new() {
            Ok(l) => Some(l),
            Err(e) if config.transport == Transport::Auto => {
                tracing::debug!(rank, error = %e, "no shared memory, using TCP only");
                None
            }
            Err(e) => return Err(fail(format!("cannot set up shared memory: {e}"))),
        },
        _ => None,
    };
    let mut geometry = Geometry {
        rank,
        size,
        wires: config.wire_count(),
        mesh: false,
    };
    let (left, right) = (geometry.left(), geometry.right());
    let (rdma_available, rdma_devices) = rdma::open_devices(config, (left, right), geometry.wires);
    let me = PeerInfo {
        host: shm::host_identity(config.host_id.as_deref()),
        tcp: listener
            .local_addr()
            .map_err(|e| Error::io(rank, "data listener address", e))?,
        shm: shm_listener.as_ref().map(|l| l.name().to_owned()),
        wires: geometry.wires,
        transport: config.transport.to_string(),
        topology: config.topology.to_string(),
        rdma: rdma_available,
    };
    let infos: Vec<PeerInfo> = exchange(&mut side, rank, &me, deadline)?;
    agree(rank, &me, &infos)?;

    let liveness = Liveness::new(rank).map_err(|e| Error::io(rank, "liveness", e))?;
    let pair_shares_memory = |a: usize, b: usize| {
        infos[a].shm.is_some() && infos[b].shm.is_some() && infos[a].host == infos[b].host
    };
    let shares_memory = |peer: usize| pair_shares_memory(rank, peer);
    // Forced shared memory needs every pair of ring neighbours on one host; every rank checks
    // every pair, so all fail at once instead of waiting for the ones that noticed.
    if config.transport == Transport::Shm
        && let Some(r) = (0..size).find(|&r| infos[r].host != infos[(r + 1) % size].host)
    {
        let next = (r + 1) % size;
        return Err(Error::Unsupported(format!(
            "rank {rank}: the shm transport needs all ranks on one host, but ring neighbours \
             {r} ({}) and {next} ({}) are not; use auto or tcp",
            infos[r].host, infos[next].host
        )));
    }
    let available: Vec<&rdma::Availability> = infos.iter().map(|i| &i.rdma).collect();
    let rdma_pairs = rdma::candidates(config, &available, pair_shares_memory)?;
    let rdma_links = if rdma_pairs.contains(&true) {
        rdma::connect(
            &mut side,
            config,
            rdma_devices.as_ref(),
            &rdma_pairs,
            deadline,
        )?
    } else {
        rdma::Links::default()
    };
    drop(rdma_devices);
    let transport_to = |peer: usize, rdma: &[_]| {
        if shares_memory(peer) {
            Transport::Shm
        } else if !rdma.is_empty() {
            Transport::Rdma
        } else {
            Transport::Tcp
        }
    };
    let to_left = transport_to(left, &rdma_links.left);
    let to_right = transport_to(right, &rdma_links.right);
    let all_here = (0..size).all(|r| r == rank || shares_memory(r));

    let identity = Identity {
        rank,
        size,
        token: config.token(),
    };
    // The mesh's links to the ranks that are not ring neighbours are TCP connections, each
    // opened by the lower rank, after the ring's own ones.
    let hosts: std::collections::HashSet<&str> = infos.iter().map(|i| i.host.as_str()).collect();
    geometry.mesh = uses_mesh(
        config.topology,
        size,
        hosts.len() == size,
        rdma_pairs.contains(&true),
    );
    let mesh_peers: Vec<usize> = geometry
        .non_neighbours()
        .filter(|_| geometry.mesh)
        .collect();
    let connect_to: Vec<_> = (to_right == Transport::Tcp)
        .then(|| (right, infos[right].tcp, me.wires))
        .into_iter()
        .chain(
            mesh_peers
                .iter()
                .filter(|&&p| p > rank)
                .map(|&p| (p, infos[p].tcp, 1)),
        )
        .collect();
    let accept_from: Vec<_> = (to_left == Transport::Tcp)
        .then_some((left, me.wires))
        .into_iter()
        .chain(mesh_peers.iter().filter(|&&p| p < rank).map(|&p| (p, 1)))
        .collect();
    let tcp_links = tcp::establish(&listener, &identity, &connect_to, &accept_from, deadline)?;
    drop(listener);
    let mut outgoing = tcp_links.outgoing.into_iter();
    let mut incoming = tcp_links.incoming.into_iter();
    let mut to_right_tcp = (to_right == Transport::Tcp)
        .then(|| outgoing.next())
        .flatten()
        .into_iter()
        .flatten();
    let mut from_left = (to_left == Transport::Tcp)
        .then(|| incoming.next())
        .flatten()
        .into_iter()
        .flatten();
    let mesh_channels = mesh_peers
        .iter()
        .map(|&p| {
            let links = if p < rank {
                incoming.next()
            } else {
                outgoing.next()
            };
            let link = links.into_iter().flatten().next().ok_or_else(|| {
                Error::Bootstrap(format!("internal error: no mesh link to rank {p}"))
            })?;
            Ok(Channel::new(Box::new(link), p))
        })
        .collect::<Result<Vec<_>>>()?;

    // Shared memory: with every rank for the direct collectives, else with the neighbours on
    // this host. A neighbour sends to this rank on its rings towards this rank.
    let wires = me.wires;
    let specs: Vec<PeerSpec> = (0..size)
        .filter(|&p| p != rank && (all_here || (shares_memory(p) && (p == left || p == right))))
        .map(|p| {
            let mut reads = Vec::new();
            if p == left && to_left == Transport::Shm {
                reads.extend((0..wires).map(|w| wires + w));
            }
            if p == right && to_right == Transport::Shm {
                reads.extend(0..wires);
            }
            PeerSpec {
                rank: p,
                name: infos[p].shm.clone().unwrap_or_default(),
                reads,
            }
        })
        .collect();
    let here = infos.iter().filter(|i| i.host == me.host).count();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let wait = config.wait.unwrap_or_else(|| WaitPolicy::auto(here, cpus));
    let shm = match (specs.is_empty(), shm_listener) {
        (false, Some(l)) => {
            let layout = Layout::new(wires, shm::RING_BYTES, shm::AREA_BYTES);
            // A rank that spins first rarely sleeps, so the costly barrier before sleeping
            // buys cheaper publishing for its peers (see `shm::Peer::wake`).
            let asymmetric = !wait.spin.is_zero();
            Some(shm::establish(
                l, &identity, layout, &specs, asymmetric, deadline,
            )?)
        }
        _ => None,
    };

    let shm_ref = shm.as_ref();
    let left_channels = channels(
        left,
        to_left,
        shm_ref,
        &mut from_left,
        rdma_links.left,
        (0, wires),
        wires,
    )?;
    let right_channels = channels(
        right,
        to_right,
        shm_ref,
        &mut to_right_tcp,
        rdma_links.right,
        (wires, 0),
        wires,
    )?;
    let mut channels = left_channels;
    channels.extend(right_channels);
    channels.extend(mesh_channels);
    let board = shm.as_ref().filter(|_| all_here);
    let collectives = Collectives::new(
        geometry,
        channels,
        Arc::clone(&liveness),
        // Known alike to every rank (unlike this rank's own links), so all choose alike.
        rdma_pairs.contains(&true),
        board.and_then(|s| Board::new(size, s)).map(Arc::new),
    );
    let mut peers = vec![(left, to_left)];
    if right != left {
        peers.push((right, to_right));
    }
    peers.extend(mesh_peers.iter().map(|&p| (p, Transport::Tcp)));
    side.barrier(deadline)?;
    let heartbeat = (config.liveness != std::time::Duration::MAX)
        .then(|| side.into_heartbeat(config.liveness, Arc::clone(&liveness)))
        .transpose()
        .map_err(|e| Error::io(rank, "starting the heartbeat", e))?;
    Ok(Connected {
        collectives,
        shm,
        peers,
        wait,
        liveness,
        heartbeat,
    })
}

/// The `wires` channels to `peer` over `transport`: shared-memory links sending on this rank's
/// rings `rings.0 + w` and receiving on the peer's rings `rings.1 + w`, the RDMA links, or the
/// TCP links.
fn channels(
    peer: usize,
    transport: Transport,
    shm: Option<&Shm>,
    tcp: &mut impl Iterator<Item = tcp::TcpLink>,
    rdma: Vec<RdmaLink>,
    rings: (usize, usize),
    wires: usize,
) -> Result<Vec<Channel>> {
    let mut rdma = rdma.into_iter();
    (0..wires)
        .map(|w| {
            let missing =
                || Error::Bootstrap(format!("internal error: no link to rank {peer}, wire {w}"));
            let link: Box<dyn Link> = match (
                transport,
                shm.and_then(|s| Some((s, s.peers[peer].as_ref()?))),
            ) {
                (Transport::Shm, Some((shm, p))) => Box::new(ShmLink::new(
                    Arc::clone(&shm.local),
                    Arc::clone(p),
                    rings.0 + w,
                    rings.1 + w,
                )),
                (Transport::Rdma, _) => Box::new(rdma.next().ok_or_else(missing)?),
                _ => Box::new(tcp.next().ok_or_else(missing)?),
            };
            Ok(Channel::new(link, peer))
        })
        .collect()
}

/// Whether a group builds the mesh's links: when asked to, or with `auto` where it pays. Small
/// collectives then take one step instead of ⌈(size − 1)/2⌉ around the ring, which pays when
/// each hop costs a network's latency (with 1 ms per packet, 4 ranks: 1.7 ms instead of 2.8 ms
/// per small all-reduce; docs/algorithms.md, "Mesh"). So `auto` builds it for 4 to
/// [`AUTO_MESH_MAX`] ranks that are each on a host of their own and talk TCP (the mesh's extra
/// links are TCP). Every input is the same on every rank, so all choose alike.
fn uses_mesh(topology: Topology, size: usize, one_rank_per_host: bool, rdma: bool) -> bool {
    match topology {
        Topology::Mesh => true,
        Topology::Auto => (4..=AUTO_MESH_MAX).contains(&size) && one_rank_per_host && !rdma,
        _ => false,
    }
}

/// The most ranks for which `auto` builds the mesh: each rank opens `size − 3` more TCP
/// connections, and a one-step exchange sends `size − 1` messages at once.
const AUTO_MESH_MAX: usize = 16;

/// All-gathers `mine` as JSON through the side channel.
fn exchange<T: Serialize + DeserializeOwned>(
    side: &mut SideChannel,
    rank: usize,
    mine: &T,
    deadline: Instant,
) -> Result<Vec<T>> {
    let bytes = serde_json::to_vec(mine).map_err(|e| Error::Bootstrap(e.to_string()))?;
    side.all_gather(&bytes, deadline)?
        .iter()
        .enumerate()
        .map(|(r, b)| {
            serde_json::from_slice(b).map_err(|e| {
                Error::Bootstrap(format!(
                    "rank {rank}: rank {r} published unreadable start-up data: {e}"
                ))
            })
        })
        .collect()
}

/// Checks that every rank uses the same settings.
fn agree(rank: usize, me: &PeerInfo, infos: &[PeerInfo]) -> Result<()> {
    for (r, info) in infos.iter().enumerate() {
        if info.wires != me.wires {
            return Err(Error::Bootstrap(format!(
                "ranks disagree on the number of wires: rank {rank} uses {}, rank {r} uses {}; \
                 set JACCL_WIRES (or Config::wires) the same on every rank",
                me.wires, info.wires
            )));
        }
        if info.topology != me.topology {
            return Err(Error::Bootstrap(format!(
                "ranks disagree on the topology: rank {rank} uses {}, rank {r} uses {}; set \
                 JACCL_TOPOLOGY (or Config::topology) the same on every rank",
                me.topology, info.topology
            )));
        }
        if info.transport != me.transport {
            return Err(Error::Bootstrap(format!(
                "ranks disagree on the transport: rank {rank} uses {}, rank {r} uses {}; set \
                 JACCL_TRANSPORT (or Config::transport) the same on every rank",
                me.transport, info.transport
            )));
        }
    }
    Ok(())
}
