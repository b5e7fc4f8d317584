//! Host and device files in the formats of `mlx.launch` / `mlx.distributed_config`.
//!
//! A hostfile is a JSON list of hosts, or an object `{"backend": ..., "envs": [...], "hosts":
//! [...]}`. A host is `{"ssh": "name", "ips": ["10.0.0.1"], "rdma": [null, "rdma_en5", ...]}`
//! (`ips` and `rdma` optional); `rdma[j]` names the local RDMA device cabled to rank j (a list
//! for several wires), `null` where there is none and at the host's own index. Instead of
//! `ssh`, `"netns": "name"` runs the host's ranks on this machine inside that network namespace
//! (a pretend host, as `scripts/pretend-hosts.sh` makes them).
//!
//! A device file (`MLX_IBV_DEVICES`) is the N × N matrix of those `rdma` lists
//! ([`DeviceMatrix`], which also checks the hosts' lists).
//!
//! Every problem is reported with the file, the entry and what is wrong.

use std::path::Path;

use jaccl::DeviceMatrix;
use serde_json::Value;

/// One host of a hostfile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostEntry {
    /// How its ranks are started.
    pub(crate) place: Place,
    /// Addresses of this host; the first is where other hosts reach it.
    pub(crate) ips: Vec<String>,
}

/// Where a host's ranks run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Place {
    /// Over `ssh` to this destination (`host` or `user@host`).
    Ssh(String),
    /// On this machine, inside this network namespace (`ip netns exec`).
    Netns(String),
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Ssh(dest) => write!(f, "ssh {dest}"),
            Place::Netns(name) => write!(f, "netns {name}"),
        }
    }
}

/// A parsed hostfile.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Hostfile {
    pub(crate) hosts: Vec<HostEntry>,
    pub(crate) backend: Option<String>,
    /// `KEY=VALUE` pairs for every rank.
    pub(crate) envs: Vec<(String, String)>,
    /// The hosts' `rdma` lists, when they have them.
    pub(crate) devices: Option<DeviceMatrix>,
}

/// What a JSON file turned out to be.
#[derive(Debug)]
pub(crate) enum Parsed {
    Hostfile(Hostfile),
    /// An N × N device matrix.
    Devices(DeviceMatrix),
}

/// Reads `path` as a hostfile or a device file (by its shape).
///
/// # Errors
/// Every problem found, each naming the file and the entry.
pub(crate) fn read(path: &Path) -> Result<Parsed, Vec<String>> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| vec![format!("{name}: {e}")])?;
    let value: Value =
        serde_json::from_str(&text).map_err(|e| vec![format!("{name}: not valid JSON: {e}")])?;
    let is_matrix = value
        .as_array()
        .is_some_and(|rows| !rows.is_empty() && rows.iter().all(Value::is_array));
    if is_matrix {
        DeviceMatrix::from_value(&value)
            .map(Parsed::Devices)
            .map_err(|errors| errors.iter().map(|e| format!("{name}: {e}")).collect())
    } else {
        hostfile(&name, &value).map(Parsed::Hostfile)
    }
}

/// Reads `path`, which must be a hostfile.
///
/// # Errors
/// As [`read`], or when the file is a device file.
pub(crate) fn read_hostfile(path: &Path) -> Result<Hostfile, Vec<String>> {
    match read(path)? {
        Parsed::Hostfile(h) => Ok(h),
        Parsed::Devices(_) => Err(vec![format!(
            "{}: this is a device matrix (MLX_IBV_DEVICES), not a hostfile: expected a list of \
             {{\"ssh\": ..., \"ips\": [...]}} objects",
            path.display()
        )]),
    }
}

