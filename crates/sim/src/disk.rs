//! A simulated disk: files whose synced bytes are kept apart from their
//! unsynced writes, so that a crash keeps exactly what `fsync`'s contract
//! promises and loses, keeps or tears the rest as the seed says.
//!
//! Names are durable once their directory is synced (`sync_dir`), or, for
//! files a SQLite VFS opens as journals (SQLite's unix VFS syncs their
//! directory at their first sync), at their first sync. A crash also drops
//! every lock and every SQLite shared-memory region (rebuilt from the WAL at
//! the next open, as after a real crash), and fences the handles opened
//! before it: they fail from then on, so nothing of the crashed incarnation
//! writes to the next one's disk.

use nasd_env::disk::{SimDisk, SimFile};
use rand::Rng;
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// Bytes per page of a simulated file (a file is a sparse map of pages).
pub const PAGE_LEN: usize = 4096;
/// The unit a torn write keeps or loses: the sector.
pub const SECTOR_LEN: usize = 512;
const _: () = assert!(PAGE_LEN.is_multiple_of(SECTOR_LEN));

/// Chance, in percent, that a crash keeps an unsynced write whole, and that
/// it tears it (keeps some of its sectors); the rest are lost.
const CRASH_KEEP_PERCENT: u32 = 45;
const CRASH_TEAR_PERCENT: u32 = 15;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().expect("simulated disk mutex poisoned")
}

/// A file's bytes: sparse pages and a length.
#[derive(Clone, Default)]
struct Image {
    pages: BTreeMap<u64, Box<[u8; PAGE_LEN]>>,
    len: u64,
}

impl Image {
    fn read(&self, buf: &mut [u8], offset: u64) -> usize {
        if offset >= self.len {
            return 0;
        }
        let n = buf.len().min((self.len - offset) as usize);
        let mut done = 0;
        while done < n {
            let at = offset + done as u64;
            let (page, within) = (at / PAGE_LEN as u64, (at % PAGE_LEN as u64) as usize);
            let take = (PAGE_LEN - within).min(n - done);
            match self.pages.get(&page) {
                Some(p) => buf[done..done + take].copy_from_slice(&p[within..within + take]),
                None => buf[done..done + take].fill(0),
            }
            done += take;
        }
        n
    }

    fn write(&mut self, buf: &[u8], offset: u64) {
        let mut done = 0;
        while done < buf.len() {
            let at = offset + done as u64;
            let (page, within) = (at / PAGE_LEN as u64, (at % PAGE_LEN as u64) as usize);
            let take = (PAGE_LEN - within).min(buf.len() - done);
            let p = self.pages.entry(page).or_insert_with(|| Box::new([0u8; PAGE_LEN]));
            p[within..within + take].copy_from_slice(&buf[done..done + take]);
            done += take;
        }
        self.len = self.len.max(offset + buf.len() as u64);
    }

    fn set_len(&mut self, len: u64) {
        if len < self.len {
            let first_gone = len.div_ceil(PAGE_LEN as u64);
            self.pages.retain(|&p, _| p < first_gone);
            if let Some(p) = self.pages.get_mut(&(len / PAGE_LEN as u64)) {
                p[(len % PAGE_LEN as u64) as usize..].fill(0);
            }
        }
        self.len = len;
    }

    /// Zeros `offset .. offset + len`, dropping the pages it covers whole.
    fn punch(&mut self, offset: u64, len: u64) {
        let end = (offset + len).min(self.len);
        if offset >= end {
            return;
        }
        let page = PAGE_LEN as u64;
        let (first_whole, end_whole) = (offset.div_ceil(page), end / page);
        self.pages.retain(|&p, _| p < first_whole || p >= end_whole);
        let mut at = offset;
        while at < end {
            let (p, within) = (at / page, (at % page) as usize);
            let take = (PAGE_LEN - within).min((end - at) as usize);
            if let Some(bytes) = self.pages.get_mut(&p) {
                bytes[within..within + take].fill(0);
            }
            at += take as u64;
        }
    }

    fn bytes(&self) -> u64 {
        self.pages.len() as u64 * PAGE_LEN as u64
    }
}

/// A change not yet synced.
#[derive(Clone)]
enum Change {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
    Punch { offset: u64, len: u64 },
}

/// One file: what a crash keeps for sure, what reads see now, and what lies between.
#[derive(Default)]
struct FileData {
    durable: Image,
    current: Image,
    unsynced: Vec<Change>,
}

