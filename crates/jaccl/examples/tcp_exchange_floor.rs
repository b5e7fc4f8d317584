//! The floor of an 8-byte exchange over loopback TCP on this machine: two threads, each sends
//! 8 bytes, then busy-polls a non-blocking read for the other's 8 bytes, over and over. Nothing
//! else happens, so no library can exchange faster over the kernel's TCP; `jaccl bench -n 2
//! --transport tcp -b 8 -e 8` is the same pattern with jaccl's headers, plans and checks.
//!
//! `cargo run --release --example tcp_exchange_floor [one|two]`: over one connection both ways
//! (the default, as jaccl with two ranks), or one connection each way.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

const EXCHANGES: u32 = 200_000;

fn main() -> std::io::Result<()> {
    let two = match std::env::args().nth(1).as_deref() {
        None | Some("one") => false,
        Some("two") => true,
        Some(other) => {
            eprintln!("usage: tcp_exchange_floor [one|two] (not {other:?})");
            std::process::exit(2);
        }
    };
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let a_out = TcpStream::connect(addr)?;
    let b_in = listener.accept()?.0;
    let (a_in, b_out) = if two {
        let a_in = TcpStream::connect(addr)?;
        (a_in, listener.accept()?.0)
    } else {
        (a_out.try_clone()?, b_in.try_clone()?)
    };
    let other = std::thread::spawn(move || exchange(b_out, b_in));
    let mine = exchange(a_out, a_in)?;
    let theirs = other
        .join()
        .map_err(|_| std::io::Error::other("the other end panicked"))??;
    let how = if two {
        "one connection each way"
    } else {
        "one connection both ways"
    };
    println!("{how}: {mine:.2} µs and {theirs:.2} µs per 8-byte exchange (the two ends)");
    Ok(())
}

/// Runs the exchanges (a warm-up round, then a timed one); returns µs per exchange.
fn exchange(mut out: TcpStream, mut inbox: TcpStream) -> std::io::Result<f64> {
    out.set_nodelay(true)?;
    inbox.set_nonblocking(true)?;
    let (message, mut got) = ([0u8; 8], [0u8; 8]);
    let mut per_exchange = 0.0;
    for _round in 0..2 {
        let start = Instant::now();
        for _ in 0..EXCHANGES {
            out.write_all(&message)?;
            let mut have = 0;
            while have < got.len() {
                match inbox.read(&mut got[have..]) {
                    Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
                    Ok(n) => have += n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
        }
        per_exchange = start.elapsed().as_secs_f64() * 1e6 / f64::from(EXCHANGES);
    }
    Ok(per_exchange)
}
