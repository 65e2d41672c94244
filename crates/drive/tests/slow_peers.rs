//! Clients that stop sending their write data or stop reading their reply,
//! against a real drive on loopback: they hold no lock other requests of
//! their object (so of its lock stripe), or partition removal, or a flush,
//! wait for; the drive cuts them off at its deadlines and frees what they
//! held; and writes that stream while others install lose no byte of either.

mod common;

use common::{bytes, rg, Drive, Options, BS, OTHER, P};
use nasd_client::{ClientError, DriveClient};
use nasd_proto::Region;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::task::JoinHandle;

/// Bound on any wait of these tests: a hang guard only (every step takes
/// milliseconds, or a deadline of 1 s, or — where a test checks that a
/// request did *not* wait for a held one — at most the drive's default
/// 30 s deadline), so a regression fails instead of hanging.
const HANG_GUARD: Duration = Duration::from_secs(120);
/// The drive's deadlines in the tests that wait for a cut-off.
const SHORT_DEADLINE: Duration = Duration::from_secs(1);
/// How often a test looks again at state it waits for.
const POLL: Duration = Duration::from_millis(10);

async fn timed<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(HANG_GUARD, f).await.unwrap_or_else(|_| panic!("{what} hung"))
}

/// Waits until `check` holds (within the hang guard).
async fn eventually<F: Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    timed(what, async {
        while !check().await {
            tokio::time::sleep(POLL).await;
        }
    })
    .await
}

/// The client's chunk length for write data. It buffers what it sends up
/// to this much, so held data reaches the drive at chunk granularity: with
/// `k` chunks let through, the drive has the first `k - 1` whole (the last
/// one's tag waits in the client's buffer).
const CHUNK: u64 = nasd_proto::limits::CHUNK_LEN_DEFAULT as u64;

/// Write data the test lets through in two parts: the first `at` bytes at
/// once, the rest when released.
struct HeldData {
    rest: Vec<u8>,
    tx: DuplexStream,
}

impl HeldData {
    async fn new(data: &[u8], at: usize) -> (DuplexStream, HeldData) {
        let (mut tx, rx) = tokio::io::duplex(data.len().max(1));
        tx.write_all(&data[..at]).await.unwrap();
        (rx, HeldData { rest: data[at..].to_vec(), tx })
    }

    async fn release(mut self) {
        let _ = self.tx.write_all(&self.rest).await;
    }
}

/// `c` writes `data` to `regions` of `o`, its data held after `at` bytes.
async fn held_write(
    mut c: DriveClient,
    o: u64,
    regions: Vec<Region>,
    data: &[u8],
    at: usize,
) -> (HeldData, JoinHandle<Result<u64, ClientError>>) {
    let (mut src, held) = HeldData::new(data, at).await;
    let len = data.len() as u64;
    let task = tokio::spawn(async move { c.write_from(P, o, &regions, len, &mut src).await });
    (held, task)
}

/// `c` reads `regions` of `o` into a pipe of 64 KiB that the test reads
/// only on `resume`: once the pipe is full, the client stops reading its
/// reply. Returns once the reply's first data byte arrived.
struct HeldRead {
    pipe: DuplexStream,
    got: Vec<u8>,
    task: JoinHandle<Result<Vec<u64>, ClientError>>,
}

impl HeldRead {
    async fn start(mut c: DriveClient, o: u64, regions: Vec<Region>) -> HeldRead {
        let (mut dst, mut pipe) = tokio::io::duplex(64 * 1024);
        let task = tokio::spawn(async move { c.read_to(P, o, &regions, &mut dst).await });
        let mut first = [0u8; 1];
        timed("the reply's first byte", pipe.read_exact(&mut first)).await.unwrap();
        HeldRead { pipe, got: first.to_vec(), task }
    }

    /// Reads on: everything the client passes on, and the client's result.
    async fn resume(mut self) -> (Vec<u8>, Result<Vec<u64>, ClientError>) {
        let HeldRead { pipe, got, task } = &mut self;
        let drained = async {
            pipe.read_to_end(got).await.unwrap();
        };
        let (_, result) = timed("the held read's end", async { tokio::join!(drained, task) }).await;
        (std::mem::take(got), result.unwrap())
    }
}

/// Bytes the drive has allocated (its `INQUIRY`): blocks pinned by a read
/// count until the read lets them go.
async fn drive_used(c: &mut DriveClient) -> u64 {
    c.inquiry().await.unwrap().used_bytes
}

/// Bytes partition `p` is charged, writes in progress included.
async fn charged(c: &mut DriveClient, p: u64) -> u64 {
    c.inquiry().await.unwrap().partitions.iter().find(|x| x.partition == p).expect("partition").used_bytes
}

