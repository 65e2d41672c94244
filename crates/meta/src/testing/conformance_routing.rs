//! Conformance cases of routing by request class: the site every new
//! inode records, and the routing table's compare-and-set versions.

use super::conformance::{create, mkdir, symlink, ROOT};
use crate::backend::Backend;
use crate::Namespace;
use nasd_proto::fs::*;
use nasd_proto::routing::{name_hash, name_site, RoutingPolicy, RoutingTable};

/// The table is stored once, then only as the next version.
pub(super) fn routing_table<B: Backend>(ns: &Namespace<B>) {
    assert_eq!(ns.routing().unwrap(), None, "a new store has no table");
    let first = RoutingTable::single("m1:7000", RoutingPolicy::MkdirSwitching);
    assert_eq!(ns.init_routing(&first).unwrap(), first);
    let other = RoutingTable::single("m9:7000", RoutingPolicy::NameHashing);
    assert_eq!(ns.init_routing(&other).unwrap(), first, "the first table stays");
    assert_eq!(ns.set_routing(&other), Err(FsStatus::StaleRouting), "version 1 again");
    let second = first.with_manager("m2:7000").unwrap();
    let third = second.with_manager("m3:7000").unwrap();
    assert_eq!(ns.set_routing(&third), Err(FsStatus::StaleRouting), "a version skipped");
    assert_eq!(ns.set_routing(&second).unwrap(), second);
    assert_eq!(ns.set_routing(&second), Err(FsStatus::StaleRouting), "the same version twice");
    assert_eq!(ns.routing().unwrap(), Some(second.clone()));
    let mut broken = third.clone();
    broken.sites[0] = 9;
    assert_eq!(ns.set_routing(&broken), Err(FsStatus::InvalidArgument));
    assert_eq!(ns.set_routing(&third).unwrap(), third);
    assert_eq!(ns.routing().unwrap(), Some(third));
}

/// Sites follow the policy, are stored with the inode, and come back.
pub(super) fn routing_sites<B: Backend>(ns: &Namespace<B>) {
    assert_eq!(ns.getattr(ROOT_INO).unwrap().site, 0, "the root is in site 0");
    let plain = mkdir(ns, &ROOT, "/plain", 0o755).unwrap();
    assert_eq!(plain.site, 0, "no policy set: every inode in site 0");

    // Mkdir switching, always redirecting: a directory takes name_site, what is in it its site.
    ns.set_site_policy(RoutingPolicy::MkdirSwitching, 1.0);
    let a = mkdir(ns, &ROOT, "/a", 0o755).unwrap();
    assert_eq!(a.site, name_site(ROOT_INO, "a"));
    let f = create(ns, &ROOT, "/a/f", 0o644).unwrap();
    let l = symlink(ns, "/a/l", "f").unwrap();
    assert_eq!((f.site, l.site), (a.site, a.site), "files take their directory's site");
    assert_eq!(ns.getattr(a.attr.ino).unwrap().site, a.site, "stored");
    assert_eq!(ns.lookup(&ROOT, a.attr.ino, "f").unwrap().site, a.site);

    // Never redirecting: directories keep their parent's site.
    ns.set_site_policy(RoutingPolicy::MkdirSwitching, 0.0);
    assert_eq!(mkdir(ns, &ROOT, "/a/b", 0o755).unwrap().site, a.site);

    // Half of the time: exactly the names whose hash's top half is below 2^31 move.
    ns.set_site_policy(RoutingPolicy::MkdirSwitching, 0.5);
    let mut moved = 0;
    for i in 0..64 {
        let name = format!("d{i}");
        let d = ns.mkdir(&ROOT, a.attr.ino, &name, 0o755).unwrap();
        let redirect = name_hash(a.attr.ino, &name) >> 32 < 1 << 31;
        let want = if redirect { name_site(a.attr.ino, &name) } else { a.site };
        assert_eq!(d.site, want, "{name}");
        moved += usize::from(redirect);
    }
    assert!(moved > 16 && moved < 48, "about half redirect: {moved}");

    // Name hashing: every inode takes the site of its (parent, name).
    ns.set_site_policy(RoutingPolicy::NameHashing, 0.0);
    let h = mkdir(ns, &ROOT, "/a/h", 0o755).unwrap();
    assert_eq!(h.site, name_site(a.attr.ino, "h"));
    let g = create(ns, &ROOT, "/a/h/g", 0o644).unwrap();
    assert_eq!(g.site, name_site(h.attr.ino, "g"));
    assert_eq!(ns.getattr(g.attr.ino).unwrap().site, g.site);
    ns.set_site_policy(RoutingPolicy::MkdirSwitching, 0.0);
}
