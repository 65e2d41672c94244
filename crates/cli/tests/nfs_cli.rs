//! The NFSv3 gateway (`nasd nfs`) on a real `nasd up` cluster, driven by a
//! real third-party client (libnfs's `nfs-cp`, `nfs-ls`, `nfs-cat`) and by
//! hand-made RPC calls (a forged handle, UNSTABLE writes and COMMIT, a
//! listing paged while its directory changes, a gateway restart; refused
//! credential flavours, the per-client connection cap, resent calls
//! answered from the duplicate-request cache, also after a restart, `..`
//! kept inside its export; a 10 000-entry directory; a copy whose gateway
//! is killed and restarted,
//! its uncommitted writes resent as RFC 1813 asks; a large file).

mod common;

use common::up::Up;
use common::Daemon;
use rand::{Rng, RngCore, SeedableRng};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Output};

const NFS: u32 = 100_003;
const MOUNT: u32 = 100_005;
const OK: u32 = 0;
const NFS3ERR_ACCES: u32 = 13;
const NFS3ERR_BADHANDLE: u32 = 10_001;
const NFS3ERR_BAD_COOKIE: u32 = 10_003;
const NFS3ERR_JUKEBOX: u32 = 10_008;

fn start_gateway(cwd: &Path, log: &str, prefer: Option<SocketAddr>, extra: &[&str]) -> Daemon {
    let extra: Vec<OsString> = extra.iter().map(OsString::from).collect();
    Daemon::start("nasd nfs", cwd, &cwd.join(log), prefer, move |addr| {
        let mut args: Vec<OsString> = vec!["nfs".into(), "--listen".into(), addr.to_string().into()];
        args.extend(extra.iter().cloned());
        args
    })
}

fn url(gw: &Daemon, path: &str, uid: u32) -> String {
    let p = gw.addr.port();
    format!("nfs://127.0.0.1{path}?nfsport={p}&mountport={p}&uid={uid}&gid={uid}")
}

fn libnfs(tool: &str, args: &[&str]) -> Output {
    Command::new(tool).args(args).output().unwrap_or_else(|e| panic!("run {tool} (libnfs-utils): {e}"))
}

fn libnfs_ok(tool: &str, args: &[&str]) -> Vec<u8> {
    let out = libnfs(tool, args);
    assert!(out.status.success(), "{tool} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

/// `nfs-ls` of a directory: name → (mode column, size).
fn nfs_ls(u: &str) -> BTreeMap<String, (String, u64)> {
    let out = String::from_utf8(libnfs_ok("nfs-ls", &[u])).unwrap();
    out.lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert!(f.len() >= 6, "nfs-ls line {l:?}");
            (f[f.len() - 1].to_string(), (f[0].to_string(), f[f.len() - 2].parse().unwrap()))
        })
        .collect()
}

// ------------------------------------------------------------- raw RPC

/// XDR encoding of call arguments.
#[derive(Default)]
struct Xdr(Vec<u8>);