impl FileData {
    fn sync(&mut self) {
        for c in self.unsynced.drain(..) {
            match c {
                Change::Write { offset, data } => self.durable.write(&data, offset),
                Change::SetLen(len) => self.durable.set_len(len),
                Change::Punch { offset, len } => self.durable.punch(offset, len),
            }
        }
    }

    /// What survives a crash: each unsynced change kept, torn or lost.
    fn crash(&mut self, rng: &mut impl Rng, log: &mut Vec<String>, name: &Path) {
        let (mut kept, mut torn, mut lost) = (0, 0, 0);
        for c in self.unsynced.drain(..) {
            let roll = rng.gen_range(0..100);
            match c {
                Change::SetLen(len) if roll < CRASH_KEEP_PERCENT + CRASH_TEAR_PERCENT => {
                    self.durable.set_len(len);
                    kept += 1;
                }
                Change::SetLen(_) => lost += 1,
                // A punch is one change of the file's extent map: all or nothing.
                Change::Punch { offset, len } if roll < CRASH_KEEP_PERCENT + CRASH_TEAR_PERCENT => {
                    self.durable.punch(offset, len);
                    kept += 1;
                }
                Change::Punch { .. } => lost += 1,
                Change::Write { offset, data } if roll < CRASH_KEEP_PERCENT => {
                    self.durable.write(&data, offset);
                    kept += 1;
                }
                Change::Write { offset, data } if roll < CRASH_KEEP_PERCENT + CRASH_TEAR_PERCENT => {
                    // Sectors of the file the write covers, each kept or not.
                    let mut at = offset;
                    let end = offset + data.len() as u64;
                    while at < end {
                        let sector_end = ((at / SECTOR_LEN as u64) + 1) * SECTOR_LEN as u64;
                        let piece_end = sector_end.min(end);
                        if rng.gen_bool(0.5) {
                            let from = (at - offset) as usize;
                            self.durable.write(&data[from..from + (piece_end - at) as usize], at);
                        }
                        at = piece_end;
                    }
                    torn += 1;
                }
                Change::Write { .. } => lost += 1,
            }
        }
        if kept + torn + lost > 0 {
            log.push(format!("{}: unsynced changes kept {kept} torn {torn} lost {lost}", name.display()));
        }
        self.current = self.durable.clone();
    }
}

/// SQLite shared memory of one database (its `-shm`): volatile, never on disk.
#[derive(Default)]
pub(crate) struct Shm {
    pub(crate) regions: Vec<Box<[u8]>>,
    /// Per lock slot: shared holders (connection ids), exclusive holder.
    pub(crate) shared: [BTreeSet<u64>; 8],
    pub(crate) exclusive: [Option<u64>; 8],
    pub(crate) mapped_by: BTreeSet<u64>,
}

/// What a simulated disk holds.
struct DiskState {
    /// Bumped by every crash: handles of an older generation are fenced.
    generation: u64,
    files: BTreeMap<PathBuf, Arc<Mutex<FileData>>>,
    /// Names a crash keeps (their directory was synced since they were made).
    durable_names: BTreeMap<PathBuf, Arc<Mutex<FileData>>>,
    dirs: BTreeSet<PathBuf>,
    locks: BTreeSet<PathBuf>,
    shm: BTreeMap<PathBuf, Arc<Mutex<Shm>>>,
    /// Bytes the disk may hold (pages of every file's current image).
    capacity_bytes: u64,
    /// While set, writes that need a new page fail as a full disk would.
    full: bool,
    /// Syncs left to fail (an `fsync` that reports an I/O error).
    failing_syncs: u32,
}

/// A node's simulated disk. Survives the node's crashes and restarts.
pub struct Disk {
    id: u64,
    name: String,
    state: Mutex<DiskState>,
    rng: Arc<Mutex<rand::rngs::StdRng>>,
}

static NEXT_DISK: AtomicU64 = AtomicU64::new(1);

/// Every disk alive in the process, by id, for the SQLite VFS.
fn registry() -> &'static Mutex<BTreeMap<u64, Weak<Disk>>> {
    static DISKS: std::sync::OnceLock<Mutex<BTreeMap<u64, Weak<Disk>>>> = std::sync::OnceLock::new();
    DISKS.get_or_init(|| Mutex::new(BTreeMap::new()))
}

pub(crate) fn disk_by_id(id: u64) -> Option<Arc<Disk>> {
    lock(registry()).get(&id).and_then(Weak::upgrade)
}

