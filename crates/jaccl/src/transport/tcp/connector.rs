//! TCP's part in a group's set-up ([`TcpConnector`]): a listener's address published, the
//! connections opened and authenticated, and the listener kept for the job afterwards
//! (`crate::transport::listener`).

use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::link::TcpLink;
use crate::auth::{self, Admission, Claim, Identity, Purpose};
use crate::error::{Error, Result};
use crate::os::{accept_tcp, deadline_after};
use crate::transport::Link;
use crate::transport::connector::{Blobs, Connector, End, Opened, Request};
use crate::transport::listener::{Established, JobListener, dial, links};
use crate::wait::GoOn;

/// TCP's part in a group's set-up: an address published to the peers; a connection is
/// opened by the rank whose right neighbour (or, off the ring, the higher rank) the other is.
/// The group `init` makes listens on an ephemeral port of the address the side channel
/// reaches this rank at, and keeps that listener for the job ([`TcpConnector::into_late`]);
/// its sub-groups make their connections through that same listener ([`TcpConnector::through`]),
/// so they need no port of their own.
pub(crate) struct TcpConnector {
    how: How,
}

enum How {
    /// A listener of this connector's own.
    Listening(TcpListener),
    /// The job's listener, for the connections of group `group`, whose rank `r` is the job's
    /// rank `job_rank[r]`.
    Through {
        job: Arc<JobListener>,
        group: u64,
        job_rank: Arc<[usize]>,
        go_on: GoOn,
    },
}

impl TcpConnector {
    /// Listens on an ephemeral port of `ip`.
    ///
    /// # Errors
    /// The listener cannot be made.
    pub(crate) fn new(ip: IpAddr) -> io::Result<TcpConnector> {
        Ok(TcpConnector {
            how: How::Listening(super::congestion::listen(SocketAddr::new(ip, 0))?),
        })
    }

    /// Makes the connections of sub-group `group` through the job's listener: rank `r` of the
    /// sub-group is the job's rank `job_rank[r]`; its waits ask `go_on`.
    pub(crate) fn through(
        job: Arc<JobListener>,
        group: u64,
        job_rank: Arc<[usize]>,
        go_on: GoOn,
    ) -> TcpConnector {
        TcpConnector {
            how: How::Through {
                job,
                group,
                job_rank,
                go_on,
            },
        }
    }
}

/// The address a rank published, if it is one.
fn address(blob: &Value) -> std::result::Result<SocketAddr, String> {
    blob.as_str()
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| format!("it published no TCP address ({blob})"))
}

impl Connector for TcpConnector {
    fn publish(&self) -> Value {
        let address = match &self.how {
            How::Listening(listener) => listener.local_addr().ok(),
            How::Through { job, .. } => job.own_address(),
        };
        address.map_or(Value::Null, |a| Value::String(a.to_string()))
    }

    fn unusable(&self, blob: &Value) -> Option<String> {
        address(blob).err()
    }

    fn open(&mut self, request: Request<'_>) -> Result<Opened> {
        let me = request.me;
        let opens = |end: End, peer: usize| match end {
            End::Right => true,
            End::Left => false,
            End::Other => peer > me.rank,
        };
        let mut connect_to = Vec::new();
        let mut accept_from = Vec::new();
        for want in request.wants {
            if opens(want.end, want.peer) {
                let addr = address(request.published.get(want.peer)).map_err(|why| {
                    Error::Bootstrap(format!("rank {}: rank {}: {why}", me.rank, want.peer))
                })?;
                connect_to.push((want.peer, addr, want.wires));
            } else {
                accept_from.push((want.peer, want.wires));
            }
        }
        let (outgoing, incoming) = match &self.how {
            How::Listening(listener) => {
                establish(listener, me, &connect_to, &accept_from, request.deadline)?
            }
            How::Through {
                job,
                group,
                job_rank,
                go_on,
            } => job.establish(
                *group,
                job_rank,
                &connect_to,
                &accept_from,
                request.deadline,
                go_on.as_ref(),
            )?,
        };
        let (mut outgoing, mut incoming) = (outgoing.into_iter(), incoming.into_iter());
        let boxed = |links: Vec<TcpLink>| {
            links
                .into_iter()
                .map(|l| Box::new(l) as Box<dyn Link>)
                .collect()
        };
        Ok(request
            .wants
            .iter()
            .map(|want| match opens(want.end, want.peer) {
                true => outgoing.next().map(boxed),
                false => incoming.next().map(boxed),
            })
            .collect())
    }
}

impl TcpConnector {
    /// The job's listener, for connections made after start-up ([`JobListener`]): this one's
    /// own, kept (`published` is what every rank's TCP connector published, each read when
    /// first dialled), or the one it made its connections through.
    ///
    /// # Errors
    /// The thread that accepts them cannot start.
    pub(crate) fn into_late(
        self,
        me: Identity,
        published: Blobs,
        startup_timeout: Duration,
    ) -> io::Result<Arc<JobListener>> {
        let listener = match self.how {
            How::Listening(listener) => listener,
            How::Through { job, .. } => return Ok(job),
        };
        let addresses = Box::new(move |rank| address(published.get(rank)).ok());
        JobListener::start(listener, me, addresses, startup_timeout)
    }
}