impl Xdr {
    fn u32(mut self, v: u32) -> Xdr {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Xdr {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn opaque(mut self, b: &[u8]) -> Xdr {
        self = self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
        self.0.resize(self.0.len() + (4 - b.len() % 4) % 4, 0);
        self
    }
    fn fixed(mut self, b: &[u8]) -> Xdr {
        self.0.extend_from_slice(b);
        self
    }
    /// A `sattr3` that changes nothing.
    fn no_sattr(self) -> Xdr {
        (0..6).fold(self, |x, _| x.u32(0))
    }
}

/// A decoder of a reply's results.
struct Reply {
    b: Vec<u8>,
    at: usize,
}

impl Reply {
    fn u32(&mut self) -> u32 {
        let v = u32::from_be_bytes(self.b[self.at..self.at + 4].try_into().unwrap());
        self.at += 4;
        v
    }
    fn u64(&mut self) -> u64 {
        let v = u64::from_be_bytes(self.b[self.at..self.at + 8].try_into().unwrap());
        self.at += 8;
        v
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let v = self.b[self.at..self.at + n].to_vec();
        self.at += n;
        v
    }
    fn opaque(&mut self) -> Vec<u8> {
        let n = self.u32() as usize;
        let v = self.bytes(n);
        self.at += (4 - n % 4) % 4;
        v
    }
    /// A `post_op_attr`; the file id if present.
    fn post_op_attr(&mut self) -> Option<u64> {
        (self.u32() == 1).then(|| {
            let attr = self.bytes(84);
            u64::from_be_bytes(attr[44..52].try_into().unwrap())
        })
    }
    fn wcc(&mut self) {
        if self.u32() == 1 {
            self.bytes(24);
        }
        self.post_op_attr();
    }
    /// A READDIR (or, with `plus`, READDIRPLUS) reply: status, (name,
    /// cookie) pairs, verifier, eof. READDIRPLUS entries are checked to carry
    /// attributes and a sealed handle.
    fn directory_page(mut self, plus: bool) -> (u32, Vec<(String, u64)>, [u8; 8], bool) {
        let status = self.u32();
        self.post_op_attr();
        if status != OK {
            return (status, Vec::new(), [0; 8], false);
        }
        let verf: [u8; 8] = self.bytes(8).try_into().unwrap();
        let mut entries = Vec::new();
        while self.u32() == 1 {
            self.u64();
            let name = String::from_utf8(self.opaque()).unwrap();
            let cookie = self.u64();
            if plus {
                assert!(self.post_op_attr().is_some(), "{name} has attributes");
                assert_eq!(self.post_op_fh().len(), 64, "{name} has a sealed handle");
            }
            entries.push((name, cookie));
        }
        let eof = self.u32() == 1;
        (OK, entries, verf, eof)
    }

    fn post_op_fh(&mut self) -> Vec<u8> {
        assert_eq!(self.u32(), 1, "a handle follows");
        self.opaque()
    }
}

/// One TCP connection to the gateway, calling as `uid`.
struct Rpc {
    s: TcpStream,
    xid: u32,
    uid: u32,
}

impl Rpc {
    fn connect(addr: SocketAddr, uid: u32) -> Rpc {
        Rpc::try_connect(addr, uid).expect("connect to the gateway")
    }

    /// A connection, its xids starting at random (as clients' do: the
    /// gateway's duplicate-request cache tells calls apart by client
    /// address and xid); `None` if nothing listens.
    fn try_connect(addr: SocketAddr, uid: u32) -> Option<Rpc> {
        let s = TcpStream::connect(addr).ok()?;
        // A hang guard (a call the gateway never answers), not a timing assertion.
        s.set_read_timeout(Some(common::DAEMON_WAIT_MAX)).unwrap();
        Some(Rpc { s, xid: rand::random::<u32>() >> 1, uid })
    }

    /// A connection the gateway serves (a NULL call answered), once the
    /// per-client cap lets one in.
    fn served(addr: SocketAddr, uid: u32) -> Option<Rpc> {
        let mut rpc = Rpc::try_connect(addr, uid)?;
        rpc.send(NFS, 3, 0, Xdr::default()).ok()?;
        Some(rpc)
    }

    fn send(&mut self, prog: u32, vers: u32, proc: u32, args: Xdr) -> std::io::Result<Reply> {
        self.xid += 1;
        let cred = Xdr::default().u32(0).opaque(b"test").u32(self.uid).u32(self.uid).u32(0).0;
        let msg = Xdr::default()
            .u32(self.xid)
            .u32(0)
            .u32(2)
            .u32(prog)
            .u32(vers)
            .u32(proc)
            .u32(1)
            .opaque(&cred)
            .u32(0)
            .u32(0)
            .fixed(&args.0)
            .0;
        self.s.write_all(&(msg.len() as u32 | 1 << 31).to_be_bytes())?;
        self.s.write_all(&msg)?;
        let mut mark = [0u8; 4];
        self.s.read_exact(&mut mark)?;
        let mark = u32::from_be_bytes(mark);
        assert!(mark & 1 << 31 != 0, "one fragment per reply");
        let mut b = vec![0u8; (mark & !(1 << 31)) as usize];
        self.s.read_exact(&mut b)?;
        let mut r = Reply { b, at: 0 };
        assert_eq!(r.u32(), self.xid, "xid");
        assert_eq!(r.u32(), 1, "a reply");
        assert_eq!(r.u32(), 0, "accepted");
        r.u32();
        r.opaque();
        assert_eq!(r.u32(), 0, "SUCCESS");
        Ok(r)
    }

    fn call(&mut self, prog: u32, proc: u32, args: Xdr) -> Reply {
        self.send(prog, 3, proc, args).expect("the gateway answers")
    }

    /// The last call sent again, with its xid (a client's retransmission).
    fn resend(&mut self, prog: u32, proc: u32, args: Xdr) -> Reply {
        self.xid -= 1;
        self.call(prog, proc, args)
    }

    fn mount(&mut self, path: &str) -> Vec<u8> {
        let mut r = self.call(MOUNT, 1, Xdr::default().opaque(path.as_bytes()));
        assert_eq!(r.u32(), OK, "MOUNT {path}");
        r.opaque()
    }

    /// GETATTR's status.
    fn getattr(&mut self, fh: &[u8]) -> u32 {
        self.call(NFS, 1, Xdr::default().opaque(fh)).u32()
    }

    fn lookup(&mut self, dir: &[u8], name: &str) -> (u32, Vec<u8>) {
        let mut r = self.call(NFS, 3, Xdr::default().opaque(dir).opaque(name.as_bytes()));
        match r.u32() {
            OK => (OK, r.opaque()),
            e => (e, Vec::new()),
        }
    }

    fn create(&mut self, dir: &[u8], name: &str) -> Vec<u8> {
        let mut r = self.call(NFS, 8, Xdr::default().opaque(dir).opaque(name.as_bytes()).u32(0).no_sattr());
        assert_eq!(r.u32(), OK, "CREATE {name}");
        r.post_op_fh()
    }

    fn remove(&mut self, dir: &[u8], name: &str) {
        let mut r = self.call(NFS, 12, Xdr::default().opaque(dir).opaque(name.as_bytes()));
        assert_eq!(r.u32(), OK, "REMOVE {name}");
    }

    /// An UNSTABLE WRITE: the stability answered and the write verifier.
    fn write(&mut self, fh: &[u8], offset: u64, data: &[u8]) -> (u32, [u8; 8]) {
        let args = Xdr::default().opaque(fh).u64(offset).u32(data.len() as u32).u32(0).opaque(data);
        let mut r = self.call(NFS, 7, args);
        assert_eq!(r.u32(), OK, "WRITE");
        r.wcc();
        assert_eq!(r.u32(), data.len() as u32, "count");
        let stable = r.u32();
        (stable, r.bytes(8).try_into().unwrap())
    }

    fn commit(&mut self, fh: &[u8]) -> [u8; 8] {
        let mut r = self.call(NFS, 21, Xdr::default().opaque(fh).u64(0).u32(0));
        assert_eq!(r.u32(), OK, "COMMIT");
        r.wcc();
        r.bytes(8).try_into().unwrap()
    }

    fn read(&mut self, fh: &[u8], offset: u64, count: u32) -> (Vec<u8>, bool) {
        let mut r = self.call(NFS, 6, Xdr::default().opaque(fh).u64(offset).u32(count));
        assert_eq!(r.u32(), OK, "READ");
        r.post_op_attr();
        r.u32();
        let eof = r.u32() == 1;
        (r.opaque(), eof)
    }

    /// One READDIRPLUS page: status, (name, cookie) pairs (each checked to
    /// carry attributes and a handle), verifier, eof.
    fn readdirplus(
        &mut self,
        dir: &[u8],
        cookie: u64,
        verf: [u8; 8],
        (dircount, maxcount): (u32, u32),
    ) -> (u32, Vec<(String, u64)>, [u8; 8], bool) {
        let args = Xdr::default().opaque(dir).u64(cookie).fixed(&verf).u32(dircount).u32(maxcount);
        let r = self.call(NFS, 17, args);
        r.directory_page(true)
    }

    /// One READDIR page: status, (name, cookie) pairs, verifier, eof.
    fn readdir(
        &mut self,
        dir: &[u8],
        cookie: u64,
        verf: [u8; 8],
        count: u32,
    ) -> (u32, Vec<(String, u64)>, [u8; 8], bool) {
        let r = self.call(NFS, 16, Xdr::default().opaque(dir).u64(cookie).fixed(&verf).u32(count));
        r.directory_page(false)
    }
}

/// GETATTR's file id and link count.
fn stat(rpc: &mut Rpc, fh: &[u8]) -> (u64, u32) {
    let mut r = rpc.call(NFS, 1, Xdr::default().opaque(fh));
    assert_eq!(r.u32(), OK, "GETATTR");
    let a = r.bytes(84);
    // fattr3: type, mode, nlink, uid, gid, size, used, rdev, fsid, fileid, times.
    (u64::from_be_bytes(a[52..60].try_into().unwrap()), u32::from_be_bytes(a[8..12].try_into().unwrap()))
}

/// The whole file back through READ, in `piece`-byte calls.
fn read_all(rpc: &mut Rpc, fh: &[u8], piece: u32) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let (data, eof) = rpc.read(fh, out.len() as u64, piece);
        out.extend_from_slice(&data);
        if eof || data.is_empty() {
            return out;
        }
    }
}

