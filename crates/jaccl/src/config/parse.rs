//! Parsers of configuration values: durations, `host:port` addresses.

use std::time::Duration;

/// Parses a duration variable: seconds as a plain number (`30`, `2.5`), a duration with units
/// (`500ms`, `1m 30s`), or `off` / `none` / `never` for no limit (`Duration::MAX`). A number too
/// large to count also means no limit.
///
/// # Errors
/// A message saying why the value is not a positive duration.
pub fn parse_duration(value: &str) -> Result<Duration, String> {
    let value = value.trim();
    if ["off", "none", "never"]
        .iter()
        .any(|w| value.eq_ignore_ascii_case(w))
    {
        return Ok(Duration::MAX);
    }
    let duration = match value.parse::<f64>() {
        Ok(secs) if secs > 0.0 => Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX),
        Ok(_) => return Err("must be a positive number of seconds".into()),
        Err(_) => match humantime::parse_duration(value) {
            Ok(d) => d,
            Err(humantime::DurationError::NumberOverflow) => Duration::MAX,
            Err(e) => {
                return Err(format!(
                    "not a duration ({e}); use seconds (30, 2.5), units (500ms, 30s, 5m) or off"
                ));
            }
        },
    };
    if duration.is_zero() {
        return Err("must be greater than zero".into());
    }
    Ok(duration)
}

/// `host:port`, with an IPv6 host in brackets.
pub(crate) fn join_host_port(host: &str, port: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Splits `host:port` (or `[v6]:port`) into its parts, checking the port.
pub(crate) fn split_host_port(addr: &str) -> Result<(&str, u16), String> {
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or("expected host:port, e.g. 127.0.0.1:29500")?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err("the host is empty (expected host:port)".into());
    }
    let port = port
        .parse::<u16>()
        .map_err(|_| format!("'{port}' is not a port number (0 to 65535)"))?;
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_split() {
        assert_eq!(split_host_port("a.b:1"), Ok(("a.b", 1)));
        assert_eq!(split_host_port("[fe80::1]:22"), Ok(("fe80::1", 22)));
        assert!(split_host_port(":22").is_err());
    }
}
