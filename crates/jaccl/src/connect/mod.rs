//! Start-up of a group: every rank joins the side channel, publishes what its peers need (its
//! host, the settings all ranks must agree on, and what each transport's connector publishes,
//! `crate::transport::connector`), and the ranks check that they agree. Then each ring
//! neighbour gets its own transport, by the same rule on every rank: shared memory when both
//! ranks are on one host, RDMA when both have a device that reaches the other, TCP otherwise
//! (unless `Config::transport` forces one); so 2 hosts × 4 ranks use shared memory inside each
//! host and RDMA or TCP between them. The mesh's other links are TCP. When every rank is on
//! this host, each also maps every other rank's segment for the direct collectives
//! (`crate::algo::direct`). The transports open their links in turn: RDMA first (a pair it
//! cannot connect falls back to TCP under `auto`), then TCP, then shared memory.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::algo::channel::Channel;
use crate::algo::collectives::Collectives;
use crate::algo::geometry::Geometry;
use crate::auth::Identity;
use crate::bootstrap::SideChannel;
use crate::config::{Config, Topology, Transport};
use crate::error::{Error, Result};
use crate::liveness::{Heartbeat, Liveness};
use crate::os::deadline_after;
use crate::transport::Link;
use crate::transport::connector::{
    Connector, End, Exchange, Opened, Published, Request, Want, exchange_json,
};
use crate::transport::listener::JobListener;
use crate::transport::rdma::{DeviceNames, RdmaConnector};
use crate::transport::shm::{self, Board, Shm, ShmConnector};
use crate::transport::tcp::connector::TcpConnector;
use crate::wait::GoOn;
use crate::wait::WaitPolicy;

pub(crate) mod late;

/// What each rank publishes at start-up.
#[derive(Debug, Serialize, Deserialize)]
struct PeerInfo {
    /// Ranks with the same host may share memory ([`shm::host_identity`]).
    host: String,
    wires: usize,
    transport: String,
    topology: String,
    /// What each transport's connector published, by transport name (opaque here).
    links: BTreeMap<String, Value>,
}

impl PeerInfo {
    fn published<'a>(&'a self, transport: Transport) -> Published<'a> {
        Published {
            host: &self.host,
            blob: self.links.get(transport.name()).unwrap_or(&Value::Null),
        }
    }
}

/// A group's connections, ready for collectives.
pub(crate) struct Connected {
    pub(crate) collectives: Collectives,
    /// This rank's shared memory, if it has any peer on this host.
    pub(crate) shm: Option<Shm>,
    /// The transport to each peer this rank has links to from start-up: the left neighbour,
    /// the right one if different, then other ranks in rank order (all with the mesh, those on
    /// this host with shared memory).
    pub(crate) peers: Vec<(usize, Transport)>,
    /// The peers of links made later, when first used, in that order.
    pub(crate) opened_late: late::Opened,
    pub(crate) wait: WaitPolicy,
    /// What the heartbeat found out (also held by the collectives).
    pub(crate) liveness: Arc<Liveness>,
    /// Beats while the group lives; says goodbye when it is dropped. `None`: liveness off.
    pub(crate) heartbeat: Option<Heartbeat>,
}

/// The side channel as the connectors' [`Exchange`], until the start-up deadline.
struct SideExchange<'a> {
    side: &'a mut SideChannel,
    deadline: Instant,
}

impl Exchange for SideExchange<'_> {
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.side.all_gather(mine, self.deadline)
    }
}

/// Joins the group of `config` (size > 1) and opens its links. Also returns the listener this
/// rank keeps for the job: links made on first use and sub-groups connect through it.
pub(crate) fn connect(config: &Config) -> Result<(Connected, Arc<JobListener>)> {
    let deadline = deadline_after(config.startup_timeout);
    let side = SideChannel::join(config, deadline)?;
    let tcp = TcpConnector::new(side.local_ip())
        .map_err(|e| Error::io(config.rank, "listening for data connections", e))?;
    let job_rank: Arc<[usize]> = (0..config.size).collect();
    set_up(config, side, tcp, &job_rank, 0, deadline)
}

/// Forms sub-group `group` of the job whose listener is `job` (see `crate::group`), as
/// `config` (its rank and size) says: rank `r` of it is the job's rank `job_rank[r]`. Its side
/// channel and TCP links go through the job's listener, and the waits for members ask
/// `go_on`; everything else as [`connect`].
pub(crate) fn connect_subgroup(
    config: &Config,
    job: Arc<JobListener>,
    job_rank: Arc<[usize]>,
    group: u64,
    go_on: GoOn,
) -> Result<Connected> {
    let deadline = deadline_after(config.startup_timeout);
    let side = SideChannel::through(&job, group, &job_rank, config.rank, deadline, &*go_on)?;
    let tcp = TcpConnector::through(job, group, Arc::clone(&job_rank), go_on);
    set_up(config, side, tcp, &job_rank, group, deadline).map(|(connected, _)| connected)
}

