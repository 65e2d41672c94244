//! The NFSv3 (RFC 1813) and MOUNT v3 procedures: arguments decoded,
//! the file system called with the caller and the client's handles,
//! replies encoded. Arguments that do not decode are `GARBAGE_ARGS`
//! (the caller's `Err`); a handle that is empty or over 64 bytes is
//! `NFS3ERR_BADHANDLE` without a file-system call.

use crate::fs::{Caller, CreateHow, FileHandle, NfsFileSystem, Stable};
use crate::nfs::{
    cookieverf3, fattr3, fsinfo3, ftype3, nfs_fh3, nfsstat3, nfstime3, post_op_attr, post_op_fh3, pre_op_attr, sattr3,
    specdata3, wcc_data, FSF_CANSETTIME, FSF_HOMOGENEOUS, FSF_LINK, FSF_SYMLINK,
};
use crate::rpc::{make_success_reply, proc_unavail_reply_message};
use crate::xdr::XDR;
use crate::{IO_BYTES_MAX, NAME_BYTES_MAX, PATH_BYTES_MAX};
use std::io::{Cursor, Write};

type Io = std::io::Result<()>;
type In<'a, 'b> = &'a mut Cursor<&'b [u8]>;

/// Entries one READDIR or READDIRPLUS asks the file system for at most.
pub const READDIR_ENTRIES_MAX: usize = 1024;
/// Bytes of a READDIR/READDIRPLUS reply before its entries (RPC header,
/// status, directory attributes, verifier) and after them (list end, eof).
const READDIR_OVERHEAD_BYTES: usize = 160;

fn decode<T: XDR + Default>(input: In) -> std::io::Result<T> {
    let mut v = T::default();
    v.deserialize(input)?;
    Ok(v)
}

fn invalid(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}

/// A handle argument: `None` (answered `BADHANDLE`) if empty or too long.
fn handle(input: In) -> std::io::Result<Option<FileHandle>> {
    let fh: nfs_fh3 = decode(input)?;
    Ok(FileHandle::new(fh.data))
}

/// A name argument (`filename3`), at most [`NAME_BYTES_MAX`].
fn name(input: In) -> std::io::Result<Vec<u8>> {
    let n: Vec<u8> = decode(input)?;
    if n.len() > NAME_BYTES_MAX {
        return Err(invalid("a name over NAME_BYTES_MAX"));
    }
    Ok(n)
}

fn status(out: &mut Vec<u8>, xid: u32, stat: nfsstat3) -> Io {
    make_success_reply(xid).serialize(out)?;
    stat.serialize(out)
}

fn post(attr: Option<fattr3>) -> post_op_attr {
    attr.map_or(post_op_attr::Void, post_op_attr::attributes)
}

fn wcc(after: Option<fattr3>) -> wcc_data {
    wcc_data { before: pre_op_attr::Void, after: post(after) }
}

fn fh3(fh: &FileHandle) -> nfs_fh3 {
    nfs_fh3 { data: fh.as_bytes().to_vec() }
}

/// Attributes for a post-operation field: `None` when they cannot be had.
async fn attrs(fs: &dyn NfsFileSystem, caller: &Caller, fh: &FileHandle) -> Option<fattr3> {
    fs.getattr(caller, fh).await.ok()
}

/// Runs NFS procedure `proc`.
pub(crate) async fn nfs(
    xid: u32,
    proc: u32,
    caller: &Caller,
    input: In<'_, '_>,
    out: &mut Vec<u8>,
    fs: &dyn NfsFileSystem,
) -> Io {
    match proc {
        0 => make_success_reply(xid).serialize(out),
        1 => getattr(xid, caller, input, out, fs).await,
        2 => setattr(xid, caller, input, out, fs).await,
        3 => lookup(xid, caller, input, out, fs).await,
        4 => access(xid, caller, input, out, fs).await,
        5 => readlink(xid, caller, input, out, fs).await,
        6 => read(xid, caller, input, out, fs).await,
        7 => write(xid, caller, input, out, fs).await,
        8..=11 => make(xid, proc, caller, input, out, fs).await,
        12 | 13 => remove(xid, proc == 13, caller, input, out, fs).await,
        14 => rename(xid, caller, input, out, fs).await,
        15 => link(xid, caller, input, out, fs).await,
        16 | 17 => readdir(xid, proc == 17, caller, input, out, fs).await,
        18..=20 => fsinfo(xid, proc, caller, input, out, fs).await,
        21 => commit(xid, caller, input, out, fs).await,
        _ => proc_unavail_reply_message(xid).serialize(out),
    }
}