fn storage_full() -> io::Error {
    io::Error::new(io::ErrorKind::StorageFull, "simulated disk full")
}

fn fenced() -> io::Error {
    io::Error::other("the simulated node crashed: this handle is gone")
}

impl Disk {
    /// A new empty disk of `capacity_bytes`, its crash decisions drawn from `rng`.
    pub fn new(name: &str, capacity_bytes: u64, rng: Arc<Mutex<rand::rngs::StdRng>>) -> Arc<Disk> {
        let id = NEXT_DISK.fetch_add(1, Ordering::Relaxed);
        let disk = Arc::new(Disk {
            id,
            name: name.to_string(),
            state: Mutex::new(DiskState {
                generation: 0,
                files: BTreeMap::new(),
                durable_names: BTreeMap::new(),
                dirs: BTreeSet::from([PathBuf::from("/")]),
                locks: BTreeSet::new(),
                shm: BTreeMap::new(),
                capacity_bytes,
                full: false,
                failing_syncs: 0,
            }),
            rng,
        });
        lock(registry()).insert(id, Arc::downgrade(&disk));
        disk
    }

    /// The disk's id in the SQLite VFS's paths.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Crashes the disk's node: every unsynced change kept, torn or lost;
    /// names not made durable gone; locks and shared memory dropped; old
    /// handles fenced. Returns what happened, for the event log.
    pub fn crash(&self) -> Vec<String> {
        let mut st = lock(&self.state);
        let mut rng = lock(&self.rng);
        let mut log = Vec::new();
        st.generation += 1;
        for name in st.files.keys().filter(|n| !st.durable_names.contains_key(*n)) {
            log.push(format!("{}: its name was never made durable: gone", name.display()));
        }
        st.files = st.durable_names.clone();
        for (name, f) in &st.files {
            lock(f).crash(&mut *rng, &mut log, name);
        }
        st.locks.clear();
        st.shm.clear();
        log
    }

    /// The process using the disk died (`kill -9`) while the machine stays
    /// up: every write stays (the page cache outlives the process), its
    /// locks and shared memory go (SQLite rebuilds the latter from the log),
    /// and its open handles are fenced (a dead process writes nothing more).
    pub fn process_died(&self) {
        let mut st = lock(&self.state);
        st.generation += 1;
        st.locks.clear();
        st.shm.clear();
    }

    /// Sets whether the disk is full.
    pub fn set_full(&self, full: bool) {
        lock(&self.state).full = full;
    }

    /// Makes the next `n` syncs fail with an I/O error.
    pub fn fail_syncs(&self, n: u32) {
        lock(&self.state).failing_syncs = n;
    }

    /// Flips one bit of the synced and current image of `path` at a random
    /// stored page at or after `from_offset`; returns the byte flipped, if
    /// the file holds a page there.
    pub fn rot(&self, path: &Path, from_offset: u64) -> Option<u64> {
        let st = lock(&self.state);
        let f = st.files.get(path)?;
        let mut f = lock(f);
        let first = from_offset / PAGE_LEN as u64;
        let pages: Vec<u64> = f.durable.pages.keys().copied().filter(|&p| p >= first).collect();
        if pages.is_empty() {
            return None;
        }
        let mut rng = lock(&self.rng);
        let page = pages[rng.gen_range(0..pages.len())];
        let byte = rng.gen_range(0..PAGE_LEN);
        let bit = 1u8 << rng.gen_range(0..8);
        // Rot hits the medium: both images, and any unsynced write of that byte is not involved.
        if let Some(p) = f.durable.pages.get_mut(&page) {
            p[byte] ^= bit;
        }
        if let Some(p) = f.current.pages.get_mut(&page) {
            p[byte] ^= bit;
        }
        Some(page * PAGE_LEN as u64 + byte as u64)
    }

    fn used_bytes(st: &DiskState) -> u64 {
        st.files.values().map(|f| lock(f).current.bytes()).sum()
    }

    fn handle(self: &Arc<Self>, path: &Path, data: Arc<Mutex<FileData>>, generation: u64, journal: bool) -> Handle {
        Handle { disk: self.clone(), path: path.to_path_buf(), data, generation, journal, synced_once: false.into() }
    }

