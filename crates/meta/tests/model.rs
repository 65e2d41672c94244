//! Model-based test of the name space over SQLite on disk: random sequences
//! of mkdir/create/unlink/rmdir/rename/link (and pool refills and reopening
//! the database) over a small set of names, checked step by step against a
//! simple in-memory tree: every status, every name, every link count and
//! where every object is (a file, the pool or the doomed table).

use nasd_meta::testing::{check_invariants, tree};
use nasd_meta::{
    Backend, Caller, DriveRecord, Effects, FileKind, FsStatus, Ino, Namespace, ObjectRef, Sqlite, ROOT_INO,
};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const PATHS: [&str; 6] = ["/", "/a", "/b", "/a/a", "/a/b", "/b/a"];
const NAMES: [&str; 3] = ["a", "b", "c"];
const DRIVE: u32 = 1;
const PARTITION: u64 = 3;
const ROOT: Caller = Caller::ROOT;

#[derive(Debug, Clone)]
enum Op {
    Mkdir(usize, usize),
    Create { dir: usize, name: usize, exclusive: bool },
    Unlink(usize, usize),
    Rmdir(usize, usize),
    Rename(usize, usize, usize, usize),
    Link(usize, usize, usize, usize),
    Refill(u64),
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
        1 => (1..4u64).prop_map(Op::Refill),
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

// ---- the model ----

#[derive(Debug, Clone)]
enum Node {
    Dir { entries: BTreeMap<String, Ino>, parent: Ino },
    File { nlink: u32, object: ObjectRef },
}

#[derive(Debug, Default)]
struct Model {
    nodes: BTreeMap<Ino, Node>,
    pool: BTreeSet<ObjectRef>,
    doomed: BTreeSet<ObjectRef>,
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
    object: Option<ObjectRef>,
    effects: Effects,
}

impl Model {
    fn new() -> Model {
        let root = Node::Dir { entries: BTreeMap::new(), parent: ROOT_INO };
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
                    Err(FsStatus::NotFound) if self.pool.is_empty() => Err(FsStatus::NoSpace),
                    Err(FsStatus::NotFound) => Ok(()),
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
            Op::Refill(_) | Op::Reopen => Ok(()),
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

    /// Follows a successful operation.
    fn apply(&mut self, op: &Op, out: &Outcome) {
        match *op {
            Op::Mkdir(d, n) => {
                let dir = self.resolve(PATHS[d]).unwrap();
                let ino = out.ino.unwrap();
                assert!(!self.nodes.contains_key(&ino), "inode number reused");
                self.nodes.insert(ino, Node::Dir { entries: BTreeMap::new(), parent: dir });
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
            Op::Refill(_) | Op::Reopen => {}
        }
    }

    fn apply_create(&mut self, dir: Ino, name: &str, out: &Outcome) {
        let ino = out.ino.unwrap();
        if let Ok(existing) = self.child(dir, name) {
            assert!(!out.created && ino == existing, "create of an existing file");
            return;
        }
        assert!(out.created);
        let object = out.object.unwrap();
        assert!(self.pool.remove(&object), "object {object:?} did not come from the pool");
        assert!(!self.nodes.contains_key(&ino), "inode number reused");
        self.nodes.insert(ino, Node::File { nlink: 1, object });
        self.entries_mut(dir).insert(name.to_owned(), ino);
    }

    /// Removes a name (an empty directory or a file link); returns the effects.
    fn remove(&mut self, dir: Ino, name: &str) -> Fx {
        let ino = self.entries_mut(dir).remove(name).unwrap();
        let mut fx = Fx::default();
        match self.nodes.get_mut(&ino).unwrap() {
            Node::Dir { .. } => {
                self.nodes.remove(&ino);
            }
            Node::File { nlink, object } if *nlink == 1 => {
                fx.doomed.push(*object);
                self.doomed.insert(*object);
                self.nodes.remove(&ino);
            }
            Node::File { nlink, object } => {
                *nlink -= 1;
                fx.revoke.push(*object);
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

    fn file_objects(&self) -> BTreeMap<Ino, ObjectRef> {
        self.nodes
            .iter()
            .filter_map(|(ino, n)| match n {
                Node::File { object, .. } => Some((*ino, *object)),
                Node::Dir { .. } => None,
            })
            .collect()
    }
}

// ---- the real system ----

fn open(path: &Path) -> Namespace<Sqlite> {
    Namespace::new(Sqlite::open(path).expect("open database")).expect("open name space")
}

fn walk(ns: &Namespace<Sqlite>, path: &str) -> Result<Ino, FsStatus> {
    ns.walk(&ROOT, path, false).map(|n| n.attr.ino)
}

fn run(ns: &Namespace<Sqlite>, model: &mut Model, op: &Op) -> Result<Outcome, FsStatus> {
    let mut out = Outcome::default();
    match *op {
        Op::Mkdir(d, n) => out.ino = Some(ns.mkdir(&ROOT, walk(ns, PATHS[d])?, NAMES[n], 0o755)?.attr.ino),
        Op::Create { dir, name, exclusive } => {
            let (inode, created) =
                ns.create(&ROOT, walk(ns, PATHS[dir])?, NAMES[name], 0o644, exclusive, false, &[DRIVE])?;
            (out.ino, out.created, out.object) = (Some(inode.attr.ino), created, inode.object);
        }
        Op::Unlink(d, n) => out.effects = ns.unlink(&ROOT, walk(ns, PATHS[d])?, NAMES[n])?,
        Op::Rmdir(d, n) => ns.rmdir(&ROOT, walk(ns, PATHS[d])?, NAMES[n])?,
        Op::Rename(p1, n1, p2, n2) => {
            let (sp, dp) = (walk(ns, PATHS[p1])?, walk(ns, PATHS[p2])?);
            out.effects = ns.rename(&ROOT, sp, NAMES[n1], dp, NAMES[n2])?;
        }
        Op::Link(p1, n1, p2, n2) => {
            let src = walk(ns, &join(PATHS[p1], NAMES[n1]))?;
            ns.link(&ROOT, src, walk(ns, PATHS[p2])?, NAMES[n2])?;
        }
        Op::Refill(k) => {
            let objects: Vec<ObjectRef> = (0..k)
                .map(|i| ObjectRef { drive: DRIVE, partition: PARTITION, object: model.next_object + i })
                .collect();
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
/// and matches the inode's acv.
fn check_revocations(ns: &Namespace<Sqlite>, out: &Outcome, before: &BTreeMap<ObjectRef, u64>) {
    let now = acvs(ns);
    let pending = ns.acv_intents(nasd_meta::BATCH_MAX).unwrap();
    for intent in &out.effects.revoke {
        assert_eq!(intent.acv, before[&intent.object] + 1, "revocation must raise the acv by one");
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
    let real_objects: BTreeMap<Ino, ObjectRef> =
        real.iter().filter_map(|(_, n)| Some((n.attr.ino, n.object?))).collect();
    assert_eq!(real_objects, model.file_objects(), "file objects differ");
    let doomed: BTreeSet<ObjectRef> = ns.doomed(nasd_meta::BATCH_MAX).unwrap().into_iter().collect();
    assert_eq!(doomed, model.doomed, "doomed objects differ");
    assert_eq!(ns.pool_len(DRIVE).unwrap(), model.pool.len());
    let known = ns.known_objects(DRIVE).unwrap();
    let all: BTreeSet<u64> = model.all.iter().map(|o| o.object).collect();
    assert_eq!(known, all, "an object was lost or invented");
}

fn acvs(ns: &Namespace<Sqlite>) -> BTreeMap<ObjectRef, u64> {
    let real = ns.backend().read(|t| tree(t)).unwrap();
    real.into_iter().filter_map(|(_, n)| Some((n.object?, n.acv))).collect()
}

/// A starting tree, so that most random operations find their names:
/// every path of [`PATHS`] a directory, and a few files named `c`.
fn seed() -> Vec<Op> {
    let file = |dir| Op::Create { dir, name: 2, exclusive: true };
    vec![Op::Mkdir(0, 0), Op::Mkdir(0, 1), Op::Mkdir(1, 0), Op::Mkdir(1, 1), Op::Mkdir(2, 0), file(0), file(1), file(3)]
}

fn run_sequence(ops: &[Op]) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.sqlite");
    let mut ns = open(&path);
    let rec = DriveRecord {
        drive: DRIVE,
        drive_id: [1; 16],
        addr: "127.0.0.1:1".into(),
        partition: PARTITION,
        sealed_keys: vec![],
        capacity_bytes: 0,
    };
    ns.add_drive(&rec).unwrap();
    let mut model = Model::new();
    run(&ns, &mut model, &Op::Refill(6)).unwrap();
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
