//! Choosing a backend at run time: a [`Location`] names where the metadata
//! lives, and [`Store`] is whichever backend it opened.

use crate::backend::{Access, Backend, Txn, TxnError};
use crate::error::MetaError;
use crate::pg_connect::PgOptions;
use crate::postgres::Postgres;
use crate::sqlite::Sqlite;
use nasd_proto::fs::FsStatus;
use std::path::PathBuf;
use std::str::FromStr;

/// Where the metadata lives: `sqlite:PATH` (a file, created if missing) or
/// `postgres://USER[:PASSWORD]@HOST[:PORT]/DB` (`postgresql://` too).
///
/// Its `Display` and `Debug` never show a password.
#[derive(Clone, PartialEq, Eq)]
pub enum Location {
    /// An SQLite database file.
    Sqlite(PathBuf),
    /// A PostgreSQL connection string (it may hold a password), and what the
    /// configuration adds to it ([`crate::pg_connect`]).
    Postgres {
        /// `postgres://…` or `key=value …`.
        url: String,
        /// A password file named in the configuration, and the like.
        options: PgOptions,
    },
}

impl FromStr for Location {
    type Err = MetaError;

    /// # Errors
    /// [`MetaError::BadUrl`]: neither form, an empty path, or a PostgreSQL
    /// URL that does not parse.
    fn from_str(s: &str) -> Result<Location, MetaError> {
        if let Some(path) = s.strip_prefix("sqlite:") {
            if path.is_empty() {
                return Err(MetaError::BadUrl(
                    "sqlite: needs a file path, as in sqlite:/var/lib/nasd/meta.sqlite".into(),
                ));
            }
            return Ok(Location::Sqlite(PathBuf::from(path)));
        }
        if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            crate::pg_connect::check_syntax(s)?;
            return Ok(Location::Postgres { url: s.to_owned(), options: PgOptions::default() });
        }
        Err(MetaError::BadUrl("expected sqlite:PATH or postgres://USER@HOST[:PORT]/DATABASE".into()))
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Sqlite(path) => write!(f, "sqlite:{}", path.display()),
            Location::Postgres { url, .. } => f.write_str(&crate::pg_connect::describe_conninfo(url)),
        }
    }
}

impl std::fmt::Debug for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Location({self})")
    }
}

impl Location {
    /// Opens the backend (creating and migrating as its `open` does).
    ///
    /// # Errors
    /// As [`Sqlite::open`] and [`Postgres::open`].
    pub fn open(&self) -> Result<Store, MetaError> {
        self.open_in(&nasd_env::Env::real())
    }

    /// [`Location::open`] in `env`: SQLite on the environment's disk
    /// ([`Sqlite::open_in`]); PostgreSQL is always the real network's.
    ///
    /// # Errors
    /// As [`Location::open`].
    pub fn open_in(&self, env: &nasd_env::Env) -> Result<Store, MetaError> {
        match self {
            Location::Sqlite(path) => Ok(Store::Sqlite(Sqlite::open_in(env, path)?)),
            Location::Postgres { url, options } => {
                Ok(Store::Postgres(Box::new(Postgres::open_with_options(url, options)?)))
            }
        }
    }
}

impl Location {
    /// The same location with the password read from `file` (when the
    /// connection string has none); SQLite ignores it.
    pub fn with_password_file(self, file: Option<PathBuf>) -> Location {
        match self {
            Location::Postgres { url, mut options } => {
                options.password_file = file;
                Location::Postgres { url, options }
            }
            other => other,
        }
    }

    /// The same location with at most `writers` read-write transactions at
    /// once ([`PgOptions::writers_max`]); SQLite ignores it.
    pub fn with_writers_max(self, writers: usize) -> Location {
        match self {
            Location::Postgres { url, mut options } => {
                options.writers_max = Some(writers);
                Location::Postgres { url, options }
            }
            other => other,
        }
    }

    /// Whether this is a database several managers can share (PostgreSQL).
    pub fn is_shared(&self) -> bool {
        matches!(self, Location::Postgres { .. })
    }

    /// Opens existing metadata (migrating an older schema) and creates
    /// nothing: for tools that must not make a file system where none was.
    ///
    /// # Errors
    /// [`MetaError::Missing`] if there is none; otherwise as [`Location::open`].
    pub fn open_existing(&self) -> Result<Store, MetaError> {
        match self {
            Location::Sqlite(path) if !path.exists() => Err(MetaError::Missing(self.to_string())),
            Location::Sqlite(path) => Ok(Store::Sqlite(Sqlite::open(path)?)),
            Location::Postgres { url, options } => {
                Ok(Store::Postgres(Box::new(Postgres::open_existing(url, options)?)))
            }
        }
    }
}

/// The backend a [`Location`] opened: what the manager runs on.
#[derive(Debug)]
pub enum Store {
    /// Embedded SQLite.
    Sqlite(Sqlite),
    /// A PostgreSQL server (boxed: it is the larger).
    Postgres(Box<Postgres>),
}

impl std::fmt::Debug for Sqlite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sqlite").finish_non_exhaustive()
    }
}

impl Backend for Store {
    fn attempt<R>(
        &self,
        access: Access,
        f: &mut dyn FnMut(&mut dyn Txn) -> Result<R, FsStatus>,
    ) -> Result<R, TxnError> {
        match self {
            Store::Sqlite(b) => b.attempt(access, f),
            Store::Postgres(b) => b.attempt(access, f),
        }
    }

    fn sync(&self) -> Result<(), TxnError> {
        match self {
            Store::Sqlite(b) => b.sync(),
            Store::Postgres(b) => b.sync(),
        }
    }

    fn durability(&self) -> crate::backend::Durability {
        match self {
            Store::Sqlite(b) => b.durability(),
            Store::Postgres(b) => b.durability(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse_and_never_show_a_password() {
        assert_eq!("sqlite:/a/b.sqlite".parse::<Location>().unwrap(), Location::Sqlite("/a/b.sqlite".into()));
        let pg: Location = "postgres://nasd:s3cret@db.example:6543/meta".parse().unwrap();
        assert_eq!(
            pg,
            Location::Postgres {
                url: "postgres://nasd:s3cret@db.example:6543/meta".into(),
                options: PgOptions::default()
            }
        );
        assert_eq!(pg.to_string(), "postgres://nasd@db.example:6543/meta");
        assert!(!format!("{pg:?}").contains("s3cret"));
        assert!("postgresql://u@h/d".parse::<Location>().is_ok());
        for bad in ["", "sqlite:", "meta.sqlite", "mysql://u@h/d", "postgres://u@h:notaport/d"] {
            let e = bad.parse::<Location>().expect_err(bad);
            assert!(matches!(e, MetaError::BadUrl(_)), "{bad}: {e}");
        }
        let e = "postgres://u:s3cret@h:x/d".parse::<Location>().unwrap_err();
        assert!(!e.to_string().contains("s3cret"), "{e}");
    }
}