fn hostfile(name: &str, value: &Value) -> Result<Hostfile, Vec<String>> {
    let mut errors = Vec::new();
    let mut file = Hostfile::default();
    let hosts = match value {
        Value::Array(hosts) => hosts.as_slice(),
        Value::Object(obj) => {
            for key in obj.keys() {
                if !["backend", "envs", "hosts"].contains(&key.as_str()) {
                    errors.push(format!(
                        "{name}: unknown key \"{key}\" (expected backend, envs, hosts)"
                    ));
                }
            }
            match obj.get("backend") {
                None | Some(Value::Null) => {}
                Some(Value::String(b)) => file.backend = Some(b.clone()),
                Some(other) => errors.push(format!(
                    "{name}: \"backend\" must be a string, found {}",
                    kind(other)
                )),
            }
            match obj.get("envs") {
                None | Some(Value::Null) => {}
                Some(Value::Array(envs)) => {
                    for (i, e) in envs.iter().enumerate() {
                        match e.as_str().map(parse_env) {
                            Some(Ok(kv)) => file.envs.push(kv),
                            Some(Err(why)) => errors.push(format!("{name}: envs[{i}]: {why}")),
                            None => errors.push(format!(
                                "{name}: envs[{i}] must be a \"KEY=VALUE\" string, found {}",
                                kind(e)
                            )),
                        }
                    }
                }
                Some(other) => errors.push(format!(
                    "{name}: \"envs\" must be a list of \"KEY=VALUE\" strings, found {}",
                    kind(other)
                )),
            }
            match obj.get("hosts") {
                Some(Value::Array(hosts)) => hosts.as_slice(),
                Some(other) => {
                    errors.push(format!(
                        "{name}: \"hosts\" must be a list of hosts, found {}",
                        kind(other)
                    ));
                    &[]
                }
                None => {
                    errors.push(format!("{name}: \"hosts\" is missing"));
                    &[]
                }
            }
        }
        other => {
            return Err(vec![format!(
                "{name}: expected a list of hosts or an object with \"hosts\", found {}",
                kind(other)
            )]);
        }
    };
    if hosts.is_empty() && errors.is_empty() {
        errors.push(format!("{name}: the file lists no hosts"));
    }
    let mut rdma_rows = Vec::new();
    for (i, h) in hosts.iter().enumerate() {
        let at = format!("{name}: host {i}");
        let Some(obj) = h.as_object() else {
            errors.push(format!(
                "{at}: expected an object like {{\"ssh\": \"host\", \"ips\": [...]}}, found {}",
                kind(h)
            ));
            continue;
        };
        for key in obj.keys() {
            if !["ssh", "netns", "ips", "rdma"].contains(&key.as_str()) {
                errors.push(format!(
                    "{at}: unknown key \"{key}\" (expected ssh or netns, ips, rdma)"
                ));
            }
        }
        let mut name_of = |key: &str| match obj.get(key) {
            Some(Value::String(s)) if !s.trim().is_empty() => Some(s.trim().to_string()),
            Some(Value::String(_)) => {
                errors.push(format!("{at}: \"{key}\" is empty"));
                Some(String::new())
            }
            Some(other) => {
                errors.push(format!(
                    "{at}: \"{key}\" must be a string, found {}",
                    kind(other)
                ));
                Some(String::new())
            }
            None => None,
        };
        let place = match (name_of("ssh"), name_of("netns")) {
            (Some(dest), None) => Place::Ssh(dest),
            (None, Some(name)) => Place::Netns(name),
            (Some(dest), Some(_)) => {
                errors.push(format!(
                    "{at}: \"ssh\" and \"netns\" both given: one host, one place"
                ));
                Place::Ssh(dest)
            }
            (None, None) => {
                errors.push(format!(
                    "{at}: \"ssh\" is missing (or \"netns\", for a pretend host)"
                ));
                Place::Ssh(String::new())
            }
        };
        let ips = match obj.get("ips") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(ips)) => ips
                .iter()
                .enumerate()
                .filter_map(|(j, ip)| match ip.as_str() {
                    Some(s) if s.parse::<std::net::IpAddr>().is_ok() => Some(s.to_string()),
                    Some(s) => {
                        errors.push(format!("{at}: ips[{j}] \"{s}\" is not an IP address"));
                        None
                    }
                    None => {
                        errors.push(format!(
                            "{at}: ips[{j}] must be a string, found {}",
                            kind(ip)
                        ));
                        None
                    }
                })
                .collect(),
            Some(other) => {
                errors.push(format!(
                    "{at}: \"ips\" must be a list of addresses, found {}",
                    kind(other)
                ));
                Vec::new()
            }
        };
        if matches!(place, Place::Netns(_)) && ips.is_empty() {
            errors.push(format!(
                "{at}: a \"netns\" host needs \"ips\": where the other hosts reach it"
            ));
        }
        if let Some(first) = file.hosts.first()
            && std::mem::discriminant(&first.place) != std::mem::discriminant(&place)
        {
            errors.push(format!(
                "{at}: hosts reached over ssh and pretend hosts (\"netns\") cannot reach each \
                 other: use one kind"
            ));
        }
        rdma_rows.push(obj.get("rdma").cloned().unwrap_or(Value::Null));
        file.hosts.push(HostEntry { place, ips });
    }
    if rdma_rows.iter().any(|r| !r.is_null()) {
        match DeviceMatrix::from_value(&Value::Array(rdma_rows)) {
            Ok(m) => file.devices = Some(m),
            Err(problems) => errors.extend(
                problems
                    .iter()
                    .map(|p| format!("{name}: the hosts' \"rdma\" lists as a device matrix: {p}")),
            ),
        }
    }
    if errors.is_empty() {
        Ok(file)
    } else {
        Err(errors)
    }
}

