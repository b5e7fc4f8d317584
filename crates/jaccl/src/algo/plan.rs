//! Plans: what one call moves, as data. An algorithm builds a [`Plan`] (for each lane, the
//! sequence of steps it sends and receives, over which channels); the engine
//! (`super::engine`) runs any plan over any links.

/// Which caller buffer a span lies in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Buf {
    /// The call's input (the output itself when the call is in place).
    Input,
    /// The call's output.
    Output,
}

/// A byte range of one caller buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub(crate) buf: Buf,
    pub(crate) off: usize,
    pub(crate) len: usize,
}

impl Span {
    pub(crate) const EMPTY: Span = Span {
        buf: Buf::Output,
        off: 0,
        len: 0,
    };

    pub(crate) fn output(off: usize, len: usize) -> Span {
        Span {
            buf: Buf::Output,
            off,
            len,
        }
    }

    pub(crate) fn input(off: usize, len: usize) -> Span {
        Span {
            buf: Buf::Input,
            off,
            len,
        }
    }
}

/// What happens to received bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Merge {
    /// Copied into the receive span.
    Copy,
    /// Reduced into the receive span (an output span): `out = own ⊕ received`, where `own` is the
    /// input at this offset, or the output span itself when `None`.
    Reduce { own: Option<usize> },
}

/// One step of a lane: send one span, receive into another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Step {
    pub(crate) send: Span,
    pub(crate) recv: Span,
    pub(crate) merge: Merge,
}

impl Step {
    /// A step whose received bytes are copied, not reduced.
    pub(crate) fn copy(send: Span, recv: Span) -> Step {
        Step {
            send,
            recv,
            merge: Merge::Copy,
        }
    }
}

/// One lane: a sequence of steps over one sending and one receiving channel.
///
/// When a lane both sends and receives, step `s + 1` forwards what step `s` received: its first
/// `k` bytes may go as soon as the first `k` received bytes of step `s` are merged. So steps
/// overlap at byte granularity instead of waiting for each other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Transfer {
    /// Index of the channel this lane sends on, if it sends.
    pub(crate) tx: Option<usize>,
    /// Index of the channel this lane receives on, if it receives.
    pub(crate) rx: Option<usize>,
    pub(crate) steps: Vec<Step>,
    /// The most bytes handed to the link at once.
    pub(crate) frame: usize,
    /// Step `s` receives into the span step `s` sends from (reduce-scatter's accumulator): each
    /// received byte waits until the byte it overwrites has been sent.
    pub(crate) merge_after_send: bool,
}

impl Transfer {
    /// A lane of `steps` over `tx` and `rx`, `frame` bytes at a time, whose received bytes are
    /// merged as they arrive.
    pub(crate) fn new(
        tx: Option<usize>,
        rx: Option<usize>,
        steps: Vec<Step>,
        frame: usize,
    ) -> Transfer {
        Transfer {
            tx,
            rx,
            steps,
            frame,
            merge_after_send: false,
        }
    }
}

/// Everything one call moves.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Plan {
    pub(crate) transfers: Vec<Transfer>,
    /// Channels that carry this call's header both ways even if no lane sends or receives on
    /// them, so that every neighbour of a rank that called something else notices.
    pub(crate) headers_both_ways: Vec<usize>,
    /// Channels that carry only this call's header out, with nothing expected back.
    pub(crate) headers_out: Vec<usize>,
}

impl Plan {
    /// Whether this plan receives anything on `channel`: data, or the peer's header.
    pub(crate) fn receives_on(&self, channel: usize) -> bool {
        self.transfers.iter().any(|t| t.rx == Some(channel))
            || self.headers_both_ways.contains(&channel)
    }

    /// The channels this plan's lanes send or receive on.
    pub(crate) fn channels(&self) -> impl Iterator<Item = usize> + '_ {
        self.transfers
            .iter()
            .flat_map(|t| t.tx.into_iter().chain(t.rx))
    }

    /// This call's header alone on every channel this plan sends on or exchanges headers
    /// over, nothing received: for a rank that fails before a step whose peers expect its
    /// header, so they can check it.
    pub(crate) fn announcement(&self) -> Plan {
        let senders = self.transfers.iter().filter_map(|t| t.tx);
        Plan {
            headers_out: senders
                .chain(self.headers_both_ways.iter().copied())
                .collect(),
            ..Plan::default()
        }
    }
}
