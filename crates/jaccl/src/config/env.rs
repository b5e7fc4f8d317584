//! [`Config::from_env`]: the configuration from environment variables, jaccl's own and those
//! of the launchers it runs under (see the table of the module `config`).

use std::str::FromStr;

use super::devices::DeviceMatrix;
use super::parse::{join_host_port, parse_duration};
use super::{Config, Topology};
use crate::error::{Error, Result};
use crate::token::JobToken;

impl Config {
    /// Reads the configuration from the environment; see the [module docs](crate::config) for the
    /// variables and their precedence.
    ///
    /// # Errors
    /// [`Error::Config`] naming the variable and value when a value does not parse, or when a
    /// rank is set without a size (or the reverse).
    pub fn from_env() -> Result<Config> {
        Config::from_lookup(env_var)
    }

    /// [`Config::from_env`], where `overrides` (variable name → value, e.g. `JACCL_WIRES` →
    /// `2`) take precedence over the environment: settings given in code, read with the
    /// environment's rules and errors (the Python bindings' `jaccl.init(wires=2)`).
    ///
    /// # Errors
    /// As [`Config::from_env`].
    pub fn from_env_with(overrides: &std::collections::HashMap<String, String>) -> Result<Config> {
        Config::from_lookup(|name| match overrides.get(name) {
            Some(value) => Ok(Some(value.clone())),
            None => env_var(name),
        })
    }

    /// [`Config::from_env`] over any variable lookup (tests use a map).
    pub(crate) fn from_lookup(lookup: impl Fn(&str) -> Result<Option<String>>) -> Result<Config> {
        let env = Env { lookup };
        let join = match env.get("JACCL_JOIN")? {
            Some(value) => Some(
                value
                    .parse()
                    .map_err(|e: Error| Error::Config(format!("JACCL_JOIN: {}", e.detail())))?,
            ),
            None => None,
        };
        // A process that joins a running group gets its rank and size from the group; the
        // launcher's variables describe the job as it started.
        let (rank, size) = match join {
            Some(_) => (None, None),
            None => (env.first(&RANK_VARIABLES)?, env.first(&SIZE_VARIABLES)?),
        };
        let (rank, size) = match (rank, size) {
            (None, None) => (0, 1),
            (Some((var, value)), None) => {
                return Err(Error::Config(format!(
                    "{var}={value} sets a rank but no variable sets the size; set JACCL_SIZE \
                     (or WORLD_SIZE)"
                )));
            }
            (None, Some((var, value))) => {
                return Err(Error::Config(format!(
                    "{var}={value} sets a size but no variable sets the rank; set JACCL_RANK \
                     (or RANK)"
                )));
            }
            (Some((rvar, rval)), Some((svar, sval))) => {
                let size: usize = parse_number(svar, &sval, "a size")?;
                if size > Config::MAX_SIZE {
                    return Err(Error::Config(format!(
                        "{svar}={sval}: above the largest group jaccl supports ({})",
                        Config::MAX_SIZE
                    )));
                }
                (parse_number(rvar, &rval, "a rank")?, size)
            }
        };
        let mut cfg = Config::new(rank, size);
        cfg.join = join;
        cfg.coordinator = match env.first(&["JACCL_COORDINATOR", "MLX_JACCL_COORDINATOR"])? {
            Some((_, addr)) => Some(addr),
            None => match (env.get("MASTER_ADDR")?, env.get("MASTER_PORT")?) {
                (Some(host), Some(port)) => {
                    let mut port = parse_number::<u16>("MASTER_PORT", &port, "a port")?;
                    // Under torchrun, its agent serves its own store on MASTER_PORT.
                    if env
                        .get("TORCHELASTIC_USE_AGENT_STORE")?
                        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
                    {
                        port = port.checked_add(1).ok_or_else(|| {
                            Error::Config(format!(
                                "MASTER_PORT={port} is torchrun's and jaccl uses the next port, \
                                 but there is none; set JACCL_COORDINATOR"
                            ))
                        })?;
                    }
                    Some(join_host_port(&host, &port.to_string()))
                }
                (Some(host), None) => {
                    return Err(Error::Config(format!(
                        "MASTER_ADDR={host} is set but MASTER_PORT is not"
                    )));
                }
                (None, Some(port)) => {
                    return Err(Error::Config(format!(
                        "MASTER_PORT={port} is set but MASTER_ADDR is not"
                    )));
                }
                (None, None) => None,
            },
        };
        if let Some(value) = env.get("JACCL_TOPOLOGY")? {
            cfg.topology = parse_with("JACCL_TOPOLOGY", &value)?;
        } else if env.present("JACCL_RING")? || env.present("MLX_JACCL_RING")? {
            cfg.topology = Topology::Ring;
        }
        if let Some(value) = env.get("JACCL_TRANSPORT")? {
            cfg.transport = parse_with("JACCL_TRANSPORT", &value)?;
        }
        if let Some(value) = env.get("JACCL_WIRES")? {
            let wires = parse_number("JACCL_WIRES", &value, "a number of wires")?;
            if !(1..=Config::MAX_WIRES).contains(&wires) {
                return Err(Error::Config(format!(
                    "JACCL_WIRES={value}: must be 1 to {}",
                    Config::MAX_WIRES
                )));
            }
            cfg.wires = Some(wires);
        }
        if let Some(value) = env.get("JACCL_LINK")? {
            cfg.link = Some(parse_with("JACCL_LINK", &value)?);
        }
        for (var, field) in [
            ("JACCL_TIMEOUT", &mut cfg.timeout),
            ("JACCL_STARTUP_TIMEOUT", &mut cfg.startup_timeout),
            ("JACCL_LIVENESS", &mut cfg.liveness),
        ] {
            if let Some(value) = env.get(var)? {
                *field = parse_duration(&value)
                    .map_err(|why| Error::Config(format!("{var}={value}: {why}")))?;
            }
        }
        if let Some(value) = env.get("JACCL_WAIT")?
            && !value.eq_ignore_ascii_case("auto")
        {
            cfg.wait = Some(parse_with("JACCL_WAIT", &value)?);
        }
        cfg.host_id = env.get("JACCL_HOST_ID")?;
        cfg.rdma_library = env.get("JACCL_IBVERBS")?;
        if let Some((var, value)) = env.first(&["JACCL_IBV_DEVICES", "MLX_IBV_DEVICES"])? {
            let text = if value.starts_with('[') {
                value.clone()
            } else {
                std::fs::read_to_string(&value).map_err(|e| {
                    Error::Config(format!("{var}={value}: cannot read the device file: {e}"))
                })?
            };
            let matrix = DeviceMatrix::from_json(&text)
                .map_err(|errors| Error::Config(format!("{var}={value}: {}", errors.join("; "))))?;
            cfg.devices = Some(matrix);
        }
        // The token's value never appears in an error.
        if let Some(value) = env.get("JACCL_JOB_TOKEN")? {
            cfg.job_token = Some(
                JobToken::new(&value)
                    .map_err(|e| Error::Config(format!("JACCL_JOB_TOKEN: {}", e.detail())))?,
            );
        } else if let Some(path) = env.get("JACCL_JOB_TOKEN_FILE")? {
            let secret = std::fs::read_to_string(&path).map_err(|e| {
                Error::Config(format!("JACCL_JOB_TOKEN_FILE={path}: cannot read it: {e}"))
            })?;
            cfg.job_token = Some(JobToken::new(secret.trim_end()).map_err(|e| {
                Error::Config(format!("JACCL_JOB_TOKEN_FILE={path}: {}", e.detail()))
            })?);
        }
        let mut job = String::new();
        for var in JOB_ID_VARIABLES {
            if let Some(value) = env.raw(var)? {
                job += &format!(" {var}={value}");
            }
        }
        cfg.launcher_job = (!job.is_empty()).then_some(job);
        Ok(cfg)
    }
}