async fn getattr(xid: u32, caller: &Caller, input: In<'_, '_>, out: &mut Vec<u8>, fs: &dyn NfsFileSystem) -> Io {
    let Some(fh) = handle(input)? else { return status(out, xid, nfsstat3::NFS3ERR_BADHANDLE) };
    match fs.getattr(caller, &fh).await {
        Ok(a) => {
            status(out, xid, nfsstat3::NFS3_OK)?;
            a.serialize(out)
        }
        Err(e) => status(out, xid, e),
    }
}

async fn setattr(xid: u32, caller: &Caller, input: In<'_, '_>, out: &mut Vec<u8>, fs: &dyn NfsFileSystem) -> Io {
    let fh = handle(input)?;
    let set: sattr3 = decode(input)?;
    let check: bool = decode(input)?;
    let guard = if check { Some(decode::<nfstime3>(input)?) } else { None };
    let Some(fh) = fh else {
        status(out, xid, nfsstat3::NFS3ERR_BADHANDLE)?;
        return wcc(None).serialize(out);
    };
    match fs.setattr(caller, &fh, set, guard).await {
        Ok(a) => {
            status(out, xid, nfsstat3::NFS3_OK)?;
            wcc(Some(a)).serialize(out)
        }
        Err(e) => {
            status(out, xid, e)?;
            wcc(attrs(fs, caller, &fh).await).serialize(out)
        }
    }
}

async fn lookup(xid: u32, caller: &Caller, input: In<'_, '_>, out: &mut Vec<u8>, fs: &dyn NfsFileSystem) -> Io {
    let dir = handle(input)?;
    let n = name(input)?;
    let Some(dir) = dir else {
        status(out, xid, nfsstat3::NFS3ERR_BADHANDLE)?;
        return post_op_attr::Void.serialize(out);
    };
    let found = fs.lookup(caller, &dir, &n).await;
    let dir_attr = post(attrs(fs, caller, &dir).await);
    match found {
        Ok((fh, a)) => {
            status(out, xid, nfsstat3::NFS3_OK)?;
            fh3(&fh).serialize(out)?;
            post_op_attr::attributes(a).serialize(out)?;
            dir_attr.serialize(out)
        }
        Err(e) => {
            status(out, xid, e)?;
            dir_attr.serialize(out)
        }
    }
}

async fn access(xid: u32, caller: &Caller, input: In<'_, '_>, out: &mut Vec<u8>, fs: &dyn NfsFileSystem) -> Io {
    let fh = handle(input)?;
    let mask: u32 = decode(input)?;
    let Some(fh) = fh else {
        status(out, xid, nfsstat3::NFS3ERR_BADHANDLE)?;
        return post_op_attr::Void.serialize(out);
    };
    match fs.access(caller, &fh, mask).await {
        Ok((granted, a)) => {
            status(out, xid, nfsstat3::NFS3_OK)?;
            post_op_attr::attributes(a).serialize(out)?;
            granted.serialize(out)
        }
        Err(e) => {
            status(out, xid, e)?;
            post_op_attr::Void.serialize(out)
        }
    }
}

async fn readlink(xid: u32, caller: &Caller, input: In<'_, '_>, out: &mut Vec<u8>, fs: &dyn NfsFileSystem) -> Io {
    let Some(fh) = handle(input)? else {
        status(out, xid, nfsstat3::NFS3ERR_BADHANDLE)?;
        return post_op_attr::Void.serialize(out);
    };
    match fs.readlink(caller, &fh).await {
        Ok((target, a)) => {
            status(out, xid, nfsstat3::NFS3_OK)?;
            post_op_attr::attributes(a).serialize(out)?;
            target.serialize(out)
        }
        Err(e) => {
            status(out, xid, e)?;
            post_op_attr::Void.serialize(out)
        }
    }
}

