//! How a group's links are made, transport by transport: each transport has a [`Connector`]
//! that publishes what its peers need of this rank (an opaque JSON value that travels in the
//! start-up exchange) and builds this rank's links from what the peers published.
//! `crate::connect` orchestrates: the side channel, which transport each peer gets, the order,
//! the errors; it knows no transport's fields.

use std::sync::OnceLock;
use std::time::Instant;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::Link;
use crate::auth::Identity;
use crate::error::{Error, Result};

/// Which of its ring positions a peer holds for this rank: it decides who opens a connection,
/// and which rings of a shared-memory segment carry the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// The left neighbour (`rank − 1`): it opened the connections to this rank.
    Left,
    /// The right neighbour (`rank + 1`): this rank opens the connections.
    Right,
    /// Any other rank (the mesh, or shared memory for the direct collectives): the lower
    /// rank opens.
    Other,
}

/// Links this rank needs: `wires` of them to `peer`, which holds `end` for this rank. Zero
/// wires (shared memory only) means: map the peer's segment, for the direct collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Want {
    pub(crate) peer: usize,
    pub(crate) wires: usize,
    pub(crate) end: End,
}

/// An all-gather of bytes among the ranks that set up links together (the side channel at
/// start-up); it ends by its own deadline.
pub(crate) trait Exchange {
    /// Every rank's `mine`, in rank order.
    ///
    /// # Errors
    /// A rank did not answer in time or the channel failed.
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>>;
}

/// All-gathers `mine` as JSON over `exchange`; `rank` names this rank in errors.
///
/// # Errors
/// As [`Exchange::all_gather`], or a rank's bytes are not a `T`.
pub(crate) fn exchange_json<T: Serialize + DeserializeOwned>(
    exchange: &mut dyn Exchange,
    rank: usize,
    mine: &T,
) -> Result<Vec<T>> {
    let bytes = serde_json::to_vec(mine).map_err(|e| Error::Bootstrap(e.to_string()))?;
    exchange
        .all_gather(&bytes)?
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

/// One rank's published facts, as a connector sees them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Published<'a> {
    /// Its host identity (`crate::transport::shm::host_identity`).
    pub(crate) host: &'a str,
    /// What its connector of this transport published.
    pub(crate) blob: &'a Value,
}

/// What every rank's connector of one transport published, by rank: the distinct entries
/// (many ranks publish the same, such as "no RDMA device"), each read as JSON once, when
/// first asked, so a rank reads only those it needs.
#[derive(Debug)]
pub(crate) struct Blobs {
    /// The distinct entries' JSON, one after another: entry `i` ends at `ends[i]`.
    json: Vec<u8>,
    ends: Vec<usize>,
    /// Each rank's entry, an index into the distinct ones.
    of: Vec<usize>,
    /// Each distinct entry, once read (`Null` if unreadable).
    read: Vec<OnceLock<Value>>,
}

impl Blobs {
    /// No rank's: what a transport nobody published has.
    pub(crate) const fn none() -> Blobs {
        Blobs {
            json: Vec::new(),
            ends: Vec::new(),
            of: Vec::new(),
            read: Vec::new(),
        }
    }

    /// The `distinct` entries' JSON, and each rank's (`of`, in rank order, indices into them).
    ///
    /// # Errors
    /// An index names no entry.
    pub(crate) fn new<'a>(
        distinct: impl IntoIterator<Item = &'a [u8]>,
        of: Vec<usize>,
    ) -> std::result::Result<Blobs, String> {
        let mut blobs = Blobs {
            of,
            ..Blobs::none()
        };
        for json in distinct {
            blobs.json.extend_from_slice(json);
            blobs.ends.push(blobs.json.len());
            blobs.read.push(OnceLock::new());
        }
        match blobs.of.iter().find(|&&i| i >= blobs.ends.len()) {
            Some(i) => Err(format!("entry {i} of {}", blobs.ends.len())),
            None => Ok(blobs),
        }
    }

    /// What rank `rank` published: `Null` if nothing, or nothing readable.
    pub(crate) fn get(&self, rank: usize) -> &Value {
        static NULL: Value = Value::Null;
        let Some(&i) = self.of.get(rank) else {
            return &NULL;
        };
        self.read[i].get_or_init(|| {
            let start = i.checked_sub(1).map_or(0, |j| self.ends[j]);
            serde_json::from_slice(&self.json[start..self.ends[i]]).unwrap_or(Value::Null)
        })
    }
}

/// What [`Connector::open`] is asked.
pub(crate) struct Request<'a> {
    pub(crate) me: &'a Identity,
    /// This rank's wants of this transport (maybe none: every rank of the group takes part).
    pub(crate) wants: &'a [Want],
    /// What every rank's connector of this transport published, by rank.
    pub(crate) published: &'a Blobs,
    pub(crate) exchange: &'a mut dyn Exchange,
    /// Whether the transport was asked for by name: then a pair that cannot connect fails
    /// every rank instead of falling back to TCP.
    pub(crate) required: bool,
    pub(crate) deadline: Instant,
}

/// The links of each want, in order; `None` where the pair could not connect and may fall
/// back to TCP.
pub(crate) type Opened = Vec<Option<Vec<Box<dyn Link>>>>;

/// One transport's part in a group's set-up.
pub(crate) trait Connector {
    /// What this rank publishes about the transport, for every other rank.
    fn publish(&self) -> Value;

    /// Why a rank that published `blob` cannot use this transport at all, if it cannot.
    fn unusable(&self, blob: &Value) -> Option<String>;

    /// Whether ranks `a` and `b` may use this transport between them (every rank answers
    /// alike, from what both published): by default, when both can use it.
    fn pairs(&self, a: Published<'_>, b: Published<'_>) -> bool {
        self.unusable(a.blob).is_none() && self.unusable(b.blob).is_none()
    }

    /// Opens this rank's links of `request.wants`. Every rank of the group calls it when any
    /// rank wants links of this transport.
    ///
    /// # Errors
    /// Start-up failures (a peer that does not connect in time, a refused handshake); with
    /// `required`, a pair that could not connect.
    fn open(&mut self, request: Request<'_>) -> Result<Opened>;
}