/// Opens the links of group `group` once its side channel is up: `job_rank` gives the job's
/// rank of each of its ranks.
fn set_up(
    config: &Config,
    mut side: SideChannel,
    mut tcp: TcpConnector,
    job_rank: &Arc<[usize]>,
    group: u64,
    deadline: std::time::Instant,
) -> Result<(Connected, Arc<JobListener>)> {
    let (rank, size) = (config.rank, config.size);
    let fail = |what: String| Error::Bootstrap(format!("rank {rank}: {what}"));
    let mut geometry = Geometry {
        rank,
        size,
        wires: config.wire_count(),
        mesh: false,
    };
    let wires = geometry.wires;
    let (left, right) = (geometry.left(), geometry.right());

    // Each transport's connector, and what it publishes.
    let mut shm = matches!(config.transport, Transport::Auto | Transport::Shm)
        .then(|| ShmConnector::new(wires));
    if let Some(why) = shm.as_ref().and_then(ShmConnector::unavailable) {
        if config.transport == Transport::Shm {
            return Err(fail(format!("cannot set up shared memory: {why}")));
        }
        tracing::debug!(rank, %why, "no shared memory, using TCP only");
    }
    let mut rdma = match config.transport {
        Transport::Auto | Transport::Rdma => RdmaConnector::open_devices(
            config.rdma_library.as_deref(),
            device_names(config, job_rank, left),
            device_names(config, job_rank, right),
        ),
        _ => RdmaConnector::off(),
    };
    let mut links = BTreeMap::new();
    links.insert(Transport::Tcp.name().to_owned(), tcp.publish());
    links.insert(
        Transport::Shm.name().to_owned(),
        shm.as_ref().map_or(Value::Null, ShmConnector::publish),
    );
    links.insert(Transport::Rdma.name().to_owned(), rdma.publish());
    let me = PeerInfo {
        host: shm::host_identity(config.host_id.as_deref()),
        wires,
        transport: config.transport.to_string(),
        topology: config.topology.to_string(),
        links,
    };
    let mut exchange = SideExchange {
        side: &mut side,
        deadline,
    };
    let infos: Vec<PeerInfo> = exchange_json(&mut exchange, rank, &me)?;
    agree(rank, &me, &infos)?;

    // Which transport each pair of ring neighbours uses: every rank works it out alike.
    let shares_memory = |a: usize, b: usize| {
        let (a, b) = (&infos[a], &infos[b]);
        shm.as_ref()
            .is_some_and(|c| c.pairs(a.published(Transport::Shm), b.published(Transport::Shm)))
    };
    // Forced transports need every pair of ring neighbours to use them; every rank checks
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
    let rdma_unusable = |r: usize| rdma.unusable(infos[r].published(Transport::Rdma).blob);
    if config.transport == Transport::Rdma
        && let Some((r, why)) = (0..size).find_map(|r| rdma_unusable(r).map(|why| (r, why)))
    {
        return Err(Error::Unsupported(format!(
            "rank {rank}: the rdma transport is unavailable on rank {r}: {why}"
        )));
    }
    // Ring pair p is (p, p + 1): this rank's left side is pair `left`, its right side `rank`.
    let rdma_pairs: Vec<bool> = (0..size)
        .map(|p| {
            let q = (p + 1) % size;
            let (a, b) = (&infos[p], &infos[q]);
            rdma.pairs(a.published(Transport::Rdma), b.published(Transport::Rdma))
                && (config.transport == Transport::Rdma || !shares_memory(p, q))
        })
        .collect();
    let any_rdma = rdma_pairs.contains(&true);
    let identity = Identity {
        rank,
        size,
        token: config.token(),
    };
    let open = |connector: &mut dyn Connector,
                wants: &[Want],
                transport: Transport,
                exchange: &mut SideExchange<'_>| {
        let published: Vec<Value> = infos
            .iter()
            .map(|i| i.published(transport).blob.clone())
            .collect();
        connector.open(Request {
            me: &identity,
            wants,
            published: &published,
            exchange,
            required: config.transport == transport,
            deadline,
        })
    };

    let rdma_wants: Vec<Want> = [
        (rdma_pairs[left], left, End::Left),
        (rdma_pairs[rank], right, End::Right),
    ]
    .into_iter()
    .filter(|(wanted, _, _)| *wanted)
    .map(|(_, peer, end)| Want { peer, wires, end })
    .collect();
    let mut rdma_links = match any_rdma {
        true => open(&mut rdma, &rdma_wants, Transport::Rdma, &mut exchange)?,
        false => Vec::new(),
    };
    drop(rdma);
    let mut rdma_left = take(&mut rdma_links, &rdma_wants, End::Left, left);
    let mut rdma_right = take(&mut rdma_links, &rdma_wants, End::Right, right);
    let transport_to = |peer: usize, rdma: &Option<Vec<Box<dyn Link>>>| {
        if shares_memory(rank, peer) {
            Transport::Shm
        } else if rdma.is_some() {
            Transport::Rdma
        } else {
            Transport::Tcp
        }
    };
    let to_left = transport_to(left, &rdma_left);
    let to_right = transport_to(right, &rdma_right);
    let all_here = (0..size).all(|r| r == rank || shares_memory(rank, r));

    // TCP: the ring's links not taken by another transport, and the mesh's to other hosts.
    let hosts: std::collections::HashSet<&str> = infos.iter().map(|i| i.host.as_str()).collect();
    geometry.mesh = uses_mesh(config.topology, size, hosts.len() == size, any_rdma);
    let others: Vec<usize> = geometry.non_neighbours().collect();
    let local: Vec<bool> = (0..size).map(|p| shares_memory(rank, p)).collect();
    let ring_wants = |transport: Transport| {
        [(to_left, left, End::Left), (to_right, right, End::Right)]
            .into_iter()
            .filter(move |(t, _, _)| *t == transport)
            .map(move |(_, peer, end)| Want { peer, wires, end })
    };
    let other_wants = |transport: Transport| {
        let (mesh, local) = (geometry.mesh, &local);
        let wanted = move |p: usize| match transport {
            Transport::Shm => local[p],
            _ => mesh && !local[p],
        };
        others
            .iter()
            .filter(move |&&p| wanted(p))
            .map(|&peer| Want {
                peer,
                wires: 1,
                end: End::Other,
            })
    };
    let tcp_wants: Vec<Want> = ring_wants(Transport::Tcp)
        .chain(other_wants(Transport::Tcp))
        .collect();
    let mut tcp_links = open(&mut tcp, &tcp_wants, Transport::Tcp, &mut exchange)?;

    // Shared memory: with every rank on this host (the neighbours' links on every wire, one
    // link to each other rank); the direct collectives use the segments when all are here.
    let here = infos.iter().filter(|i| i.host == me.host).count();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let wait = config.wait.unwrap_or_else(|| WaitPolicy::auto(here, cpus));
    let shm_wants: Vec<Want> = ring_wants(Transport::Shm)
        .chain(other_wants(Transport::Shm))
        .collect();
    let (mut shm_links, shared) = match &mut shm {
        Some(connector) if !shm_wants.is_empty() => {
            connector.offer_asymmetric_fences(!wait.spin.is_zero());
            let opened = open(connector, &shm_wants, Transport::Shm, &mut exchange)?;
            (opened, connector.take_shared())
        }
        _ => (Vec::new(), None),
    };

    let mut side_links = |transport: Transport, end: End, peer: usize, rdma: &mut Option<_>| {
        let links = match transport {
            Transport::Shm => take(&mut shm_links, &shm_wants, end, peer),
            Transport::Rdma => rdma.take(),
            _ => take(&mut tcp_links, &tcp_wants, end, peer),
        };
        channels(links, peer, wires)
    };
    let mut channels_all = side_links(to_left, End::Left, left, &mut rdma_left)?;
    channels_all.extend(side_links(to_right, End::Right, right, &mut rdma_right)?);
    let mut peers = vec![(left, to_left)];
    if right != left {
        peers.push((right, to_right));
    }
    // One channel to each other rank: opened now, or on first use (`late`).
    for &p in &others {
        let opened = match local[p] {
            true => take(&mut shm_links, &shm_wants, End::Other, p).map(|l| (l, Transport::Shm)),
            false => take(&mut tcp_links, &tcp_wants, End::Other, p).map(|l| (l, Transport::Tcp)),
        };
        match opened {
            Some((links, transport)) => {
                channels_all.extend(channels(Some(links), p, 1)?);
                peers.push((p, transport));
            }
            None => channels_all.push(Channel::unopened(p)),
        }
    }
    let tcp_published: Vec<Value> = infos
        .iter()
        .map(|i| i.published(Transport::Tcp).blob.clone())
        .collect();
    let opened_late = late::Opened::default();
    let job = tcp
        .into_late(identity.clone(), &tcp_published, config.startup_timeout)
        .map_err(|e| Error::io(rank, "accepting data connections", e))?;
    let late = late::Late {
        tcp: Arc::clone(&job),
        group,
        job_rank: Arc::clone(job_rank),
        opened: Arc::clone(&opened_late),
    };
    let job_ranks = (group != 0).then(|| Arc::clone(job_rank));
    let liveness =
        Liveness::of_group(rank, job_ranks).map_err(|e| Error::io(rank, "liveness", e))?;
    let board = shared.as_ref().filter(|_| all_here);
    let collectives = Collectives::new(
        geometry,
        channels_all,
        Arc::clone(&liveness),
        // Known alike to every rank (unlike this rank's own links), so all choose alike.
        any_rdma,
        board.and_then(|s| Board::new(size, s)).map(Arc::new),
        Some(Box::new(late)),
    );
    side.barrier(deadline)?;
    let heartbeat = (config.liveness != std::time::Duration::MAX)
        .then(|| side.into_heartbeat(config.liveness, Arc::clone(&liveness)))
        .transpose()
        .map_err(|e| Error::io(rank, "starting the heartbeat", e))?;
    let connected = Connected {
        collectives,
        shm: shared,
        peers,
        opened_late,
        wait,
        liveness,
        heartbeat,
    };
    Ok((connected, job))
}

