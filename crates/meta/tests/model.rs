//! Model-based test of the name space over SQLite on disk: random sequences
//! of mkdir/create/unlink/rmdir/rename/link, layouts set on directories and
//! files, write intents (begin, commit with stale components, abort,
//! finish), pool refills on three drives and reopening the database, over a
//! small set of names, checked step by step against a simple in-memory
//! model: every status, every name, every link count, every layout (set and
//! inherited), every file's components and their states, every intent, and
//! where every object is (a file's component, the pool or the doomed table).

use nasd_meta::testing::{check_invariants, pool_placer, tree};
use nasd_meta::{
    Backend, Caller, ComponentState, DriveRecord, DriveState, Effects, FileKind, FsStatus, Ino, IntentState, Layout,
    Namespace, ObjectRef, Sqlite, StaleRange, ROOT_INO,
};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const PATHS: [&str; 6] = ["/", "/a", "/b", "/a/a", "/a/b", "/b/a"];
const NAMES: [&str; 3] = ["a", "b", "c"];
/// Drives, in the placement order of the test's placer.
const DRIVES: [u32; 3] = [1, 2, 3];
/// Layouts the test sets: 1, 2 and 3 components. The root starts with the first.
const LAYOUTS: [&str; 3] = ["stripe:1", "stripe:2", "mirror:3"];
const PARTITION: u64 = 3;
const ROOT: Caller = Caller::ROOT;
/// A transaction id no intent has (the test's begins stay far below it).
const NO_TXN: u64 = 1 << 40;

fn layout(i: usize) -> Layout {
    Layout::parse(LAYOUTS[i]).expect("test layout")
}

#[derive(Debug, Clone)]
enum Op {
    Mkdir(usize, usize),
    Create {
        dir: usize,
        name: usize,
        exclusive: bool,
    },
    Unlink(usize, usize),
    Rmdir(usize, usize),
    Rename(usize, usize, usize, usize),
    Link(usize, usize, usize, usize),
    /// A layout for `PATHS[dir]` (name `None`) or `PATHS[dir]/NAMES[name]`.
    SetLayout {
        dir: usize,
        name: Option<usize>,
        layout: Option<usize>,
    },
    Begin(usize, usize),
    /// Commits the file's intent (a txn it does not have if none) with
    /// `written_end` and component `stale` stale over one range.
    Commit {
        dir: usize,
        name: usize,
        written_end: u64,
        stale: Option<usize>,
    },
    Abort(usize, usize),
    Finish(usize, usize),
    /// Pools this many objects on `DRIVES[drive]`.
    Refill(usize, u64),
    Reopen,
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let p = || 0..PATHS.len();
    let n = || 0..NAMES.len();
    prop_oneof![
        3 => (p(), n()).prop_map(|(d, n)| Op::Mkdir(d, n)),
        3 => (p(), n(), any::<bool>()).prop_map(|(dir, name, exclusive)| Op::Create { dir, name, exclusive }),
        2 => (p(), n()).prop_map(|(d, n)| Op::Unlink(d, n)),
        2 => (p(), n()).prop_map(|(d, n)| Op::Rmdir(d, n)),
        4 => (p(), n(), p(), n()).prop_map(|(a, b, c, d)| Op::Rename(a, b, c, d)),
        2 => (p(), n(), p(), n()).prop_map(|(a, b, c, d)| Op::Link(a, b, c, d)),
        2 => (p(), proptest::option::of(n()), proptest::option::of(0..LAYOUTS.len()))
            .prop_map(|(dir, name, layout)| Op::SetLayout { dir, name, layout }),
        2 => (p(), n()).prop_map(|(d, n)| Op::Begin(d, n)),
        2 => (p(), n(), prop_oneof![Just(0u64), Just(100), Just(5000)], proptest::option::of(0..3usize))
            .prop_map(|(dir, name, written_end, stale)| Op::Commit { dir, name, written_end, stale }),
        1 => (p(), n()).prop_map(|(d, n)| Op::Abort(d, n)),
        1 => (p(), n()).prop_map(|(d, n)| Op::Finish(d, n)),
        1 => (0..DRIVES.len(), 1..4u64).prop_map(|(d, k)| Op::Refill(d, k)),
        1 => Just(Op::Reopen),
    ]
}