/// Opens `wires` authenticated connections to each `(peer, address, wires)` of `connect_to`
/// while accepting `wires` from each `(peer, wires)` of `accept_from` on `listener` (on
/// another thread: every rank's handshakes as the connecting side need its neighbour to be
/// accepting). Returns the links: `outgoing[i][w]` is wire `w` to `connect_to[i]`, and
/// `incoming[i][w]` wire `w` from `accept_from[i]`.
fn establish(
    listener: &TcpListener,
    me: &Identity,
    connect_to: &[(usize, SocketAddr, usize)],
    accept_from: &[(usize, usize)],
    deadline: Instant,
) -> Result<Established> {
    let stop = AtomicBool::new(false);
    let (incoming, outgoing) = std::thread::scope(|s| {
        let acceptor = s.spawn(|| accept_all(listener, me, accept_from, deadline, &stop));
        let outgoing = connect_all(me, connect_to, deadline);
        if outgoing.is_err() {
            stop.store(true, Ordering::Relaxed);
        }
        let incoming = acceptor.join().unwrap_or_else(|_| {
            Err(Error::Bootstrap(format!(
                "rank {}: the data acceptor failed",
                me.rank
            )))
        });
        (incoming, outgoing)
    });
    links(outgoing?, incoming?, connect_to, accept_from, me)
}

/// Opens and authenticates `wires` connections to each `(peer, address, wires)` of
/// `connect_to`.
fn connect_all(
    me: &Identity,
    connect_to: &[(usize, SocketAddr, usize)],
    deadline: Instant,
) -> Result<Vec<Vec<TcpStream>>> {
    connect_to
        .iter()
        .map(|&(peer, addr, wires)| {
            (0..wires)
                .map(|wire| {
                    let claim = Claim {
                        purpose: Purpose::Data,
                        rank: me.rank,
                        size: me.size,
                        wire,
                        group: 0,
                    };
                    dial(me, peer, addr, claim, deadline, &mut || Ok(()))
                        .map_err(|e| Error::Bootstrap(format!("rank {}: {e}", me.rank)))
                })
                .collect()
        })
        .collect()
}

/// Accepts until every wire of every `(peer, wires)` of `accept_from` has connected and
/// authenticated. Strangers are dropped; a connection that claims a taken slot, or is not
/// expected, is refused and the slot keeps its connection.
fn accept_all(
    listener: &TcpListener,
    me: &Identity,
    accept_from: &[(usize, usize)],
    deadline: Instant,
    stop: &AtomicBool,
) -> Result<Vec<Vec<TcpStream>>> {
    let mut slots: Vec<Vec<Option<TcpStream>>> = accept_from
        .iter()
        .map(|&(_, wires)| (0..wires).map(|_| None).collect())
        .collect();
    let mut missing: usize = accept_from.iter().map(|a| a.1).sum();
    if missing > 0 {
        let done = auth::serve(
            listener.as_fd(),
            || accept_tcp(listener),
            &me.token,
            me.rank,
            deadline,
            Some(&|| stop.load(Ordering::Relaxed)),
            |claim, mut stream| {
                let reply_by = deadline.min(deadline_after(auth::HANDSHAKE_TIMEOUT));
                let slot = accept_from
                    .iter()
                    .position(|&(p, _)| p == claim.rank)
                    .filter(|_| claim.purpose == Purpose::Data && claim.size == me.size)
                    .and_then(|i| slots[i].get_mut(claim.wire));
                match slot {
                    Some(slot @ None) => {
                        if auth::verdict(&mut stream, Ok(()), reply_by).is_ok() {
                            *slot = Some(stream);
                            missing -= 1;
                        }
                    }
                    taken => {
                        let why = if taken.is_some() {
                            format!(
                                "rank {} wire {} is connected already",
                                claim.rank, claim.wire
                            )
                        } else {
                            format!(
                                "not expecting {:?} from rank {} here",
                                claim.purpose, claim.rank
                            )
                        };
                        tracing::warn!(rank = me.rank, %why, "refused a data connection");
                        let _ = auth::verdict(&mut stream, Err(&why), reply_by);
                    }
                }
                Ok(if missing == 0 {
                    Admission::Done
                } else {
                    Admission::More
                })
            },
        )?;
        if !done && !stop.load(Ordering::Relaxed) {
            let absent: Vec<String> = accept_from
                .iter()
                .zip(&slots)
                .flat_map(|((peer, _), wires)| {
                    wires
                        .iter()
                        .enumerate()
                        .filter(|(_, s)| s.is_none())
                        .map(move |(w, _)| format!("rank {peer} wire {w}"))
                })
                .collect();
            return Err(Error::Bootstrap(format!(
                "rank {}: timed out waiting for data connections from {} (is that rank \
                 running and reachable?)",
                me.rank,
                absent.join(", ")
            )));
        }
    }
    Ok(slots
        .into_iter()
        .map(|wires| wires.into_iter().flatten().collect())
        .collect())
}
