//! The job's secret, which every connection proves knowledge of (`crate::auth`) and which
//! configuration carries (`crate::config`): below both.

use std::fmt;
use std::io;

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// A job's shared secret. Every connection of the job proves knowledge of it without sending
/// it; `Debug` never shows it.
///
/// Set it with `JACCL_JOB_TOKEN` (any string of at least [`JobToken::MIN_LEN`] bytes),
/// `JACCL_JOB_TOKEN_FILE`, or [`Config::job_token`](crate::Config::job_token); `jaccl launch`
/// makes a random one per job ([`JobToken::generate`]). Without one, the ranks derive a token
/// from their launcher's job identity, which keeps two jobs apart but is no secret.
#[derive(Clone, PartialEq, Eq)]
pub struct JobToken {
    key: [u8; 32],
    secret: bool,
}

impl JobToken {
    /// The shortest secret accepted: 16 bytes, 128 bits if random.
    pub const MIN_LEN: usize = 16;

    /// A token from a secret of at least [`JobToken::MIN_LEN`] bytes.
    ///
    /// # Errors
    /// [`Error::Config`] when the secret is shorter (the message does not show it).
    pub fn new(secret: impl AsRef<[u8]>) -> Result<JobToken> {
        let secret = secret.as_ref();
        if secret.len() < JobToken::MIN_LEN {
            return Err(Error::Config(format!(
                "the job token has {} bytes; it needs at least {} (e.g. `jaccl launch` makes \
                 64 random hex digits)",
                secret.len(),
                JobToken::MIN_LEN
            )));
        }
        Ok(JobToken::derive(b"jaccl job token\0", secret, true))
    }

    /// 256 random bits as 64 hex digits, for a new job's `JACCL_JOB_TOKEN`.
    ///
    /// # Errors
    /// [`Error::Io`] (rank 0) if the system's random number generator fails.
    pub fn generate() -> Result<String> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes)
            .map_err(|e| Error::io(0, "making a job token", io::Error::other(e.to_string())))?;
        Ok(hex(&bytes))
    }

    /// A token derived from public facts about the job (launcher ids, the coordinator
    /// address): it keeps jobs apart, and protects nothing.
    pub(crate) fn derived(identity: &str) -> JobToken {
        JobToken::derive(b"jaccl derived token\0", identity.as_bytes(), false)
    }

    fn derive(label: &[u8], material: &[u8], secret: bool) -> JobToken {
        let mut h = Sha256::new();
        h.update(label);
        h.update(material);
        JobToken {
            key: h.finalize().into(),
            secret,
        }
    }

    /// Whether the token came from a secret (rather than from public facts about the job).
    pub fn is_secret(&self) -> bool {
        self.secret
    }

    /// The HMAC of `parts` under this token's key, after `label` (the handshake's proofs).
    pub(crate) fn mac(&self, label: &[u8], parts: &[&[u8]]) -> Hmac<Sha256> {
        // HMAC takes keys of any length, so this never fails.
        let mut mac = match <Hmac<Sha256> as KeyInit>::new_from_slice(&self.key) {
            Ok(m) => m,
            Err(_) => <Hmac<Sha256> as KeyInit>::new(&Default::default()),
        };
        mac.update(label);
        for p in parts {
            mac.update(p);
        }
        mac
    }
}

impl fmt::Debug for JobToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.secret { "secret" } else { "derived" };
        write!(f, "JobToken({kind}, hidden)")
    }
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_tokens_are_refused_and_tokens_never_print() {
        assert!(JobToken::new("short").is_err());
        let t = JobToken::new("a sufficiently long passphrase").unwrap();
        assert!(!format!("{t:?}").contains("passphrase"));
        assert_eq!(JobToken::generate().unwrap().len(), 64);
        assert_ne!(JobToken::generate().unwrap(), JobToken::generate().unwrap());
        assert!(!JobToken::derived("job 7").is_secret());
    }
}
