//! nasd striping engine: moves bytes between a caller and the component
//! objects of one striped object, given its layout and bindings.
//!
//! A file of layout `rs:4+2` is six drive objects; this crate knows which
//! byte lives where ([`geometry`]), how parity is computed and lost chunks
//! rebuilt ([`coding`], Reed-Solomon over `reed-solomon-simd`), and how to
//! read and write them all at once over the network ([`Striper`] on a
//! shared [`DrivePool`]), serving reads from redundancy when components
//! fail and recording writes that components missed. It knows nothing of
//! names, files or the manager protocol beyond `nasd_proto`'s types: a
//! [`Binder`] supplies the [`Target`] (layout and per-component binding)
//! and refreshes it when a drive refuses a stale capability.
//!
//! Users: the file-system client (striped reads and writes under
//! capabilities, with [`ReadAhead`] and [`WriteBehind`] for sequential
//! access) and the manager (rebuild with [`Striper::read_component`] and
//! [`Striper::write_component`], under its drive-key credentials with a
//! [`StaticBinder`]).
//!
//! ```no_run
//! # async fn demo(target: nasd_stripe::Target) -> Result<(), nasd_stripe::StripeError> {
//! use nasd_stripe::{DrivePool, StaticBinder, Striper};
//! use std::sync::Arc;
//! let pool = Arc::new(DrivePool::new());
//! let striper = Striper::new(pool, Arc::new(StaticBinder::new(target)?));
//! let outcome = striper.write(0, b"hello, striped world", 0).await?;
//! assert!(outcome.missed.is_empty());
//! let (bytes, report) = striper.read(0, 20, 20).await?;
//! assert_eq!(bytes, b"hello, striped world");
//! assert!(report.is_clean());
//! # Ok(()) }
//! ```
//!
//! **Architecture Invariant:** a read returns the object's bytes or an
//! error, never a mix: a component that fails is served from redundancy or
//! the read fails with [`StripeError::Unavailable`] naming the drives.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod coding;
mod engine;
mod error;
pub mod geometry;
mod pool;
mod request;
mod sequential;
mod target;

pub use engine::{
    ColumnDigests, Options, Report, Seek, Striper, WriteOutcome, BATCHES_AHEAD_MAX, BATCH_BYTES_MAX,
    CONNECT_DEADLINE_MS, REQUEST_DEADLINE_MS, SEEK_REQUESTS_PER_COLUMN_MAX,
};
pub use error::{ComponentFailure, FailureCause, StripeError};
pub use pool::{DrivePool, DRIVE_IDLE_MAX, DRIVE_INFLIGHT_MAX, POOL_DRIVES_MAX};
pub use request::refreshable;
pub use sequential::{ReadAhead, WriteBehind, READ_AHEAD_BYTES_MAX, READ_AHEAD_WINDOWS, WRITE_BEHIND_BYTES_MAX};
pub use target::{Binder, Binding, BoxFuture, StaticBinder, Target};
