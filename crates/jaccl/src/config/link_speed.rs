//! [`LinkSpeed`]: a link's latency and bandwidth, as a user states them (`100Gb/s,2us`), for
//! the cost model that chooses algorithms ([`crate::Config::link`](crate::Config#structfield.link))
//! and for `jaccl plan`.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// The speed of the links between ranks: what a message costs (the latency, α) and what a
/// byte costs (the bandwidth, 1/β). Parsed from `BANDWIDTH,LATENCY`: `100Gb/s,2us`,
/// `12.5GB/s,800ns` ([`parse_rate`], [`parse_latency`]).
///
/// ```
/// use jaccl::config::LinkSpeed;
/// let link: LinkSpeed = "100Gb/s,2us".parse().unwrap();
/// assert_eq!(link.bandwidth, 12_500_000_000);
/// assert_eq!(link.latency, std::time::Duration::from_micros(2));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LinkSpeed {
    /// From a message's send to its arrival, software included.
    pub latency: Duration,
    /// Bytes per second each way.
    pub bandwidth: u64,
}

impl LinkSpeed {
    /// TCP between the ranks of the 2-core machine jaccl is measured on (loopback), per rank:
    /// the latency of a message (an 8-byte all-reduce between 2 ranks, one swap: 3.3–3.5 µs)
    /// and the bandwidth of copies through the kernel that fits the all-reduces, all-gathers
    /// and all-to-alls of 4–64 ranks there (docs/algorithms.md, "The cost model").
    pub const MEASURED_LOOPBACK: LinkSpeed = LinkSpeed {
        latency: Duration::from_nanos(3500),
        bandwidth: 6_000_000_000,
    };

    /// A link through shared memory between two ranks of one host of that machine, as a ring
    /// uses it (each byte copied into an area and out of it): an all-reduce between 2 ranks
    /// moves 2 MiB in 1.7 ms, 8 bytes in 0.96 µs (docs/algorithms.md, "Shared memory").
    pub const MEASURED_SHARED_MEMORY: LinkSpeed = LinkSpeed {
        latency: Duration::from_nanos(1000),
        bandwidth: 1_300_000_000,
    };

    /// The latency in seconds.
    pub fn latency_seconds(&self) -> f64 {
        self.latency.as_secs_f64()
    }

    /// The bandwidth in bytes per second, at least 1.
    pub fn bytes_per_second(&self) -> f64 {
        self.bandwidth.max(1) as f64
    }
}

impl FromStr for LinkSpeed {
    type Err = String;

    fn from_str(s: &str) -> Result<LinkSpeed, String> {
        let (rate, latency) = s
            .split_once(',')
            .ok_or_else(|| format!("'{s}' is not BANDWIDTH,LATENCY (example: 100Gb/s,2us)"))?;
        let bandwidth = parse_rate(rate)?;
        Ok(LinkSpeed {
            latency: Duration::from_secs_f64(parse_latency(latency)?),
            // Whole bytes per second, so that ranks compare the figures exactly.
            bandwidth: (bandwidth.round() as u64).max(1),
        })
    }
}

/// Written in the largest unit that divides each figure exactly (`100Gb/s,2us`); whatever
/// [`LinkSpeed::from_str`] made parses back to the same figures.
impl fmt::Display for LinkSpeed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bits = u128::from(self.bandwidth) * 8;
        let (unit, prefix) = [(1_000_000_000, "G"), (1_000_000, "M"), (1_000, "k")]
            .into_iter()
            .find(|(unit, _)| bits.is_multiple_of(*unit))
            .unwrap_or((1, ""));
        let nanos = self.latency.as_nanos();
        let (per, name) = [(1_000_000, "ms"), (1_000, "us")]
            .into_iter()
            .find(|(unit, _)| nanos.is_multiple_of(*unit))
            .unwrap_or((1, "ns"));
        write!(f, "{}{prefix}b/s,{}{name}", bits / unit, nanos / per)
    }
}