async fn read(xid: u32, caller: &Caller, input: In<'_, '_>, out: &mut Vec<u8>, fs: &dyn NfsFileSystem) -> Io {
    let fh = handle(input)?;
    let offset: u64 = decode(input)?;
    let count: u32 = decode(input)?;
    let Some(fh) = fh else {
        status(out, xid, nfsstat3::NFS3ERR_BADHANDLE)?;
        return post_op_attr::Void.serialize(out);
    };
    match fs.read(caller, &fh, offset, count.min(IO_BYTES_MAX)).await {
        Ok((data, eof, a)) => {
            status(out, xid, nfsstat3::NFS3_OK)?;
            post_op_attr::attributes(a).serialize(out)?;
            (data.len() as u32).serialize(out)?;
            eof.serialize(out)?;
            data.serialize(out)
        }
        Err(e) => {
            status(out, xid, e)?;
            post_op_attr::Void.serialize(out)
        }
    }
}

fn stable_of(v: u32) -> std::io::Result<Stable> {
    match v {
        0 => Ok(Stable::Unstable),
        1 => Ok(Stable::DataSync),
        2 => Ok(Stable::FileSync),
        _ => Err(invalid("an unknown stable_how")),
    }
}

fn stable_code(s: Stable) -> u32 {
    match s {
        Stable::Unstable => 0,
        Stable::DataSync => 1,
        Stable::FileSync => 2,
    }
}

async fn write(xid: u32, caller: &Caller, input: In<'_, '_>, out: &mut Vec<u8>, fs: &dyn NfsFileSystem) -> Io {
    let fh = handle(input)?;
    let offset: u64 = decode(input)?;
    let count: u32 = decode(input)?;
    let stable = stable_of(decode(input)?)?;
    let data: Vec<u8> = decode(input)?;
    if count as usize != data.len() {
        return Err(invalid("a WRITE whose count is not its data's length"));
    }
    let Some(fh) = fh else {
        status(out, xid, nfsstat3::NFS3ERR_BADHANDLE)?;
        return wcc(None).serialize(out);
    };
    match fs.write(caller, &fh, offset, &data, stable).await {
        Ok((kept, a)) => {
            status(out, xid, nfsstat3::NFS3_OK)?;
            wcc(Some(a)).serialize(out)?;
            count.serialize(out)?;
            stable_code(kept).serialize(out)?;
            fs.write_verifier().serialize(out)
        }
        Err(e) => {
            status(out, xid, e)?;
            wcc(None).serialize(out)
        }
    }
}

