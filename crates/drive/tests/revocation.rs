//! Revocation against writes in flight, on a real drive over loopback: a
//! write authorized before the file manager's revoke-and-flush must not
//! land after the drive answered it, and a capability's access control
//! version that cannot be read is a refusal, never a pass.

mod common;

use common::{bytes, refused, rg, Drive, BS, P, PROTECTION};
use nasd_client::{Auth, ClientError, DriveClient};
use nasd_proto::{rights, AttrMask, Attributes, Region, Status};
use std::future::Future;
use std::time::Duration;
use tokio::io::{AsyncWriteExt, DuplexStream};

/// Bound on any wait (a hang guard only: every step takes milliseconds).
const HANG_GUARD: Duration = Duration::from_secs(60);
/// How often a test looks again at state it waits for.
const POLL: Duration = Duration::from_millis(10);
/// The client's chunk length for write data. It buffers what it sends up
/// to this much, so with `k` chunks let through the drive has the first
/// `k - 1` whole (the last one's tag waits in the client's buffer).
const CHUNK: u64 = nasd_proto::limits::CHUNK_LEN_DEFAULT as u64;
/// Chunks of each write.
const CHUNKS: u64 = 4;
/// Times each combination of hold point and write shape runs.
const REPEATS: u64 = 2;

async fn timed<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(HANG_GUARD, f).await.unwrap_or_else(|_| panic!("{what} hung"))
}

async fn charged(c: &mut DriveClient) -> u64 {
    c.inquiry().await.unwrap().partitions.iter().find(|x| x.partition == P).expect("partition").used_bytes
}

async fn read_all(c: &mut DriveClient, o: u64) -> Vec<u8> {
    let size = c.getattr(P, o).await.unwrap().logical_size;
    c.read(P, o, &[rg(0, size)]).await.unwrap().1
}

/// How the writer writes: what its capability allows and where.
#[derive(Debug, Clone, Copy)]
enum Shape {
    /// `WRITE`, from inside the last block on: blocks covered in part at
    /// both ends.
    Overlapping,
    /// `WRITE`, from the object's end on.
    AtEnd,
    /// `APPEND` only, at the object's end.
    Append,
}

impl Shape {
    fn rights(self) -> u32 {
        match self {
            Shape::Overlapping | Shape::AtEnd => rights::WRITE | rights::GETATTR,
            Shape::Append => rights::APPEND | rights::GETATTR,
        }
    }
    fn region(self, size: u64) -> Region {
        let len = CHUNKS * CHUNK;
        match self {
            Shape::Overlapping => rg(size - BS / 2 - 3, len),
            Shape::AtEnd | Shape::Append => rg(size, len),
        }
    }
}

/// A write under a capability whose object is revoked — the test acting as
/// the file manager with the drive key: `SETATTR` of a new access control
/// version, then `FLUSH` — while the write's data is held at every point
/// (before the drive saw the request; with its first chunk's data but not
/// its tag; with one and with two whole chunks in the store), for writes
/// covering blocks in part, whole blocks, and appends. Once the revocation
/// is answered the write must be refused with `ACCESS_REVOKED` and the
/// object must be unchanged, its partition charged nothing more. Before,
/// the drive checked the version once, before the data: a write authorized
/// just before the revocation landed after the manager was told
/// "revoked" (and a version it could not read was taken as a pass).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_streaming_while_its_capability_is_revoked_lands_nothing() {
    let d = Drive::start().await;
    let mut admin = d.admin().await;
    let drive_id = admin.drive_id();
    let (o, _) = admin.create(P).await.unwrap();
    let mut v = bytes(1, 3 * BS);
    admin.write(P, o, &[rg(0, v.len() as u64)], &v).await.unwrap();
    let mut acv = 0;
    for repeat in 0..REPEATS {
        for shape in [Shape::Overlapping, Shape::AtEnd, Shape::Append] {
            for let_through in 0..CHUNKS {
                let what = format!("{shape:?}, {let_through} chunks let through, repeat {repeat}");
                let mut args = Drive::capability_args(drive_id, o);
                (args.access_control_version, args.rights) = (acv, shape.rights());
                let mut writer = DriveClient::connect(d.addr).await.unwrap();
                writer.set_auth(Auth::new(Drive::mint(&d.working, &args), PROTECTION));
                let region = shape.region(v.len() as u64);
                let data = bytes(2 + acv as u8, region.length);
                let base = charged(&mut admin).await;
                let (src, mut held) = tokio::io::duplex(data.len());
                let at = (let_through * CHUNK) as usize;
                held.write_all(&data[..at]).await.unwrap();
                let write = tokio::spawn(async move {
                    let mut src: DuplexStream = src;
                    writer.write_from(P, o, &[region], region.length, &mut src).await
                });
                if let_through >= 2 {
                    // The store task has planned the write: authorized, not yet installed.
                    timed(&format!("{what}: the write planned"), async {
                        while charged(&mut d.admin().await).await == base {
                            tokio::time::sleep(POLL).await;
                        }
                    })
                    .await;
                }
                acv += 1;
                let revoked = Attributes { access_control_version: acv, ..Attributes::default() };
                timed(&what, admin.setattr(P, o, AttrMask::ACCESS_CONTROL_VERSION, &revoked)).await.unwrap();
                timed(&what, admin.flush(P, &[o])).await.unwrap();
                held.write_all(&data[at..]).await.unwrap();
                match timed(&what, write).await.unwrap() {
                    Err(ClientError::Status { status: Status::AccessRevoked, .. }) => {}
                    other => panic!("{what}: expected ACCESS_REVOKED, got {other:?}"),
                }
                assert_eq!(read_all(&mut admin, o).await, v, "{what}: the object changed");
                assert_eq!(charged(&mut admin).await, base, "{what}: a charge left behind");
            }
        }
        // The object grows between repeats, so appends and tails move on.
        let more = bytes(9, BS + 7);
        admin.write(P, o, &[rg(v.len() as u64, more.len() as u64)], &more).await.unwrap();
        v.extend_from_slice(&more);
    }
}

/// A capability for an object that no longer exists is refused with the
/// reason (`NO_SUCH_OBJECT`) when its access control version is checked,
/// even by a request that touches no object of its own: a `FLUSH` naming
/// no objects. Before, the failure to read the version was skipped, and
/// the flush went through under a capability for an object that was gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capability_whose_object_is_gone_is_refused_not_passed() {
    let d = Drive::start().await;
    let mut admin = d.admin().await;
    let drive_id = admin.drive_id();
    let (o, _) = admin.create(P).await.unwrap();
    let mut holder = d.client(d.capability(drive_id, o)).await;
    holder.flush(P, &[]).await.expect("the object exists: the capability is good");
    admin.remove(P, o).await.unwrap();
    assert_eq!(refused(holder.flush(P, &[]).await), Status::NoSuchObject);
    assert_eq!(refused(holder.getattr(P, o).await), Status::NoSuchObject);
    let e = holder.write(P, o, &[rg(0, 10)], &[1; 10]).await;
    assert!(matches!(e, Err(ClientError::Status { status: Status::NoSuchObject, .. })), "{e:?}");
}
