//! TCP: links ([`link`]), their congestion control ([`congestion`]), and opening them at a group's set-up with an authenticated
//! handshake ([`connector`]). Connections made after start-up come through the job's
//! listener (`crate::transport::listener`).

pub(crate) mod congestion;
pub(crate) mod connector;
pub(crate) mod link;