async fn read_all(c: &mut DriveClient, o: u64) -> Vec<u8> {
    let size = c.getattr(P, o).await.unwrap().logical_size;
    c.read(P, o, &[rg(0, size)]).await.unwrap().1
}

fn apply(model: &mut Vec<u8>, regions: &[Region], data: &[u8]) {
    let mut at = 0;
    for r in regions {
        let end = r.end() as usize;
        if model.len() < end {
            model.resize(end, 0);
        }
        model[r.offset as usize..end].copy_from_slice(&data[at..at + r.length as usize]);
        at += r.length as usize;
    }
}

/// Fails with the first byte where `got` and `want` differ (not both whole).
#[track_caller]
fn same_bytes(got: &[u8], want: &[u8], what: &str) {
    if let Some(at) = got.iter().zip(want).position(|(g, w)| g != w) {
        panic!("{what}: byte {at} is {} not {} (block {})", got[at], want[at], at as u64 / BS);
    }
    assert_eq!(got.len(), want.len(), "{what}: length");
}

/// An object of partition `P` holding `v`, and an object with data in
/// partition `OTHER` (so removing that needs `force`).
async fn objects(admin: &mut DriveClient, v: &[u8]) -> u64 {
    let (o, _) = admin.create(P).await.unwrap();
    admin.write(P, o, &[rg(0, v.len() as u64)], v).await.unwrap();
    let (other, _) = admin.create(OTHER).await.unwrap();
    admin.write(OTHER, other, &[rg(0, 100)], &[5; 100]).await.unwrap();
    admin.flush(P, &[o]).await.unwrap();
    o
}

/// A relay between one client and the drive that says when the drive ends
/// the connection, and how many bytes it had passed to the drive by then.
async fn relay(drive: SocketAddr) -> (SocketAddr, tokio::sync::oneshot::Receiver<u64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (closed, closed_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (client, _) = listener.accept().await.unwrap();
        let upstream = tokio::net::TcpStream::connect(drive).await.unwrap();
        let (mut client_rd, mut client_wr) = client.into_split();
        let (mut drive_rd, mut drive_wr) = upstream.into_split();
        let passed = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = passed.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(n @ 1..) = client_rd.read(&mut buf).await {
                if drive_wr.write_all(&buf[..n]).await.is_err() {
                    break;
                }
                counted.fetch_add(n as u64, std::sync::atomic::Ordering::SeqCst);
            }
        });
        let _ = tokio::io::copy(&mut drive_rd, &mut client_wr).await;
        let _ = closed.send(passed.load(std::sync::atomic::Ordering::SeqCst));
    });
    (addr, closed_rx)
}

/// A client that stops sending its write data mid-request holds no lock:
/// while it is silent, another connection writes the blocks it covers in
/// part (other bytes of them), reads the object, flushes it and its
/// partition, and removes another partition (which takes every lock
/// stripe). When it goes on, its write lands merged with the other — it
/// was neither blocked nor cut off meanwhile. Before, the write held its
/// object's stripe lock while waiting for each chunk: the other writes
/// and the partition removal waited for the drive's 30 s deadline, which
/// then cut the silent writer off, so its write failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_stops_sending_blocks_nothing_of_its_object_or_drive() {
    let d = Drive::start().await;
    let mut admin = d.admin().await;
    let drive_id = admin.drive_id();
    let mut model = bytes(1, 4 * BS);
    let o = objects(&mut admin, &model).await;

    // A covers block 3 in part, the blocks after it whole, and its last
    // block in part; its first chunk reaches the store, the rest waits.
    let a = d.client(d.capability(drive_id, o)).await;
    let a_end = 3 * BS + 100 + 3 * CHUNK;
    let a_regions = vec![rg(3 * BS + 100, 3 * CHUNK)];
    let a_data = bytes(2, 3 * CHUNK);
    let base = charged(&mut admin, P).await;
    let (held, a_write) = held_write(a, o, a_regions.clone(), &a_data, 2 * CHUNK as usize).await;
    eventually("A's write is planned", || async { charged(&mut d.admin().await, P).await > base }).await;

    let b_regions = [rg(3 * BS, 100), rg(a_end, 50)];
    let b_data = bytes(3, 150);
    timed("the other requests", async {
        admin.write(P, o, &b_regions, &b_data).await.unwrap();
        apply(&mut model, &b_regions, &b_data);
        same_bytes(&read_all(&mut admin, o).await, &model, "a read while A is silent");
        admin.flush(P, &[o]).await.unwrap();
        admin.flush_partition(P).await.unwrap();
        admin.remove_partition(OTHER, true).await.unwrap();
    })
    .await;
    held.release().await;
    let written = timed("A's write", a_write).await.unwrap();
    assert_eq!(written.expect("A was neither blocked nor cut off"), 3 * CHUNK);
    apply(&mut model, &a_regions, &a_data);
    same_bytes(&read_all(&mut admin, o).await, &model, "both writes, merged");
    assert_eq!(charged(&mut admin, P).await, (a_end + 50).div_ceil(BS) * BS, "no charge left in flight");
}

