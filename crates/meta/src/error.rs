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
    /// The PostgreSQL server failed or refused (`target` names the database,
    /// never with a password).
    #[error("metadata database {target}: {}", postgres_detail(source))]
    Postgres {
        /// `postgres://USER@HOST:PORT/DB`.
        target: String,
        /// What failed.
        #[source]
        source: tokio_postgres::Error,
    },
    /// A metadata location that does not parse (the message does not repeat
    /// it: it may hold a password).
    #[error("metadata location: {0}")]
    BadUrl(String),
    /// No metadata where an existing store was asked for (no such file or
    /// database, or a database without the schema).
    #[error("no metadata at {0}")]
    Missing(String),
    /// A local resource the backend needs could not be had.
    #[error("metadata backend: {0}")]
    Io(String),
}

impl From<MetaError> for FsStatus {
    fn from(e: MetaError) -> FsStatus {
        tracing::error!(error = %e, "metadata store failed");
        FsStatus::Internal
    }
}

/// What a PostgreSQL error says: the server's message and SQLSTATE, or the
/// client's error with its causes (`Display` of the error alone is just "db
/// error").
pub fn postgres_detail(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{} (SQLSTATE {})", db.message(), db.code().code());
    }
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// Maps a SQLite failure inside an operation to [`FsStatus::Internal`],
/// logging the cause.
pub(crate) fn internal(e: rusqlite::Error) -> FsStatus {
    tracing::error!(error = %e, "metadata store failed");
    FsStatus::Internal
}