    /// Opens `path` as a SQLite VFS does (`journal`: its name is made
    /// durable by its first sync).
    pub(crate) fn open_handle(self: &Arc<Self>, path: &Path, create: bool, journal: bool) -> io::Result<Handle> {
        let mut st = lock(&self.state);
        let data = match st.files.get(path) {
            Some(d) => d.clone(),
            None if !create => {
                return Err(io::Error::new(io::ErrorKind::NotFound, format!("{}: no such file", path.display())))
            }
            None => {
                let parent = path.parent().unwrap_or(Path::new("/"));
                if !st.dirs.contains(parent) {
                    return Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("{}: no such directory", parent.display()),
                    ));
                }
                let d = Arc::new(Mutex::new(FileData::default()));
                st.files.insert(path.to_path_buf(), d.clone());
                d
            }
        };
        let generation = st.generation;
        drop(st);
        Ok(self.handle(path, data, generation, journal))
    }

    pub(crate) fn exists(&self, path: &Path) -> bool {
        lock(&self.state).files.contains_key(path)
    }

    pub(crate) fn remove(&self, path: &Path, durably: bool) {
        let mut st = lock(&self.state);
        st.files.remove(path);
        if durably {
            st.durable_names.remove(path);
        }
    }

    pub(crate) fn shm(&self, path: &Path) -> Arc<Mutex<Shm>> {
        lock(&self.state).shm.entry(path.to_path_buf()).or_default().clone()
    }

    pub(crate) fn drop_shm(&self, path: &Path) {
        lock(&self.state).shm.remove(path);
    }

    /// The files on the disk now, with their lengths.
    pub fn files(&self) -> Vec<(PathBuf, u64)> {
        lock(&self.state).files.iter().map(|(p, f)| (p.clone(), lock(f).current.len)).collect()
    }
}

/// An open file of a simulated disk.
pub(crate) struct Handle {
    disk: Arc<Disk>,
    path: PathBuf,
    data: Arc<Mutex<FileData>>,
    generation: u64,
    journal: bool,
    synced_once: std::sync::atomic::AtomicBool,
}

impl Handle {
    fn live(&self) -> io::Result<MutexGuard<'_, DiskState>> {
        let st = lock(&self.disk.state);
        if st.generation != self.generation {
            return Err(fenced());
        }
        Ok(st)
    }
}

impl SimFile for Handle {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        drop(self.live()?);
        Ok(lock(&self.data).current.read(buf, offset))
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let st = self.live()?;
        let mut f = lock(&self.data);
        let first = offset / PAGE_LEN as u64;
        let last = (offset + buf.len() as u64).div_ceil(PAGE_LEN as u64);
        let new_pages = (first..last).filter(|p| !f.current.pages.contains_key(p)).count() as u64;
        if new_pages > 0 {
            drop(f);
            let used = Disk::used_bytes(&st);
            if st.full || used + new_pages * PAGE_LEN as u64 > st.capacity_bytes {
                return Err(storage_full());
            }
            f = lock(&self.data);
        }
        f.current.write(buf, offset);
        f.unsynced.push(Change::Write { offset, data: buf.to_vec() });
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        let mut st = self.live()?;
        if st.failing_syncs > 0 {
            st.failing_syncs -= 1;
            return Err(io::Error::other("simulated fsync failure"));
        }
        lock(&self.data).sync();
        if self.journal && !self.synced_once.swap(true, Ordering::Relaxed) {
            st.durable_names.insert(self.path.clone(), self.data.clone());
        }
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        drop(self.live()?);
        let mut f = lock(&self.data);
        f.current.set_len(len);
        f.unsynced.push(Change::SetLen(len));
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        drop(self.live()?);
        Ok(lock(&self.data).current.len)
    }

    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        drop(self.live()?);
        let mut f = lock(&self.data);
        f.current.punch(offset, len);
        f.unsynced.push(Change::Punch { offset, len });
        Ok(())
    }
}

impl Handle {
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
    pub(crate) fn disk(&self) -> &Arc<Disk> {
        &self.disk
    }
}

/// A node's view of its disk, as the environment seam wants it.
pub(crate) struct NodeDisk(pub(crate) Arc<Disk>);

impl SimDisk for NodeDisk {
    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn SimFile>> {
        Ok(Arc::new(self.0.open_handle(path, create, false)?))
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut st = lock(&self.0.state);
        for a in path.ancestors() {
            st.dirs.insert(a.to_path_buf());
        }
        Ok(())
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let mut st = lock(&self.0.state);
        let inside: Vec<_> =
            st.files.iter().filter(|(p, _)| p.parent() == Some(path)).map(|(p, d)| (p.clone(), d.clone())).collect();
        st.durable_names.retain(|p, _| p.parent() != Some(path));
        st.durable_names.extend(inside);
        Ok(())
    }