/// The variables that give a process its rank, in order of precedence. A process where one of
/// them is set was started by a launcher.
pub const RANK_VARIABLES: [&str; 6] = [
    "JACCL_RANK",
    "MLX_RANK",
    "RANK",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "SLURM_PROCID",
];
/// The variables that give the group size, in order of precedence.
pub const SIZE_VARIABLES: [&str; 5] = [
    "JACCL_SIZE",
    "WORLD_SIZE",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_SIZE",
    "SLURM_NTASKS",
];

/// Variable lookup where an empty value counts as unset.
/// The environment variable `name`, if set.
fn env_var(name: &str) -> Result<Option<String>> {
    match std::env::var(name) {
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => Err(Error::Config(format!(
            "{name}={} is not valid UTF-8",
            v.to_string_lossy()
        ))),
    }
}

struct Env<F> {
    lookup: F,
}

impl<F: Fn(&str) -> Result<Option<String>>> Env<F> {
    fn get(&self, name: &str) -> Result<Option<String>> {
        Ok((self.lookup)(name)?
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty()))
    }

    /// The value as set, untrimmed, even empty.
    fn raw(&self, name: &str) -> Result<Option<String>> {
        (self.lookup)(name)
    }

    /// Set at all, even to an empty value (MLX's `MLX_JACCL_RING` convention).
    fn present(&self, name: &str) -> Result<bool> {
        Ok((self.lookup)(name)?.is_some())
    }

    fn first<'a>(&self, names: &[&'a str]) -> Result<Option<(&'a str, String)>> {
        for name in names {
            if let Some(value) = self.get(name)? {
                return Ok(Some((name, value)));
            }
        }
        Ok(None)
    }
}