#[test]
fn nfs_gateway_serves_libnfs_as_mapped_users_with_sealed_handles_that_survive_a_restart() {
    let seed = std::env::var("NFS_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random::<u64>);
    println!("seed {seed} (NFS_TEST_SEED to repeat)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let mut up = Up::start(cwd, 2, &["--no-s3"]);
    up.ok(&["admin", "set-gateway", "admin", "--ids", "1000-60000"]);
    up.ok(&["mkdir", "/pub"]);
    up.ok(&["chmod", "777", "/pub"]);
    let gw = start_gateway(cwd, "nfs.log", None, &[]);

    // libnfs: a file copied in and out byte for byte, and listed.
    let len = rng.gen_range(1..6 << 20);
    let mut data = vec![0u8; len];
    rng.fill_bytes(&mut data);
    let local = cwd.join("in.bin");
    std::fs::write(&local, &data).unwrap();
    libnfs_ok("nfs-cp", &[local.to_str().unwrap(), &url(&gw, "/pub/in.bin", 1000)]);
    let back = cwd.join("back.bin");
    libnfs_ok("nfs-cp", &[&url(&gw, "/pub/in.bin", 1000), back.to_str().unwrap()]);
    assert!(std::fs::read(&back).unwrap() == data, "{len} bytes copied in and out differ");
    assert!(libnfs_ok("nfs-cat", &[&url(&gw, "/pub/in.bin", 1000)]) == data, "nfs-cat differs");
    libnfs_ok("nfs-cp", &[local.to_str().unwrap(), &url(&gw, "/pub/second", 1001)]);
    let listed = nfs_ls(&url(&gw, "/pub", 1000));
    assert_eq!(listed.keys().collect::<Vec<_>>(), ["in.bin", "second"], "{listed:?}");
    assert_eq!(listed["in.bin"].1, len as u64);
    // The file belongs to the caller's uid at the manager.
    let ls = up.ok(&["ls", "-l", "/pub"]);
    assert!(ls.lines().any(|l| l.contains("1000") && l.ends_with("in.bin")), "{ls}");

    // Users: root squashed (to 65534, outside the grant), a uid outside the
    // grant, and a uid the file's mode (0660 from libnfs) keeps out.
    for uid in [0, 70_000] {
        let out = libnfs("nfs-ls", &[&url(&gw, "/pub", uid)]);
        assert!(!out.status.success(), "uid {uid} was served: {}", String::from_utf8_lossy(&out.stdout));
    }
    let out = libnfs("nfs-cat", &[&url(&gw, "/pub/in.bin", 2000)]);
    assert!(!out.status.success() && out.stdout.is_empty(), "uid 2000 read a 0660 file of uid 1000");

    // Raw RPC: UNSTABLE writes gathered, COMMIT with the same verifier.
    let mut rpc = Rpc::connect(gw.addr, 1000);
    let root = rpc.mount("/pub");
    let fh = rpc.create(&root, "raw");
    let body: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + 3) as u8).collect();
    let cut = rng.gen_range(1..body.len());
    let (stable_a, verf) = rpc.write(&fh, cut as u64, &body[cut..]);
    let (stable_b, verf_b) = rpc.write(&fh, 0, &body[..cut]);
    assert_eq!((stable_a, stable_b), (0, 0), "UNSTABLE writes are answered UNSTABLE");
    assert_eq!(verf, verf_b);
    assert_eq!(rpc.commit(&fh), verf, "COMMIT answers the writes' verifier");
    assert!(read_all(&mut rpc, &fh, 65_536) == body, "written and read back differ (cut at {cut})");

    // The other procedures, each checked against what the manager then holds.
    let (fileid, nlink) = stat(&mut rpc, &fh);
    let mut r = rpc.call(NFS, 15, Xdr::default().opaque(&fh).opaque(&root).opaque(b"raw-link"));
    assert_eq!(r.u32(), OK, "LINK");
    assert_eq!(rpc.lookup(&root, "raw-link").0, OK);
    assert_eq!(stat(&mut rpc, &fh), (fileid, nlink + 1), "LINK adds a name to the same file");
    let mut r = rpc.call(NFS, 10, Xdr::default().opaque(&root).opaque(b"sym").no_sattr().opaque(b"raw"));
    assert_eq!(r.u32(), OK, "SYMLINK");
    let sym = r.post_op_fh();
    let mut r = rpc.call(NFS, 5, Xdr::default().opaque(&sym));
    assert_eq!(r.u32(), OK, "READLINK");
    r.post_op_attr();
    assert_eq!(r.opaque(), b"raw");
    // MKNOD: a FIFO (type 7).
    let mut r = rpc.call(NFS, 11, Xdr::default().opaque(&root).opaque(b"fifo").u32(7).no_sattr());
    assert_eq!(r.u32(), OK, "MKNOD");
    let mut r = rpc.call(NFS, 14, Xdr::default().opaque(&root).opaque(b"raw-link").opaque(&root).opaque(b"renamed"));
    assert_eq!(r.u32(), OK, "RENAME");
    assert_ne!(rpc.lookup(&root, "raw-link").0, OK);
    let mut r = rpc.call(NFS, 9, Xdr::default().opaque(&root).opaque(b"empty").no_sattr());
    assert_eq!(r.u32(), OK, "MKDIR");
    let mut r = rpc.call(NFS, 13, Xdr::default().opaque(&root).opaque(b"empty"));
    assert_eq!(r.u32(), OK, "RMDIR");
    let ls = up.ok(&["ls", "-l", "/pub"]);
    for (name, kind) in [("renamed", '-'), ("sym", 'l'), ("fifo", 'p')] {
        assert!(ls.lines().any(|l| l.starts_with(kind) && l.contains(&format!(" {name}"))), "{name} in {ls}");
    }
    assert!(!ls.contains("empty") && !ls.contains("raw-link"), "{ls}");
    // SETATTR of a new file: mode 0600 and size 1000; ACCESS then says the
    // owner reads and modifies it and uid 2000 nothing.
    let sized = rpc.create(&root, "sized");
    let args = Xdr::default().opaque(&sized).u32(1).u32(0o600).u32(0).u32(0).u32(1).u64(1000).u32(0).u32(0).u32(0);
    assert_eq!(rpc.call(NFS, 2, args).u32(), OK, "SETATTR");
    assert_eq!(read_all(&mut rpc, &sized, 4096), vec![0u8; 1000], "a file set to 1000 bytes reads as zeros");
    let mut r = rpc.call(NFS, 4, Xdr::default().opaque(&sized).u32(0x3f));
    assert_eq!(r.u32(), OK, "ACCESS");
    r.post_op_attr();
    assert_eq!(r.u32() & 0x0d, 0x0d, "owner reads, modifies, extends");
    let mut stranger = Rpc::connect(gw.addr, 2000);
    let mut r = stranger.call(NFS, 4, Xdr::default().opaque(&sized).u32(0x3f));
    assert_eq!(r.u32(), OK, "ACCESS");
    r.post_op_attr();
    assert_eq!(r.u32(), 0, "uid 2000 may do nothing to a 0600 file of uid 1000");
    for proc in [18, 19, 20] {
        assert_eq!(rpc.call(NFS, proc, Xdr::default().opaque(&root)).u32(), OK, "FSSTAT/FSINFO/PATHCONF {proc}");
    }
    // READDIRPLUS: every entry with attributes and a handle that works.
    let mut r = rpc.call(NFS, 17, Xdr::default().opaque(&root).u64(0).fixed(&[0; 8]).u32(4096).u32(65536));
    assert_eq!(r.u32(), OK, "READDIRPLUS");
    r.post_op_attr();
    r.bytes(8);
    let mut plus = Vec::new();
    while r.u32() == 1 {
        r.u64();
        let name = String::from_utf8(r.opaque()).unwrap();
        r.u64();
        assert!(r.post_op_attr().is_some(), "{name} has attributes");
        plus.push((name, r.post_op_fh()));
    }
    assert_eq!(r.u32(), 1, "eof");
    let names: Vec<&str> = plus.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["fifo", "in.bin", "raw", "renamed", "second", "sized", "sym"], "READDIRPLUS names");
    for (name, h) in &plus {
        assert_eq!(rpc.getattr(h), OK, "{name}'s handle from READDIRPLUS");
    }

    // An exclusive CREATE resent with its verifier answers the same file;
    // another verifier finds the name taken.
    let verf: [u8; 8] = rng.gen();
    let excl = |rpc: &mut Rpc, v: [u8; 8]| {
        let mut r = rpc.call(NFS, 8, Xdr::default().opaque(&root).opaque(b"excl").u32(2).fixed(&v));
        match r.u32() {
            OK => Ok(stat(rpc, &r.post_op_fh()).0),
            e => Err(e),
        }
    };
    let first = excl(&mut rpc, verf).expect("an exclusive CREATE");
    assert_eq!(excl(&mut rpc, verf), Ok(first), "the same exclusive CREATE resent");
    let mut other_verf = verf;
    other_verf[7] ^= 1;
    assert_eq!(excl(&mut rpc, other_verf), Err(17), "another exclusive CREATE of the name");

    // A credential naming more than AUTH_SYS's 16 groups is refused (AUTH_BADCRED).
    let mut s = TcpStream::connect(gw.addr).unwrap();
    let cred = (0..17).fold(Xdr::default().u32(0).opaque(b"t").u32(1000).u32(1000).u32(17), |x, g| x.u32(g)).0;
    let msg = Xdr::default().u32(9).u32(0).u32(2).u32(NFS).u32(3).u32(0).u32(1).opaque(&cred).u32(0).u32(0).0;
    s.write_all(&(msg.len() as u32 | 1 << 31).to_be_bytes()).unwrap();
    s.write_all(&msg).unwrap();
    let mut reply = [0u8; 24];
    s.read_exact(&mut reply).unwrap();
    let words: Vec<u32> = reply.chunks(4).map(|c| u32::from_be_bytes(c.try_into().unwrap())).collect();
    assert_eq!(words[1..], [9, 1, 1, 1, 1], "mark, then xid, REPLY, MSG_DENIED, AUTH_ERROR, AUTH_BADCRED");

    // A forged or altered handle is refused as a bad handle.
    for at in [0, 3, 10, 20, 50, fh.len() - 1] {
        let mut bad = fh.clone();
        bad[at] ^= 0x40;
        assert_eq!(rpc.getattr(&bad), NFS3ERR_BADHANDLE, "handle altered at byte {at}");
    }
    assert_eq!(rpc.getattr(&fh[..fh.len() - 1]), NFS3ERR_BADHANDLE, "a short handle");
    assert_eq!(rpc.getattr(&[7u8; 64]), NFS3ERR_BADHANDLE, "a made-up handle");
    // Another uid's client holding a handle is still judged as itself, even
    // while the owner has the file open at the gateway.
    let (status, private) = rpc.lookup(&root, "in.bin");
    assert_eq!(status, OK);
    assert_eq!(rpc.read(&private, 0, 10).0, data[..10.min(len)]);
    let mut other = Rpc::connect(gw.addr, 2000);
    let mut r = other.call(NFS, 6, Xdr::default().opaque(&private).u64(0).u32(10));
    assert_eq!(r.u32(), NFS3ERR_ACCES, "uid 2000 read uid 1000's 0660 file by its handle");

    // A listing paged while its directory changes: each unchanged entry once.
    let (status, dir) = {
        let mut r = rpc.call(NFS, 9, Xdr::default().opaque(&root).opaque(b"many").no_sattr());
        (r.u32(), r.post_op_fh())
    };
    assert_eq!(status, OK, "MKDIR");
    let names: Vec<String> = (0..200).map(|i| format!("entry-{i:04}")).collect();
    for n in &names {
        rpc.create(&dir, n);
    }
    let mut seen: Vec<String> = Vec::new();
    let (mut cookie, mut verf3, mut removed, mut added) = (0, [0u8; 8], Vec::new(), Vec::new());
    let change_after = rng.gen_range(1..4);
    for page in 0.. {
        let (status, entries, v, eof) = rpc.readdir(&dir, cookie, verf3, 600);
        assert_eq!(status, OK, "READDIR page {page}");
        assert!(!entries.is_empty() || eof, "an empty page before the end");
        verf3 = v;
        for (name, c) in entries {
            seen.push(name);
            cookie = c;
        }
        if page == change_after {
            // One name already listed and one not yet listed go; one new comes.
            let gone_listed = seen[rng.gen_range(0..seen.len())].clone();
            let later: Vec<&String> = names.iter().filter(|n| !seen.contains(n)).collect();
            let gone_later = later[rng.gen_range(0..later.len())].clone();
            for n in [&gone_listed, &gone_later] {
                rpc.remove(&dir, n);
            }
            removed = vec![gone_listed, gone_later];
            rpc.create(&dir, "entry-new");
            added.push("entry-new".to_string());
        }
        if eof {
            break;
        }
    }
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for n in &seen {
        *counts.entry(n).or_default() += 1;
    }
    // POSIX leaves the changed names themselves unspecified: at most once.
    for n in names.iter().filter(|n| !removed.contains(n)) {
        assert_eq!(counts.get(n.as_str()).copied(), Some(1), "{n} (removed {removed:?}, added {added:?})");
    }
    assert!(counts.values().all(|&c| c == 1), "an entry listed twice: {counts:?}");
    let unfinished = rpc.readdir(&dir, 0, [0; 8], 300);
    assert!(!unfinished.3, "a first page of a larger directory");

    // Restart: the old handles still name their files, the write verifier
    // changes, and the old listing's cookie is refused (the client restarts it).
    // A write the client has not committed when the gateway stops: resent
    // after COMMIT shows a new verifier, it lands once.
    let pending = rpc.create(&root, "resend");
    let chunk: Vec<u8> = (0..70_000u32).map(|i| (i % 251) as u8).collect();
    let (_, verf_pending) = rpc.write(&pending, 0, &chunk);
    drop(rpc);
    drop(other);
    drop(stranger);
    let mut gw = gw;
    gw.terminate();
    let gw = start_gateway(cwd, "nfs.log", Some(gw.addr), &[]);
    let mut rpc = Rpc::connect(gw.addr, 1000);
    assert_eq!(rpc.getattr(&fh), OK, "a handle from before the restart");
    assert!(read_all(&mut rpc, &fh, 100_000) == body, "read after the restart");
    let (_, verf_after) = rpc.write(&fh, body.len() as u64, b"tail");
    assert_ne!(verf_after, verf, "the write verifier changes with a restart");
    assert_eq!(rpc.commit(&fh), verf_after);
    let cookie = unfinished.1.last().expect("a first page").1;
    assert_eq!(rpc.readdir(&dir, cookie, unfinished.2, 300).0, NFS3ERR_BAD_COOKIE);
    assert_eq!(rpc.lookup(&root, "in.bin").0, OK);
    let verf_now = rpc.commit(&pending);
    assert_ne!(verf_now, verf_pending, "COMMIT after a restart shows a new verifier");
    let (_, v) = rpc.write(&pending, 0, &chunk);
    assert_eq!(rpc.commit(&pending), v);
    assert!(read_all(&mut rpc, &pending, 1 << 20) == chunk, "the resent write landed once");

    // Clients outside the allowed networks are refused at connect.
    let fenced = start_gateway(cwd, "nfs-fenced.log", None, &["--client", "10.0.0.0/8"]);
    let mut outsider = Rpc::connect(fenced.addr, 1000);
    assert!(outsider.send(NFS, 3, 0, Xdr::default()).is_err(), "a loopback client of a 10/8-only gateway was served");

    // With the whole cluster stopped, an altered handle is still refused
    // as bad: the gateway's seal is checked before any manager request.
    up.daemon.terminate();
    let mut bad = fh.clone();
    bad[30] ^= 1;
    assert_eq!(rpc.getattr(&bad), NFS3ERR_BADHANDLE);
    drop((rpc, gw, fenced));

    // `nasd up` serves NFS too when configured, with the same handle key:
    // a handle from `nasd nfs` names the same file there.
    let config = cwd.join("nasd-data").join("nasd.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.contains("[up]\n"), "{text}");
    std::fs::write(&config, text.replacen("[up]\n", "[up]\nnfs = true\n", 1)).unwrap();
    let up = Up::start_with(cwd, 2, Some(up.daemon.addr), &["--no-s3"], &[]);
    let text = std::fs::read_to_string(&config).unwrap();
    let nfs_section = &text[text.find("[nfs]").unwrap_or_else(|| panic!("no [nfs] recorded: {text}"))..];
    let listen = nfs_section.lines().find_map(|l| l.strip_prefix("listen = ")).expect("[nfs] listen recorded");
    let addr: SocketAddr = listen.trim_matches('"').parse().unwrap();
    common::until("nasd up's NFS gateway listens", || TcpStream::connect(addr).is_ok());
    let mut rpc = Rpc::connect(addr, 1000);
    assert_eq!(rpc.getattr(&fh), OK, "a handle of `nasd nfs` through `nasd up`'s gateway");
    let mut want = body.clone();
    want.extend_from_slice(b"tail");
    assert!(read_all(&mut rpc, &fh, 1 << 20) == want, "read through nasd up's gateway");
    let p = addr.port();
    let listed = nfs_ls(&format!("nfs://127.0.0.1/pub?nfsport={p}&mountport={p}&uid=1000&gid=1000"));
    assert!(listed.contains_key("in.bin") && listed.contains_key("many"), "{listed:?}");
    drop(up);
}