/// A client that stops sending its write data is cut off after the
/// drive's frame deadline: the drive ends the connection, having given
/// back the write's charge and its new blocks, and the object is as it
/// was. (If the drive waited for write data without a deadline, the relay
/// would never see the connection end.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_stops_sending_is_cut_off_and_its_write_changes_nothing() {
    let d = Drive::start_with(Options { config: |c| c.frame_timeout = SHORT_DEADLINE, ..Options::default() }).await;
    let mut admin = d.admin().await;
    let drive_id = admin.drive_id();
    let v1 = bytes(1, 4 * BS);
    let o = objects(&mut admin, &v1).await;
    let (charged_before, used_before) = (charged(&mut admin, P).await, drive_used(&mut admin).await);

    let (via, drive_closed) = relay(d.addr).await;
    let mut a = DriveClient::connect(via).await.unwrap();
    a.set_auth(nasd_client::Auth::new(d.capability(drive_id, o), common::PROTECTION));
    let let_through = 2 * CHUNK as usize;
    let (held, a_write) = held_write(a, o, vec![rg(3 * BS + 100, 3 * CHUNK)], &bytes(2, 3 * CHUNK), let_through).await;
    let passed = timed("the drive cutting the silent writer off", drive_closed).await.unwrap();
    assert!(passed > let_through as u64, "the write's first chunks reached the drive ({passed} bytes)");
    assert_eq!(charged(&mut admin, P).await, charged_before, "the write's charge is given back");
    assert_eq!(drive_used(&mut admin).await, used_before, "the write's new blocks are free");
    held.release().await;
    let e = timed("A's write", a_write).await.unwrap().expect_err("the drive cut A off");
    assert!(matches!(e, ClientError::Io(_)), "{e}");
    same_bytes(&read_all(&mut admin, o).await, &v1, "the object");
}

/// Block size of the read tests: one batch of the block map
/// (`READ_BATCH_BLOCKS` = 1024 blocks, 64 MiB) holds the whole read, and the
/// read is far larger than what loopback sockets and the drive's channel
/// can buffer, so a client that stops reading stops the drive's read task.
const READ_BS: u32 = 64 * 1024;
const READ_LEN: u64 = 40 << 20;
fn read_options() -> Options {
    Options { block_size: READ_BS, capacity_bytes: 512 << 20, quota_bytes: 128 << 20, ..Options::default() }
}

/// A client that stops reading its reply holds no lock: while it is
/// silent, another connection overwrites the whole object twice, flushing
/// after each (the blocks the read still has to send are dropped by the
/// index, released and could be handed out again), and removes another
/// partition. When the reader goes on it gets the object as it was when
/// its read began, every byte: its blocks were pinned. Before, the read
/// held its object's stripe lock while its data waited for the socket,
/// with no deadline on sending: the writes waited for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stops_reading_blocks_no_writer_and_reads_what_it_began_with() {
    let d = Drive::start_with(read_options()).await;
    let mut admin = d.admin().await;
    let drive_id = admin.drive_id();
    let v1 = bytes(1, READ_LEN);
    let o = objects(&mut admin, &v1).await;

    let a = d.client(d.capability(drive_id, o)).await;
    let reader = HeldRead::start(a, o, vec![rg(0, READ_LEN)]).await;
    timed("writes while the reader is silent", async {
        for seed in [2, 3] {
            admin.write(P, o, &[rg(0, READ_LEN)], &bytes(seed, READ_LEN)).await.unwrap();
            admin.flush(P, &[o]).await.unwrap();
        }
        admin.remove_partition(OTHER, true).await.unwrap();
    })
    .await;
    let (got, result) = reader.resume().await;
    assert_eq!(result.expect("the reader was neither blocked nor cut off"), vec![READ_LEN]);
    same_bytes(&got, &v1, "the read");
    same_bytes(&read_all(&mut admin, o).await, &bytes(3, READ_LEN), "the object now");
}

