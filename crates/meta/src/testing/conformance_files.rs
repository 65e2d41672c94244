//! Conformance cases of the file model: layouts (set on directories and
//! inherited dynamically, re-placing empty files), placement of component
//! objects, write intents, stale components and repair, revocation and
//! removal of files of several components, and the drive map.

use super::conformance::{
    at, drive_rec, ino, link, mkdir, obj, own, pool_placer, rename, set_times, setup, single, symlink, unlink, ALICE,
    BOB, CAROL, POOLED, ROOT, WIDE_POOLED,
};
use super::{check_invariants, snapshot};
use crate::backend::{Backend, Txn};
use crate::types::{AcvIntent, Caller, Effects, Inode, Intent, IntentState, SetAttrs, StaleRange};
use crate::{take_pooled, Namespace, BATCH_MAX, COMMIT_STALE_MAX, STALE_RANGES_MAX};
use nasd_proto::fs::*;
use nasd_proto::layout::{Component, ComponentState, Layout, Scheme};
use nasd_proto::manager::DriveState;

/// Every drive [`setup`] pools objects on, in placement order.
const ALL: [u32; 5] = [1, 3, 4, 5, 6];

fn l(text: &str) -> Layout {
    Layout::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn r(offset: u64, length: u64) -> StaleRange {
    StaleRange { offset, length }
}

/// A placer that must not be called (directories, existing files).
fn no_place() -> impl FnMut(&Layout, &mut dyn Txn) -> Result<Vec<ObjectRef>, FsStatus> {
    |layout, _| panic!("placement asked for {layout} where none is due")
}

/// Creates `path` (exclusively) placing its components on `drives`.
fn create_on<B: Backend>(ns: &Namespace<B>, who: &Caller, path: &str, drives: &[u32]) -> Result<Inode, FsStatus> {
    let (dir, name) = path.rsplit_once('/').expect("absolute path");
    let parent = ino(ns, if dir.is_empty() { "/" } else { dir });
    ns.create(who, parent, name, 0o644, true, false, &mut pool_placer(drives)).map(|(n, created)| {
        assert!(created);
        n
    })
}

fn set_layout<B: Backend>(
    ns: &Namespace<B>,
    who: &Caller,
    path: &str,
    layout: Option<Layout>,
) -> Result<Effects, FsStatus> {
    ns.set_layout(who, ino(ns, path), layout, &mut no_place())
}

fn effective<B: Backend>(ns: &Namespace<B>, path: &str) -> (Layout, bool) {
    ns.effective_layout(ino(ns, path)).unwrap_or_else(|e| panic!("{path}: {e:?}"))
}

fn ok_components(objects: &[ObjectRef]) -> Vec<Component> {
    objects.iter().map(|&object| Component { object, state: ComponentState::Ok }).collect()
}

fn drives_of(n: &Inode) -> Vec<u32> {
    n.objects().map(|o| o.drive).collect()
}

/// Write transaction ids come from a counter the backend keeps: a name
/// space opened again on the same backend goes on from it, and its root
/// keeps its own layout whatever default the new name space is given.
pub(super) fn reopen<B: Backend>(make: &impl Fn() -> B) {
    let rs = l("rs:2+1");
    let ns = Namespace::new(make(), rs).unwrap();
    setup(&ns);
    assert_eq!(effective(&ns, "/"), (rs, true), "the root gets the default layout");
    let f = create_on(&ns, &ROOT, "/f", &ALL).unwrap();
    assert_eq!((f.layout, drives_of(&f)), (Some(rs), vec![1, 3, 4]));
    let t1 = ns.begin_write(&ROOT, f.attr.ino, 0).unwrap();
    ns.finish_intent(t1).unwrap();
    let ns = Namespace::new(ns.backend, Layout::SINGLE).unwrap();
    assert_eq!(effective(&ns, "/"), (rs, true), "an existing root keeps its layout");
    let t2 = ns.begin_write(&ROOT, f.attr.ino, 0).unwrap();
    assert!(t2 > t1, "txn ids go on from the stored counter: {t1} then {t2}");
    check_invariants(&ns);
    let bad = Layout { stripe_unit: 3000, ..Layout::SINGLE };
    assert_eq!(Namespace::new(make(), bad).err(), Some(FsStatus::InvalidArgument), "a bad default layout");
}

pub(super) fn layout_inheritance<B: Backend>(ns: &Namespace<B>) {
    let (s2, rs) = (l("stripe:2@64K"), l("rs:2+1"));
    assert_eq!(effective(ns, "/"), (Layout::SINGLE, true));
    for d in ["/a", "/a/b", "/a/b/c"] {
        mkdir(ns, &ROOT, d, 0o755).unwrap();
    }
    assert_eq!(effective(ns, "/a/b/c"), (Layout::SINGLE, false));
    assert_eq!(set_layout(ns, &ROOT, "/a", Some(s2)).unwrap(), Effects::default());
    assert_eq!(effective(ns, "/a"), (s2, true));
    assert_eq!(effective(ns, "/a/b/c"), (s2, false), "directories made before inherit it too (dynamic)");
    let f = create_on(ns, &ROOT, "/a/b/c/f", &ALL).unwrap();
    assert_eq!((f.layout, f.components.len(), drives_of(&f)), (Some(s2), 2, vec![1, 3]));
    assert_eq!(effective(ns, "/a/b/c/f"), (s2, true), "a file's layout is its own");
    set_layout(ns, &ROOT, "/a/b", Some(rs)).unwrap();
    assert_eq!(create_on(ns, &ROOT, "/a/b/c/g", &ALL).unwrap().layout, Some(rs), "the nearest layout wins");
    assert_eq!(create_on(ns, &ROOT, "/a/h", &ALL).unwrap().layout, Some(s2));
    assert_eq!(create_on(ns, &ROOT, "/i", &ALL).unwrap().layout, Some(Layout::SINGLE));
    assert_eq!(at(ns, "/a/b/c/f").unwrap().layout, Some(s2), "an existing file keeps its layout");
    mkdir(ns, &ROOT, "/a/b/new", 0o755).unwrap();
    assert_eq!(effective(ns, "/a/b/new"), (rs, false));
    assert_eq!(at(ns, "/a/b/new").unwrap().layout, None, "nothing is copied into new directories");
    // A moved subtree inherits from where it lands.
    rename(ns, &ROOT, "/a/b/c", "/c").unwrap();
    assert_eq!(effective(ns, "/c"), (Layout::SINGLE, false));
    assert_eq!(create_on(ns, &ROOT, "/c/k", &ALL).unwrap().layout, Some(Layout::SINGLE));
    set_layout(ns, &ROOT, "/a/b", None).unwrap();
    assert_eq!(effective(ns, "/a/b/new"), (s2, false), "cleared: inherits from above again");
    set_layout(ns, &ROOT, "/a", None).unwrap();
    assert_eq!(effective(ns, "/a/b/new"), (Layout::SINGLE, false));
    assert_eq!(effective(ns, "/a"), (Layout::SINGLE, false));
    let s = symlink(ns, "/s", "a").unwrap();
    assert_eq!(ns.effective_layout(s.attr.ino).err(), Some(FsStatus::InvalidArgument));
    assert_eq!(ns.effective_layout(9999).err(), Some(FsStatus::NotFound));
}

pub(super) fn set_layout_directories<B: Backend>(ns: &Namespace<B>) {
    let s2 = l("stripe:2");
    mkdir(ns, &ROOT, "/d", 0o777).unwrap();
    own(ns, "/d", &ALICE, 0o777);
    set_times(ns, "/d", 5);
    assert_eq!(set_layout(ns, &BOB, "/d", Some(s2)).err(), Some(FsStatus::NotPermitted), "owner or root only");
    set_layout(ns, &ALICE, "/d", Some(s2)).unwrap();
    let d = at(ns, "/d").unwrap();
    assert_eq!(d.layout, Some(s2));
    assert!(d.attr.ctime_ns > 5, "ctime moves");
    set_layout(ns, &ROOT, "/d", None).unwrap();
    assert_eq!(at(ns, "/d").unwrap().layout, None);
    assert_eq!(set_layout(ns, &ALICE, "/", Some(s2)).err(), Some(FsStatus::NotPermitted));
    assert_eq!(set_layout(ns, &ROOT, "/", None).err(), Some(FsStatus::InvalidArgument), "the root keeps a layout");
    set_layout(ns, &ROOT, "/", Some(s2)).unwrap();
    assert_eq!(effective(ns, "/"), (s2, true));
    assert_eq!(create_on(ns, &ROOT, "/x", &ALL).unwrap().layout, Some(s2));
    let bad_unit = Layout { stripe_unit: 3000, ..s2 };
    let no_columns = Layout { scheme: Scheme::Stripe { width: 0 }, ..s2 };
    let too_wide = Layout { scheme: Scheme::Mirror { width: 32, copies: 4 }, ..s2 };
    for bad in [bad_unit, no_columns, too_wide] {
        assert_eq!(set_layout(ns, &ROOT, "/d", Some(bad)).err(), Some(FsStatus::InvalidArgument), "{bad:?}");
    }
    symlink(ns, "/s", "d").unwrap();
    assert_eq!(set_layout(ns, &ROOT, "/s", Some(s2)).err(), Some(FsStatus::InvalidArgument));
    assert_eq!(ns.set_layout(&ROOT, 9999, Some(s2), &mut no_place()).err(), Some(FsStatus::NotFound));
}

pub(super) fn set_layout_files<B: Backend>(ns: &Namespace<B>) {
    let rs = l("rs:2+1");
    let f = create_on(ns, &ROOT, "/f", &ALL).unwrap();
    own(ns, "/f", &ALICE, 0o444);
    let i = f.attr.ino;
    let old = single(&f);
    let acv = ns.getattr(i).unwrap().acv;
    assert_eq!(acv, 1, "the chown revoked");
    let mut place = pool_placer(&[3, 4, 5]);
    assert_eq!(ns.set_layout(&BOB, i, Some(rs), &mut place).err(), Some(FsStatus::NotPermitted));
    assert_eq!(ns.set_layout(&ALICE, i, None, &mut place).err(), Some(FsStatus::InvalidArgument), "files have one");
    // Re-placing an empty file: new components, the old object doomed, the new ones get the file's acv.
    let fx = ns.set_layout(&ALICE, i, Some(rs), &mut place).unwrap();
    let n = ns.getattr(i).unwrap();
    assert_eq!((n.layout, drives_of(&n), n.acv), (Some(rs), vec![3, 4, 5], acv));
    assert!(n.components.iter().all(|c| c.state == ComponentState::Ok));
    let intents: Vec<AcvIntent> = n.objects().map(|object| AcvIntent { object, acv }).collect();
    assert_eq!(fx, Effects { revoke: intents.clone(), doomed: vec![old], collections: vec![] });
    assert_eq!(ns.doomed(10).unwrap(), vec![old]);
    let mut pending = ns.acv_intents(10).unwrap();
    pending.sort_by_key(|i| i.object);
    assert_eq!(pending, intents, "the doomed object's intent is forgotten, the new ones recorded");
    // A writer (a write intent) makes it Busy; data makes it InvalidArgument.
    let txn = ns.begin_write(&ALICE, i, 0).unwrap();
    assert_eq!(ns.set_layout(&ALICE, i, Some(Layout::SINGLE), &mut place).err(), Some(FsStatus::Busy));
    ns.finish_intent(txn).unwrap();
    ns.record_size(i, 10, 10, 1).unwrap();
    let e = ns.set_layout(&ROOT, i, Some(Layout::SINGLE), &mut pool_placer(&ALL));
    assert_eq!(e.err(), Some(FsStatus::InvalidArgument), "only an empty file is re-placed");
    ns.record_size(i, 0, 0, 1).unwrap();
    // A failed placement changes nothing.
    let before = snapshot(ns);
    let e = ns.set_layout(&ROOT, i, Some(l("stripe:2")), &mut pool_placer(&[2, 9]));
    assert_eq!(e.err(), Some(FsStatus::NoSpace));
    assert_eq!(snapshot(ns), before);
    // Stale components and their ranges go with the old objects.
    ns.mark_stale(i, 1, &[r(0, 10)]).unwrap();
    let fx = ns.set_layout(&ROOT, i, Some(Layout::SINGLE), &mut pool_placer(&ALL)).unwrap();
    assert_eq!(fx.doomed, n.objects().collect::<Vec<_>>());
    let n = ns.getattr(i).unwrap();
    assert_eq!((n.layout, drives_of(&n)), (Some(Layout::SINGLE), vec![1]));
    assert_eq!(ns.stale_components((0, 0), 10).unwrap(), vec![]);
    assert_eq!(ns.degraded_files().unwrap(), 0);
    let d = mkdir(ns, &ROOT, "/d", 0o755).unwrap();
    assert_eq!(ns.begin_write(&ROOT, d.attr.ino, 0).err(), Some(FsStatus::IsDir));
}

pub(super) fn placement<B: Backend>(ns: &Namespace<B>) {
    let before: Vec<usize> = ALL.iter().map(|&d| ns.pool_len(d).unwrap()).collect();
    mkdir(ns, &ROOT, "/rs", 0o777).unwrap();
    set_layout(ns, &ROOT, "/rs", Some(l("rs:2+1"))).unwrap();
    let f = create_on(ns, &ALICE, "/rs/f", &ALL).unwrap();
    assert_eq!((f.attr.size, f.acv, f.attr.uid), (0, 0, ALICE.uid));
    let objects: Vec<ObjectRef> = f.objects().collect();
    assert_eq!(drives_of(&f), vec![1, 3, 4], "the placer's order is component order");
    assert_eq!(f.components, ok_components(&objects));
    assert_eq!(ns.getattr(f.attr.ino).unwrap(), f);
    assert_eq!(ns.walk(&ALICE, "/rs/f", true).unwrap(), f);
    let after: Vec<usize> = ALL.iter().map(|&d| ns.pool_len(d).unwrap()).collect();
    assert_eq!(after, vec![before[0] - 1, before[1] - 1, before[2] - 1, before[3], before[4]]);
    for o in &objects {
        assert!(ns.known_objects(o.drive).unwrap().contains(&o.object));
    }
    for (text, drives) in [("mirror:2x2", vec![1, 3, 4, 5]), ("stripe:5", vec![1, 3, 4, 5, 6])] {
        set_layout(ns, &ROOT, "/rs", Some(l(text))).unwrap();
        let g = create_on(ns, &ROOT, &format!("/rs/{text}"), &ALL).unwrap();
        assert_eq!((g.layout, drives_of(&g)), (Some(l(text)), drives), "{text}");
    }
    // Opening an existing file places nothing.
    let (again, created) = ns.create(&ALICE, ino(ns, "/rs"), "f", 0o644, false, false, &mut no_place()).unwrap();
    assert_eq!((again, created), (f.clone(), false));
    // Too few drives with pooled objects: the placer's NoSpace, nothing taken.
    set_layout(ns, &ROOT, "/rs", Some(l("stripe:6"))).unwrap();
    let before = snapshot(ns);
    assert_eq!(create_on(ns, &ROOT, "/rs/wide", &ALL).err(), Some(FsStatus::NoSpace));
    assert_eq!(snapshot(ns), before, "a failed create puts the objects it took back");
    // readdir carries components.
    let listed = ns.readdir(&ROOT, ino(ns, "/rs"), "", 10).unwrap();
    assert_eq!(listed.iter().find(|e| e.name == "f").map(|e| &e.inode), Some(&f));
}

pub(super) fn placement_refusals<B: Backend>(ns: &Namespace<B>) {
    mkdir(ns, &ROOT, "/d", 0o777).unwrap();
    set_layout(ns, &ROOT, "/d", Some(l("stripe:2"))).unwrap();
    let held = single(&create_on(ns, &ROOT, "/held", &[1]).unwrap());
    let d = ino(ns, "/d");
    type Bad = fn(&Layout, &mut dyn Txn) -> Result<Vec<ObjectRef>, FsStatus>;
    let cases: [(&str, Bad, FsStatus); 7] = [
        ("too few", |_, t| Ok(take_pooled(t, 3)?.into_iter().collect()), FsStatus::Internal),
        (
            "too many",
            |_, t| Ok([3, 4, 5].iter().filter_map(|&d| take_pooled(t, d).unwrap()).collect()),
            FsStatus::Internal,
        ),
        (
            "one drive twice",
            |_, t| Ok(vec![take_pooled(t, 3)?.unwrap(), take_pooled(t, 3)?.unwrap()]),
            FsStatus::Internal,
        ),
        ("still pooled", |_, t| Ok(vec![take_pooled(t, 3)?.unwrap(), obj(4, 500)]), FsStatus::Internal),
        ("held by a file", |_, t| Ok(vec![take_pooled(t, 3)?.unwrap(), obj(1, 100)]), FsStatus::Internal),
        ("unknown drive", |_, t| Ok(vec![take_pooled(t, 3)?.unwrap(), obj(9, 1)]), FsStatus::Internal),
        ("the placer's own error", |_, _| Err(FsStatus::Busy), FsStatus::Busy),
    ];
    assert_eq!(held, obj(1, 100), "the case 'held by a file' names it");
    for (what, mut bad, want) in cases {
        let before = snapshot(ns);
        let e = ns.create(&ROOT, d, "f", 0o644, true, false, &mut bad);
        assert_eq!(e.err(), Some(want), "create, {what}");
        let e = ns.set_layout(&ROOT, ino(ns, "/held"), Some(l("stripe:2")), &mut bad);
        assert_eq!(e.err(), Some(want), "set_layout, {what}");
        assert_eq!(snapshot(ns), before, "{what}: a refused placement left a trace");
    }
}

pub(super) fn write_intents<B: Backend>(ns: &Namespace<B>) {
    let f = create_on(ns, &ROOT, "/f", &[1]).unwrap();
    own(ns, "/f", &ALICE, 0o644);
    let g = create_on(ns, &ROOT, "/g", &[1]).unwrap().attr.ino;
    let i = f.attr.ino;
    assert_eq!(ns.intent_of(i).unwrap(), None);
    let t1 = ns.begin_write(&ALICE, i, 1000).unwrap();
    assert!(t1 > 0, "txn 0 means no transaction");
    let open = Intent {
        txn: t1,
        ino: i,
        state: IntentState::Open,
        uid: ALICE.uid,
        deadline_ns: 1000,
        escrow: 0,
        size_limit: u64::MAX,
        writes: Intent::ALL,
        unopened: 0,
    };
    assert_eq!((ns.intent_of(i).unwrap(), ns.intent(t1).unwrap()), (Some(open), Some(open)));
    assert_eq!(ns.begin_write(&ALICE, i, 0).err(), Some(FsStatus::Busy), "one writer at a time");
    assert_eq!(ns.begin_write(&ROOT, i, 0).err(), Some(FsStatus::Busy));
    assert_eq!(ns.extend_intent(t1, 2000).unwrap().deadline_ns, 2000);
    let commit = |who: &Caller, ino: Ino, txn: u64| ns.commit_write(who, ino, txn, 10, 10, &[], 5555);
    assert_eq!(commit(&BOB, i, t1).err(), Some(FsStatus::NotPermitted), "only its writer commits it");
    assert_eq!(commit(&ALICE, g, t1).err(), Some(FsStatus::InvalidArgument), "another file's txn");
    assert_eq!(commit(&ALICE, i, t1 + 1000).err(), Some(FsStatus::InvalidArgument), "no such txn");
    assert_eq!(commit(&ALICE, 9999, t1).err(), Some(FsStatus::NotFound));
    let n = commit(&ALICE, i, t1).unwrap();
    assert_eq!((n.attr.size, n.attr.mtime_ns, n.attr.ctime_ns), (10, 5555, 5555));
    assert_eq!(ns.getattr(i).unwrap(), n);
    let committed = Intent { state: IntentState::Committed, deadline_ns: 2000, ..open };
    assert_eq!(ns.intent(t1).unwrap(), Some(committed));
    assert_eq!(commit(&ALICE, i, t1).err(), Some(FsStatus::InvalidArgument), "committed already");
    assert_eq!(ns.extend_intent(t1, 1).err(), Some(FsStatus::InvalidArgument));
    assert_eq!(ns.abort_intent(t1).err(), Some(FsStatus::InvalidArgument), "a committed write is not aborted");
    assert_eq!(ns.begin_write(&ALICE, i, 0).err(), Some(FsStatus::Busy), "until the manager finishes it");
    ns.finish_intent(t1).unwrap();
    ns.finish_intent(t1).unwrap();
    assert_eq!(ns.intent(t1).unwrap(), None);
    // Aborting.
    let t2 = ns.begin_write(&ALICE, i, 3000).unwrap();
    assert!(t2 > t1);
    let aborting = Intent { txn: t2, state: IntentState::Aborting, deadline_ns: 3000, ..open };
    assert_eq!(ns.abort_intent(t2).unwrap(), aborting);
    assert_eq!(ns.abort_intent(t2).unwrap(), aborting, "aborting twice is harmless");
    assert_eq!(commit(&ALICE, i, t2).err(), Some(FsStatus::InvalidArgument), "too late");
    assert_eq!(ns.extend_intent(t2, 1).err(), Some(FsStatus::InvalidArgument));
    assert_eq!(ns.getattr(i).unwrap(), n, "an aborted write records nothing");
    ns.finish_intent(t2).unwrap();
    assert_eq!(ns.abort_intent(t2).err(), Some(FsStatus::NotFound));
    assert_eq!(ns.scope_intent(i, t2, 0, 0).err(), Some(FsStatus::NotFound));
    // What a transaction may change and could not be opened on: recorded while Open, kept
    // through the abort (the rollback reads it), unopened only within writes.
    let t2b = ns.begin_write(&ALICE, i, 3000).unwrap();
    let scoped = ns.scope_intent(i, t2b, 0b101, 0b110).unwrap();
    assert_eq!((scoped.writes, scoped.unopened), (0b101, 0b100));
    assert_eq!(ns.scope_intent(g, t2b, 0, 0).err(), Some(FsStatus::InvalidArgument), "another file's");
    let aborted = ns.abort_intent(t2b).unwrap();
    assert_eq!((aborted.writes, aborted.unopened, aborted.state), (0b101, 0b100, IntentState::Aborting));
    assert_eq!(ns.scope_intent(i, t2b, 0, 0).err(), Some(FsStatus::InvalidArgument), "not Open");
    ns.finish_intent(t2b).unwrap();
    assert_eq!(ns.extend_intent(t2, 1).err(), Some(FsStatus::NotFound));
    // Root commits anyone's.
    let t3 = ns.begin_write(&ALICE, i, 0).unwrap();
    ns.commit_write(&ROOT, i, t3, 0, 0, &[], 1).unwrap();
    ns.finish_intent(t3).unwrap();
    // Listing, ascending by txn.
    let h = create_on(ns, &ROOT, "/h", &[1]).unwrap().attr.ino;
    let ti = ns.begin_write(&ROOT, i, 0).unwrap();
    let tg = ns.begin_write(&ROOT, g, 0).unwrap();
    let th = ns.begin_write(&ROOT, h, 0).unwrap();
    assert!(t3 < ti && ti < tg && tg < th, "txn ids ascend and are never reused");
    let txns = |after, limit| ns.intents(after, limit).unwrap().into_iter().map(|i| i.txn).collect::<Vec<_>>();
    assert_eq!(txns(0, 10), vec![ti, tg, th]);
    assert_eq!(txns(ti, 10), vec![tg, th]);
    assert_eq!(txns(0, 1), vec![ti]);
    assert_eq!(txns(th, 10), Vec::<u64>::new());
    assert_eq!(txns(0, usize::MAX).len(), 3, "the limit is capped at BATCH_MAX, not refused");
    // A name dropped keeps the intent while a link remains; the last one drops it.
    link(ns, "/f", "/f2").unwrap();
    unlink(ns, &ROOT, "/f").unwrap();
    assert_eq!(ns.intent(ti).unwrap().map(|x| x.ino), Some(i));
    unlink(ns, &ROOT, "/f2").unwrap();
    assert_eq!(ns.intent(ti).unwrap(), None, "the last link takes the file's intent with it");
    rename(ns, &ROOT, "/g", "/h").unwrap();
    assert_eq!(txns(0, 10), vec![tg], "renamed over: h's intent went with it");
}

pub(super) fn write_intent_permissions<B: Backend>(ns: &Namespace<B>) {
    let f = create_on(ns, &ROOT, "/f", &[1]).unwrap().attr.ino;
    // r-- rw- r--: ALICE owns it but may not write by its mode; BOB's group may.
    own(ns, "/f", &ALICE, 0o464);
    for (who, allowed) in [(&ALICE, true), (&BOB, true), (&CAROL, false), (&ROOT, true)] {
        match ns.begin_write(who, f, 0) {
            Ok(txn) => {
                assert!(allowed, "{who:?} may not write");
                assert_eq!(ns.intent(txn).unwrap().map(|i| i.uid), Some(who.uid));
                ns.finish_intent(txn).unwrap();
            }
            Err(e) => assert_eq!((allowed, e), (false, FsStatus::PermissionDenied), "{who:?}"),
        }
    }
    let d = mkdir(ns, &ROOT, "/d", 0o777).unwrap().attr.ino;
    let s = symlink(ns, "/s", "f").unwrap().attr.ino;
    assert_eq!(ns.begin_write(&ROOT, d, 0).err(), Some(FsStatus::IsDir));
    assert_eq!(ns.begin_write(&ROOT, s, 0).err(), Some(FsStatus::InvalidArgument));
    assert_eq!(ns.begin_write(&ROOT, 9999, 0).err(), Some(FsStatus::NotFound));
    assert!(ns.intents(0, 10).unwrap().is_empty());
}

pub(super) fn commit_rules<B: Backend>(ns: &Namespace<B>) {
    mkdir(ns, &ROOT, "/rs", 0o777).unwrap();
    set_layout(ns, &ROOT, "/rs", Some(l("rs:2+1"))).unwrap();
    let i = create_on(ns, &ROOT, "/rs/f", &ALL).unwrap().attr.ino;
    set_times(ns, "/rs/f", 100);
    let ctime = ns.getattr(i).unwrap().attr.ctime_ns;
    let begin = || ns.begin_write(&ROOT, i, 0).unwrap();
    let commit = |txn, end, stale: &[(usize, StaleRange)], now| {
        let n = ns.commit_write(&ROOT, i, txn, end, end, stale, now)?;
        ns.finish_intent(txn)?;
        Ok::<_, FsStatus>(n)
    };
    let n = commit(begin(), 0, &[], 999).unwrap();
    assert_eq!((n.attr.size, n.attr.mtime_ns, n.attr.ctime_ns), (0, 100, ctime), "nothing written: no times");
    let n = commit(begin(), 4096, &[], 200).unwrap();
    assert_eq!((n.attr.size, n.attr.mtime_ns, n.attr.ctime_ns), (4096, 200, 200));
    let n = commit(begin(), 1000, &[], 300).unwrap();
    assert_eq!((n.attr.size, n.attr.mtime_ns), (4096, 300), "size never shrinks by a commit");
    // Refusals change nothing, and the intent stays Open.
    let txn = begin();
    let before = snapshot(ns);
    let too_many = vec![(0, r(0, 1)); COMMIT_STALE_MAX + 1];
    for bad in [&[(3, r(0, 1))][..], &[(0, r(5, 0))], &[(0, r(u64::MAX, 2))], &too_many[..]] {
        let e = ns.commit_write(&ROOT, i, txn, 1, 1, bad, 1).err();
        assert_eq!(e, Some(FsStatus::InvalidArgument), "{:?}", &bad[..1]);
    }
    assert_eq!(snapshot(ns), before);
    // Stale components: marked, ranges merged; a report of stale ranges counts as a write.
    let stale = [(1, r(0, 100)), (1, r(50, 100)), (2, r(1000, 10))];
    let n = commit(txn, 0, &stale, 400).unwrap();
    assert_eq!((n.attr.size, n.attr.mtime_ns), (4096, 400));
    let states: Vec<ComponentState> = n.components.iter().map(|c| c.state).collect();
    assert_eq!(states, vec![ComponentState::Ok, ComponentState::Stale, ComponentState::Stale]);
    assert_eq!(ns.getattr(i).unwrap(), n);
    assert_eq!(ns.stale_ranges(i, 1).unwrap(), vec![r(0, 150)]);
    assert_eq!(ns.stale_ranges(i, 2).unwrap(), vec![r(1000, 10)]);
    assert_eq!(ns.stale_ranges(i, 0).unwrap(), vec![]);
    commit(begin(), 0, &[(1, r(150, 50)), (1, r(500, 1))], 500).unwrap();
    assert_eq!(ns.stale_ranges(i, 1).unwrap(), vec![r(0, 200), r(500, 1)], "touching ranges join");
    assert_eq!(ns.degraded_files().unwrap(), 1);
    assert_eq!(ns.stale_components((0, 0), 10).unwrap(), vec![(i, 1), (i, 2)]);
}

/// A size change the manager commits records, in the same transaction,
/// the components that missed it.
pub(super) fn size_change_missed<B: Backend>(ns: &Namespace<B>) {
    mkdir(ns, &ROOT, "/z", 0o777).unwrap();
    set_layout(ns, &ROOT, "/z", Some(l("mirror:2"))).unwrap();
    let i = create_on(ns, &ROOT, "/z/f", &ALL).unwrap().attr.ino;
    let set = SetAttrs { size: Some(100), ..SetAttrs::default() };
    let t = ns.begin_write(&ROOT, i, 0).unwrap();
    let refused = ns.setattr_committing(&ROOT, i, &set, t, &[(5, r(0, 1))]);
    assert_eq!(refused.err(), Some(FsStatus::InvalidArgument), "no component 5");
    assert_eq!(
        (ns.getattr(i).unwrap().attr.size, ns.intent(t).unwrap().map(|x| x.state)),
        (0, Some(IntentState::Open))
    );
    let (n, _) = ns.setattr_committing(&ROOT, i, &set, t, &[(1, r(0, 4096))]).unwrap();
    assert_eq!(
        (n.attr.size, n.components[0].state, n.components[1].state),
        (100, ComponentState::Ok, ComponentState::Stale)
    );
    assert_eq!(ns.stale_ranges(i, 1).unwrap(), vec![r(0, 4096)]);
    assert_eq!(ns.getattr(i).unwrap(), n);
    ns.finish_intent(t).unwrap();
    // A cut to nothing that the stale component took leaves it holding what the file holds.
    let zero = SetAttrs { size: Some(0), ..SetAttrs::default() };
    let t = ns.begin_write(&ROOT, i, 0).unwrap();
    let (n, _) = ns.setattr_committing(&ROOT, i, &zero, t, &[]).unwrap();
    assert_eq!((n.attr.size, n.components[1].state), (0, ComponentState::Ok));
    assert_eq!(ns.stale_ranges(i, 1).unwrap(), vec![]);
    assert_eq!(ns.getattr(i).unwrap(), n);
    ns.finish_intent(t).unwrap();
    // One that missed the cut stays stale.
    ns.mark_stale(i, 1, &[r(0, 10)]).unwrap();
    let t = ns.begin_write(&ROOT, i, 0).unwrap();
    let (n, _) = ns.setattr_committing(&ROOT, i, &zero, t, &[(1, r(0, 4096))]).unwrap();
    assert_eq!((n.components[0].state, n.components[1].state), (ComponentState::Ok, ComponentState::Stale));
    assert_eq!(ns.stale_ranges(i, 1).unwrap(), vec![r(0, 4096)]);
    ns.finish_intent(t).unwrap();
}

pub(super) fn stale_marking<B: Backend>(ns: &Namespace<B>) {
    mkdir(ns, &ROOT, "/m", 0o777).unwrap();
    set_layout(ns, &ROOT, "/m", Some(l("mirror:2"))).unwrap();
    let i = create_on(ns, &ROOT, "/m/f", &ALL).unwrap().attr.ino;
    let state = |idx: usize| ns.getattr(i).unwrap().components[idx].state;
    ns.mark_stale(i, 0, &[]).unwrap();
    assert_eq!((state(0), ns.stale_ranges(i, 0).unwrap()), (ComponentState::Stale, vec![]), "stale, rebuild whole");
    ns.mark_stale(i, 0, &[r(10, 10)]).unwrap();
    ns.mark_stale(i, 0, &[r(15, 10), r(40, 5)]).unwrap();
    ns.mark_stale(i, 0, &[r(25, 15)]).unwrap();
    assert_eq!(ns.stale_ranges(i, 0).unwrap(), vec![r(10, 35)], "overlapping and touching ranges join");
    // Many scattered ranges: at most STALE_RANGES_MAX kept, every byte still covered.
    let many: Vec<StaleRange> = (0..STALE_RANGES_MAX as u64 + 10).map(|k| r(1000 + k * 7, 2)).collect();
    for chunk in many.chunks(100) {
        ns.mark_stale(i, 1, chunk).unwrap();
    }
    let kept = ns.stale_ranges(i, 1).unwrap();
    assert!(kept.len() <= STALE_RANGES_MAX, "{} ranges kept", kept.len());
    for x in &many {
        assert!(kept.iter().any(|k| k.offset <= x.offset && x.end() <= k.end()), "{x:?} forgotten");
    }
    assert_eq!(ns.degraded_files().unwrap(), 1, "one file, two stale components");
    ns.clear_stale(i, 0).unwrap();
    assert_eq!((state(0), ns.stale_ranges(i, 0).unwrap()), (ComponentState::Ok, vec![]));
    ns.clear_stale(i, 1).unwrap();
    assert_eq!(ns.degraded_files().unwrap(), 0);
    ns.clear_stale(i, 1).unwrap();
    // A resync's commit: the intent Committed and the component Ok with no ranges, at once.
    ns.mark_stale(i, 0, &[r(0, 5)]).unwrap();
    let t = ns.begin_write(&ROOT, i, 0).unwrap();
    assert_eq!(ns.commit_resync(i, t + 1000, 0).err(), Some(FsStatus::InvalidArgument), "no such txn");
    assert_eq!(ns.commit_resync(i, t, 2).err(), Some(FsStatus::InvalidArgument), "no component 2");
    assert_eq!(ns.commit_resync(9999, t, 0).err(), Some(FsStatus::NotFound));
    assert_eq!(state(0), ComponentState::Stale, "a refused commit changes nothing");
    let n = ns.commit_resync(i, t, 0).unwrap();
    assert_eq!(
        (n.components[0].state, state(0), ns.stale_ranges(i, 0).unwrap()),
        (ComponentState::Ok, ComponentState::Ok, vec![])
    );
    assert_eq!(ns.intent(t).unwrap().map(|x| x.state), Some(IntentState::Committed));
    assert_eq!(ns.commit_resync(i, t, 0).err(), Some(FsStatus::InvalidArgument), "committed already");
    ns.finish_intent(t).unwrap();
    // Only an Open intent: one rolled back (its deadline passed) records nothing.
    ns.mark_stale(i, 1, &[r(0, 5)]).unwrap();
    let t = ns.begin_write(&ROOT, i, 0).unwrap();
    ns.abort_intent(t).unwrap();
    assert_eq!(ns.commit_resync(i, t, 1).err(), Some(FsStatus::InvalidArgument), "aborted");
    assert_eq!((state(1), ns.stale_ranges(i, 1).unwrap()), (ComponentState::Stale, vec![r(0, 5)]));
    ns.finish_intent(t).unwrap();
    // A component that is not Stale is left as it is.
    let t = ns.begin_write(&ROOT, i, 0).unwrap();
    assert_eq!(ns.commit_resync(i, t, 0).unwrap().components[0].state, ComponentState::Ok);
    ns.finish_intent(t).unwrap();
    // A repair's commit: the ranges found current come out of what is recorded; a component
    // with nothing left is Ok; one stale whole (no ranges) keeps what no range covers.
    ns.mark_stale(i, 0, &[r(0, 100), r(200, 50)]).unwrap();
    let t = ns.begin_write(&ROOT, i, 0).unwrap();
    assert_eq!(ns.commit_repair(i, t, &[(2, r(0, 1))]).err(), Some(FsStatus::InvalidArgument), "no component 2");
    assert_eq!(ns.commit_repair(i, t, &[(0, r(1, 0))]).err(), Some(FsStatus::InvalidArgument), "empty");
    let n = ns.commit_repair(i, t, &[(0, r(10, 20)), (0, r(190, 100))]).unwrap();
    assert_eq!(n.components[0].state, ComponentState::Stale);
    assert_eq!(ns.stale_ranges(i, 0).unwrap(), vec![r(0, 10), r(30, 70)]);
    assert_eq!(ns.intent(t).unwrap().map(|x| x.state), Some(IntentState::Committed));
    ns.finish_intent(t).unwrap();
    ns.clear_stale(i, 1).unwrap();
    ns.mark_stale(i, 1, &[]).unwrap();
    let t = ns.begin_write(&ROOT, i, 0).unwrap();
    let n = ns.commit_repair(i, t, &[(0, r(0, 100)), (1, r(0, 1000))]).unwrap();
    assert_eq!((n.components[0].state, state(0)), (ComponentState::Ok, ComponentState::Ok), "nothing left");
    assert_eq!((state(1), ns.stale_ranges(i, 1).unwrap()), (ComponentState::Stale, vec![r(1000, u64::MAX - 1000)]));
    ns.finish_intent(t).unwrap();
    ns.clear_stale(i, 1).unwrap();
    let d = ino(ns, "/m");
    let too_many = vec![r(0, 1); COMMIT_STALE_MAX + 1];
    for (ino, idx, ranges, want) in [
        (d, 0, &[][..], FsStatus::InvalidArgument),
        (i, 2, &[], FsStatus::InvalidArgument),
        (i, 0, &[r(1, 0)], FsStatus::InvalidArgument),
        (i, 0, &too_many[..], FsStatus::InvalidArgument),
        (9999, 0, &[], FsStatus::NotFound),
    ] {
        assert_eq!(ns.mark_stale(ino, idx, ranges).err(), Some(want), "mark_stale({ino}, {idx})");
        if ranges.is_empty() {
            assert_eq!(ns.clear_stale(ino, idx).err(), Some(want), "clear_stale({ino}, {idx})");
            assert_eq!(ns.stale_ranges(ino, idx).err(), Some(want), "stale_ranges({ino}, {idx})");
        }
    }
}

pub(super) fn replace_component<B: Backend>(ns: &Namespace<B>) {
    mkdir(ns, &ROOT, "/rs", 0o777).unwrap();
    set_layout(ns, &ROOT, "/rs", Some(l("rs:2+1"))).unwrap();
    let f = create_on(ns, &ROOT, "/rs/f", &ALL).unwrap();
    let i = f.attr.ino;
    let old: Vec<ObjectRef> = f.objects().collect();
    let revoked = ns.bump_acv(i).unwrap();
    ns.mark_stale(i, 1, &[r(0, 10)]).unwrap();
    let pooled = ns.pool_len(5).unwrap();
    let new = ns.take_pooled_object(5).unwrap().expect("drive 5 has pooled objects");
    assert_eq!((new.drive, ns.pool_len(5).unwrap()), (5, pooled - 1));
    assert!(!ns.known_objects(5).unwrap().contains(&new.object), "held by no table until it is placed");
    let fx = ns.replace_component(i, 1, new, ComponentState::Ok).unwrap();
    assert_eq!(
        fx,
        Effects { revoke: vec![AcvIntent { object: new, acv: 1 }], doomed: vec![old[1]], collections: vec![] }
    );
    let n = ns.getattr(i).unwrap();
    assert_eq!(n.components, ok_components(&[old[0], new, old[2]]));
    assert_eq!((n.acv, n.attr.ctime_ns), (1, f.attr.ctime_ns), "no revocation, no POSIX change");
    assert_eq!(ns.stale_ranges(i, 1).unwrap(), vec![], "a rebuilt component has no stale ranges");
    assert_eq!(ns.doomed(10).unwrap(), vec![old[1]]);
    let mut pending = ns.acv_intents(10).unwrap();
    pending.sort_by_key(|x| x.object);
    let mut want = vec![revoked[0], revoked[2], AcvIntent { object: new, acv: 1 }];
    want.sort_by_key(|x| x.object);
    assert_eq!(pending, want, "the replaced object's intent is forgotten");
    assert_eq!(ns.component_of(&new).unwrap(), Some((i, 1)));
    assert_eq!(ns.component_of(&old[1]).unwrap(), None);
    // A Stale replacement (a rebuild to come) starts without ranges too.
    ns.mark_stale(i, 2, &[r(5, 5)]).unwrap();
    let new2 = ns.take_pooled_object(6).unwrap().unwrap();
    ns.replace_component(i, 2, new2, ComponentState::Stale).unwrap();
    let n = ns.getattr(i).unwrap();
    assert_eq!(n.components[2], Component { object: new2, state: ComponentState::Stale });
    assert_eq!(ns.stale_ranges(i, 2).unwrap(), vec![], "stale without ranges: rebuild it whole");
    // A component may move to another object on its own drive.
    let same_drive = ns.take_pooled_object(old[0].drive).unwrap().unwrap();
    ns.replace_component(i, 0, same_drive, ComponentState::Ok).unwrap();
    let before = snapshot(ns);
    let d = ino(ns, "/rs");
    for (ino, idx, object, state, want) in [
        (i, 0, obj(1, 9000), ComponentState::Down, FsStatus::InvalidArgument),
        (i, 3, obj(1, 9000), ComponentState::Ok, FsStatus::InvalidArgument),
        (i, 0, same_drive, ComponentState::Ok, FsStatus::InvalidArgument),
        (i, 0, obj(5, 9000), ComponentState::Ok, FsStatus::InvalidArgument),
        (i, 0, obj(9, 9000), ComponentState::Ok, FsStatus::InvalidArgument),
        (i, 0, obj(3, 500 + WIDE_POOLED - 1), ComponentState::Ok, FsStatus::Exists),
        (i, 0, old[1], ComponentState::Ok, FsStatus::Exists),
        (d, 0, obj(1, 9000), ComponentState::Ok, FsStatus::InvalidArgument),
        (9999, 0, obj(1, 9000), ComponentState::Ok, FsStatus::NotFound),
    ] {
        let e = ns.replace_component(ino, idx, object, state).err();
        assert_eq!(e, Some(want), "replace_component({ino}, {idx}, {object:?}, {state:?})");
    }
    assert_eq!(snapshot(ns), before, "refusals change nothing");
}

pub(super) fn component_queries<B: Backend>(ns: &Namespace<B>) {
    mkdir(ns, &ROOT, "/d", 0o777).unwrap();
    set_layout(ns, &ROOT, "/d", Some(l("stripe:2"))).unwrap();
    let mut files = Vec::new();
    for (k, drives) in [[3, 4], [4, 5], [3, 5], [3, 6]].iter().enumerate() {
        files.push(create_on(ns, &ROOT, &format!("/d/f{k}"), drives).unwrap());
    }
    let single_file = create_on(ns, &ROOT, "/s", &[1]).unwrap();
    let on3: Vec<(Ino, usize, ObjectRef)> =
        [&files[0], &files[2], &files[3]].iter().map(|f| (f.attr.ino, 0, f.components[0].object)).collect();
    assert_eq!(ns.components_on_drive(3, (0, 0), 100).unwrap(), on3);
    let mut paged = Vec::new();
    let mut after = (0, 0);
    while let Some(&(ino, idx, o)) = ns.components_on_drive(3, after, 1).unwrap().first() {
        paged.push((ino, idx, o));
        after = (ino, idx);
    }
    assert_eq!(paged, on3, "paging one at a time");
    assert_eq!(ns.components_on_drive(3, (files[2].attr.ino, 0), 100).unwrap(), on3[2..]);
    assert_eq!(ns.components_on_drive(2, (0, 0), 100).unwrap(), vec![]);
    assert_eq!(
        ns.component_counts().unwrap(),
        vec![(1, 1), (2, 0), (3, 3), (4, 2), (5, 2), (6, 1)],
        "every drive of the table, in order"
    );
    for f in files.iter().chain([&single_file]) {
        for (idx, o) in f.objects().enumerate() {
            assert_eq!(ns.component_of(&o).unwrap(), Some((f.attr.ino, idx)));
        }
    }
    assert_eq!(ns.component_of(&obj(1, 101)).unwrap(), None, "a pooled object is no component");
    ns.mark_stale(files[1].attr.ino, 1, &[]).unwrap();
    ns.mark_stale(files[3].attr.ino, 0, &[]).unwrap();
    ns.mark_stale(files[3].attr.ino, 1, &[]).unwrap();
    let stale = vec![(files[1].attr.ino, 1), (files[3].attr.ino, 0), (files[3].attr.ino, 1)];
    assert_eq!(ns.stale_components((0, 0), 10).unwrap(), stale);
    assert_eq!(ns.stale_components(stale[0], 10).unwrap(), stale[1..]);
    assert_eq!(ns.stale_components((0, 0), 2).unwrap(), stale[..2]);
    assert_eq!(ns.degraded_files().unwrap(), 2);
    assert!(ns.stale_components((0, 0), usize::MAX).unwrap().len() <= BATCH_MAX);
}

pub(super) fn multi_component_revocation<B: Backend>(ns: &Namespace<B>) {
    mkdir(ns, &ROOT, "/rs", 0o777).unwrap();
    set_layout(ns, &ROOT, "/rs", Some(l("rs:2+1"))).unwrap();
    let f = create_on(ns, &ROOT, "/rs/f", &ALL).unwrap();
    let i = f.attr.ino;
    let every = |acv| f.objects().map(|object| AcvIntent { object, acv }).collect::<Vec<_>>();
    let sorted = |mut v: Vec<AcvIntent>| {
        v.sort_by_key(|x| x.object);
        v
    };
    let (_, intents) = ns.setattr(&ROOT, i, &SetAttrs { mode: Some(0o600), ..SetAttrs::default() }).unwrap();
    assert_eq!(intents, every(1), "a chmod revokes on every component, in component order");
    assert_eq!(ns.acv_intents(10).unwrap(), sorted(every(1)));
    assert_eq!(ns.bump_acv(i).unwrap(), every(2));
    assert_eq!(ns.acv_intents(10).unwrap(), sorted(every(2)), "one intent per object, the newest");
    link(ns, "/rs/f", "/rs/f2").unwrap();
    let fx = unlink(ns, &ROOT, "/rs/f").unwrap();
    assert_eq!(fx, Effects { revoke: every(3), doomed: vec![], collections: vec![] });
    let g = create_on(ns, &ROOT, "/rs/g", &ALL).unwrap();
    link(ns, "/rs/f2", "/rs/f3").unwrap();
    let fx = rename(ns, &ROOT, "/rs/g", "/rs/f3").unwrap();
    assert_eq!(fx, Effects { revoke: every(4), doomed: vec![], collections: vec![] }, "renamed over, a link remains");
    assert_eq!(ns.getattr(i).unwrap().acv, 4);
    let fx = rename(ns, &ROOT, "/rs/f3", "/rs/f2").unwrap();
    assert_eq!(
        fx,
        Effects { revoke: vec![], doomed: f.objects().collect(), collections: vec![] },
        "renamed over, the last link"
    );
    assert!(ns.getattr(g.attr.ino).is_ok());
    assert!(ns.acv_intents(10).unwrap().is_empty(), "doomed objects need no revocation");
}

pub(super) fn multi_component_removal<B: Backend>(ns: &Namespace<B>) {
    mkdir(ns, &ROOT, "/m", 0o777).unwrap();
    set_layout(ns, &ROOT, "/m", Some(l("mirror:2x2"))).unwrap();
    let f = create_on(ns, &ROOT, "/m/f", &ALL).unwrap();
    let i = f.attr.ino;
    let objects: Vec<ObjectRef> = f.objects().collect();
    let txn = ns.begin_write(&ROOT, i, 0).unwrap();
    ns.mark_stale(i, 1, &[r(0, 4096)]).unwrap();
    ns.bump_acv(i).unwrap();
    let fx = unlink(ns, &ROOT, "/m/f").unwrap();
    assert_eq!(
        fx,
        Effects { revoke: vec![], doomed: objects.clone(), collections: vec![] },
        "every component, in order"
    );
    let mut doomed = ns.doomed(10).unwrap();
    doomed.sort();
    let mut want = objects.clone();
    want.sort();
    assert_eq!(doomed, want);
    assert!(ns.acv_intents(10).unwrap().is_empty());
    assert_eq!(ns.intent(txn).unwrap(), None, "the write intent goes with the file");
    assert_eq!(ns.stale_components((0, 0), 10).unwrap(), vec![], "and the stale ranges");
    assert_eq!(ns.degraded_files().unwrap(), 0);
    assert_eq!(ns.getattr(i).err(), Some(FsStatus::NotFound));
    for o in &objects {
        assert!(ns.known_objects(o.drive).unwrap().contains(&o.object), "doomed objects stay known");
        assert_eq!(ns.pool_add(&[*o]).err(), Some(FsStatus::Exists));
        assert_eq!(ns.component_of(o).unwrap(), None);
    }
    ns.forget_doomed(&objects).unwrap();
    assert!(!ns.known_objects(objects[0].drive).unwrap().contains(&objects[0].object));
    assert_eq!(ns.pool_len(1).unwrap(), POOLED as usize - 1);
}

pub(super) fn drive_state_and_epoch<B: Backend>(ns: &Namespace<B>) {
    assert_eq!(ns.map_epoch().unwrap(), 0);
    assert_eq!(ns.bump_map_epoch().unwrap(), 1);
    assert_eq!(ns.map_epoch().unwrap(), 1);
    let rec = |d: u32| ns.drives().unwrap().into_iter().find(|r| r.drive == d).unwrap();
    assert_eq!(ns.set_drive_state(3, DriveState::Out).unwrap(), 2, "a change moves the map on");
    assert_eq!(rec(3).state, DriveState::Out);
    assert_eq!(ns.set_drive_state(3, DriveState::Out).unwrap(), 2, "no change, no new epoch");
    assert_eq!(ns.set_drive_state(3, DriveState::In).unwrap(), 3);
    assert_eq!(ns.set_drive_state(9, DriveState::Out).err(), Some(FsStatus::NotFound));
    ns.set_drive_failure_domain(3, "rack-a").unwrap();
    assert_eq!(rec(3).failure_domain, "rack-a");
    let long = "r".repeat(nasd_proto::limits::NAME_LEN_MAX + 1);
    assert_eq!(ns.set_drive_failure_domain(3, &long).err(), Some(FsStatus::InvalidArgument));
    assert_eq!(ns.set_drive_failure_domain(9, "x").err(), Some(FsStatus::NotFound));
    ns.set_drive_failure_domain(3, "").unwrap();
    assert_eq!(rec(3), drive_rec(3));
    assert_eq!(ns.map_epoch().unwrap(), 3, "failure domains steer placement only");
    let mut out = drive_rec(4);
    out.state = DriveState::Out;
    out.failure_domain = "rack-b".into();
    ns.update_drive(&out).unwrap();
    assert_eq!(rec(4), out, "whole records round-trip");
}