fn parse_number<T: FromStr>(var: &str, value: &str, what: &str) -> Result<T> {
    value.parse().map_err(|_| {
        Error::Config(format!(
            "{var}={value} is not {what} (expected a non-negative integer)"
        ))
    })
}

fn parse_with<T: FromStr<Err = String>>(var: &str, value: &str) -> Result<T> {
    value
        .parse()
        .map_err(|why| Error::Config(format!("{var}={value}: {why}")))
}

/// Variables that identify a launcher's job, mixed into the token derived when none is set.
pub const JOB_ID_VARIABLES: [&str; 6] = [
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "PMIX_NAMESPACE",
    "OMPI_MCA_ess_base_jobid",
];

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use std::time::Duration;

    use super::*;
    use crate::config::{LinkSpeed, Transport};
    use crate::wait::WaitPolicy;

    fn from(vars: &[(&str, &str)]) -> Result<Config> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|name| Ok(map.get(name).cloned()))
    }

    fn config_error(vars: &[(&str, &str)]) -> String {
        match from(vars) {
            Err(Error::Config(msg)) => msg,
            other => panic!("expected a Config error, got {other:?}"),
        }
    }

    #[test]
    fn nothing_set_is_a_single_rank() {
        let cfg = from(&[]).unwrap();
        assert_eq!((cfg.rank, cfg.size), (0, 1));
        cfg.validate().unwrap();
    }

    #[test]
    fn jaccl_names_win_over_mlx_torch_and_mpi() {
        let cfg = from(&[
            ("JACCL_RANK", "2"),
            ("MLX_RANK", "3"),
            ("RANK", "1"),
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("JACCL_SIZE", "4"),
            ("WORLD_SIZE", "8"),
            ("JACCL_COORDINATOR", "10.0.0.1:5000"),
            ("MLX_JACCL_COORDINATOR", "10.0.0.2:5000"),
            ("MASTER_ADDR", "10.0.0.3"),
            ("MASTER_PORT", "6000"),
        ])
        .unwrap();
        assert_eq!((cfg.rank, cfg.size), (2, 4));
        assert_eq!(cfg.coordinator.as_deref(), Some("10.0.0.1:5000"));
    }

    #[test]
    fn torchrun_mpi_pmi_slurm_variables() {
        let cfg = from(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "::1"),
            ("MASTER_PORT", "29500"),
        ])
        .unwrap();
        assert_eq!((cfg.rank, cfg.size), (1, 2));
        assert_eq!(cfg.coordinator.as_deref(), Some("[::1]:29500"));
        cfg.validate().unwrap();
        for (r, s) in [
            ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
            ("PMI_RANK", "PMI_SIZE"),
            ("SLURM_PROCID", "SLURM_NTASKS"),
        ] {
            let cfg = from(&[(r, "3"), (s, "5")]).unwrap();
            assert_eq!((cfg.rank, cfg.size), (3, 5), "{r}/{s}");
        }
    }

    #[test]
    fn under_torchrun_the_coordinator_is_the_port_after_its_store() {
        let cfg = from(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "localhost"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ])
        .unwrap();
        assert_eq!(cfg.coordinator.as_deref(), Some("localhost:29501"));
        let msg = config_error(&[
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "65535"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ]);
        assert!(msg.contains("MASTER_PORT=65535"), "{msg}");
    }

    #[test]
    fn mlx_names() {
        let cfg = from(&[
            ("MLX_RANK", "1"),
            ("JACCL_SIZE", "3"),
            ("MLX_JACCL_COORDINATOR", "127.0.0.1:7"),
            ("MLX_JACCL_RING", ""),
        ])
        .unwrap();
        assert_eq!((cfg.rank, cfg.size), (1, 3));
        assert_eq!(cfg.topology, Topology::Ring);
        assert_eq!(cfg.coordinator.as_deref(), Some("127.0.0.1:7"));
    }

    #[test]
    fn bad_values_name_the_variable_and_value() {
        let msg = config_error(&[("JACCL_RANK", "abc"), ("JACCL_SIZE", "2")]);
        assert!(msg.contains("JACCL_RANK=abc"), "{msg}");
        let msg = config_error(&[("JACCL_WIRES", "7")]);
        assert!(msg.contains("JACCL_WIRES=7"), "{msg}");
        let msg = config_error(&[("JACCL_TIMEOUT", "soon")]);
        assert!(msg.contains("JACCL_TIMEOUT=soon"), "{msg}");
        let msg = config_error(&[("JACCL_TIMEOUT", "-1")]);
        assert!(msg.contains("JACCL_TIMEOUT=-1"), "{msg}");
        let msg = config_error(&[("JACCL_TRANSPORT", "pigeon")]);
        assert!(msg.contains("JACCL_TRANSPORT=pigeon"), "{msg}");
        let msg = config_error(&[("JACCL_TOPOLOGY", "star")]);
        assert!(msg.contains("JACCL_TOPOLOGY=star"), "{msg}");
        let msg = config_error(&[("JACCL_RANK", "1")]);
        assert!(
            msg.contains("JACCL_RANK=1") && msg.contains("size"),
            "{msg}"
        );
        let msg = config_error(&[("WORLD_SIZE", "4")]);
        assert!(
            msg.contains("WORLD_SIZE=4") && msg.contains("rank"),
            "{msg}"
        );
        let msg = config_error(&[("MASTER_ADDR", "h")]);
        assert!(msg.contains("MASTER_PORT"), "{msg}");
        let msg = config_error(&[("MASTER_ADDR", "h"), ("MASTER_PORT", "x")]);
        assert!(msg.contains("MASTER_PORT=x"), "{msg}");
        let msg = config_error(&[("JACCL_LINK", "100Gb/s")]);
        assert!(msg.contains("JACCL_LINK=100Gb/s"), "{msg}");
        let msg = config_error(&[("JACCL_WAIT", "fast")]);
        assert!(msg.contains("JACCL_WAIT=fast"), "{msg}");
        let msg = config_error(&[("JACCL_JOB_TOKEN", "0xzz")]);
        assert!(
            msg.contains("JACCL_JOB_TOKEN") && !msg.contains("0xzz"),
            "{msg}"
        );
        let msg = config_error(&[("JACCL_JOB_TOKEN_FILE", "/nonexistent/token")]);
        assert!(msg.contains("/nonexistent/token"), "{msg}");
        let msg = config_error(&[("JACCL_RANK", "0"), ("JACCL_SIZE", "4294967297")]);
        assert!(msg.contains("4294967297"), "{msg}");
    }

    #[test]
    fn settings_parse() {
        let cfg = from(&[
            ("JACCL_WIRES", "3"),
            ("JACCL_TIMEOUT", "1.5"),
            ("JACCL_TRANSPORT", "TCP"),
            ("JACCL_TOPOLOGY", "ring"),
            ("JACCL_JOB_TOKEN", "0123456789abcdef"),
            ("JACCL_STARTUP_TIMEOUT", "500000000000y"),
            ("JACCL_LIVENESS", "off"),
            ("JACCL_WAIT", "spin=5us,yield=1ms"),
            ("JACCL_HOST_ID", "node-b"),
            ("JACCL_LINK", "10Gbit/s,5us"),
        ])
        .unwrap();
        assert_eq!(
            cfg.link,
            Some(LinkSpeed {
                latency: Duration::from_micros(5),
                bandwidth: 1_250_000_000
            })
        );
        assert_eq!(
            cfg.wait,
            Some(WaitPolicy {
                spin: Duration::from_micros(5),
                yield_for: Duration::from_millis(1)
            })
        );
        assert_eq!(cfg.host_id.as_deref(), Some("node-b"));
        assert_eq!(from(&[("JACCL_WAIT", "auto")]).unwrap().wait, None);
        assert_eq!(cfg.wires, Some(3));
        assert_eq!(cfg.timeout, Duration::from_millis(1500));
        assert_eq!(cfg.transport, Transport::Tcp);
        assert_eq!(cfg.topology, Topology::Ring);
        assert_eq!(cfg.job_token, JobToken::new("0123456789abcdef").ok());
        assert!(cfg.startup_timeout > Duration::from_secs(1 << 60));
        assert_eq!(cfg.liveness, Duration::MAX);
        assert_eq!(parse_duration("1e30"), Ok(Duration::MAX));
        let cfg = from(&[("JACCL_TIMEOUT", "250ms")]).unwrap();
        assert_eq!(cfg.timeout, Duration::from_millis(250));
        let cfg = from(&[("JACCL_RANK", ""), ("JACCL_SIZE", " ")]).unwrap();
        assert_eq!(cfg.size, 1, "empty values count as unset");
        // The launcher's job identity is read here, once; Config::new reads nothing.
        let cfg = from(&[("SLURM_JOB_ID", "7"), ("TORCHELASTIC_RUN_ID", "x")]).unwrap();
        assert_eq!(
            cfg.launcher_job.as_deref(),
            Some(" TORCHELASTIC_RUN_ID=x SLURM_JOB_ID=7")
        );
        assert_ne!(cfg.token(), Config::new(0, 1).token());
        assert_eq!(Config::new(0, 1).launcher_job, None);
    }
}
