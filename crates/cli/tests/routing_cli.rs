//! The routing table through the real `nasd` binary on a real cluster
//! (`nasd up`, one manager on SQLite): the manager holds every site; `nasd
//! admin add-manager` gives half of them to a second address, which no
//! manager answers at, and clients still work (requests for its sites go
//! to the manager that answers); `remove-manager` gives them back, and the
//! last manager cannot be removed.

mod common;

use common::up::{fails, nasd_with_config, ok, Up};

#[test]
fn the_routing_table_through_the_cli() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let up = Up::start(cwd, 1, &[]);
    let config = up.data().join("nasd.toml");
    let nasd = |args: &[&str]| nasd_with_config(cwd, &config, args, &[]);

    let shown = ok(nasd(&["admin", "routing"]));
    assert!(shown.starts_with("routing table version 1, mkdir-switching\n"), "{shown}");
    assert!(shown.contains(" 64 sites  0-63"), "one manager holds every site: {shown}");

    // A port nothing listens on: reserved, then released.
    let ghost = format!("127.0.0.1:{}", common::up::free_ports(1));
    let added = ok(nasd(&["admin", "add-manager", &ghost]));
    assert!(added.contains("routing table version 2, 32 of 64 sites moved"), "{added}");
    let shown = ok(nasd(&["admin", "routing"]));
    assert!(shown.contains(&format!("{ghost:<24} 32 sites  32-63")), "{shown}");
    let again = fails(nasd(&["admin", "add-manager", &ghost]));
    assert!(again.contains("in the routing table already"), "{again}");

    // Directories land in both managers' sites; the absent one's go to the manager that answers.
    // (With two managers a new directory leaves the root's site with probability 1/2, to its name's
    // site: these names put some in the absent manager's sites 32-63.)
    let ghostly = (0..12)
        .filter(|i| {
            let name = format!("d{i}");
            let h = nasd_proto::routing::name_hash(1, &name);
            h >> 32 < 1 << 31 && nasd_proto::routing::name_site(1, &name) >= 32
        })
        .count();
    assert!(ghostly > 0, "some directory in the absent manager's sites");
    for i in 0..12 {
        ok(nasd(&["mkdir", &format!("/d{i}")]));
        let file = cwd.join(format!("f{i}"));
        std::fs::write(&file, format!("file {i}")).unwrap();
        ok(nasd(&["put", file.to_str().unwrap(), &format!("/d{i}/f")]));
    }
    for i in 0..12 {
        assert_eq!(ok(nasd(&["cat", &format!("/d{i}/f")])), format!("file {i}"));
    }

    let removed = ok(nasd(&["admin", "remove-manager", &ghost]));
    assert!(removed.contains("routing table version 3, 32 of 64 sites moved"), "{removed}");
    let shown = ok(nasd(&["admin", "routing"]));
    assert!(shown.starts_with("routing table version 3") && shown.contains(" 64 sites  0-63"), "{shown}");
    let last = shown.lines().nth(1).unwrap().split_whitespace().next().unwrap().to_string();
    let refused = fails(nasd(&["admin", "remove-manager", &last]));
    assert!(refused.contains("is the only manager in the routing table"), "{refused}");
    let absent = fails(nasd(&["admin", "remove-manager", &ghost]));
    assert!(absent.contains("is not in the routing table"), "{absent}");
}
