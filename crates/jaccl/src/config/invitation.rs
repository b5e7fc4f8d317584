//! [`Invitation`]: what a new process needs to join a running group ([`crate::Group::grow`]).

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

use crate::error::{Error, Result};

/// An invitation to join a running group: where its rank 0 takes new processes in, and which
/// grow of which group they join. Every member of the group gets the same one from
/// [`crate::Group::invitation`]; a process given it (as `JACCL_JOIN`, or
/// [`crate::Config::join`](crate::Config#structfield.join)) and the job's token joins when the
/// members call [`crate::Group::grow`]. As text: `jaccl-join:ADDRESS/ID`, e.g.
/// `jaccl-join:10.0.0.1:40123/9f3a51c2d0e47b16`. It holds no secret: joining takes the job's
/// token, as every connection does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Invitation {
    address: SocketAddr,
    group: u64,
}

const PREFIX: &str = "jaccl-join:";

impl Invitation {
    pub(crate) fn new(address: SocketAddr, group: u64) -> Invitation {
        Invitation { address, group }
    }

    /// Where the group takes new processes in (the listener of its rank 0).
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The id of the group the grow makes.
    pub(crate) fn group(&self) -> u64 {
        self.group
    }
}

impl fmt::Display for Invitation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PREFIX}{}/{:016x}", self.address, self.group)
    }
}

impl FromStr for Invitation {
    type Err = Error;

    fn from_str(s: &str) -> Result<Invitation> {
        let bad = |why: &str| {
            Error::Config(format!(
                "{s:?} is not an invitation to join a group ({why}; expected \
                 {PREFIX}ADDRESS/ID, as Group::invitation gives)"
            ))
        };
        let rest = s
            .trim()
            .strip_prefix(PREFIX)
            .ok_or_else(|| bad("no prefix"))?;
        let (address, group) = rest.rsplit_once('/').ok_or_else(|| bad("no id"))?;
        let address = address.parse().map_err(|_| bad("a bad address"))?;
        let group = u64::from_str_radix(group, 16)
            .ok()
            .filter(|&g| g != 0 && group.len() == 16)
            .ok_or_else(|| bad("a bad id"))?;
        Ok(Invitation { address, group })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invitations_round_trip_as_text_and_bad_text_is_refused() {
        for address in ["10.0.0.1:40123", "[::1]:7", "[fe80::1%2]:65535"] {
            let invitation = Invitation::new(address.parse().unwrap(), 0x9f3a_51c2_d0e4_7b16);
            let text = invitation.to_string();
            assert_eq!(text.parse::<Invitation>().unwrap(), invitation, "{text}");
        }
        for bad in [
            "",
            "10.0.0.1:1/9f3a51c2d0e47b16",
            "jaccl-join:10.0.0.1/9f3a51c2d0e47b16",
            "jaccl-join:10.0.0.1:1",
            "jaccl-join:10.0.0.1:1/xyz",
            "jaccl-join:10.0.0.1:1/0000000000000000",
            "jaccl-join:10.0.0.1:1/9f3a",
        ] {
            let err = bad.parse::<Invitation>().unwrap_err().to_string();
            assert!(err.contains("not an invitation"), "{bad}: {err}");
        }
    }
}
