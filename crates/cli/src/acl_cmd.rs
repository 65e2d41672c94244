//! `nasd acl`: show and change files' and directories' global ACLs.

use crate::fs_cmd::Login;
use anyhow::Context;
use clap::Subcommand;
use nasd_fs::{
    AclEntry, AclInfo, AclWho, FsClient, ACL_EXECUTE, ACL_INHERIT, ACL_READ, ACL_SET_ACL, ACL_SHARED, ACL_WRITE,
};

/// How an entry is written on the command line.
const ENTRY_SYNTAX: &str = "user:UID:RIGHTS[:FLAG...], group:GID:RIGHTS[:FLAG...] or role:ROLE:RIGHTS[:FLAG...] \
                            (u:, g: and r: for short; ROLE a role id other than 0), \
                            RIGHTS a non-empty set of r (read), w (write), x (execute / search), \
                            c (change the ACL), FLAG inherit or shared (directories only), \
                            e.g. user:1001:rx, g:7:rwx:inherit or role:3:r:shared";

#[derive(Subcommand)]
pub enum AclCommand {
    /// Show an ACL: the owner, group and other entries (the mode bits) and
    /// the named entries.
    ///
    /// A caller holds a right if its class in the mode bits gives it or a
    /// named entry for its uid, one of its groups or the role it logged in
    /// with (at the authentication server) does: entries only add.
    /// Entries marked `inherit` (directories only) are copied onto each
    /// file and directory made in the directory afterwards; entries marked
    /// `shared` (directories only) hold live for every file made in it.
    Get {
        /// A file or directory in nasd.
        path: String,
        #[command(flatten)]
        login: Login,
    },
    /// Replace all named entries (none given: remove them all). The owner,
    /// an administrator, or a holder of the `c` right.
    ///
    /// ENTRY is user:UID:RIGHTS[:FLAG...], group:GID:RIGHTS[:FLAG...] or
    /// role:ROLE:RIGHTS[:FLAG...] (u:, g: and r: for short; ROLE a numeric
    /// role id of the authentication server, not 0). On a partition that
    /// takes PALs, the owner, user and role entries are what drives check
    /// by identity; group entries go through capabilities. RIGHTS is a set
    /// of r (read), w (write), x (execute / search) and c (change the ACL).
    /// FLAG, on a directory's entry: `inherit` copies the entry onto what is
    /// created in the directory from then on; `shared` grants it live to
    /// every regular file created in the directory, so changing or removing
    /// it later reaches all of them at once (on drives, one super PAL per
    /// drive rather than one PAL per file); both together also make new
    /// subdirectories share it with their own files.
    Set {
        /// A file or directory in nasd.
        path: String,
        /// The entries (at most 32).
        entries: Vec<String>,
        #[command(flatten)]
        login: Login,
    },
    /// Add named entries, or replace the rights of principals already named.
    ///
    /// ENTRY as for `nasd acl set`, e.g. `nasd acl add /docs/plan user:1001:r`.
    Add {
        /// A file or directory in nasd.
        path: String,
        /// The entries.
        #[arg(required = true)]
        entries: Vec<String>,
        #[command(flatten)]
        login: Login,
    },
    /// Remove the named entries of principals: user:UID, group:GID or role:ROLE.
    Remove {
        /// A file or directory in nasd.
        path: String,
        /// The principals.
        #[arg(required = true)]
        principals: Vec<String>,
        #[command(flatten)]
        login: Login,
    },
}

impl AclCommand {
    /// How this command logs in.
    pub fn login(&self) -> &Login {
        match self {
            AclCommand::Get { login, .. }
            | AclCommand::Set { login, .. }
            | AclCommand::Add { login, .. }
            | AclCommand::Remove { login, .. } => login,
        }
    }
}

/// `nasd acl`. `add` and `remove` read the ACL and write it back whole:
/// a change another client makes in between is overwritten.
pub async fn run(fs: &FsClient, cmd: AclCommand) -> anyhow::Result<()> {
    match cmd {
        AclCommand::Get { path, .. } => {
            let info = fs.get_acl(&path).await.with_context(|| format!("acl get {path}"))?;
            print!("{}", show(&path, &info));
        }
        AclCommand::Set { path, entries, .. } => {
            let entries = entries.iter().map(|e| parse_entry(e)).collect::<anyhow::Result<Vec<_>>>()?;
            fs.set_acl(&path, entries).await.with_context(|| format!("acl set {path}"))?;
        }
        AclCommand::Add { path, entries, .. } => {
            let add = entries.iter().map(|e| parse_entry(e)).collect::<anyhow::Result<Vec<_>>>()?;
            let mut now = fs.get_acl(&path).await.with_context(|| format!("acl add {path}"))?.entries;
            for e in add {
                now.retain(|o| o.who != e.who);
                now.push(e);
            }
            fs.set_acl(&path, now).await.with_context(|| format!("acl add {path}"))?;
        }
        AclCommand::Remove { path, principals, .. } => {
            let gone = principals.iter().map(|p| parse_who(p)).collect::<anyhow::Result<Vec<_>>>()?;
            let now = fs.get_acl(&path).await.with_context(|| format!("acl remove {path}"))?.entries;
            if let Some(missing) = gone.iter().find(|w| !now.iter().any(|e| e.who == **w)) {
                anyhow::bail!("acl remove {path}: no entry for {}", who_text(*missing));
            }
            let kept = now.into_iter().filter(|e| !gone.contains(&e.who)).collect();
            fs.set_acl(&path, kept).await.with_context(|| format!("acl remove {path}"))?;
        }
    }
    Ok(())
}