/// The test's seed: `NFS_TEST_SEED`, else drawn and printed.
fn seeded() -> rand::rngs::StdRng {
    let seed = std::env::var("NFS_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random::<u64>);
    println!("seed {seed} (NFS_TEST_SEED to repeat)");
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// A cluster with `/pub` (mode 777) and a gateway grant for uids 1000-60000.
fn cluster(cwd: &Path) -> Up {
    let up = Up::start(cwd, 2, &["--no-s3"]);
    up.ok(&["admin", "set-gateway", "admin", "--ids", "1000-60000"]);
    up.ok(&["mkdir", "/pub"]);
    up.ok(&["chmod", "777", "/pub"]);
    up
}

/// One call sent with RPC version `rpcvers` and credential `(flavor,
/// body)`; the reply's words (xid, REPLY, then the accepted or denied
/// fields). Panics if the gateway drops the call unanswered.
fn raw_reply(
    addr: SocketAddr,
    rpcvers: u32,
    (flavor, cred): (u32, &[u8]),
    prog: u32,
    proc: u32,
    args: &[u8],
) -> Vec<u32> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(common::DAEMON_WAIT_MAX)).unwrap();
    let xid = rand::random::<u32>();
    let msg = Xdr::default()
        .u32(xid)
        .u32(0)
        .u32(rpcvers)
        .u32(prog)
        .u32(3)
        .u32(proc)
        .u32(flavor)
        .opaque(cred)
        .u32(0)
        .u32(0)
        .fixed(args)
        .0;
    s.write_all(&(msg.len() as u32 | 1 << 31).to_be_bytes()).unwrap();
    s.write_all(&msg).unwrap();
    let mut mark = [0u8; 4];
    s.read_exact(&mut mark).unwrap_or_else(|e| panic!("flavour {flavor} proc {proc}: no answer ({e})"));
    let mut b = vec![0u8; (u32::from_be_bytes(mark) & !(1 << 31)) as usize];
    s.read_exact(&mut b).unwrap();
    let words: Vec<u32> = b.chunks(4).map(|c| u32::from_be_bytes(c.try_into().unwrap())).collect();
    assert_eq!(words[0], xid, "the reply's xid");
    words[1..].to_vec()
}

