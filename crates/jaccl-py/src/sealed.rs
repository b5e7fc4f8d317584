//! The sealed boxes that the torch backend's start-up passes the job secret in.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::exception;

/// An ephemeral X25519 key pair that a sealed box ([`seal`]) is opened with: the torch
/// backend's ranks receive the job secret from rank 0 in one, through a store that others
/// may read (python/jaccl/torch). The secret key never leaves this object.
#[pyclass(module = "jaccl._native", frozen)]
pub(crate) struct SealKey {
    secret: crypto_box::SecretKey,
}

#[pymethods]
impl SealKey {
    #[new]
    fn new() -> SealKey {
        SealKey {
            secret: crypto_box::SecretKey::generate(&mut crypto_box::aead::OsRng),
        }
    }

    /// The public key (32 bytes), to publish.
    #[getter]
    fn public<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.secret.public_key().as_bytes())
    }

    /// The message sealed for this key; `None` if `sealed` was not made by [`seal`] for it
    /// (or was changed since).
    fn open<'py>(&self, py: Python<'py>, sealed: &[u8]) -> Option<Bound<'py, PyBytes>> {
        let message = self.secret.unseal(sealed).ok()?;
        Some(PyBytes::new(py, &message))
    }
}

/// `message` in an anonymous sealed box for the holder of `public` (libsodium's
/// `crypto_box_seal`: an ephemeral X25519 key agreement, then XSalsa20-Poly1305), which
/// only its [`SealKey`] opens.
#[pyfunction]
pub(crate) fn seal<'py>(
    py: Python<'py>,
    public: &[u8],
    message: &[u8],
) -> PyResult<Bound<'py, PyBytes>> {
    let invalid = |why: &str| exception(py, "InvalidArgument", why.to_owned(), None, None, None);
    let public = crypto_box::PublicKey::from_slice(public)
        .map_err(|_| invalid("a public key has 32 bytes"))?;
    let sealed = public
        .seal(&mut crypto_box::aead::OsRng, message)
        .map_err(|_| invalid("the message cannot be sealed"))?;
    Ok(PyBytes::new(py, &sealed))
}