/// `getfacl`-like text.
fn show(path: &str, info: &AclInfo) -> String {
    let triple = |shift: u32| {
        let bits = ((info.mode >> shift) & 0o7) as u8;
        rights_text(bits)
    };
    let mut out = format!("# file: {path}\n# owner: {}\n# group: {}\n", info.uid, info.gid);
    out += &format!("user::{}\ngroup::{}\nother::{}\n", triple(6), triple(3), triple(0));
    for e in &info.entries {
        let shared = if e.flags & ACL_SHARED != 0 { ":shared" } else { "" };
        let inherit = if e.flags & ACL_INHERIT != 0 { ":inherit" } else { "" };
        out += &format!("{}:{}{shared}{inherit}\n", who_text(e.who), rights_text(e.rights));
    }
    out
}

fn who_text(who: AclWho) -> String {
    match who {
        AclWho::User(uid) => format!("user:{uid}"),
        AclWho::Group(gid) => format!("group:{gid}"),
        AclWho::Role(role) => format!("role:{role}"),
    }
}

/// `rwxc` with `-` for what is not granted (`c` only when granted).
fn rights_text(rights: u8) -> String {
    let bit = |b: u8, c: char| if rights & b != 0 { c } else { '-' };
    let mut s: String = [bit(ACL_READ, 'r'), bit(ACL_WRITE, 'w'), bit(ACL_EXECUTE, 'x')].into_iter().collect();
    if rights & ACL_SET_ACL != 0 {
        s.push('c');
    }
    s
}

fn parse_who(text: &str) -> anyhow::Result<AclWho> {
    let expected = || format!("{text:?}: expected user:UID, group:GID or role:ROLE");
    let (kind, id) = text.split_once(':').with_context(expected)?;
    let id: u32 = id.parse().with_context(|| format!("{text:?}: {id:?} is not a numeric id"))?;
    match kind {
        "user" | "u" => Ok(AclWho::User(id)),
        "group" | "g" => Ok(AclWho::Group(id)),
        "role" | "r" if id != 0 => Ok(AclWho::Role(id)),
        "role" | "r" => anyhow::bail!("{text:?}: role 0 is no role"),
        _ => anyhow::bail!("{}", expected()),
    }
}

fn parse_entry(text: &str) -> anyhow::Result<AclEntry> {
    let bad = || anyhow::anyhow!("{text:?}: an ACL entry is {ENTRY_SYNTAX}");
    let parts: Vec<&str> = text.split(':').collect();
    let [kind, id, rights, flag_texts @ ..] = parts.as_slice() else {
        return Err(bad());
    };
    let (who, rights) = (format!("{kind}:{id}"), *rights);
    let mut flags = 0u8;
    for f in flag_texts {
        let flag = match *f {
            "inherit" => ACL_INHERIT,
            "shared" => ACL_SHARED,
            _ => return Err(bad()),
        };
        if flags & flag != 0 {
            return Err(bad());
        }
        flags |= flag;
    }
    let who = parse_who(&who).map_err(|_| bad())?;
    let mut bits = 0u8;
    for c in rights.chars() {
        bits |= match c {
            'r' => ACL_READ,
            'w' => ACL_WRITE,
            'x' => ACL_EXECUTE,
            'c' => ACL_SET_ACL,
            '-' => 0,
            _ => return Err(bad()),
        };
    }
    if bits == 0 {
        return Err(bad());
    }
    Ok(AclEntry { who, rights: bits, flags })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_parse_and_print() {
        let e = parse_entry("r:3:r:shared:inherit").unwrap();
        assert_eq!(e, AclEntry { who: AclWho::Role(3), rights: ACL_READ, flags: ACL_SHARED | ACL_INHERIT });
        assert_eq!(parse_entry("u:5:w:shared").unwrap().flags, ACL_SHARED);
        assert!(parse_entry("u:5:w:shared:shared").is_err(), "a flag twice");
        assert!(parse_entry("u:5:w:sharing").is_err());
        let info = AclInfo { uid: 1, gid: 1, mode: 0o750, entries: vec![e] };
        assert!(show("/d", &info).contains("role:3:r--:shared:inherit\n"));
        let e = parse_entry("g:7:r-x:inherit").unwrap();
        assert_eq!(e, AclEntry { who: AclWho::Group(7), rights: ACL_READ | ACL_EXECUTE, flags: ACL_INHERIT });
        assert_eq!(parse_entry("user:1001:rc").unwrap().rights, ACL_READ | ACL_SET_ACL);
        assert_eq!(
            parse_entry("role:7:rw").unwrap(),
            AclEntry { who: AclWho::Role(7), rights: ACL_READ | ACL_WRITE, flags: 0 }
        );
        assert_eq!(parse_who("r:9").unwrap(), AclWho::Role(9));
        assert_eq!(who_text(AclWho::Role(9)), "role:9");
        for bad in ["user:1001", "user:bob:r", "user:1:", "user:1:q", "other:1:r", "user:1:r:sticky", "role:0:r"] {
            assert!(parse_entry(bad).is_err(), "{bad}");
        }
        let info = AclInfo { uid: 1000, gid: 100, mode: 0o640, entries: vec![e] };
        assert_eq!(
            show("/d", &info),
            "# file: /d\n# owner: 1000\n# group: 100\nuser::rw-\ngroup::r--\nother::---\ngroup:7:r-x:inherit\n"
        );
    }
}