#[test]
fn nfs_gateway_answers_other_flavours_caps_connections_replays_resent_calls_and_keeps_dotdot_inside() {
    let mut rng = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let up = cluster(cwd);
    up.ok(&["mkdir", "/pub/sub"]);
    up.ok(&["chmod", "777", "/pub/sub"]);
    let gw = start_gateway(cwd, "nfs.log", None, &["--export", "/pub", "--connections-per-client", "3"]);

    // Credential flavours the gateway does not implement are answered
    // MSG_DENIED / AUTH_ERROR / AUTH_BADCRED, whatever the procedure
    // (RPCSEC_GSS's context creation is a NULL call); AUTH_NONE is served
    // only the NULL procedure and MOUNT's listings, else AUTH_TOOWEAK.
    let body: Vec<u8> = (0..rng.gen_range(0..100)).map(|_| rng.gen()).collect();
    for flavor in [2, 3, 6, 7, rng.gen_range(8..u32::MAX)] {
        for (prog, proc) in [(NFS, 0), (NFS, 1), (MOUNT, 1), (MOUNT, 5)] {
            let words = raw_reply(gw.addr, 2, (flavor, &body), prog, proc, &[]);
            assert_eq!(words, [1, 1, 1, 1], "flavour {flavor}, program {prog} proc {proc}: AUTH_BADCRED");
        }
    }
    assert_eq!(raw_reply(gw.addr, 2, (0, &[]), NFS, 0, &[]), [1, 0, 0, 0, 0], "NULL as AUTH_NONE: SUCCESS");
    let exports = raw_reply(gw.addr, 2, (0, &[]), MOUNT, 5, &[]);
    assert_eq!(exports[..6], [1, 0, 0, 0, 0, 1], "EXPORT as AUTH_NONE: SUCCESS, a first export");
    let mnt = Xdr::default().opaque(b"/pub").0;
    assert_eq!(raw_reply(gw.addr, 2, (0, &[]), MOUNT, 1, &mnt), [1, 1, 1, 5], "MNT as AUTH_NONE: AUTH_TOOWEAK");
    assert_eq!(raw_reply(gw.addr, 2, (0, &[]), NFS, 1, &[]), [1, 1, 1, 5], "GETATTR as AUTH_NONE: AUTH_TOOWEAK");
    let sys = Xdr::default().u32(0).opaque(b"t").u32(1000).u32(1000).u32(0).0;
    assert_eq!(raw_reply(gw.addr, 3, (1, &sys), NFS, 0, &[]), [1, 1, 0, 2, 2], "RPC version 3: RPC_MISMATCH 2..2");

    // At most 3 connections from one address: a fourth is closed unserved
    // until one of the three goes.
    let mut held: Vec<Rpc> = Vec::new();
    while held.len() < 3 {
        // Earlier connections leave the count as the gateway notices they closed.
        common::until("a connection under the cap", || Rpc::served(gw.addr, 1000).map(|c| held.push(c)).is_some());
    }
    assert!(Rpc::served(gw.addr, 1000).is_none(), "a fourth connection from one address was served");
    held.truncate(rng.gen_range(0..3));
    common::until("a connection once one went", || Rpc::served(gw.addr, 1000).map(|c| held.push(c)).is_some());

    // `..` at the export's root is the root: nothing above /pub is reached,
    // however often it is climbed. `..` below it is the parent; `..` of a
    // directory renamed out of the export since its handle was made is the
    // export's root, not the directory's new parent. "/" is not exported.
    let mut rpc = held.pop().unwrap();
    drop(held);
    let mut r = rpc.call(MOUNT, 1, Xdr::default().opaque(b"/"));
    assert_ne!(r.u32(), OK, "MOUNT / with only /pub exported");
    let root = rpc.mount("/pub");
    let root_id = stat(&mut rpc, &root).0;
    let mut up_from = root.clone();
    for _ in 0..rng.gen_range(1..4) {
        let (status, dotdot) = rpc.lookup(&up_from, "..");
        assert_eq!(status, OK, "LOOKUP .. at the export's root");
        assert_eq!(stat(&mut rpc, &dotdot).0, root_id, "`..` of the export's root is the root");
        up_from = dotdot;
    }
    let (status, sub) = rpc.lookup(&root, "sub");
    assert_eq!(status, OK);
    let dotdot_of = |rpc: &mut Rpc, dir: &[u8], what: &str| {
        let (status, up) = rpc.lookup(dir, "..");
        assert_eq!(status, OK, "LOOKUP .. of {what}");
        stat(rpc, &up).0
    };
    assert_eq!(dotdot_of(&mut rpc, &sub, "/pub/sub"), root_id, "`..` of /pub/sub");
    let sub_mounted = rpc.mount("/pub/sub");
    assert_eq!(dotdot_of(&mut rpc, &sub_mounted, "a mounted /pub/sub"), root_id);
    let sub_id = stat(&mut rpc, &sub).0;
    let mut r = rpc.call(NFS, 9, Xdr::default().opaque(&sub).opaque(b"deep").no_sattr());
    assert_eq!(r.u32(), OK, "MKDIR /pub/sub/deep");
    let deep = r.post_op_fh();
    assert_eq!(dotdot_of(&mut rpc, &deep, "/pub/sub/deep"), sub_id);
    let mut r = rpc.call(NFS, 9, Xdr::default().opaque(&deep).opaque(b"leaving").no_sattr());
    assert_eq!(r.u32(), OK, "MKDIR /pub/sub/deep/leaving");
    let leaving = r.post_op_fh();
    up.ok(&["mkdir", "/outside"]);
    up.ok(&["mv", "/pub/sub/deep/leaving", "/outside/left"]);
    assert_eq!(dotdot_of(&mut rpc, &leaving, "a directory moved out"), root_id, "`..` escaped the export");
    up.ok(&["mv", "/pub/sub/deep", "/outside/deep"]);
    assert_eq!(dotdot_of(&mut rpc, &deep, "a directory moved out"), root_id, "`..` escaped the export");
    up.ok(&["mv", "/outside/deep", "/pub/sub/deep"]);
    assert_eq!(dotdot_of(&mut rpc, &deep, "a directory moved back"), sub_id);

    // Resent calls (same xid, same call) get their first run's reply; a
    // fresh call sees what the first run did; another call with a used xid runs.
    let mut resent = |rpc: &mut Rpc, proc: u32, args: &dyn Fn() -> Xdr, what: &str| {
        let first = rpc.call(NFS, proc, args()).b;
        assert_eq!(u32::from_be_bytes(first[24..28].try_into().unwrap()), OK, "{what}");
        for _ in 0..rng.gen_range(1..3) {
            assert!(rpc.resend(NFS, proc, args()).b == first, "{what} resent: not the first run's reply");
        }
    };
    let at = |name: &'static [u8]| {
        let root = root.clone();
        move || Xdr::default().opaque(&root).opaque(name)
    };
    let file = rpc.create(&root, "file");
    resent(&mut rpc, 9, &|| at(b"dir")().no_sattr(), "MKDIR");
    resent(&mut rpc, 8, &|| at(b"guarded")().u32(1).no_sattr(), "CREATE GUARDED");
    resent(&mut rpc, 10, &|| at(b"sym")().no_sattr().opaque(b"file"), "SYMLINK");
    resent(&mut rpc, 11, &|| at(b"fifo")().u32(7).no_sattr(), "MKNOD");
    resent(&mut rpc, 15, &|| Xdr::default().opaque(&file).opaque(&root).opaque(b"link"), "LINK");
    resent(&mut rpc, 14, &|| at(b"link")().opaque(&root).opaque(b"moved"), "RENAME");
    resent(&mut rpc, 12, &at(b"moved"), "REMOVE");
    resent(&mut rpc, 13, &at(b"dir"), "RMDIR");
    let trunc = || Xdr::default().opaque(&file).u32(0).u32(0).u32(0).u32(1).u64(0).u32(0).u32(0).u32(0);
    resent(&mut rpc, 2, &trunc, "SETATTR");
    // The first runs happened once: a new REMOVE of the removed name finds nothing.
    let mut r = rpc.call(NFS, 12, at(b"moved")());
    assert_eq!(r.u32(), 2, "a fresh REMOVE of a removed name: NFS3ERR_NOENT");
    // A client that reconnects and resends gets the first reply too.
    rpc.create(&root, "last");
    assert_eq!(rpc.call(NFS, 12, at(b"last")()).u32(), OK, "REMOVE last");
    let xid = rpc.xid;
    drop(rpc);
    let mut again = None;
    common::until("a connection to resend on", || {
        again = Rpc::served(gw.addr, 1000);
        again.is_some()
    });
    let mut again = again.unwrap();
    again.xid = xid;
    let mut r = again.resend(NFS, 12, at(b"last")());
    assert_eq!(r.u32(), OK, "a REMOVE resent on a new connection: its first reply, not NOENT");
    // Another call under a used xid is not a resend: it runs.
    let mut r = again.resend(NFS, 12, at(b"guarded")());
    assert_eq!(r.u32(), OK, "REMOVE under a used xid");
    assert_eq!(again.lookup(&root, "guarded").0, 2, "the REMOVE under a used xid ran");
    let ls = up.ok(&["ls", "/pub"]);
    // (Removed names the gateway still holds open are kept hidden until closed.)
    let names: Vec<&str> = ls.split_whitespace().filter(|n| !n.starts_with(".nasd-unlinked")).collect();
    assert_eq!(names, ["fifo", "file", "sub/", "sym"], "{ls}");

    // The gateway killed (-9) and restarted: calls resent to it, in a drawn
    // order, get their first run's replies from its journal, and ran once.
    let mut rpc = again;
    rpc.create(&root, "moving");
    rpc.create(&root, "doomed");
    type Call<'a> = (u32, Box<dyn Fn() -> Xdr + 'a>, &'a str);
    let calls: Vec<Call> = vec![
        (14, Box::new(|| at(b"moving")().opaque(&root).opaque(b"moved")), "RENAME"),
        (12, Box::new(at(b"doomed")), "REMOVE"),
        (9, Box::new(|| at(b"made")().no_sattr()), "MKDIR"),
        (8, Box::new(|| at(b"guarded2")().u32(1).no_sattr()), "CREATE GUARDED"),
    ];
    let mut firsts = Vec::new();
    for (proc, args, what) in &calls {
        let r = rpc.call(NFS, *proc, args());
        assert_eq!(u32::from_be_bytes(r.b[24..28].try_into().unwrap()), OK, "{what}");
        firsts.push((rpc.xid, r.b));
    }
    drop(rpc);
    let mut gw = gw;
    gw.kill();
    let gw = start_gateway(cwd, "nfs.log", Some(gw.addr), &["--export", "/pub", "--connections-per-client", "3"]);
    let mut rpc = Rpc::connect(gw.addr, 1000);
    let mut order: Vec<usize> = (0..calls.len()).collect();
    rand::seq::SliceRandom::shuffle(&mut order[..], &mut rng);
    for i in order {
        let ((proc, args, what), (xid, first)) = (&calls[i], &firsts[i]);
        rpc.xid = *xid;
        let r = rpc.resend(NFS, *proc, args());
        assert!(r.b == *first, "{what} resent after a restart: not the first run's reply");
    }
    assert_eq!(rpc.lookup(&root, "moving").0, 2, "RENAME ran once");
    assert_eq!(rpc.lookup(&root, "moved").0, OK, "RENAME ran");
    assert_eq!(rpc.lookup(&root, "doomed").0, 2, "REMOVE ran");
    assert_eq!(rpc.lookup(&root, "made").0, OK, "MKDIR ran");
    let mut r = rpc.call(NFS, 12, at(b"doomed")());
    assert_eq!(r.u32(), 2, "a fresh REMOVE of the removed name after the restart: NFS3ERR_NOENT");
}