/// CREATE (8), MKDIR (9), SYMLINK (10), MKNOD (11).
async fn make(
    xid: u32,
    proc: u32,
    caller: &Caller,
    input: In<'_, '_>,
    out: &mut Vec<u8>,
    fs: &dyn NfsFileSystem,
) -> Io {
    let dir = handle(input)?;
    let n = name(input)?;
    enum What {
        File(CreateHow),
        Dir(sattr3),
        Symlink(sattr3, Vec<u8>),
        Special(ftype3, sattr3, (u32, u32)),
        BadType,
    }
    let what = match proc {
        8 => What::File(match decode::<u32>(input)? {
            0 => CreateHow::Unchecked(decode(input)?),
            1 => CreateHow::Guarded(decode(input)?),
            2 => CreateHow::Exclusive(decode(input)?),
            _ => return Err(invalid("an unknown createmode3")),
        }),
        9 => What::Dir(decode(input)?),
        11 => match decode::<ftype3>(input)? {
            kind @ (ftype3::NF3CHR | ftype3::NF3BLK) => {
                let set = decode(input)?;
                let spec: specdata3 = decode(input)?;
                What::Special(kind, set, (spec.specdata1, spec.specdata2))
            }
            kind @ (ftype3::NF3SOCK | ftype3::NF3FIFO) => What::Special(kind, decode(input)?, (0, 0)),
            _ => What::BadType,
        },
        _ => {
            let set = decode(input)?;
            let target: Vec<u8> = decode(input)?;
            if target.len() > PATH_BYTES_MAX {
                return Err(invalid("a symbolic link target over PATH_BYTES_MAX"));
            }
            What::Symlink(set, target)
        }
    };
    let Some(dir) = dir else {
        status(out, xid, nfsstat3::NFS3ERR_BADHANDLE)?;
        return wcc(None).serialize(out);
    };
    let made = match what {
        What::File(how) => fs.create(caller, &dir, &n, how).await,
        What::Dir(set) => fs.mkdir(caller, &dir, &n, set).await,
        What::Symlink(set, target) => fs.symlink(caller, &dir, &n, &target, set).await,
        What::Special(kind, set, rdev) => fs.mknod(caller, &dir, &n, kind, set, rdev).await,
        What::BadType => Err(nfsstat3::NFS3ERR_BADTYPE),
    };
    let dir_wcc = wcc(attrs(fs, caller, &dir).await);
    match made {
        Ok((fh, a)) => {
            status(out, xid, nfsstat3::NFS3_OK)?;
            post_op_fh3::handle(fh3(&fh)).serialize(out)?;
            post_op_attr::attributes(a).serialize(out)?;
            dir_wcc.serialize(out)
        }
        Err(e) => {
            status(out, xid, e)?;
            dir_wcc.serialize(out)
        }
    }
}

async fn remove(
    xid: u32,
    dir_only: bool,
    caller: &Caller,
    input: In<'_, '_>,
    out: &mut Vec<u8>,
    fs: &dyn NfsFileSystem,
) -> Io {
    let dir = handle(input)?;
    let n = name(input)?;
    let Some(dir) = dir else {
        status(out, xid, nfsstat3::NFS3ERR_BADHANDLE)?;
        return wcc(None).serialize(out);
    };
    let r = if dir_only { fs.rmdir(caller, &dir, &n).await } else { fs.remove(caller, &dir, &n).await };
    status(out, xid, r.err().unwrap_or(nfsstat3::NFS3_OK))?;
    wcc(attrs(fs, caller, &dir).await).serialize(out)
}

async fn rename(xid: u32, caller: &Caller, input: In<'_, '_>, out: &mut Vec<u8>, fs: &dyn NfsFileSystem) -> Io {
    let from = handle(input)?;
    let from_name = name(input)?;
    let to = handle(input)?;
    let to_name = name(input)?;
    let (Some(from), Some(to)) = (from, to) else {
        status(out, xid, nfsstat3::NFS3ERR_BADHANDLE)?;
        wcc(None).serialize(out)?;
        return wcc(None).serialize(out);
    };
    let r = fs.rename(caller, (&from, &from_name), (&to, &to_name)).await;
    status(out, xid, r.err().unwrap_or(nfsstat3::NFS3_OK))?;
    wcc(attrs(fs, caller, &from).await).serialize(out)?;
    wcc(attrs(fs, caller, &to).await).serialize(out)
}

async fn link(xid: u32, caller: &Caller, input: In<'_, '_>, out: &mut Vec<u8>, fs: &dyn NfsFileSystem) -> Io {
    let file = handle(input)?;
    let dir = handle(input)?;
    let n = name(input)?;
    let (Some(file), Some(dir)) = (file, dir) else {
        status(out, xid, nfsstat3::NFS3ERR_BADHANDLE)?;
        post_op_attr::Void.serialize(out)?;
        return wcc(None).serialize(out);
    };
    let r = fs.link(caller, &file, &dir, &n).await;
    let dir_wcc = wcc(attrs(fs, caller, &dir).await);
    match r {
        Ok(a) => {
            status(out, xid, nfsstat3::NFS3_OK)?;
            post_op_attr::attributes(a).serialize(out)?;
            dir_wcc.serialize(out)
        }
        Err(e) => {
            status(out, xid, e)?;
            post(attrs(fs, caller, &file).await).serialize(out)?;
            dir_wcc.serialize(out)
        }
    }
}