/// Parses a rate in bits (`100Gb/s`, `10Gbit`) or bytes (`12.5GB/s`, `4GiB/s`, `2200000000B/s`)
/// per second, as bytes per second.
///
/// # Errors
/// A message saying why the value is not a positive rate.
pub fn parse_rate(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let t = t
        .strip_suffix("/s")
        .or_else(|| t.strip_suffix("ps"))
        .unwrap_or(t);
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    // `b` is bits, `B` bytes; `bit` in any case is bits (`GBit/s`).
    let unit = unit.trim();
    let (unit, bits) = if unit.to_ascii_lowercase().ends_with("bit") {
        (&unit[..unit.len() - 3], true)
    } else if let Some(prefix) = unit.strip_suffix('b') {
        (prefix, true)
    } else {
        (unit.strip_suffix('B').unwrap_or(unit), false)
    };
    let scale = match unit {
        "" => 1.0,
        "k" | "K" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        _ => {
            return Err(format!(
                "'{s}': unknown unit (examples: 100Gb/s, 12.5GB/s, 4GiB/s)"
            ));
        }
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("'{s}' is not a rate (examples: 100Gb/s, 12.5GB/s)"))?;
    let rate = value * scale / if bits { 8.0 } else { 1.0 };
    match rate.is_finite() && rate >= 1.0 {
        true => Ok(rate),
        false => Err(format!("'{s}': a rate must be at least 1 byte per second")),
    }
}

/// Parses a latency (`2us`, `1.5µs`, `800ns`, `0.1ms`) as seconds.
///
/// # Errors
/// A message saying why the value is not a latency with a unit, or is negative or too long.
pub fn parse_latency(s: &str) -> Result<f64, String> {
    let t = s.trim();
    if t.starts_with('-') {
        return Err(format!("'{s}': a latency must not be negative"));
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let scale = match unit.trim() {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        _ => {
            return Err(format!(
                "'{s}': a latency needs a unit (examples: 2us, 800ns)"
            ));
        }
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("'{s}' is not a latency (examples: 2us, 800ns)"))?;
    let seconds = value * scale;
    match seconds.is_finite() && (0.0..=3600.0).contains(&seconds) {
        true => Ok(seconds),
        false => Err(format!("'{s}': a latency must be 0 to an hour")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_parse_in_bits_or_bytes() {
        assert_eq!(parse_rate("100Gb/s"), Ok(12.5e9));
        assert_eq!(parse_rate("10Gbit"), Ok(1.25e9));
        assert_eq!(parse_rate("10GBit/s"), Ok(1.25e9));
        assert_eq!(parse_rate("10Gbps"), Ok(1.25e9));
        assert_eq!(parse_rate("4GiB"), Ok(4.0 * 1073741824.0));
        assert_eq!(parse_rate("2200000000"), Ok(2.2e9));
        assert_eq!(parse_rate("12.5GB/s"), Ok(12.5e9));
        assert_eq!(parse_rate("1GiB/s"), Ok(1073741824.0));
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("0Gb/s").is_err());
        assert_eq!(parse_latency("2us"), Ok(2e-6));
        assert_eq!(parse_latency("1.5µs"), Ok(1.5e-6));
        assert!(parse_latency("2").is_err());
        assert!(parse_latency("-1us").unwrap_err().contains("negative"));
        assert!(parse_latency("1e30s").is_err());
        let link: LinkSpeed = "100Gb/s, 2us".parse().unwrap();
        assert_eq!(link.bandwidth, 12_500_000_000);
        assert_eq!(link.latency, Duration::from_micros(2));
        assert!("100Gb/s".parse::<LinkSpeed>().is_err());
        // What Display writes parses back to the same figures.
        assert_eq!(link.to_string(), "100Gb/s,2us");
        for text in [
            "100Gb/s,2us",
            "2.2GB/s,7us",
            "12345B/s,1500ns",
            "1GiB/s,0ns",
        ] {
            let link: LinkSpeed = text.parse().unwrap();
            assert_eq!(link.to_string().parse::<LinkSpeed>(), Ok(link), "{text}");
        }
    }
}