#[test]
fn nfs_gateway_lists_a_10000_entry_directory_exactly() {
    let mut rng = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let _up = cluster(cwd);
    let gw = start_gateway(cwd, "nfs.log", None, &[]);
    let entries: usize = std::env::var("NFS_DIR_ENTRIES").ok().and_then(|n| n.parse().ok()).unwrap_or(10_000);
    let mut rpc = Rpc::connect(gw.addr, 1000);
    let root = rpc.mount("/pub");
    let mut r = rpc.call(NFS, 9, Xdr::default().opaque(&root).opaque(b"big").no_sattr());
    assert_eq!(r.u32(), OK, "MKDIR");
    let dir = r.post_op_fh();
    // Names of varying length, made by a few connections at once.
    let names: Vec<String> = (0..entries).map(|i| format!("{i:05}-{}", "x".repeat(rng.gen_range(0..40)))).collect();
    let makers = 6;
    std::thread::scope(|s| {
        for part in names.chunks(entries.div_ceil(makers)) {
            let dir = dir.clone();
            s.spawn(move || {
                let mut rpc = Rpc::connect(gw.addr, 1000);
                for n in part {
                    let mut r = rpc.call(NFS, 8, Xdr::default().opaque(&dir).opaque(n.as_bytes()).u32(1).no_sattr());
                    assert_eq!(r.u32(), OK, "CREATE {n}");
                }
            });
        }
    });
    let want: Vec<&str> = names.iter().map(String::as_str).collect();
    let check = |how: &str, listed: Vec<(String, u64)>| {
        let mut got: Vec<&str> = listed.iter().map(|(n, _)| n.as_str()).collect();
        got.sort_unstable();
        let dupes = got.windows(2).filter(|w| w[0] == w[1]).count();
        assert_eq!(dupes, 0, "{how}: names listed twice");
        assert_eq!(got.len(), want.len(), "{how}: {} names of {}", got.len(), want.len());
        assert!(got == want, "{how}: other names than were made");
    };
    // READDIR and READDIRPLUS, each page size drawn from the seed.
    for plus in [false, true] {
        let (mut listed, mut cookie, mut verf, mut pages) = (Vec::new(), 0, [0u8; 8], 0);
        loop {
            let count = rng.gen_range(1024..32_768);
            let (status, page, v, eof) = if plus {
                rpc.readdirplus(&dir, cookie, verf, (count, count * rng.gen_range(2..8)))
            } else {
                rpc.readdir(&dir, cookie, verf, count)
            };
            assert_eq!(status, OK, "page {pages} (plus: {plus})");
            assert!(!page.is_empty() || eof, "an empty page before the end");
            pages += 1;
            verf = v;
            if let Some((_, c)) = page.last() {
                cookie = *c;
            }
            listed.extend(page);
            if eof {
                break;
            }
        }
        println!("{} entries in {pages} pages (plus: {plus})", listed.len());
        check(if plus { "READDIRPLUS" } else { "READDIR" }, listed);
    }
    // And libnfs's nfs-ls.
    let listed = nfs_ls(&url(&gw, "/pub/big", 1000));
    check("nfs-ls", listed.into_keys().map(|n| (n, 0)).collect());
}