/// Reads what ranks published at start-up as every rank would: the settings, and each
/// transport's blob as its connector reads it (the fuzz target `startup`).
#[cfg(feature = "fuzzing")]
pub(crate) fn check_published(bytes: &[u8]) {
    let Ok(infos) = serde_json::from_slice::<Vec<PeerInfo>>(bytes) else {
        return;
    };
    let Some(me) = infos.first() else {
        return;
    };
    let _ = agree(0, me, &infos);
    let made = fuzz_connectors();
    let rdma = RdmaConnector::off();
    let some = &infos[..infos.len().min(8)];
    for a in some {
        for b in some {
            let pairs = |c: &dyn Connector, t: Transport| c.pairs(a.published(t), b.published(t));
            if let Some(tcp) = &made.tcp {
                let _ = pairs(tcp, Transport::Tcp);
            }
            let _ = pairs(&made.shm, Transport::Shm);
            let _ = pairs(&rdma, Transport::Rdma);
        }
    }
}

/// A connector of each kind that holds a listener, made once for every input of the fuzz
/// target.
#[cfg(feature = "fuzzing")]
struct FuzzConnectors {
    tcp: Option<TcpConnector>,
    shm: ShmConnector,
}

#[cfg(feature = "fuzzing")]
fn fuzz_connectors() -> &'static FuzzConnectors {
    static MADE: std::sync::OnceLock<FuzzConnectors> = std::sync::OnceLock::new();
    MADE.get_or_init(|| FuzzConnectors {
        tcp: TcpConnector::new([127, 0, 0, 1].into()).ok(),
        shm: ShmConnector::new(1),
    })
}