/// Bytes one READDIR entry takes in the reply (and counts against
/// `dircount`): follows-flag, fileid, name with padding, cookie.
fn entry_bytes(name: &[u8]) -> usize {
    4 + 8 + 4 + name.len().div_ceil(4) * 4 + 8
}

async fn readdir(
    xid: u32,
    plus: bool,
    caller: &Caller,
    input: In<'_, '_>,
    out: &mut Vec<u8>,
    fs: &dyn NfsFileSystem,
) -> Io {
    let dir = handle(input)?;
    let cookie: u64 = decode(input)?;
    let verifier: cookieverf3 = decode(input)?;
    let dircount: u32 = decode(input)?;
    let maxcount: u32 = if plus { decode(input)? } else { dircount };
    let Some(dir) = dir else {
        status(out, xid, nfsstat3::NFS3ERR_BADHANDLE)?;
        return post_op_attr::Void.serialize(out);
    };
    let budget = (maxcount.min(IO_BYTES_MAX) as usize).saturating_sub(READDIR_OVERHEAD_BYTES);
    let names_budget = dircount as usize;
    let max_entries = (names_budget / 24).clamp(1, READDIR_ENTRIES_MAX);
    let page = fs.readdir(caller, &dir, cookie, verifier, max_entries, plus).await;
    let dir_attr = post(attrs(fs, caller, &dir).await);
    let page = match page {
        Ok(p) => p,
        Err(e) => {
            status(out, xid, e)?;
            return dir_attr.serialize(out);
        }
    };
    status(out, xid, nfsstat3::NFS3_OK)?;
    dir_attr.serialize(out)?;
    page.verifier.serialize(out)?;
    let (mut used, mut names_used, mut all) = (0usize, 0usize, true);
    for e in &page.entries {
        let mut one = Vec::new();
        true.serialize(&mut one)?;
        e.fileid.serialize(&mut one)?;
        e.name.serialize(&mut one)?;
        e.cookie.serialize(&mut one)?;
        if plus {
            match &e.plus {
                Some((fh, a)) => {
                    post_op_attr::attributes(*a).serialize(&mut one)?;
                    post_op_fh3::handle(fh3(fh)).serialize(&mut one)?;
                }
                None => {
                    post_op_attr::Void.serialize(&mut one)?;
                    post_op_fh3::Void.serialize(&mut one)?;
                }
            }
        }
        let names = entry_bytes(&e.name);
        if used + one.len() > budget || (plus && names_used + names > names_budget) {
            all = false;
            break;
        }
        used += one.len();
        names_used += names;
        out.write_all(&one)?;
    }
    if !all && used == 0 && !page.entries.is_empty() {
        // Not even one entry fits: the client's buffer is too small.
        out.clear();
        status(out, xid, nfsstat3::NFS3ERR_TOOSMALL)?;
        return dir_attr.serialize(out);
    }
    false.serialize(out)?;
    (all && page.eof).serialize(out)
}