/// A client writing a file as RFC 1813 §3.3.7 and §3.3.21 ask: UNSTABLE
/// WRITEs are kept until a COMMIT answers the verifier they were answered
/// with; a WRITE or COMMIT answering another verifier (the server
/// restarted and may have lost them) makes it send every uncommitted
/// WRITE again. A broken connection is redialled and the call sent again;
/// `NFS3ERR_JUKEBOX` is waited out.
struct Copier<'a> {
    addr: &'a std::sync::Mutex<SocketAddr>,
    rpc: Option<Rpc>,
    fh: Vec<u8>,
    data: &'a [u8],
    uncommitted: Vec<(u64, usize)>,
    verifier: Option<[u8; 8]>,
    resent: usize,
}

impl Copier<'_> {
    /// Sends `args` to procedure `proc` until it is answered other than
    /// `NFS3ERR_JUKEBOX`; the reply after its status, which must be OK.
    fn until_answered(&mut self, proc: u32, args: impl Fn() -> Xdr) -> Reply {
        let deadline = std::time::Instant::now() + common::DAEMON_WAIT_MAX;
        loop {
            assert!(std::time::Instant::now() < deadline, "procedure {proc}: no answer within the hang guard");
            if self.rpc.is_none() {
                let addr = *self.addr.lock().unwrap();
                self.rpc = Rpc::try_connect(addr, 1000);
            }
            let Some(rpc) = self.rpc.as_mut() else {
                std::thread::sleep(std::time::Duration::from_millis(20));
                continue;
            };
            match rpc.send(NFS, 3, proc, args()) {
                Err(_) => self.rpc = None,
                Ok(mut r) => match r.u32() {
                    OK => return r,
                    NFS3ERR_JUKEBOX => std::thread::sleep(std::time::Duration::from_millis(100)),
                    e => panic!("procedure {proc}: status {e}"),
                },
            }
        }
    }

    /// One UNSTABLE WRITE; the verifier answered.
    fn write(&mut self, (offset, len): (u64, usize)) -> [u8; 8] {
        let piece = &self.data[offset as usize..offset as usize + len];
        let fh = self.fh.clone();
        let args = || Xdr::default().opaque(&fh).u64(offset).u32(len as u32).u32(0).opaque(piece);
        let mut r = self.until_answered(7, args);
        r.wcc();
        assert_eq!(r.u32(), len as u32, "WRITE count");
        r.u32();
        r.bytes(8).try_into().unwrap()
    }

    /// Writes one piece; a new verifier sends everything uncommitted again.
    fn send(&mut self, piece: (u64, usize)) {
        let v = self.write(piece);
        self.uncommitted.push(piece);
        if self.verifier.is_some_and(|known| known != v) {
            self.resend_uncommitted();
        } else {
            self.verifier = Some(v);
        }
    }

    fn resend_uncommitted(&mut self) {
        'again: loop {
            self.verifier = None;
            for piece in self.uncommitted.clone() {
                let v = self.write(piece);
                self.resent += 1;
                match self.verifier {
                    None => self.verifier = Some(v),
                    Some(known) if known != v => continue 'again,
                    Some(_) => {}
                }
            }
            return;
        }
    }

    /// COMMIT until it answers the verifier the uncommitted writes got.
    fn commit(&mut self) {
        loop {
            let fh = self.fh.clone();
            let mut r = self.until_answered(21, || Xdr::default().opaque(&fh).u64(0).u32(0));
            r.wcc();
            let v: [u8; 8] = r.bytes(8).try_into().unwrap();
            if self.verifier.is_none_or(|known| known == v) {
                self.uncommitted.clear();
                return;
            }
            self.resend_uncommitted();
        }
    }
}