/// The RDMA device of each wire towards `peer`: the device matrix's (which names the job's
/// ranks: `job_rank` maps the group's), else the first active.
fn device_names(config: &Config, job_rank: &[usize], peer: usize) -> DeviceNames {
    let job = |r: usize| job_rank.get(r).copied().unwrap_or(r);
    match &config.devices {
        Some(m) => m
            .devices(job(config.rank), job(peer))
            .iter()
            .map(|d| Some(d.clone()))
            .collect(),
        None => vec![None; config.wire_count()],
    }
}

/// The links opened for the want `(end, peer)` of `wants`.
fn take(opened: &mut Opened, wants: &[Want], end: End, peer: usize) -> Option<Vec<Box<dyn Link>>> {
    let i = wants.iter().position(|w| w.end == end && w.peer == peer)?;
    opened.get_mut(i)?.take()
}

/// `wires` channels to `peer` over `links`.
fn channels(links: Option<Vec<Box<dyn Link>>>, peer: usize, wires: usize) -> Result<Vec<Channel>> {
    let links = links.unwrap_or_default();
    if links.len() != wires {
        return Err(Error::Bootstrap(format!(
            "internal error: {} link(s) to rank {peer} where {wires} were wanted",
            links.len()
        )));
    }
    Ok(links.into_iter().map(|l| Channel::new(l, peer)).collect())
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
