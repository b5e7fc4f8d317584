//! What the entry points build and run: an [`Operation`] on the group, and its [`Kind`] (which
//! a batch needs).

/// An operation on the group, ready to run: it returns the sender of a receive from any
/// source, `None` otherwise. Boxed only to wait in a batch: a blocking call runs it as it is.
pub(crate) trait Operation:
    FnOnce(&mut jaccl::Group) -> jaccl::Result<Option<usize>> + Send + 'static
{
}

impl<F> Operation for F where
    F: FnOnce(&mut jaccl::Group) -> jaccl::Result<Option<usize>> + Send + 'static
{
}

/// What an operation is, for a batch: sends and receives wait for its end; anything else may
/// not be called inside one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Send,
    Recv,
    Other,
}