/// A client that stops reading its reply is cut off after the drive's send
/// deadline, and the blocks its read pinned are released: once the object
/// was overwritten and flushed, the drive's allocated bytes come back to
/// one copy of the object. (Without a send deadline the read task waited
/// for the socket for ever and the old copy stayed allocated.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stops_reading_is_cut_off_and_its_pins_released() {
    let options = Options { config: |c| c.send_timeout = SHORT_DEADLINE, ..read_options() };
    let d = Drive::start_with(options).await;
    let mut admin = d.admin().await;
    let drive_id = admin.drive_id();
    let o = objects(&mut admin, &bytes(1, READ_LEN)).await;
    let used = drive_used(&mut admin).await;

    let a = d.client(d.capability(drive_id, o)).await;
    let reader = HeldRead::start(a, o, vec![rg(0, READ_LEN)]).await;
    let v2 = bytes(2, READ_LEN);
    admin.write(P, o, &[rg(0, READ_LEN)], &v2).await.unwrap();
    admin.flush(P, &[o]).await.unwrap();
    eventually("the old copy's blocks freed", || async { drive_used(&mut d.admin().await).await == used }).await;
    let (got, result) = reader.resume().await;
    assert!(matches!(result, Err(ClientError::Io(_))), "the reader was cut off: {result:?}");
    assert!((got.len() as u64) < READ_LEN);
    same_bytes(&read_all(&mut admin, o).await, &v2, "the object");
}

/// Deterministic draws for the interleaving loop.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Rounds of the interleaving loop (half of them with one write held).
const ROUNDS: u64 = 40;
/// Where A's data is held in the rounds that hold it: its first chunk
/// reaches the store.
const HOLD_AT: usize = 2 * CHUNK as usize;

/// Two connections write overlapping, partial blocks of one object at
/// once, round after round, and neither's bytes are lost: the object ends
/// as if the writes installed one after the other. In even rounds A is
/// held after its first chunk — once it has stored its first block and
/// loaded the next one's old bytes — while B installs, so A installs last
/// and must merge both blocks again from B's; in odd rounds they run
/// freely and either order is allowed. Without the merge at install A put
/// back the bytes B had changed next to its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_partial_block_writes_from_two_connections_lose_no_bytes() {
    let d = Drive::start().await;
    let mut admin = d.admin().await;
    let drive_id = admin.drive_id();
    let mut rng = Rng(0x5EED_1234_ABCD_0001);
    for round in 0..ROUNDS {
        let span = 2 * CHUNK + 8 * BS;
        let v = bytes(round as u8, span);
        let (o, _) = admin.create(P).await.unwrap();
        admin.write(P, o, &[rg(0, span)], &v).await.unwrap();
        // A: a short region in one block, then a long one from a later
        // block on, longer than what is let through in held rounds.
        let first_block = rng.below(3);
        let n1 = 1 + rng.below(500);
        let r1 = rg(first_block * BS + rng.below(BS - n1), n1);
        let x2 = (first_block + 1) * BS + rng.below(BS);
        let r2 = rg(x2, HOLD_AT as u64 + 1 + rng.below(4 * BS));
        let a_regions = vec![r1, r2];
        let a_data = bytes(100 + round as u8, n1 + r2.length);
        // B: a region in A's first blocks (which A loaded before B, in
        // held rounds) and one towards A's end (which A reaches after B).
        let near = rg(rng.below(5 * BS), 1 + rng.below(BS));
        let far = rg(near.end() + CHUNK + rng.below(CHUNK), 1 + rng.below(BS));
        let b_regions = [near, far];
        let b_data = bytes(200 + round as u8, b_regions.iter().map(|r| r.length).sum());
        let a = d.client(d.capability(drive_id, o)).await;
        let what = format!("round {round}: A {a_regions:?}, B {b_regions:?}");
        let (mut a_first, mut b_first) = (v.clone(), v.clone());
        apply(&mut a_first, &a_regions, &a_data);
        apply(&mut a_first, &b_regions, &b_data);
        apply(&mut b_first, &b_regions, &b_data);
        apply(&mut b_first, &a_regions, &a_data);
        if round % 2 == 0 {
            let used = drive_used(&mut admin).await;
            let (held, a_write) = held_write(a, o, a_regions.clone(), &a_data, HOLD_AT).await;
            eventually("A stored its first block", || async { drive_used(&mut d.admin().await).await > used }).await;
            timed("B's write", admin.write(P, o, &b_regions, &b_data)).await.unwrap();
            held.release().await;
            timed("A's write", a_write).await.unwrap().unwrap();
            same_bytes(&read_all(&mut admin, o).await, &b_first, &what);
        } else {
            let (_, a_write) = held_write(a, o, a_regions.clone(), &a_data, a_data.len()).await;
            timed("B's write", admin.write(P, o, &b_regions, &b_data)).await.unwrap();
            timed("A's write", a_write).await.unwrap().unwrap();
            let got = read_all(&mut admin, o).await;
            assert!(got == a_first || got == b_first, "{what}: the object is neither order of the two writes");
        }
        admin.remove(P, o).await.unwrap();
    }
    assert_eq!(charged(&mut admin, P).await, 0, "nothing left charged");
}
