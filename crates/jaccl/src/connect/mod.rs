//! Start-up of a group: every rank joins the side channel and publishes what its peers need (its
//! host, the settings all ranks must agree on, and what each transport's connector publishes,
//! `crate::transport::connector`); rank 0 checks that they agree and sends every rank a
//! compact table of it ([`published`]), whose entries a rank reads only as it needs. Then each ring
//! neighbour gets its own transport, by the same rule on every rank ([`choice`]): shared
//! memory when both ranks are on one host, RDMA when both have a device that reaches the
//! other, TCP otherwise (unless `Config::transport` forces one); so 2 hosts × 4 ranks use
//! shared memory inside each host and RDMA or TCP between them. The mesh's other links are
//! TCP. When every rank is on this host, each also maps every other rank's segment for the
//! direct collectives (`crate::algo::shared_memory`). The transports open their links in
//! turn: RDMA first (a pair it cannot connect falls back to TCP under `auto`), then TCP, then
//! shared memory.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;

use crate::algo::call::CallNumbers;
use crate::algo::channel::Channel;
use crate::algo::collectives::Collectives;
use crate::algo::geometry::ring_index;
use crate::algo::hosts::HostLayout;
use crate::auth::Identity;
use crate::bootstrap::SideChannel;
use crate::config::{Config, Transport};
use crate::error::{Error, Result};
use crate::liveness::{Heartbeat, Liveness};
use crate::os::deadline_after;
use crate::transport::Link;
use crate::transport::connector::{Connector, End, Exchange, Opened, Request, Want};
use crate::transport::listener::JobListener;
use crate::transport::rdma::{DeviceNames, RdmaConnector};
use crate::transport::shm::{self, Board, Shm, ShmConnector};
use crate::transport::tcp::connector::TcpConnector;
use crate::wait::{GoOn, WaitPolicy};

use choice::Facts;
use published::{PeerInfo, Table, Unread};

mod choice;
pub(crate) mod late;
mod published;