#[test]
fn nfs_gateway_killed_mid_copy_and_restarted_takes_the_resent_writes_once() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let mut rng = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path().to_path_buf();
    let _up = cluster(&cwd);
    let gw = start_gateway(&cwd, "nfs.log", None, &[]);
    let addr = std::sync::Mutex::new(gw.addr);
    let mut rpc = Rpc::connect(gw.addr, 1000);
    let root = rpc.mount("/pub");
    let fh = rpc.create(&root, "copied");
    drop(rpc);

    let mut data = vec![0u8; rng.gen_range(2 << 20..10 << 20)];
    rng.fill_bytes(&mut data);
    let mut pieces = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let len = rng.gen_range(16 << 10..512 << 10).min(data.len() - at);
        pieces.push((at as u64, len));
        at += len;
    }
    let per_commit = rng.gen_range(2..8);
    let kills = rng.gen_range(1..=2usize);
    let mut kill_after: Vec<usize> = (0..kills).map(|_| rng.gen_range(1..pieces.len())).collect();
    kill_after.sort_unstable();
    let delays: Vec<u64> = (0..kills).map(|_| rng.gen_range(0..40)).collect();
    println!(
        "{} bytes in {} writes, COMMIT every {per_commit}, kill -9 after writes {kill_after:?}",
        data.len(),
        pieces.len()
    );

    let written = AtomicUsize::new(0);
    let kills_done = AtomicBool::new(false);
    let (resent, rpc, _gw) = std::thread::scope(|s| {
        let killer = s.spawn(|| {
            // Kills the gateway once the copy has sent so many writes (and a
            // drawn few milliseconds more: a write may be in flight), then
            // starts it again on its address.
            let mut gw = gw;
            for (after, delay) in kill_after.iter().zip(&delays) {
                common::until("the copy to get that far", || written.load(Ordering::SeqCst) >= *after);
                std::thread::sleep(std::time::Duration::from_millis(*delay));
                gw.kill();
                gw = start_gateway(&cwd, "nfs.log", Some(gw.addr), &[]);
                *addr.lock().unwrap() = gw.addr;
            }
            kills_done.store(true, Ordering::SeqCst);
            gw
        });
        let mut copier = Copier {
            addr: &addr,
            rpc: None,
            fh: fh.clone(),
            data: &data,
            uncommitted: Vec::new(),
            verifier: None,
            resent: 0,
        };
        for (i, piece) in pieces.iter().enumerate() {
            copier.send(*piece);
            written.store(i + 1, Ordering::SeqCst);
            if copier.uncommitted.len() >= per_commit && i + 1 < pieces.len() {
                copier.commit();
            }
        }
        // The last writes stay uncommitted until every kill has happened.
        common::until("the kills", || kills_done.load(Ordering::SeqCst));
        copier.commit();
        (copier.resent, copier.rpc.take(), killer.join().expect("the killer thread"))
    });
    println!("{resent} writes resent");
    assert!(resent > 0, "a gateway killed mid-copy made the client resend nothing");
    let mut rpc = rpc.expect("the copier's connection");
    let back = read_all(&mut rpc, &fh, 1 << 20);
    assert_eq!(back.len(), data.len(), "size after the resent writes");
    assert!(back == data, "the file differs from what was copied in");
    let addr = *addr.lock().unwrap();
    let p = addr.port();
    let cat =
        libnfs_ok("nfs-cat", &[&format!("nfs://127.0.0.1/pub/copied?nfsport={p}&mountport={p}&uid=1000&gid=1000")]);
    assert!(cat == data, "nfs-cat differs from what was copied in");
}

/// `nfs-cp` of a 1 GiB file in and out, compared byte for byte (about
/// 35 s in a debug build; `NFS_BIG_BYTES` sets another size).
#[test]
fn nfs_gateway_copies_a_large_file_in_and_out() {
    let mut rng = seeded();
    let bytes: u64 = std::env::var("NFS_BIG_BYTES").ok().and_then(|n| n.parse().ok()).unwrap_or(1 << 30);
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let _up = cluster(cwd);
    let gw = start_gateway(cwd, "nfs.log", None, &[]);
    let local = cwd.join("big.in");
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&local).unwrap());
        let mut block = vec![0u8; 1 << 20];
        let mut left = bytes;
        while left > 0 {
            rng.fill_bytes(&mut block);
            let n = left.min(block.len() as u64) as usize;
            f.write_all(&block[..n]).unwrap();
            left -= n as u64;
        }
    }
    let started = std::time::Instant::now();
    libnfs_ok("nfs-cp", &[local.to_str().unwrap(), &url(&gw, "/pub/big", 1000)]);
    let copied_in = started.elapsed();
    let back = cwd.join("big.out");
    libnfs_ok("nfs-cp", &[&url(&gw, "/pub/big", 1000), back.to_str().unwrap()]);
    println!("{bytes} bytes: in {copied_in:?}, out {:?}", started.elapsed() - copied_in);
    let (mut a, mut b) = (std::fs::File::open(&local).unwrap(), std::fs::File::open(&back).unwrap());
    assert_eq!(b.metadata().unwrap().len(), bytes, "size copied out");
    let (mut x, mut y) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    let mut at = 0u64;
    while at < bytes {
        let n = (bytes - at).min(x.len() as u64) as usize;
        a.read_exact(&mut x[..n]).unwrap();
        b.read_exact(&mut y[..n]).unwrap();
        assert!(x[..n] == y[..n], "the copy differs in the MiB at {at}");
        at += n as u64;
    }
}
