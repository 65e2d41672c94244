//! Write transactions (TXN_BEGIN, TXN_END, TXN_LIST) through a real drive on
//! loopback with security enforced: semantics as a coordinator sees them,
//! who may send them, their audit records, and a transaction surviving a
//! restart of the drive.

mod common;

use common::{bytes, refused, rg, Drive, BS, OTHER, P};
use nasd_client::{Credential, DriveClient};
use nasd_proto::limits::TXN_LIST_MAX;
use nasd_proto::{opcode, AttrMask, Attributes, KeyType, OpenTxn, Status, ANY_OBJECT};

async fn read_all(c: &mut DriveClient, o: u64) -> Vec<u8> {
    let size = c.getattr(P, o).await.unwrap().logical_size;
    if size == 0 {
        return Vec::new();
    }
    c.read(P, o, &[rg(0, size)]).await.unwrap().1
}

/// An object holding `v1` (3.5 blocks), flushed.
async fn object(c: &mut DriveClient, v1: &[u8]) -> u64 {
    let (o, _) = c.create(P).await.unwrap();
    c.write(P, o, &[rg(0, v1.len() as u64)], v1).await.unwrap();
    c.flush(P, &[o]).await.unwrap();
    o
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_begins_writes_and_aborts_or_commits() {
    let d = Drive::start().await;
    let mut c = d.admin().await;
    let v1 = bytes(1, 3 * BS + BS / 2);
    let (a, b) = (object(&mut c, &v1).await, object(&mut c, &v1).await);
    let before = c.getattr(P, a).await.unwrap();

    // BEGIN on both components; the client writes normally, then flushes.
    c.txn_begin(P, a, 41).await.unwrap();
    c.txn_begin(P, b, 41).await.unwrap();
    c.txn_begin(P, a, 41).await.unwrap(); // idempotent
    let v2 = bytes(2, 5 * BS);
    for o in [a, b] {
        c.write(P, o, &[rg(0, v2.len() as u64)], &v2).await.unwrap();
        c.setattr(P, o, AttrMask::LOGICAL_SIZE, &Attributes { logical_size: 4 * BS + 3, ..Default::default() })
            .await
            .unwrap();
        assert_eq!(read_all(&mut c, o).await, &v2[..(4 * BS + 3) as usize], "reads see the new data at once");
    }
    c.flush(P, &[a, b]).await.unwrap();
    let listed = c.txn_list(P, 0, TXN_LIST_MAX as u16).await.unwrap();
    assert_eq!(listed.iter().map(|t| (t.object, t.txn)).collect::<Vec<_>>(), vec![(a, 41), (b, 41)]);
    assert!(listed.iter().all(|t| t.begun_ns >= before.data_modify_time));
    assert_eq!(c.txn_list(P, a, 1).await.unwrap().iter().map(|t| t.object).collect::<Vec<_>>(), vec![b]);

    // The refusals a coordinator can meet.
    let e = c.txn_begin(P, a, 42).await.unwrap_err();
    assert_eq!(e.status(), Some(Status::TxnConflict));
    assert!(e.to_string().contains("transaction 41"), "the message names the open transaction: {e}");
    assert_eq!(refused(c.txn_end(P, a, 42, true).await), Status::TxnConflict);
    assert_eq!(refused(c.fastcopy(P, a).await), Status::TxnConflict);
    assert_eq!(refused(c.txn_begin(P, a, 0).await), Status::BadArguments);
    assert_eq!(refused(c.txn_begin(P, 2, 1).await), Status::ReadOnlyObject);
    assert_eq!(refused(c.txn_begin(P, 9_999, 1).await), Status::NoSuchObject);
    assert_eq!(refused(c.txn_list(7, 0, 1).await), Status::NoSuchPartition);
    assert_eq!(refused(c.txn_list(P, 0, TXN_LIST_MAX as u16 + 1).await), Status::LimitExceeded);

    // Abort one component, commit the other.
    assert!(c.txn_end(P, a, 41, false).await.unwrap());
    assert!(c.txn_end(P, b, 41, true).await.unwrap());
    assert!(!c.txn_end(P, a, 41, false).await.unwrap(), "a second end finds nothing open");
    assert_eq!(read_all(&mut c, a).await, v1, "abort restores the old bytes exactly");
    let after = c.getattr(P, a).await.unwrap();
    assert_eq!(after.logical_size, before.logical_size);
    assert!(after.data_modify_time > before.data_modify_time);
    assert_eq!(read_all(&mut c, b).await, &v2[..(4 * BS + 3) as usize], "commit keeps the new bytes");
    assert_eq!(c.txn_list(P, 0, 10).await.unwrap(), Vec::<OpenTxn>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_drive_key_or_the_partitions_key_may_send_them() {
    let d = Drive::start().await;
    let mut admin = d.admin().await;
    let o = object(&mut admin, &bytes(1, 100)).await;
    let drive_id = admin.drive_id();

    let mut own = d.client(Credential::Partition { partition: P, key: d.partition_keys[0].clone() }).await;
    own.txn_begin(P, o, 5).await.unwrap();
    assert_eq!(own.txn_list(P, 0, 10).await.unwrap().len(), 1);
    assert!(own.txn_end(P, o, 5, false).await.unwrap());

    let mut other = d.client(Credential::Partition { partition: OTHER, key: d.partition_keys[1].clone() }).await;
    let working = d.client(Credential::Working { partition: P, key_version: 1, key: d.working.clone() }).await;
    let master = d.client(Credential::Master(d.master.clone())).await;
    let object_cap = d.client(d.capability(drive_id, o)).await;
    let partition_cap = d.client(d.capability(drive_id, ANY_OBJECT)).await;
    assert_eq!(refused(other.txn_begin(P, o, 6).await), Status::WrongObject, "another partition's key");
    assert_eq!(refused(other.txn_list(P, 0, 1).await), Status::WrongObject);
    for (name, mut c) in [
        ("working key", working),
        ("master key", master),
        ("capability", object_cap),
        ("partition capability", partition_cap),
    ] {
        assert_eq!(refused(c.txn_begin(P, o, 6).await), Status::WrongKeyType, "{name}: begin");
        assert_eq!(refused(c.txn_end(P, o, 6, false).await), Status::WrongKeyType, "{name}: end");
        assert_eq!(refused(c.txn_list(P, 0, 10).await), Status::WrongKeyType, "{name}: list");
    }
    assert_eq!(admin.txn_list(P, 0, 10).await.unwrap(), Vec::<OpenTxn>::new(), "no refused begin opened anything");

    // Every one of them is in the audit trail, authorized or refused.
    let records = admin.read_audit(&d.drive_key, 0, 512).await.unwrap();
    let seen = |op: u16, key: KeyType, status: Status| {
        records.iter().any(|r| r.opcode == op && r.key_type == key as u8 && r.status == status as u16)
    };
    assert!(seen(opcode::TXN_BEGIN, KeyType::Partition, Status::Ok));
    assert!(seen(opcode::TXN_END, KeyType::Partition, Status::Ok));
    assert!(seen(opcode::TXN_LIST, KeyType::Partition, Status::Ok));
    assert!(seen(opcode::TXN_BEGIN, KeyType::Working, Status::WrongKeyType));
    assert!(seen(opcode::TXN_END, KeyType::Capability, Status::WrongKeyType));
    assert!(seen(opcode::TXN_LIST, KeyType::Master, Status::WrongKeyType));
    let begin = records.iter().find(|r| r.opcode == opcode::TXN_BEGIN && r.status == 0).unwrap();
    assert_eq!((begin.partition, begin.object), (P, o), "the audit record names the object");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_transaction_survives_a_restart() {
    let mut d = Drive::start().await;
    let mut c = d.admin().await;
    let v1 = bytes(1, 2 * BS + 10);
    let o = object(&mut c, &v1).await;
    c.txn_begin(P, o, 3).await.unwrap();
    c.write(P, o, &[rg(BS, 3 * BS)], &bytes(9, 3 * BS)).await.unwrap();
    drop(c);
    d.restart().await;
    let mut c = d.admin().await;
    let listed = c.txn_list(P, 0, 10).await.unwrap();
    assert_eq!(listed.iter().map(|t| (t.object, t.txn)).collect::<Vec<_>>(), vec![(o, 3)]);
    assert_eq!(c.getattr(P, o).await.unwrap().logical_size, 4 * BS);
    assert!(c.txn_end(P, o, 3, false).await.unwrap());
    assert_eq!(read_all(&mut c, o).await, v1);
}
