//! A backend wrapper that fails the n-th row operation.

use crate::backend::{Access, Backend, PalPush, Txn, TxnError};
use crate::types::{AcvIntent, DirEntry, DriveRecord, Inode, Intent, Lease, Quota, QuotaSubject, StaleRange, User};
use nasd_proto::acl::AclEntry;
use nasd_proto::fs::{FsStatus, Ino, ObjectRef};
use nasd_proto::layout::Component;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Wraps a backend; once armed with [`Failing::fail_after`], the row
/// operation (in a read-write transaction) after the given number of
/// successful ones returns [`FsStatus::Internal`] (then the wrapper
/// disarms). Read-only transactions are not affected. Used to show that an
/// operation failing part-way changes nothing.
pub struct Failing<B> {
    inner: B,
    left: AtomicUsize,
}

const DISARMED: usize = usize::MAX;

impl<B: Backend> Failing<B> {
    /// Wraps `inner`, disarmed.
    pub fn new(inner: B) -> Self {
        Failing { inner, left: AtomicUsize::new(DISARMED) }
    }

    /// Lets `ops` row operations succeed, then fails the next one.
    pub fn fail_after(&self, ops: usize) {
        assert!(ops < DISARMED);
        self.left.store(ops, Ordering::SeqCst);
    }

    /// Whether an armed failure has not fired yet; disarms.
    pub fn disarm(&self) -> bool {
        self.left.swap(DISARMED, Ordering::SeqCst) != DISARMED
    }
}

struct FailingTxn<'a> {
    inner: &'a mut dyn Txn,
    left: &'a AtomicUsize,
}

impl FailingTxn<'_> {
    fn tick(&self) -> Result<(), FsStatus> {
        match self.left.load(Ordering::SeqCst) {
            DISARMED => Ok(()),
            0 => {
                self.left.store(DISARMED, Ordering::SeqCst);
                Err(FsStatus::Internal)
            }
            n => {
                self.left.store(n - 1, Ordering::SeqCst);
                Ok(())
            }
        }
    }
}

impl<B: Backend> Backend for Failing<B> {
    fn attempt<R>(
        &self,
        access: Access,
        f: &mut dyn FnMut(&mut dyn Txn) -> Result<R, FsStatus>,
    ) -> Result<R, TxnError> {
        match access {
            Access::ReadWrite => {
                self.inner.attempt(access, &mut |t: &mut dyn Txn| f(&mut FailingTxn { inner: t, left: &self.left }))
            }
            Access::ReadOnly => self.inner.attempt(access, f),
        }
    }
}

macro_rules! delegate {
    ($(fn $name:ident(&mut self $(, $arg:ident: $ty:ty)*) -> $ret:ty;)*) => {
        impl Txn for FailingTxn<'_> {
            $(fn $name(&mut self $(, $arg: $ty)*) -> Result<$ret, FsStatus> {
                self.tick()?;
                self.inner.$name($($arg),*)
            })*
        }
    };
}

