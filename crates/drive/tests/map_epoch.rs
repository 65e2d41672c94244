//! The cluster map epoch on capabilities: SET_MAP_EPOCH raises a
//! partition's minimum, capabilities minted under an older epoch are refused
//! with MAP_EPOCH_MOVED (after the expiry, drive and object checks, before
//! the access control version), the minimum only grows, only the drive or
//! partition key sets it, and it survives a restart — after which the
//! partition is fenced until `SET_MAP_EPOCH` readmits it — through a real drive
//! on loopback with security enforced.

mod common;

use common::{refused, rg, Drive, OTHER, P};
use nasd_client::{Credential, DriveClient};
use nasd_crypto::Key;
use nasd_proto::{opcode, CapabilityArgs, Status};

/// A client authorized by a capability for `object` of `P` minted at `epoch`,
/// with `edit` applied to its arguments.
async fn cap_client(
    d: &Drive,
    drive_id: [u8; 16],
    object: u64,
    epoch: u32,
    edit: impl Fn(&mut CapabilityArgs),
) -> DriveClient {
    let mut args = Drive::capability_args(drive_id, object);
    args.map_epoch = epoch;
    edit(&mut args);
    d.client(Drive::mint(&d.working, &args)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capabilities_of_an_older_map_are_refused_once_the_epoch_moves() {
    let mut d = Drive::start().await;
    let mut admin = d.admin().await;
    let drive_id = admin.drive_id();
    let (o, _) = admin.create(P).await.unwrap();
    admin.write(P, o, &[rg(0, 5)], b"hello").await.unwrap();

    // Minted at epoch 3: fine while the partition's minimum is 0.
    let mut at3 = cap_client(&d, drive_id, o, 3, |_| {}).await;
    assert_eq!(at3.read(P, o, &[rg(0, 5)]).await.unwrap().1, b"hello");

    admin.set_map_epoch(P, 4).await.unwrap();
    let e = at3.read(P, o, &[rg(0, 5)]).await.unwrap_err();
    assert_eq!(e.status(), Some(Status::MapEpochMoved), "{e}");
    assert!(e.to_string().contains("fetch new bindings from the manager"), "{e}");
    assert_eq!(refused(at3.getattr(P, o).await), Status::MapEpochMoved);
    assert_eq!(refused(at3.write(P, o, &[rg(0, 1)], b"x").await), Status::MapEpochMoved, "refused writes");
    let mut partition_wide = cap_client(&d, drive_id, 0, 3, |_| {}).await;
    assert_eq!(refused(partition_wide.create(P).await), Status::MapEpochMoved, "object-0 capabilities too");

    // Minted at (or after) the current epoch: fine.
    let mut at4 = cap_client(&d, drive_id, o, 4, |_| {}).await;
    assert_eq!(at4.read(P, o, &[rg(0, 5)]).await.unwrap().1, b"hello");
    let mut at9 = cap_client(&d, drive_id, o, 9, |_| {}).await;
    at9.getattr(P, o).await.unwrap();

    // Where the check sits: after expiry and object, before the ACV.
    let mut expired = cap_client(&d, drive_id, o, 3, |a| a.expiration_ns = 1).await;
    assert_eq!(refused(expired.getattr(P, o).await), Status::CapabilityExpired);
    let mut other_object = cap_client(&d, drive_id, o + 1, 3, |_| {}).await;
    assert_eq!(refused(other_object.getattr(P, o).await), Status::WrongObject);
    let mut stale_acv = cap_client(&d, drive_id, o, 3, |a| a.access_control_version = 99).await;
    assert_eq!(refused(stale_acv.getattr(P, o).await), Status::MapEpochMoved);
    let mut stale_acv_now = cap_client(&d, drive_id, o, 4, |a| a.access_control_version = 99).await;
    assert_eq!(refused(stale_acv_now.getattr(P, o).await), Status::AccessRevoked);

    // The epoch only grows; it is per partition.
    assert_eq!(refused(admin.set_map_epoch(P, 3).await), Status::BadArguments);
    admin.set_map_epoch(P, 4).await.unwrap();
    assert_eq!(refused(admin.set_map_epoch(0, 1).await), Status::BadArguments);
    let other_working = Key::random();
    admin.set_working_key(&d.partition_keys[1], OTHER, 1, &other_working).await.unwrap();
    let mut other_args = Drive::capability_args(drive_id, 0);
    other_args.partition = OTHER;
    let mut other = d.client(Drive::mint(&other_working, &other_args)).await;
    other.create(OTHER).await.expect("partition 2's minimum is still 0");

    // Who may set it: the drive key or the partition's own key.
    let mut own = d.client(Credential::Partition { partition: P, key: d.partition_keys[0].clone() }).await;
    own.set_map_epoch(P, 5).await.unwrap();
    let mut wrong_partition =
        d.client(Credential::Partition { partition: OTHER, key: d.partition_keys[1].clone() }).await;
    assert_eq!(refused(wrong_partition.set_map_epoch(P, 6).await), Status::WrongObject);
    let mut working = d.client(Credential::Working { partition: P, key_version: 1, key: d.working.clone() }).await;
    assert_eq!(refused(working.set_map_epoch(P, 6).await), Status::WrongKeyType);
    assert_eq!(refused(at9.set_map_epoch(P, 6).await), Status::WrongKeyType);
    assert_eq!(refused(at4.getattr(P, o).await), Status::MapEpochMoved, "the minimum is 5, not 6");

    let records = admin.read_audit(&d.drive_key, 0, 512).await.unwrap();
    assert!(records.iter().any(|r| r.opcode == opcode::READ && r.status == Status::MapEpochMoved as u16));
    assert!(records.iter().any(|r| r.opcode == opcode::SET_MAP_EPOCH && r.status == 0 && r.partition == P));

    // Durable: after a restart the minimum is still 5; and the partition is
    // fenced — even current capabilities are refused — until SET_MAP_EPOCH
    // (the same epoch will do) readmits it. Partition 2, whose minimum is 0
    // (no manager placed anything there), is not fenced.
    drop((admin, at3, at4, at9, partition_wide, expired, other_object, stale_acv, stale_acv_now, other));
    drop((own, wrong_partition, working));
    d.restart().await;
    let mut at4 = cap_client(&d, drive_id, o, 4, |_| {}).await;
    assert_eq!(refused(at4.getattr(P, o).await), Status::MapEpochMoved, "the epoch survives a restart");
    let mut at5 = cap_client(&d, drive_id, o, 5, |_| {}).await;
    let e = at5.read(P, o, &[rg(0, 5)]).await.unwrap_err();
    assert_eq!(e.status(), Some(Status::MapEpochMoved), "fenced after the restart: {e}");
    assert!(e.to_string().contains("not readmitted it yet"), "{e}");
    let mut other = d.client(Drive::mint(&other_working, &other_args)).await;
    other.create(OTHER).await.expect("a partition without a minimum epoch is not fenced");
    let mut admin = d.admin().await;
    assert_eq!(refused(admin.set_map_epoch(P, 4).await), Status::BadArguments, "still only grows");
    assert_eq!(
        refused(at5.read(P, o, &[rg(0, 5)]).await),
        Status::MapEpochMoved,
        "a refused SET_MAP_EPOCH admits nothing"
    );
    admin.set_map_epoch(P, 5).await.expect("readmitted at the same epoch");
    assert_eq!(at5.read(P, o, &[rg(0, 5)]).await.unwrap().1, b"hello");
    assert_eq!(refused(at4.getattr(P, o).await), Status::MapEpochMoved, "readmission does not lower the minimum");
}

/// Removing a partition forgets its epoch with its keys: a new partition of
/// the same number starts at 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_partition_forgets_its_epoch() {
    let d = Drive::start().await;
    let mut admin = d.admin().await;
    let drive_id = admin.drive_id();
    admin.set_map_epoch(OTHER, 7).await.unwrap();
    admin.remove_partition(OTHER, true).await.unwrap();
    admin.create_partition(OTHER).await.unwrap();
    admin.resize_partition(OTHER, 1 << 20).await.unwrap();
    let pk = Key::random();
    let wk = Key::random();
    admin.set_partition_key(&d.drive_key, OTHER, &pk).await.unwrap();
    admin.set_working_key(&pk, OTHER, 1, &wk).await.unwrap();
    let mut args = Drive::capability_args(drive_id, 0);
    args.partition = OTHER;
    let mut c = d.client(Drive::mint(&wk, &args)).await;
    c.create(OTHER).await.expect("epoch 0 is current on the new partition");
    admin.set_map_epoch(OTHER, 1).await.unwrap();
    assert_eq!(refused(c.create(OTHER).await), Status::MapEpochMoved);
}
