//! The crate's error type and its record of component failures.

use nasd_client::ClientError;
use nasd_proto::layout::{ComponentState, Layout};
use nasd_proto::Status;
use std::ops::Range;
use std::sync::Arc;
use thiserror::Error;

/// Why one component could not serve its part of an operation.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum FailureCause {
    /// The manager marked it unusable for this: `Stale` (not read) or
    /// `Down` (neither read nor written). Not a failure seen by this
    /// operation; listed only when it makes an operation [`StripeError::Unavailable`].
    State(ComponentState),
    /// The caller asked not to use it (the component being rebuilt).
    Excluded,
    /// The drive did not answer within the request deadline (a wait of the
    /// connection that timed out first is a [`FailureCause::Drive`] error of
    /// kind `TimedOut`; [`FailureCause::is_time_out`] covers both).
    Deadline,
    /// The drive at the binding's address is not the drive it names.
    WrongDrive {
        /// The address.
        addr: String,
    },
    /// The connection or the drive failed the request: refused to connect,
    /// broke, refused with a status (`DATA_CORRUPTED` for rot found by the
    /// drive), or sent data that failed its check
    /// (`ClientError::HashAndMacMismatch`: rot or tampering).
    Drive(Arc<ClientError>),
}

impl FailureCause {
    /// The drive's status, if it refused.
    pub fn status(&self) -> Option<Status> {
        match self {
            FailureCause::Drive(e) => e.status(),
            _ => None,
        }
    }

    /// Whether the drive did not answer in time: the request's deadline
    /// passed, or one wait of the connection did (`DriveClient`'s own bound
    /// on each step, which names the drive and the step).
    pub fn is_time_out(&self) -> bool {
        match self {
            FailureCause::Deadline => true,
            FailureCause::Drive(e) => {
                matches!(&**e, ClientError::Io(io) if io.kind() == std::io::ErrorKind::TimedOut)
            }
            _ => false,
        }
    }

    /// Whether the failure says the component's stored bytes may be bad
    /// (rot): a `DATA_CORRUPTED` refusal, a Hash-and-MAC tag that failed,
    /// or a reply that failed verification. Worth healing from redundancy.
    pub fn suggests_rot(&self) -> bool {
        match self {
            FailureCause::Drive(e) => {
                e.status() == Some(Status::DataCorrupted)
                    || matches!(**e, ClientError::HashAndMacMismatch(_) | ClientError::BadReply(_))
            }
            _ => false,
        }
    }
}

impl std::fmt::Display for FailureCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FailureCause::State(s) => write!(f, "component is {s:?}"),
            FailureCause::Excluded => f.write_str("component excluded by the caller"),
            FailureCause::Deadline => f.write_str("drive did not answer within the request deadline"),
            FailureCause::WrongDrive { addr } => write!(f, "the drive at {addr} is not the drive the binding names"),
            FailureCause::Drive(e) => write!(f, "{e}"),
        }
    }
}

/// One component that failed an operation (or was not usable for it).
#[derive(Debug, Clone)]
pub struct ComponentFailure {
    /// The component index.
    pub component: usize,
    /// The manager's number for its drive.
    pub drive: u32,
    /// The component bytes the failed request covered (its first region to
    /// its last), if a request was made.
    pub range: Option<Range<u64>>,
    /// Why.
    pub cause: FailureCause,
}

impl std::fmt::Display for ComponentFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "component {} on drive {}: {}", self.component, self.drive, self.cause)
    }
}

/// Why an operation failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StripeError {
    /// Too many components are unavailable for the layout's redundancy: the
    /// bytes cannot be read (or a write could not reach enough components).
    /// No partial data is returned as whole; a write that fails this way may
    /// have changed some of its bytes.
    #[error("{} components unavailable on drives {missing_drives:?} ({}); the layout tolerates {tolerates}",
        missing.len(), summary(failures))]
    Unavailable {
        /// The drives of the unavailable components (sorted, no repeats).
        missing_drives: Vec<u32>,
        /// The unavailable components (sorted).
        missing: Vec<usize>,
        /// How many the layout tolerates.
        tolerates: usize,
        /// Why each is unavailable.
        failures: Vec<ComponentFailure>,
    },
    /// The binder could not produce a target (e.g. the manager refused).
    #[error("cannot bind the components: {0}")]
    Bind(String),
    /// The target is not usable: its layout is invalid, or it names another
    /// number of components than its layout has.
    #[error("bad target: {0}")]
    BadTarget(String),
    /// A refreshed target has another layout than the operation started with.
    #[error("the layout changed from {before} to {after} during the operation")]
    LayoutChanged {
        /// The layout the operation started with.
        before: Layout,
        /// The refreshed target's.
        after: Layout,
    },
    /// The range reaches past what the layout can hold (or overflows).
    #[error("range {offset}+{len} is outside the striped object (at most {max} bytes)")]
    OutOfRange {
        /// Offset asked for.
        offset: u64,
        /// Length asked for.
        len: u64,
        /// One past the largest offset the layout holds.
        max: u64,
    },
    /// Writing to the caller's destination failed.
    #[error("writing read data out failed: {0}")]
    Io(#[from] std::io::Error),
    /// A background write (write-behind) failed earlier; this is its error,
    /// reported once. Later calls get [`StripeError::WriteBehindBroken`].
    #[error("a background write failed: {0}")]
    WriteBehind(Box<StripeError>),
    /// An earlier background write failed and was reported; the buffer
    /// refuses further writes.
    #[error("an earlier background write failed; nothing more is accepted")]
    WriteBehindBroken,
}

fn summary(failures: &[ComponentFailure]) -> String {
    failures.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

impl StripeError {
    pub(crate) fn unavailable(tolerates: usize, mut failures: Vec<ComponentFailure>) -> StripeError {
        failures.sort_by_key(|f| f.component);
        failures.dedup_by_key(|f| f.component);
        let mut missing_drives: Vec<u32> = failures.iter().map(|f| f.drive).collect();
        missing_drives.sort_unstable();
        missing_drives.dedup();
        let missing = failures.iter().map(|f| f.component).collect();
        StripeError::Unavailable { missing_drives, missing, tolerates, failures }
    }
}