/// A group's connections, ready for collectives.
pub(crate) struct Connected {
    pub(crate) collectives: Collectives,
    /// What the group counts of its calls, alike on every rank.
    pub(crate) numbers: CallNumbers,
    /// This rank's shared memory, if it has any peer on this host.
    pub(crate) shm: Option<Shm>,
    /// The transport to each peer this rank has links to from start-up: the left neighbour,
    /// the right one if different, then other ranks in rank order (all with the mesh, those on
    /// this host with shared memory).
    pub(crate) peers: Vec<(usize, Transport)>,
    /// Which ranks share a host.
    pub(crate) hosts: Arc<HostLayout>,
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
    deadline: Instant,
) -> Result<(Connected, Arc<JobListener>)> {
    let (rank, size) = (config.rank, config.size);
    let fail = |what: String| Error::Bootstrap(format!("rank {rank}: {what}"));
    let wires = config.wire_count();
    let (left, right) = (ring_index(rank, -1, size), ring_index(rank, 1, size));

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
        link: config.link.map(|l| l.to_string()),
        liveness_ns: u64::try_from(config.liveness.as_nanos()).unwrap_or(u64::MAX),
        links,
    };
    let mine = serde_json::to_vec(&me).map_err(|e| fail(e.to_string()))?;
    let reply = side.gather_reply(&mine, deadline, |all| Table::reply(&all))?;
    let mut table = Table::read(&reply, size).map_err(|unread| match unread {
        Unread::Refused(why) => fail(why),
        Unread::Bad(why) => fail(format!("bad start-up table from rank 0: {why}")),
    })?;
    drop(reply);
    let hosts = HostLayout::new(rank, table.host_of().to_vec())
        .map(Arc::new)
        .map_err(|why| fail(format!("bad start-up table from rank 0: {why}")))?;
    let mut exchange = SideExchange {
        side: &mut side,
        deadline,
    };

    // Which transport each link uses: every rank works it out alike (`choice`).
    let pairs = |connector: &dyn Connector, transport: Transport, a: usize, b: usize| {
        connector.pairs(table.published(a, transport), table.published(b, transport))
    };
    // Only ranks of one host can share memory: a rank reads only its own host's entries.
    let shares_memory = |a: usize, b: usize| {
        table.host_of()[a] == table.host_of()[b]
            && shm.as_ref().is_some_and(|c| pairs(c, Transport::Shm, a, b))
    };
    let facts = Facts {
        rank,
        size,
        wires,
        transport: config.transport,
        topology: config.topology,
        hosts: table.hosts().to_vec(),
        host_of: table.host_of().to_vec(),
        ring_shares_memory: (0..size)
            .map(|p| shares_memory(p, (p + 1) % size))
            .collect(),
        local: (0..size).map(|p| shares_memory(rank, p)).collect(),
        ring_rdma: (0..size)
            .map(|p| pairs(&rdma, Transport::Rdma, p, (p + 1) % size))
            .collect(),
        rdma_unusable: (0..size).find_map(|r| {
            rdma.unusable(table.published(r, Transport::Rdma).blob)
                .map(|why| (r, why))
        }),
    };
    let choice = facts.choose()?;
    let identity = Identity {
        rank,
        size,
        token: config.token(),
    };
    let open = |connector: &mut dyn Connector,
                wants: &[Want],
                transport: Transport,
                exchange: &mut SideExchange<'_>| {
        connector.open(Request {
            me: &identity,
            wants,
            published: table.blobs(transport),
            exchange,
            required: config.transport == transport,
            deadline,
        })
    };

    let mut rdma_links = match choice.any_rdma {
        true => open(&mut rdma, &choice.rdma, Transport::Rdma, &mut exchange)?,
        false => Vec::new(),
    };
    drop(rdma);
    let mut rdma_left = take(&mut rdma_links, &choice.rdma, End::Left, left);
    let mut rdma_right = take(&mut rdma_links, &choice.rdma, End::Right, right);
    let wanted = choice.links(&facts, rdma_left.is_some(), rdma_right.is_some());
    let (to_left, to_right) = (wanted.to_left, wanted.to_right);
    let mut tcp_links = open(&mut tcp, &wanted.tcp, Transport::Tcp, &mut exchange)?;

    // Shared memory: with every rank on this host (the neighbours' links on every wire, one
    // link to each other rank); the direct collectives use the segments when all are here.
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let wait = config
        .wait
        .unwrap_or_else(|| WaitPolicy::auto(facts.ranks_on_this_machine(), cpus));
    let (mut shm_links, shared) = match &mut shm {
        Some(connector) if !wanted.shm.is_empty() => {
            connector.offer_asymmetric_fences(!wait.spin.is_zero());
            let opened = open(connector, &wanted.shm, Transport::Shm, &mut exchange)?;
            (opened, connector.take_shared())
        }
        _ => (Vec::new(), None),
    };

    let mut side_links = |transport: Transport, end: End, peer: usize, rdma: &mut Option<_>| {
        let links = match transport {
            Transport::Shm => take(&mut shm_links, &wanted.shm, end, peer),
            Transport::Rdma => rdma.take(),
            _ => take(&mut tcp_links, &wanted.tcp, end, peer),
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
    for p in choice.geometry.non_neighbours() {
        let opened = match facts.local[p] {
            true => take(&mut shm_links, &wanted.shm, End::Other, p).map(|l| (l, Transport::Shm)),
            false => take(&mut tcp_links, &wanted.tcp, End::Other, p).map(|l| (l, Transport::Tcp)),
        };
        match opened {
            Some((links, transport)) => {
                channels_all.extend(channels(Some(links), p, 1)?);
                peers.push((p, transport));
            }
            None => channels_all.push(Channel::unopened(p)),
        }
    }
    let opened_late = late::Opened::default();
    let job = tcp
        .into_late(
            identity.clone(),
            table.take_blobs(Transport::Tcp),
            config.startup_timeout,
        )
        .map_err(|e| Error::io(rank, "accepting data connections", e))?;
    let late = late::Late {
        tcp: Arc::clone(&job),
        group,
        job_rank: Arc::clone(job_rank),
        opened: Arc::clone(&opened_late),
    };
    let job_ranks = (group != 0).then(|| Arc::clone(job_rank));
    let liveness =
        Liveness::of_group(rank, size, job_ranks).map_err(|e| Error::io(rank, "liveness", e))?;
    let board = shared.as_ref().filter(|_| facts.all_here());
    let mut collectives = Collectives::new(
        choice.geometry,
        channels_all,
        Arc::clone(&liveness),
        choice.any_rdma,
        board.and_then(|s| Board::new(size, s)).map(Arc::new),
        Some(Box::new(late)),
        config.link,
    );
    collectives.set_hosts(&hosts);
    side.barrier(deadline)?;
    let heartbeat = (config.liveness != std::time::Duration::MAX)
        .then(|| side.into_heartbeat(config.liveness, Arc::clone(&liveness)))
        .transpose()
        .map_err(|e| Error::io(rank, "starting the heartbeat", e))?;
    let connected = Connected {
        collectives,
        numbers: CallNumbers::default(),
        shm: shared,
        peers,
        hosts,
        opened_late,
        wait,
        liveness,
        heartbeat,
    };
    Ok((connected, job))
}

/// Reads start-up data as rank 0 reads what the ranks published (`bytes` as a JSON list,
/// each element one rank's entry), and as a member reads rank 0's reply (`bytes` as the table
/// of a group of 1 to 4 ranks, each transport's entries read by its connector): the fuzz
/// target `startup`.
#[cfg(feature = "fuzzing")]
pub(crate) fn check_published(bytes: &[u8]) {
    if let Ok(entries) = serde_json::from_slice::<Vec<Value>>(bytes) {
        let all: Vec<Vec<u8>> = entries
            .iter()
            .filter_map(|e| serde_json::to_vec(e).ok())
            .collect();
        let _ = Table::read(&Table::reply(&all), all.len());
    }
    let made = fuzz_connectors();
    let rdma = RdmaConnector::off();
    for size in 1..=4 {
        let Ok(table) = Table::read(bytes, size) else {
            continue;
        };
        let check = |connector: &dyn Connector, transport: Transport| {
            for a in 0..size {
                let _ = connector.unusable(table.published(a, transport).blob);
                for b in 0..size {
                    let _ = connector
                        .pairs(table.published(a, transport), table.published(b, transport));
                }
            }
        };
        if let Some(tcp) = &made.tcp {
            check(tcp, Transport::Tcp);
        }
        check(&made.shm, Transport::Shm);
        check(&rdma, Transport::Rdma);
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
