//! Fuzzes the manager-protocol decoders a manager and its clients run on
//! bytes from a peer: no panic, and whatever decodes re-encodes to exactly the
//! bytes it came from. Requests name inodes by file handle (`Handle`: inode
//! number and MAC); the handles a request names are listed without panic (the
//! manager checks them before anything else); an entry's handle always names
//! the entry's own inode; a `READDIR` reply is full entries or names only.
//!
//! Run: `cd fuzz && cargo +nightly fuzz run manager_decode -- -max_total_time=120`
#![no_main]

use libfuzzer_sys::fuzz_target;
use nasd_proto::manager::{Entry, ManagerReply, ManagerRequest};

fn check_entry(e: &Entry) {
    assert_eq!(e.handle.ino, e.attr.ino, "an entry decoded with another inode's handle");
}

fuzz_target!(|body: &[u8]| {
    if let Ok((id, req)) = ManagerRequest::decode(body) {
        assert_eq!(req.encode(id), body, "request re-encodes differently");
        let _ = req.handles();
    }
    if let Ok((id, reply)) = ManagerReply::decode(body) {
        match &reply {
            Ok(ManagerReply::Entry(e)) => check_entry(e),
            Ok(ManagerReply::Dir { entries, .. }) => entries.iter().for_each(|(_, e)| check_entry(e)),
            _ => {}
        }
        let again = match &reply {
            Ok(r) => r.encode(id),
            Err((status, message)) => ManagerReply::encode_error(id, *status, message),
        };
        assert_eq!(again, body, "reply re-encodes differently");
    }
});
