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

/// Whether a PostgreSQL error says the server is gone or going: the
/// connection lost (no answer, closed, an I/O error), or the server
/// shutting down, crashed or starting (`57P01`, `57P02`, `57P03`, class
/// `08`). The one rule the managers' and the authentication servers'
/// stores share: a statement that failed so changed nothing, and the
/// request may wait for the database and be sent again.
pub fn postgres_server_gone(e: &tokio_postgres::Error) -> bool {
    match e.code() {
        Some(c) => server_gone_code(c),
        None => e.is_closed() || std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>()),
    }
}

/// [`postgres_server_gone`] for an error the server sent with `code`.
fn server_gone_code(c: &tokio_postgres::error::SqlState) -> bool {
    use tokio_postgres::error::SqlState;
    *c == SqlState::ADMIN_SHUTDOWN
        || *c == SqlState::CRASH_SHUTDOWN
        || *c == SqlState::CANNOT_CONNECT_NOW
        || c.code().starts_with("08")
}

/// Maps a SQLite failure inside an operation to [`FsStatus::Internal`],
/// logging the cause.
pub(crate) fn internal(e: rusqlite::Error) -> FsStatus {
    tracing::error!(error = %e, "metadata store failed");
    FsStatus::Internal
}

#[cfg(test)]
mod tests {
    use super::server_gone_code;
    use tokio_postgres::error::SqlState;

    #[test]
    fn a_server_shutting_down_or_unreachable_is_gone_and_a_refused_statement_is_not() {
        for gone in [
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::CONNECTION_FAILURE,
            SqlState::CONNECTION_EXCEPTION,
        ] {
            assert!(server_gone_code(&gone), "{}", gone.code());
        }
        for refused in [SqlState::UNIQUE_VIOLATION, SqlState::T_R_SERIALIZATION_FAILURE, SqlState::QUERY_CANCELED] {
            assert!(!server_gone_code(&refused), "{}", refused.code());
        }
    }
}