/// `KEY=VALUE` with a shell-safe key.
pub(crate) fn parse_env(s: &str) -> Result<(String, String), String> {
    let (k, v) = s.split_once('=').unwrap_or((s, ""));
    let valid = !k.is_empty()
        && !k.starts_with(|c: char| c.is_ascii_digit())
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if valid {
        Ok((k.to_string(), v.to_string()))
    } else {
        Err(format!(
            "\"{s}\": the name before '=' must be letters, digits and '_' (not starting with a digit)"
        ))
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Parsed, Vec<String>> {
        let dir =
            std::env::temp_dir().join(format!("jaccl-hostfile-{}", crate::launch::random_number()));
        std::fs::write(&dir, text).unwrap();
        let r = read(&dir);
        let _ = std::fs::remove_file(&dir);
        r
    }

    fn errors(text: &str) -> String {
        match parse(text) {
            Err(e) => e.join("\n"),
            Ok(p) => panic!("expected errors, got {p:?}"),
        }
    }

    #[test]
    fn list_and_object_forms() {
        let Ok(Parsed::Hostfile(h)) = parse(r#"[{"ssh": "a", "ips": ["10.0.0.1"]}, {"ssh": "b"}]"#)
        else {
            panic!()
        };
        assert_eq!(h.hosts.len(), 2);
        assert_eq!(h.hosts[0].ips, ["10.0.0.1"]);
        assert_eq!(h.hosts[1].place, Place::Ssh("b".into()));
        let Ok(Parsed::Hostfile(h)) = parse(r#"[{"netns": "h0", "ips": ["10.7.0.1"]}]"#) else {
            panic!()
        };
        assert_eq!(h.hosts[0].place, Place::Netns("h0".into()));
        let Ok(Parsed::Hostfile(h)) = parse(
            r#"{"backend": "jaccl-ring", "envs": ["A=1", "B"], "hosts": [
                {"ssh": "a", "ips": ["10.0.0.1"], "rdma": [null, ["rdma_en5", "rdma_en6"]]},
                {"ssh": "b", "ips": [], "rdma": ["rdma_en3", null]}]}"#,
        ) else {
            panic!()
        };
        assert_eq!(h.backend.as_deref(), Some("jaccl-ring"));
        assert_eq!(
            h.envs,
            [("A".into(), "1".into()), ("B".into(), String::new())]
        );
        let devices = h.devices.unwrap();
        assert_eq!(devices.devices(0, 1), ["rdma_en5", "rdma_en6"]);
        assert_eq!(devices.devices(1, 0), ["rdma_en3"]);
    }

    #[test]
    fn problems_name_the_entry_and_what_is_wrong() {
        let e = errors(r#"[{"ssh": "a"}, {"ips": ["x"]}]"#);
        assert!(e.contains("host 1: \"ssh\" is missing"), "{e}");
        assert!(
            e.contains("host 1: ips[0] \"x\" is not an IP address"),
            "{e}"
        );
        let e = errors(r#"[{"ssh": "a", "netns": "b"}, {"netns": 3}]"#);
        assert!(
            e.contains("host 0: \"ssh\" and \"netns\" both given"),
            "{e}"
        );
        assert!(e.contains("host 1: \"netns\" must be a string"), "{e}");
        let e = errors(r#"[{"netns": "h0"}]"#);
        assert!(e.contains("host 0: a \"netns\" host needs \"ips\""), "{e}");
        let e = errors(r#"[{"netns": "h0", "ips": ["10.7.0.1"]}, {"ssh": "b"}]"#);
        assert!(
            e.contains("host 1: hosts reached over ssh and pretend hosts"),
            "{e}"
        );
        let e = errors(r#"{"hosts": [{"ssh": "a", "rdma": ["rdma_en1"]}]}"#);
        assert!(
            e.contains("the hosts' \"rdma\" lists as a device matrix: [0][0]: a rank has no device to itself"),
            "{e}"
        );
        let e = errors(r#"{"hosts": [{"ssh": "a", "rdma": [null]}, {"ssh": "b", "rdma": 7}]}"#);
        assert!(e.contains("[1]: row 1 must be a list"), "{e}");
        let e = errors(r#"{"hosts": 3, "colour": "red"}"#);
        assert!(
            e.contains("unknown key \"colour\"") && e.contains("\"hosts\" must be a list"),
            "{e}"
        );
        let e = errors(r#"{"hosts": [{"ssh": "a"}], "envs": ["1X=2"]}"#);
        assert!(e.contains("envs[0]"), "{e}");
        assert!(errors("[1, 2").contains("not valid JSON"));
        assert!(errors("[]").contains("no hosts"));
    }

    #[test]
    fn device_matrices() {
        let Ok(Parsed::Devices(m)) = parse(r#"[[null, "a"], ["b", null]]"#) else {
            panic!()
        };
        assert_eq!(
            m.topology().as_deref(),
            Ok("mesh (every pair of ranks is cabled)")
        );
        let Ok(Parsed::Devices(m)) = parse(
            r#"[[null, "a", null, "b"], ["a", null, "b", null], [null, "a", null, "b"], ["a", null, "b", null]]"#,
        ) else {
            panic!()
        };
        assert_eq!(m.topology().as_deref(), Ok("ring, 1 wire"));
        let e = errors(r#"[[null, "a"], ["b"]]"#);
        assert!(e.contains("[1]: row 1 has 1 entries"), "{e}");
        let e = errors(r#"[["self", "a"], ["b", null]]"#);
        assert!(e.contains("[0][0]: a rank has no device to itself"), "{e}");
    }
}
