//! Durable small files the manager keeps beside its metadata (TLS keys and
//! certificates, the administrator's password file; `manager.key` is a key
//! file): created whole and synced, replaced by a rename whose directory
//! entry is synced too, so a crash leaves either the old file or the new
//! one. The one implementation is [`nasd_crypto::durable`], which the key
//! files below the manager use as well; this module names it for the
//! manager's callers.

pub use nasd_crypto::durable::{
    create_new, install, install_new, parent_dir, sync_dir, with_suffix, write_new, write_staged,
};
