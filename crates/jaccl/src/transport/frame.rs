//! Frames over a TCP stream: a little-endian `u32` length, then the payload; every read and
//! write ends by a deadline. The side channel (`crate::bootstrap`) and the job listener's
//! answers (`crate::transport::questions`) speak them.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Instant;

use crate::op_header::to_u32;
use crate::os::time_left;

/// Writes `payload` as one frame before `deadline`.
pub(crate) fn write_frame(
    stream: &mut TcpStream,
    payload: &[u8],
    deadline: Instant,
) -> io::Result<()> {
    stream.set_write_timeout(Some(time_left(deadline)?))?;
    let mut frame = Vec::with_capacity(4 + payload.len());
    frame.extend_from_slice(&to_u32(payload.len()).to_le_bytes());
    frame.extend_from_slice(payload);
    stream.write_all(&frame)
}

/// Reads one frame of at most `most` bytes before `deadline`.
pub(crate) fn read_frame(
    stream: &mut TcpStream,
    deadline: Instant,
    most: usize,
) -> io::Result<Vec<u8>> {
    stream.set_read_timeout(Some(time_left(deadline)?))?;
    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > most {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a message of {len} bytes is not jaccl's"),
        ));
    }
    let mut payload = vec![0u8; len];
    stream.set_read_timeout(Some(time_left(deadline)?))?;
    stream.read_exact(&mut payload)?;
    Ok(payload)
}