/// FSSTAT (18), FSINFO (19), PATHCONF (20).
async fn fsinfo(
    xid: u32,
    proc: u32,
    caller: &Caller,
    input: In<'_, '_>,
    out: &mut Vec<u8>,
    fs: &dyn NfsFileSystem,
) -> Io {
    let Some(fh) = handle(input)? else {
        status(out, xid, nfsstat3::NFS3ERR_BADHANDLE)?;
        return post_op_attr::Void.serialize(out);
    };
    if proc == 18 {
        return match fs.fsstat(caller, &fh).await {
            Ok((s, a)) => {
                status(out, xid, nfsstat3::NFS3_OK)?;
                post_op_attr::attributes(a).serialize(out)?;
                for v in [s.total_bytes, s.free_bytes, s.avail_bytes, s.total_files, s.free_files, s.avail_files] {
                    v.serialize(out)?;
                }
                0u32.serialize(out)
            }
            Err(e) => {
                status(out, xid, e)?;
                post_op_attr::Void.serialize(out)
            }
        };
    }
    let a = match fs.getattr(caller, &fh).await {
        Ok(a) => a,
        Err(e) => {
            status(out, xid, e)?;
            return post_op_attr::Void.serialize(out);
        }
    };
    status(out, xid, nfsstat3::NFS3_OK)?;
    if proc == 19 {
        let info = fsinfo3 {
            obj_attributes: post_op_attr::attributes(a),
            rtmax: IO_BYTES_MAX,
            rtpref: IO_BYTES_MAX,
            rtmult: 4096,
            wtmax: IO_BYTES_MAX,
            wtpref: IO_BYTES_MAX,
            wtmult: 4096,
            dtpref: 64 * 1024,
            maxfilesize: 1 << 48,
            time_delta: nfstime3 { seconds: 0, nseconds: 1 },
            properties: FSF_LINK | FSF_SYMLINK | FSF_HOMOGENEOUS | FSF_CANSETTIME,
        };
        return info.serialize(out);
    }
    post_op_attr::attributes(a).serialize(out)?;
    u32::MAX.serialize(out)?; // linkmax
    (NAME_BYTES_MAX as u32).serialize(out)?; // name_max
    true.serialize(out)?; // no_trunc: longer names are refused
    true.serialize(out)?; // chown_restricted
    false.serialize(out)?; // case_insensitive
    true.serialize(out) // case_preserving
}

async fn commit(xid: u32, caller: &Caller, input: In<'_, '_>, out: &mut Vec<u8>, fs: &dyn NfsFileSystem) -> Io {
    let fh = handle(input)?;
    let offset: u64 = decode(input)?;
    let count: u32 = decode(input)?;
    let Some(fh) = fh else {
        status(out, xid, nfsstat3::NFS3ERR_BADHANDLE)?;
        return wcc(None).serialize(out);
    };
    match fs.commit(caller, &fh, offset, count).await {
        Ok(a) => {
            status(out, xid, nfsstat3::NFS3_OK)?;
            wcc(Some(a)).serialize(out)?;
            fs.write_verifier().serialize(out)
        }
        Err(e) => {
            status(out, xid, e)?;
            wcc(None).serialize(out)
        }
    }
}

/// Runs MOUNT procedure `proc`.
pub(crate) async fn mount(
    xid: u32,
    proc: u32,
    caller: &Caller,
    input: In<'_, '_>,
    out: &mut Vec<u8>,
    fs: &dyn NfsFileSystem,
) -> Io {
    match proc {
        // NULL, UMNT, UMNTALL: nothing is recorded per client.
        0 | 3 | 4 => make_success_reply(xid).serialize(out),
        1 => {
            let path: Vec<u8> = decode(input)?;
            if path.len() > crate::mount::MNTPATHLEN as usize {
                return Err(invalid("a mount path over MNTPATHLEN"));
            }
            make_success_reply(xid).serialize(out)?;
            match fs.mount(caller, &path).await {
                Ok(fh) => {
                    0u32.serialize(out)?;
                    fh.as_bytes().to_vec().serialize(out)?;
                    // AUTH_SYS only.
                    vec![1u32].serialize(out)
                }
                Err(e) => mount_status(e).serialize(out),
            }
        }
        // DUMP: no mount list is kept.
        2 => {
            make_success_reply(xid).serialize(out)?;
            false.serialize(out)
        }
        5 => {
            make_success_reply(xid).serialize(out)?;
            for path in fs.exports() {
                true.serialize(out)?;
                path.serialize(out)?;
                false.serialize(out)?; // no group list
            }
            false.serialize(out)
        }
        _ => proc_unavail_reply_message(xid).serialize(out),
    }
}

/// The MOUNT status for a file-system refusal (MOUNT's codes are NFS's numbers).
fn mount_status(e: nfsstat3) -> u32 {
    use nfsstat3::*;
    match e {
        NFS3ERR_PERM | NFS3ERR_NOENT | NFS3ERR_IO | NFS3ERR_ACCES | NFS3ERR_NOTDIR | NFS3ERR_INVAL
        | NFS3ERR_NAMETOOLONG | NFS3ERR_NOTSUPP | NFS3ERR_SERVERFAULT => e as u32,
        _ => NFS3ERR_ACCES as u32,
    }
}
