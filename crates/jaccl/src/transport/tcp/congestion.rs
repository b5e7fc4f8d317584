//! Congestion control of data connections: Reno within this host from the first packet, the
//! system's default to other hosts.
//!
//! Over the loopback device there is no congestion to control, and the default may cost a lot:
//! this machine's is BBR, which (without the `fq` queueing discipline) paces each connection's
//! packets with timers. Switching a connection to Reno once it is open is not enough: BBR asks
//! the kernel to pace the socket when the connection opens, and that request outlives the
//! switch, so such a connection is still paced at what Reno's window over the measured round
//! trip allows. With many ranks per core, round trips include waits for the CPU and the pacing
//! stalls every core (64 ranks on 2 cores, broadcast of 4 MiB: 80% idle, 74–78 ms a call with
//! the switch; 58–60 ms with Reno from the start; docs/algorithms.md, "Congestion control
//! within a host"). So a data connection to this host's address is made from a socket set to
//! Reno before it connects, and the listeners of data connections are set to Reno (accepted
//! connections inherit it); a connection accepted from another host goes back to the system's
//! default when it becomes a link ([`choose`]).

use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::OnceLock;
use std::time::Duration;

/// The algorithm of connections within this host: always built in, and allowed without
/// privileges.
const WITHIN_HOST: &str = "reno";

/// A non-blocking listener of data connections on `addr`, set to Reno ([`choose`] restores the
/// default on connections from other hosts).
///
/// # Errors
/// The address cannot be bound.
pub(crate) fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let listener = crate::os::listen_tcp(addr)?;
    set(&listener, WITHIN_HOST);
    Ok(listener)
}

/// Connects to `addr` within `within`, from a socket set to Reno first when `addr` is this
/// host's.
///
/// # Errors
/// What connect(2) reports, or the timeout.
pub(crate) fn connect(addr: SocketAddr, within: Duration) -> io::Result<TcpStream> {
    let socket = socket_to(addr)?;
    socket.connect_timeout(&addr.into(), within)?;
    Ok(socket.into())
}

/// A TCP socket to connect to `addr`: set to Reno if `addr` is this host's.
fn socket_to(addr: SocketAddr) -> io::Result<socket2::Socket> {
    let domain = socket2::Domain::for_address(addr);
    let socket = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    if is_this_hosts(addr) {
        set(&socket, WITHIN_HOST);
    }
    Ok(socket)
}

/// Gives a data connection the algorithm for where its peer is: Reno within this host (a no-op
/// for connections made by [`connect`] or accepted by [`listen`]'s listener); to another host,
/// the system's default in place of the Reno it inherited from [`listen`]'s listener (an
/// algorithm other than Reno that a route gave it, `ip route ... congctl`, is kept).
pub(crate) fn choose(socket: &TcpStream) -> io::Result<()> {
    let (local, peer) = (socket.local_addr()?.ip(), socket.peer_addr()?.ip());
    if within_host(local, peer) {
        set(socket, WITHIN_HOST);
    } else if let Some(default) = system_default()
        && rustix::net::sockopt::tcp_congestion(socket).is_ok_and(|c| c == WITHIN_HOST)
    {
        set(socket, default);
    }
    Ok(())
}

/// Sets `algorithm` on `socket`. Not fatal: an administrator may have removed it from the
/// allowed algorithms, and the connection works with the one it has.
fn set(socket: &impl AsFd, algorithm: &str) {
    let current = rustix::net::sockopt::tcp_congestion(socket);
    if current.as_deref().is_ok_and(|c| c == algorithm) {
        return;
    }
    if let Err(e) = rustix::net::sockopt::set_tcp_congestion(socket, algorithm) {
        tracing::debug!(error = %e, algorithm, "keeping the congestion control");
    }
}

/// The system's default algorithm (what a new socket has), read once.
fn system_default() -> Option<&'static str> {
    static DEFAULT: OnceLock<Option<String>> = OnceLock::new();
    DEFAULT
        .get_or_init(|| {
            let socket = socket2::Socket::new(
                socket2::Domain::IPV4,
                socket2::Type::STREAM,
                Some(socket2::Protocol::TCP),
            )
            .ok()?;
            rustix::net::sockopt::tcp_congestion(&socket).ok()
        })
        .as_deref()
}

/// Whether a connection from `local` to `peer` stays within this host (over the loopback
/// device): the peer is a loopback address or our own.
fn within_host(local: IpAddr, peer: IpAddr) -> bool {
    peer.is_loopback() || peer == local
}

/// Whether `addr` is one of this host's addresses: a loopback one, or one a socket can bind to
/// (with its IPv6 scope: a link-local address binds only on its interface).
fn is_this_hosts(addr: SocketAddr) -> bool {
    let mut local = addr;
    local.set_port(0);
    addr.ip().is_loopback()
        || socket2::Socket::new(
            socket2::Domain::for_address(local),
            socket2::Type::STREAM,
            None,
        )
        .and_then(|s| s.bind(&local.into()))
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn algorithm(socket: &impl AsFd) -> String {
        rustix::net::sockopt::tcp_congestion(socket).unwrap()
    }

    #[test]
    fn only_connections_within_the_host_count_as_such() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(within_host(ip("127.0.0.1"), ip("127.0.0.1")));
        assert!(within_host(ip("127.0.0.1"), ip("127.0.0.2")));
        assert!(within_host(ip("::1"), ip("::1")));
        assert!(within_host(ip("10.0.0.1"), ip("10.0.0.1")));
        assert!(!within_host(ip("10.0.0.1"), ip("10.0.0.2")));
        assert!(!within_host(ip("fd00::1"), ip("fd00::2")));
        assert!(is_this_hosts("127.0.0.1:9".parse().unwrap()));
        assert!(is_this_hosts("[::1]:9".parse().unwrap()));
    }

    /// Reno is on the connecting socket before it connects, and on the accepted one as it comes
    /// out of accept(2) (inherited from the listener); `choose` keeps it. (Where the system's
    /// default is Reno, this cannot tell.)
    #[test]
    fn connections_within_the_host_are_reno_before_they_open() {
        let listener = listen("127.0.0.1:0".parse().unwrap()).unwrap();
        assert_eq!(algorithm(&listener), WITHIN_HOST);
        let addr = listener.local_addr().unwrap();
        let socket = socket_to(addr).unwrap();
        assert_eq!(algorithm(&socket), WITHIN_HOST);
        socket
            .connect_timeout(&addr.into(), Duration::from_secs(5))
            .unwrap();
        let connected: TcpStream = socket.into();
        listener.set_nonblocking(false).unwrap();
        let accepted = listener.accept().unwrap().0;
        for socket in [&connected, &accepted] {
            assert_eq!(algorithm(socket), WITHIN_HOST);
            choose(socket).unwrap();
            assert_eq!(algorithm(socket), WITHIN_HOST);
        }
    }
}