delegate! {
    fn get_inode(&mut self, ino: Ino) -> Option<Inode>;
    fn put_inode(&mut self, inode: &Inode) -> ();
    fn delete_inode(&mut self, ino: Ino) -> ();
    fn alloc_ino(&mut self) -> Ino;
    fn dir_parent(&mut self, dir: Ino) -> Option<Ino>;
    fn set_dir_parent(&mut self, dir: Ino, parent: Ino) -> ();
    fn get_dirent(&mut self, dir: Ino, name: &str) -> Option<Ino>;
    fn insert_dirent(&mut self, dir: Ino, name: &str, child: Ino) -> ();
    fn delete_dirent(&mut self, dir: Ino, name: &str) -> ();
    fn list_dir(&mut self, dir: Ino, after: &str, limit: usize) -> Vec<DirEntry>;
    fn dir_is_empty(&mut self, dir: Ino) -> bool;
    fn usage(&mut self) -> (u64, u64);
    fn get_quota(&mut self, subject: QuotaSubject) -> Option<Quota>;
    fn put_quota(&mut self, quota: &Quota) -> ();
    fn delete_quota(&mut self, subject: QuotaSubject) -> ();
    fn list_quotas(&mut self) -> Vec<Quota>;
    fn usage_of_uid(&mut self, uid: u32) -> (u64, u64);
    fn get_xattr(&mut self, ino: Ino, name: &str) -> Option<Vec<u8>>;
    fn list_xattrs(&mut self, ino: Ino) -> Vec<(String, usize)>;
    fn put_xattr(&mut self, ino: Ino, name: &str, value: &[u8]) -> ();
    fn delete_xattr(&mut self, ino: Ino, name: &str) -> bool;
    fn get_small(&mut self, ino: Ino) -> Option<Vec<u8>>;
    fn put_small(&mut self, ino: Ino, bytes: &[u8]) -> ();
    fn get_staged(&mut self, ino: Ino) -> Option<(u64, Vec<u8>)>;
    fn put_staged(&mut self, ino: Ino, txn: u64, bytes: &[u8]) -> ();
    fn delete_staged(&mut self, ino: Ino) -> ();
    fn get_acl(&mut self, ino: Ino) -> Vec<AclEntry>;
    fn put_acl(&mut self, ino: Ino, entries: &[AclEntry]) -> ();
    fn pal_pending_put(&mut self, what: PalPush, ino: Ino) -> ();
    fn pal_pending_delete(&mut self, what: PalPush, ino: Ino, seq: u64) -> ();
    fn pal_pending_seq(&mut self, what: PalPush, ino: Ino) -> Option<u64>;
    fn pal_pending_list(&mut self, what: PalPush, limit: usize) -> Vec<(Ino, u64)>;
    fn pal_member(&mut self, ino: Ino) -> Option<Ino>;
    fn put_pal_member(&mut self, ino: Ino, collection: Ino) -> ();
    fn pal_members(&mut self, collection: Ino, after: Ino, limit: usize) -> Vec<Ino>;
    fn shared_collections(&mut self, limit: usize) -> Vec<Ino>;
    fn get_user(&mut self, name: &str) -> Option<User>;
    fn uid_taken(&mut self, uid: u32) -> bool;
    fn put_user(&mut self, user: &User) -> ();
    fn list_users(&mut self) -> Vec<User>;
    fn get_drive(&mut self, drive: u32) -> Option<DriveRecord>;
    fn drive_with_id(&mut self, drive_id: &[u8; 16]) -> Option<u32>;
    fn put_drive(&mut self, rec: &DriveRecord) -> ();
    fn list_drives(&mut self) -> Vec<DriveRecord>;
    fn pool_insert(&mut self, object: &ObjectRef) -> ();
    fn pool_take(&mut self, drive: u32) -> Option<ObjectRef>;
    fn pool_count(&mut self, drive: u32) -> u64;
    fn pool_objects(&mut self, drive: u32) -> Vec<ObjectRef>;
    fn file_objects(&mut self, drive: u32) -> Vec<ObjectRef>;
    fn object_known(&mut self, object: &ObjectRef) -> bool;
    fn put_component(&mut self, ino: Ino, idx: usize, component: &Component) -> ();
    fn delete_components(&mut self, ino: Ino) -> ();
    fn component_of(&mut self, object: &ObjectRef) -> Option<(Ino, usize)>;
    fn list_stale_components(&mut self, after: (Ino, usize), limit: usize) -> Vec<(Ino, usize)>;
    fn list_components_on_drive(&mut self, drive: u32, after: (Ino, usize), limit: usize) -> Vec<(Ino, usize, ObjectRef)>;
    fn component_counts(&mut self) -> Vec<(u32, u64)>;
    fn count_degraded(&mut self) -> u64;
    fn get_stale_ranges(&mut self, ino: Ino, idx: usize) -> Vec<StaleRange>;
    fn put_stale_range(&mut self, ino: Ino, idx: usize, range: &StaleRange) -> ();
    fn delete_stale_ranges(&mut self, ino: Ino, idx: Option<usize>) -> ();
    fn alloc_txn(&mut self) -> u64;
    fn put_intent(&mut self, intent: &Intent) -> ();
    fn get_intent(&mut self, txn: u64) -> Option<Intent>;
    fn intent_of_inode(&mut self, ino: Ino) -> Option<Intent>;
    fn list_intents(&mut self, after: u64, limit: usize) -> Vec<Intent>;
    fn delete_intent(&mut self, txn: u64) -> ();
    fn doom(&mut self, object: &ObjectRef) -> ();
    fn list_doomed(&mut self, drive: Option<u32>, limit: usize) -> Vec<ObjectRef>;
    fn doomed_objects(&mut self, drive: u32) -> Vec<ObjectRef>;
    fn forget_doomed(&mut self, object: &ObjectRef) -> ();
    fn put_acv_intent(&mut self, intent: &AcvIntent) -> ();
    fn list_acv_intents(&mut self, drive: Option<u32>, limit: usize) -> Vec<AcvIntent>;
    fn delete_acv_intent(&mut self, object: &ObjectRef, only_acv: Option<u64>) -> ();
    fn get_setting(&mut self, key: &str) -> Option<Vec<u8>>;
    fn put_setting(&mut self, key: &str, value: &[u8]) -> ();
    fn now_ms(&mut self) -> u64;
    fn get_lease(&mut self, name: &str) -> Option<Lease>;
    fn put_lease(&mut self, lease: &Lease) -> ();
    fn delete_lease(&mut self, name: &str) -> ();
    fn list_leases(&mut self, prefix: &str, limit: usize) -> Vec<Lease>;
    fn list_names_ending(&mut self, suffix: &str, after_dir: Ino, after_name: &str, limit: usize) -> Vec<(Ino, String, Ino)>;
}
