//! Errors of opening a metadata store.

use nasd_proto::fs::FsStatus;

/// Why a metadata store could not be opened or migrated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetaError {
    /// The database failed.
    #[error("metadata database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The database was written by a newer build.
    #[error("metadata schema version {found} is newer than this build supports ({supported})")]
    TooNew {
        /// Version found in the database.
        found: i64,
        /// Newest version this build knows.
        supported: i64,
    },
    /// The database holds a schema version that cannot be valid.
    #[error("metadata schema version {0} is invalid")]
    BadVersion(i64),
}

impl From<MetaError> for FsStatus {
    fn from(e: MetaError) -> FsStatus {
        tracing::error!(error = %e, "metadata store failed");
        FsStatus::Internal
    }
}

/// Maps a SQLite failure inside an operation to [`FsStatus::Internal`],
/// logging the cause.
pub(crate) fn internal(e: rusqlite::Error) -> FsStatus {
    tracing::error!(error = %e, "metadata store failed");
    FsStatus::Internal
}