    fn lock(&self, path: &Path) -> io::Result<()> {
        let mut st = lock(&self.0.state);
        if !st.locks.insert(path.to_path_buf()) {
            return Err(io::Error::new(io::ErrorKind::WouldBlock, "lock file held"));
        }
        if !st.files.contains_key(path) {
            st.files.insert(path.to_path_buf(), Arc::default());
        }
        Ok(())
    }

    fn unlock(&self, path: &Path) {
        lock(&self.0.state).locks.remove(path);
    }

    fn sqlite_vfs(&self, path: &Path) -> (String, PathBuf) {
        crate::sqlite::register();
        (crate::sqlite::VFS_NAME.to_string(), crate::sqlite::vfs_path(self.0.id, path))
    }
}

impl std::fmt::Debug for Disk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Disk({})", self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn disk(seed: u64) -> Arc<Disk> {
        Disk::new("t", 1 << 20, Arc::new(Mutex::new(rand::rngs::StdRng::seed_from_u64(seed))))
    }

    #[test]
    fn synced_bytes_survive_a_crash_and_unsynced_ones_may_not() {
        for seed in 0..50 {
            let d = disk(seed);
            let nd = NodeDisk(d.clone());
            nd.create_dir_all(Path::new("/a")).unwrap();
            let f = nd.open(Path::new("/a/f"), true).unwrap();
            f.write_all_at(&[1u8; 4096], 0).unwrap();
            f.sync().unwrap();
            nd.sync_dir(Path::new("/a")).unwrap();
            f.write_all_at(&[2u8; 4096], 0).unwrap();
            d.crash();
            assert!(f.read_at(&mut [0u8; 1], 0).is_err(), "an old handle is fenced");
            let g = nd.open(Path::new("/a/f"), false).unwrap();
            let mut buf = [0u8; 4096];
            assert_eq!(g.read_at(&mut buf, 0).unwrap(), 4096);
            // Each sector is the old or the new bytes, never anything else.
            for sector in buf.chunks(SECTOR_LEN) {
                assert!(sector.iter().all(|&b| b == sector[0]) && (sector[0] == 1 || sector[0] == 2), "seed {seed}");
            }
        }
    }

    #[test]
    fn a_punched_hole_reads_as_zeros_and_gives_its_pages_back() {
        let d = disk(3);
        let nd = NodeDisk(d.clone());
        let f = nd.open(Path::new("/f"), true).unwrap();
        f.write_all_at(&[9u8; 3 * PAGE_LEN], 0).unwrap();
        f.punch_hole(100, 2 * PAGE_LEN as u64).unwrap();
        let mut buf = vec![0u8; 3 * PAGE_LEN];
        assert_eq!(f.read_at(&mut buf, 0).unwrap(), 3 * PAGE_LEN, "the length is kept");
        assert!(buf[..100].iter().all(|&b| b == 9) && buf[100 + 2 * PAGE_LEN..].iter().all(|&b| b == 9));
        assert!(buf[100..100 + 2 * PAGE_LEN].iter().all(|&b| b == 0));
        assert_eq!(Disk::used_bytes(&lock(&d.state)), 2 * PAGE_LEN as u64, "the one page covered whole is given back");
    }

    #[test]
    fn a_name_not_made_durable_is_gone_after_a_crash() {
        let d = disk(1);
        let nd = NodeDisk(d.clone());
        nd.create_dir_all(Path::new("/a")).unwrap();
        let f = nd.open(Path::new("/a/f"), true).unwrap();
        f.write_all_at(b"x", 0).unwrap();
        f.sync().unwrap();
        d.crash();
        assert!(nd.open(Path::new("/a/f"), false).is_err());
    }

    #[test]
    fn a_full_disk_refuses_new_pages_and_a_failing_sync_reports_it() {
        let d = disk(2);
        let nd = NodeDisk(d.clone());
        let f = nd.open(Path::new("/f"), true).unwrap();
        f.write_all_at(&vec![7u8; 1 << 20], 0).unwrap();
        assert_eq!(f.write_all_at(b"y", 1 << 20).unwrap_err().kind(), io::ErrorKind::StorageFull);
        f.write_all_at(b"y", 0).unwrap();
        d.fail_syncs(1);
        assert!(f.sync().is_err());
        f.sync().unwrap();
    }
}