fn join(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

/// The one range every stale report in the test names.
const STALE: StaleRange = StaleRange { offset: 0, length: 4096 };

// ---- the model ----

#[derive(Debug, Clone)]
enum Node {
    Dir { entries: BTreeMap<String, Ino>, parent: Ino, layout: Option<usize> },
    File { nlink: u32, layout: usize, objects: Vec<ObjectRef>, stale: BTreeSet<usize>, size: u64 },
}

#[derive(Debug, Default)]
struct Model {
    nodes: BTreeMap<Ino, Node>,
    pool: BTreeSet<ObjectRef>,
    doomed: BTreeSet<ObjectRef>,
    /// Write intents by inode: (txn, state).
    intents: BTreeMap<Ino, (u64, IntentState)>,
    /// The largest txn handed out so far.
    last_txn: u64,
    /// Every object ever pooled: each must be in exactly one place forever.
    all: BTreeSet<ObjectRef>,
    next_object: u64,
}

/// The objects an operation's effects name (the model does not track acvs;
/// [`check_revocations`] checks them against the real inodes).
#[derive(Debug, Default, PartialEq, Eq)]
struct Fx {
    revoke: Vec<ObjectRef>,
    doomed: Vec<ObjectRef>,
}

impl Fx {
    fn of(e: &Effects) -> Fx {
        Fx { revoke: e.revoke.iter().map(|i| i.object).collect(), doomed: e.doomed.clone() }
    }
}

/// What the real operation returned, for the model to follow.
#[derive(Debug, Default)]
struct Outcome {
    ino: Option<Ino>,
    created: bool,
    objects: Vec<ObjectRef>,
    txn: u64,
    effects: Effects,
}

/// What a file looks like, for comparison: layout index, objects, stale
/// component indexes, size.
type FileView = (Layout, Vec<ObjectRef>, BTreeSet<usize>, u64);

impl Model {
    fn new() -> Model {
        let root = Node::Dir { entries: BTreeMap::new(), parent: ROOT_INO, layout: Some(0) };
        Model { nodes: BTreeMap::from([(ROOT_INO, root)]), ..Model::default() }
    }

    fn entries(&self, ino: Ino) -> Result<&BTreeMap<String, Ino>, FsStatus> {
        match &self.nodes[&ino] {
            Node::Dir { entries, .. } => Ok(entries),
            Node::File { .. } => Err(FsStatus::NotDir),
        }
    }

    fn entries_mut(&mut self, ino: Ino) -> &mut BTreeMap<String, Ino> {
        match self.nodes.get_mut(&ino) {
            Some(Node::Dir { entries, .. }) => entries,
            _ => panic!("model: {ino} is not a directory"),
        }
    }

    fn is_dir(&self, ino: Ino) -> bool {
        matches!(self.nodes[&ino], Node::Dir { .. })
    }

    fn resolve(&self, path: &str) -> Result<Ino, FsStatus> {
        let mut cur = ROOT_INO;
        for name in path.split('/').filter(|c| !c.is_empty()) {
            cur = *self.entries(cur)?.get(name).ok_or(FsStatus::NotFound)?;
        }
        Ok(cur)
    }

    fn child(&self, dir: Ino, name: &str) -> Result<Ino, FsStatus> {
        self.entries(dir)?.get(name).copied().ok_or(FsStatus::NotFound)
    }

    /// Whether `dir` is `ancestor` or below it.
    fn is_below(&self, mut dir: Ino, ancestor: Ino) -> bool {
        loop {
            if dir == ancestor {
                return true;
            }
            if dir == ROOT_INO {
                return false;
            }
            let Node::Dir { parent, .. } = &self.nodes[&dir] else { unreachable!() };
            dir = *parent;
        }
    }

    /// The layout a new file in `dir` gets: the nearest directory's up the tree.
    fn inherited(&self, mut dir: Ino) -> usize {
        loop {
            let Node::Dir { parent, layout, .. } = &self.nodes[&dir] else { unreachable!() };
            if let Some(l) = layout {
                return *l;
            }
            dir = *parent;
        }
    }

    /// The objects the test's placer takes for `components`: the lowest
    /// pooled object of each of the first drives (in [`DRIVES`] order) that
    /// have one; `NoSpace` if too few have.
    fn placement(&self, components: usize) -> Result<Vec<ObjectRef>, FsStatus> {
        let placed: Vec<ObjectRef> =
            DRIVES.iter().filter_map(|&d| self.pool.iter().find(|o| o.drive == d).copied()).take(components).collect();
        if placed.len() < components {
            return Err(FsStatus::NoSpace);
        }
        Ok(placed)
    }

    fn file_path(op_dir: usize, name: usize) -> String {
        join(PATHS[op_dir], NAMES[name])
    }

    /// The status the operation must return.
    fn check(&self, op: &Op) -> Result<(), FsStatus> {
        match *op {
            Op::Mkdir(d, n) => {
                let dir = self.resolve(PATHS[d])?;
                match self.child(dir, NAMES[n]) {
                    Ok(_) => Err(FsStatus::Exists),
                    Err(FsStatus::NotFound) => Ok(()),
                    Err(e) => Err(e),
                }
            }
            Op::Create { dir, name, exclusive } => {
                let dir = self.resolve(PATHS[dir])?;
                match self.child(dir, NAMES[name]) {
                    Ok(_) if exclusive => Err(FsStatus::Exists),
                    Ok(c) if self.is_dir(c) => Err(FsStatus::IsDir),
                    Ok(_) => Ok(()),
                    Err(FsStatus::NotFound) => self.placement(layout(self.inherited(dir)).components()).map(drop),
                    Err(e) => Err(e),
                }
            }
            Op::Unlink(d, n) => {
                let c = self.child(self.resolve(PATHS[d])?, NAMES[n])?;
                if self.is_dir(c) {
                    return Err(FsStatus::IsDir);
                }
                Ok(())
            }
            Op::Rmdir(d, n) => {
                let c = self.child(self.resolve(PATHS[d])?, NAMES[n])?;
                if !self.is_dir(c) {
                    return Err(FsStatus::NotDir);
                }
                if !self.entries(c)?.is_empty() {
                    return Err(FsStatus::NotEmpty);
                }
                Ok(())
            }
            Op::Rename(p1, n1, p2, n2) => self.check_rename(PATHS[p1], NAMES[n1], PATHS[p2], NAMES[n2]),
            Op::Link(p1, n1, p2, n2) => {
                let src = self.resolve(&join(PATHS[p1], NAMES[n1]))?;
                let dir = self.resolve(PATHS[p2])?;
                if self.is_dir(src) {
                    return Err(FsStatus::NotPermitted);
                }
                match self.child(dir, NAMES[n2]) {
                    Ok(_) => Err(FsStatus::Exists),
                    Err(FsStatus::NotFound) => Ok(()),
                    Err(e) => Err(e),
                }
            }
            Op::SetLayout { dir, name, layout: l } => {
                let path = name.map_or(PATHS[dir].to_string(), |n| Self::file_path(dir, n));
                let ino = self.resolve(&path)?;
                match &self.nodes[&ino] {
                    Node::Dir { .. } if l.is_none() && ino == ROOT_INO => Err(FsStatus::InvalidArgument),
                    Node::Dir { .. } => Ok(()),
                    Node::File { .. } if l.is_none() => Err(FsStatus::InvalidArgument),
                    Node::File { .. } if self.intents.contains_key(&ino) => Err(FsStatus::Busy),
                    Node::File { size, .. } if *size != 0 => Err(FsStatus::InvalidArgument),
                    Node::File { .. } => self.placement(layout(l.unwrap()).components()).map(drop),
                }
            }
            Op::Begin(d, n) => {
                let ino = self.resolve(&Self::file_path(d, n))?;
                if self.is_dir(ino) {
                    return Err(FsStatus::IsDir);
                }
                if self.intents.contains_key(&ino) {
                    return Err(FsStatus::Busy);
                }
                Ok(())
            }
            Op::Commit { dir, name, stale, .. } => {
                let ino = self.resolve(&Self::file_path(dir, name))?;
                match (self.intents.get(&ino), &self.nodes[&ino]) {
                    (Some((_, IntentState::Open)), Node::File { objects, .. })
                        if stale.is_none_or(|s| s < objects.len()) =>
                    {
                        Ok(())
                    }
                    _ => Err(FsStatus::InvalidArgument),
                }
            }
            Op::Abort(d, n) => {
                let ino = self.resolve(&Self::file_path(d, n))?;
                match self.intents.get(&ino) {
                    None => Err(FsStatus::NotFound),
                    Some((_, IntentState::Committed)) => Err(FsStatus::InvalidArgument),
                    Some(_) => Ok(()),
                }
            }
            Op::Finish(d, n) => self.resolve(&Self::file_path(d, n)).map(drop),
            Op::Refill(..) | Op::Reopen => Ok(()),
        }
    }

    fn check_rename(&self, p1: &str, n1: &str, p2: &str, n2: &str) -> Result<(), FsStatus> {
        let (sp, dp) = (self.resolve(p1)?, self.resolve(p2)?);
        self.entries(sp)?;
        self.entries(dp)?;
        let src = self.child(sp, n1)?;
        if self.is_dir(src) && self.is_below(dp, src) {
            return Err(FsStatus::InvalidMove);
        }
        let Ok(old) = self.child(dp, n2) else { return Ok(()) };
        match (self.is_dir(src), self.is_dir(old)) {
            _ if old == src => Ok(()),
            (true, false) => Err(FsStatus::NotDir),
            (false, true) => Err(FsStatus::IsDir),
            (true, true) if !self.entries(old)?.is_empty() => Err(FsStatus::NotEmpty),
            _ => Ok(()),
        }
    }

    /// The txn the test names for the file at `path`: its intent's, or one no intent has.
    fn txn_of(&self, path: &str) -> u64 {
        self.resolve(path).ok().and_then(|ino| self.intents.get(&ino)).map_or(NO_TXN, |(txn, _)| *txn)
    }

    /// Follows a successful operation.
    fn apply(&mut self, op: &Op, out: &Outcome) {
        match *op {
            Op::Mkdir(d, n) => {
                let dir = self.resolve(PATHS[d]).unwrap();
                let ino = out.ino.unwrap();
                assert!(!self.nodes.contains_key(&ino), "inode number reused");
                self.nodes.insert(ino, Node::Dir { entries: BTreeMap::new(), parent: dir, layout: None });
                self.entries_mut(dir).insert(NAMES[n].to_owned(), ino);
            }
            Op::Create { dir, name, .. } => self.apply_create(self.resolve(PATHS[dir]).unwrap(), NAMES[name], out),
            Op::Unlink(d, n) | Op::Rmdir(d, n) => {
                let dir = self.resolve(PATHS[d]).unwrap();
                let want = self.remove(dir, NAMES[n]);
                assert_eq!(Fx::of(&out.effects), want, "effects of {op:?}");
            }
            Op::Rename(p1, n1, p2, n2) => {
                let (sp, dp) = (self.resolve(PATHS[p1]).unwrap(), self.resolve(PATHS[p2]).unwrap());
                let want = self.rename(sp, NAMES[n1], dp, NAMES[n2]);
                assert_eq!(Fx::of(&out.effects), want, "effects of {op:?}");
            }
            Op::Link(p1, n1, p2, n2) => {
                let src = self.resolve(&join(PATHS[p1], NAMES[n1])).unwrap();
                let dir = self.resolve(PATHS[p2]).unwrap();
                let Some(Node::File { nlink, .. }) = self.nodes.get_mut(&src) else { unreachable!() };
                *nlink += 1;
                self.entries_mut(dir).insert(NAMES[n2].to_owned(), src);
            }
            Op::SetLayout { dir, name, layout: l } => {
                let path = name.map_or(PATHS[dir].to_string(), |n| Self::file_path(dir, n));
                let ino = self.resolve(&path).unwrap();
                let want = self.set_layout(ino, l);
                assert_eq!(Fx::of(&out.effects), want, "effects of {op:?}");
            }
            Op::Begin(d, n) => {
                let ino = self.resolve(&Self::file_path(d, n)).unwrap();
                assert!(out.txn > self.last_txn, "txn {} after {}: ids must ascend", out.txn, self.last_txn);
                self.last_txn = out.txn;
                self.intents.insert(ino, (out.txn, IntentState::Open));
            }
            Op::Commit { dir, name, written_end, stale } => {
                let ino = self.resolve(&Self::file_path(dir, name)).unwrap();
                self.intents.get_mut(&ino).unwrap().1 = IntentState::Committed;
                let Some(Node::File { size, stale: stale_set, .. }) = self.nodes.get_mut(&ino) else { unreachable!() };
                *size = (*size).max(written_end);
                stale_set.extend(stale);
            }
            Op::Abort(d, n) => {
                let ino = self.resolve(&Self::file_path(d, n)).unwrap();
                self.intents.get_mut(&ino).unwrap().1 = IntentState::Aborting;
            }
            Op::Finish(d, n) => {
                let ino = self.resolve(&Self::file_path(d, n)).unwrap();
                self.intents.remove(&ino);
            }
            Op::Refill(..) | Op::Reopen => {}
        }
    }

    /// Takes `objects` out of the pool (they must be what the model predicts).
    fn take(&mut self, components: usize, objects: &[ObjectRef]) {
        assert_eq!(Ok(objects.to_vec()), self.placement(components), "placement");
        for o in objects {
            assert!(self.pool.remove(o), "object {o:?} did not come from the pool");
        }
    }

    fn apply_create(&mut self, dir: Ino, name: &str, out: &Outcome) {
        let ino = out.ino.unwrap();
        if let Ok(existing) = self.child(dir, name) {
            assert!(!out.created && ino == existing, "create of an existing file");
            return;
        }
        assert!(out.created);
        let l = self.inherited(dir);
        self.take(layout(l).components(), &out.objects);
        assert!(!self.nodes.contains_key(&ino), "inode number reused");
        let file = Node::File { nlink: 1, layout: l, objects: out.objects.clone(), stale: BTreeSet::new(), size: 0 };
        self.nodes.insert(ino, file);
        self.entries_mut(dir).insert(name.to_owned(), ino);
    }

    fn set_layout(&mut self, ino: Ino, l: Option<usize>) -> Fx {
        let placed = match &self.nodes[&ino] {
            Node::File { .. } => self.placement(layout(l.unwrap()).components()).unwrap(),
            Node::Dir { .. } => Vec::new(),
        };
        match self.nodes.get_mut(&ino).unwrap() {
            Node::Dir { layout, .. } => {
                *layout = l;
                Fx::default()
            }
            Node::File { layout, objects, stale, .. } => {
                *layout = l.unwrap();
                stale.clear();
                let old = std::mem::replace(objects, placed.clone());
                for o in &placed {
                    assert!(self.pool.remove(o));
                }
                self.doomed.extend(&old);
                Fx { revoke: placed, doomed: old }
            }
        }
    }

    /// Removes a name (an empty directory or a file link); returns the effects.
    fn remove(&mut self, dir: Ino, name: &str) -> Fx {
        let ino = self.entries_mut(dir).remove(name).unwrap();
        let mut fx = Fx::default();
        match self.nodes.get_mut(&ino).unwrap() {
            Node::Dir { .. } => {
                self.nodes.remove(&ino);
            }
            Node::File { nlink, objects, .. } if *nlink == 1 => {
                fx.doomed.clone_from(objects);
                self.doomed.extend(objects.iter());
                self.nodes.remove(&ino);
                self.intents.remove(&ino);
            }
            Node::File { nlink, objects, .. } => {
                *nlink -= 1;
                fx.revoke.clone_from(objects);
            }
        }
        fx
    }

    fn rename(&mut self, sp: Ino, n1: &str, dp: Ino, n2: &str) -> Fx {
        let src = self.child(sp, n1).unwrap();
        let mut fx = Fx::default();
        match self.child(dp, n2) {
            Ok(old) if old == src => return fx,
            Ok(_) => fx = self.remove(dp, n2),
            Err(_) => {}
        }
        self.entries_mut(sp).remove(n1);
        self.entries_mut(dp).insert(n2.to_owned(), src);
        if let Some(Node::Dir { parent, .. }) = self.nodes.get_mut(&src) {
            *parent = dp;
        }
        fx
    }

    /// path → (ino, is_dir, link count) for every name.
    fn tree(&self) -> BTreeMap<String, (Ino, bool, u32)> {
        let mut out = BTreeMap::new();
        let mut stack = vec![(String::new(), ROOT_INO)];
        while let Some((path, dir)) = stack.pop() {
            for (name, &ino) in self.entries(dir).unwrap() {
                let p = format!("{path}/{name}");
                let (is_dir, nlink) = match &self.nodes[&ino] {
                    Node::Dir { entries, .. } => {
                        stack.push((p.clone(), ino));
                        let subdirs = entries.values().filter(|c| self.is_dir(**c)).count() as u32;
                        (true, 2 + subdirs)
                    }
                    Node::File { nlink, .. } => (false, *nlink),
                };
                out.insert(p, (ino, is_dir, nlink));
            }
        }
        out
    }

    fn files(&self) -> BTreeMap<Ino, FileView> {
        self.nodes
            .iter()
            .filter_map(|(ino, n)| match n {
                Node::File { layout: l, objects, stale, size, .. } => {
                    Some((*ino, (layout(*l), objects.clone(), stale.clone(), *size)))
                }
                Node::Dir { .. } => None,
            })
            .collect()
    }

    /// Every directory's explicit layout.
    fn dir_layouts(&self) -> BTreeMap<Ino, Option<Layout>> {
        self.nodes
            .iter()
            .filter_map(|(ino, n)| match n {
                Node::Dir { layout: l, .. } => Some((*ino, l.map(layout))),
                Node::File { .. } => None,
            })
            .collect()
    }
}

// ---- the real system ----

fn open(path: &Path) -> Namespace<Sqlite> {
    Namespace::new(Sqlite::open(path).expect("open database"), Layout::SINGLE).expect("open name space")
}

fn walk(ns: &Namespace<Sqlite>, path: &str) -> Result<Ino, FsStatus> {
    ns.walk(&ROOT, path, false).map(|n| n.attr.ino)
}

fn run(ns: &Namespace<Sqlite>, model: &mut Model, op: &Op) -> Result<Outcome, FsStatus> {
    let mut out = Outcome::default();
    let mut place = pool_placer(&DRIVES);
    match *op {
        Op::Mkdir(d, n) => out.ino = Some(ns.mkdir(&ROOT, walk(ns, PATHS[d])?, NAMES[n], 0o755)?.attr.ino),
        Op::Create { dir, name, exclusive } => {
            let (inode, created) =
                ns.create(&ROOT, walk(ns, PATHS[dir])?, NAMES[name], 0o644, exclusive, false, &mut place)?;
            (out.ino, out.created, out.objects) = (Some(inode.attr.ino), created, inode.objects().collect());
        }
        Op::Unlink(d, n) => out.effects = ns.unlink(&ROOT, walk(ns, PATHS[d])?, NAMES[n])?,
        Op::Rmdir(d, n) => out.effects = ns.rmdir(&ROOT, walk(ns, PATHS[d])?, NAMES[n])?,
        Op::Rename(p1, n1, p2, n2) => {
            let (sp, dp) = (walk(ns, PATHS[p1])?, walk(ns, PATHS[p2])?);
            out.effects = ns.rename(&ROOT, sp, NAMES[n1], dp, NAMES[n2])?;
        }
        Op::Link(p1, n1, p2, n2) => {
            let src = walk(ns, &join(PATHS[p1], NAMES[n1]))?;
            ns.link(&ROOT, src, walk(ns, PATHS[p2])?, NAMES[n2])?;
        }
        Op::SetLayout { dir, name, layout: l } => {
            let path = name.map_or(PATHS[dir].to_string(), |n| Model::file_path(dir, n));
            out.effects = ns.set_layout(&ROOT, walk(ns, &path)?, l.map(layout), &mut place)?;
        }
        Op::Begin(d, n) => out.txn = ns.begin_write(&ROOT, walk(ns, &Model::file_path(d, n))?, 0)?,
        Op::Commit { dir, name, written_end, stale } => {
            let path = Model::file_path(dir, name);
            let stale: Vec<(usize, StaleRange)> = stale.map(|s| (s, STALE)).into_iter().collect();
            ns.commit_write(&ROOT, walk(ns, &path)?, model.txn_of(&path), written_end, written_end, &stale, 1)?;
        }
        Op::Abort(d, n) => {
            let path = Model::file_path(d, n);
            walk(ns, &path)?;
            ns.abort_intent(model.txn_of(&path))?;
        }
        Op::Finish(d, n) => {
            let path = Model::file_path(d, n);
            walk(ns, &path)?;
            ns.finish_intent(model.txn_of(&path))?;
        }
        Op::Refill(d, k) => {
            let drive = DRIVES[d];
            let objects: Vec<ObjectRef> =
                (0..k).map(|i| ObjectRef { drive, partition: PARTITION, object: model.next_object + i }).collect();
            ns.pool_add(&objects)?;
            model.next_object += k;
            model.pool.extend(&objects);
            model.all.extend(&objects);
        }
        Op::Reopen => unreachable!("handled by the driver"),
    }
    Ok(out)
}

/// Each revocation raised its object's acv by one, is recorded as pending,
/// and matches the inode's acv; each object placed into an existing file
/// got an intent for the file's acv.
fn check_revocations(ns: &Namespace<Sqlite>, out: &Outcome, before: &BTreeMap<ObjectRef, u64>) {
    let now = acvs(ns);
    let pending = ns.acv_intents(nasd_meta::BATCH_MAX).unwrap();
    for intent in &out.effects.revoke {
        // An object new to the file (set_layout) gets the file's acv as it is.
        if let Some(acv) = before.get(&intent.object) {
            assert_eq!(intent.acv, acv + 1, "revocation must raise the acv by one");
        }
        assert_eq!(now.get(&intent.object), Some(&intent.acv), "inode acv differs from the intent");
        assert!(pending.contains(intent), "revocation {intent:?} not recorded");
    }
}

fn compare(ns: &Namespace<Sqlite>, model: &Model) {
    check_invariants(ns);
    let real = ns.backend().read(|t| tree(t)).unwrap();
    let real_tree: BTreeMap<String, (Ino, bool, u32)> = real
        .iter()
        .filter(|(p, _)| p != "/")
        .map(|(p, n)| (p.clone(), (n.attr.ino, n.attr.kind == FileKind::Dir, n.attr.nlink)))
        .collect();
    assert_eq!(real_tree, model.tree(), "name space differs from the model");
    let mut real_files = BTreeMap::new();
    let mut real_dirs = BTreeMap::new();
    for (_, n) in &real {
        if n.attr.kind == FileKind::Dir {
            real_dirs.insert(n.attr.ino, n.layout);
            continue;
        }
        let stale = n.components.iter().enumerate().filter(|(_, c)| c.state == ComponentState::Stale);
        let stale: BTreeSet<usize> = stale.map(|(i, _)| i).collect();
        for &idx in &stale {
            assert_eq!(ns.stale_ranges(n.attr.ino, idx).unwrap(), vec![STALE]);
        }
        let view = (n.layout.expect("file layout"), n.objects().collect(), stale, n.attr.size);
        real_files.insert(n.attr.ino, view);
    }
    assert_eq!(real_files, model.files(), "files differ (layout, components, stale, size)");
    assert_eq!(real_dirs, model.dir_layouts(), "directory layouts differ");
    for (&ino, layout_set) in &real_dirs {
        let want = model.inherited(ino);
        assert_eq!(ns.effective_layout(ino).unwrap(), (layout(want), layout_set.is_some()), "inherited by {ino}");
    }
    let intents: BTreeMap<Ino, (u64, IntentState)> =
        ns.intents(0, nasd_meta::BATCH_MAX).unwrap().into_iter().map(|i| (i.ino, (i.txn, i.state))).collect();
    assert_eq!(intents, model.intents, "write intents differ");
    let doomed: BTreeSet<ObjectRef> = ns.doomed(nasd_meta::BATCH_MAX).unwrap().into_iter().collect();
    assert_eq!(doomed, model.doomed, "doomed objects differ");
    for drive in DRIVES {
        let pooled = model.pool.iter().filter(|o| o.drive == drive).count();
        assert_eq!(ns.pool_len(drive).unwrap(), pooled, "pool of drive {drive}");
        let known = ns.known_objects(drive).unwrap();
        let all: BTreeSet<u64> = model.all.iter().filter(|o| o.drive == drive).map(|o| o.object).collect();
        assert_eq!(known, all, "an object of drive {drive} was lost or invented");
    }
}

fn acvs(ns: &Namespace<Sqlite>) -> BTreeMap<ObjectRef, u64> {
    let real = ns.backend().read(|t| tree(t)).unwrap();
    real.into_iter().flat_map(|(_, n)| n.objects().map(|o| (o, n.acv)).collect::<Vec<_>>()).collect()
}

/// A starting tree, so that most random operations find their names:
/// every path of [`PATHS`] a directory, a few files named `c`, and a
/// layout of two components on `/a`.
fn seed() -> Vec<Op> {
    let file = |dir| Op::Create { dir, name: 2, exclusive: true };
    let two = Op::SetLayout { dir: 1, name: None, layout: Some(1) };
    vec![
        Op::Mkdir(0, 0),
        Op::Mkdir(0, 1),
        Op::Mkdir(1, 0),
        Op::Mkdir(1, 1),
        Op::Mkdir(2, 0),
        two,
        file(0),
        file(1),
        file(3),
    ]
}

fn run_sequence(ops: &[Op]) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.sqlite");
    let mut ns = open(&path);
    for drive in DRIVES {
        let rec = DriveRecord {
            drive,
            drive_id: [drive as u8; 16],
            addr: format!("127.0.0.1:{drive}"),
            partition: PARTITION,
            sealed_keys: vec![],
            capacity_bytes: 0,
            failure_domain: String::new(),
            state: DriveState::In,
        };
        ns.add_drive(&rec).unwrap();
    }
    let mut model = Model::new();
    for d in 0..DRIVES.len() {
        run(&ns, &mut model, &Op::Refill(d, 5)).unwrap();
    }
    for op in seed().iter().chain(ops) {
        if let Op::Reopen = op {
            drop(ns);
            ns = open(&path);
            compare(&ns, &model);
            continue;
        }
        let want = model.check(op);
        let before = acvs(&ns);
        let got = run(&ns, &mut model, op);
        assert_eq!(got.as_ref().err().copied(), want.err(), "status of {op:?}");
        if let Ok(out) = got {
            check_revocations(&ns, &out, &before);
            model.apply(op, &out);
        }
        compare(&ns, &model);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn namespace_matches_model(ops in proptest::collection::vec(op_strategy(), 1..80)) {
        run_sequence(&ops);
    }
}
