//! Fuzzes the manager-protocol decoders a manager and its clients run on
//! bytes from a peer: no panic, and whatever decodes re-encodes to exactly the
//! bytes it came from. Requests name inodes by file handle (`Handle`: inode
//! number, routing site and MAC); the handles a request names are listed
//! without panic (the manager checks them before anything else). Covers the
//! ACL lists of `SET_ACL` and the `Acl` reply (`ACL_ENTRIES_MAX`, canonical
//! order), and routing tables (`SET_ROUTING`, the `Routing` reply, and the
//! table as the metadata store keeps it): whatever decodes is valid, so it
//! re-encodes, and adding or removing a manager keeps it valid.
//!
//! Run: `cd fuzz && cargo +nightly fuzz run manager_decode -- -max_total_time=120`
#![no_main]

use libfuzzer_sys::fuzz_target;
use nasd_proto::manager::{ManagerReply, ManagerRequest};
use nasd_proto::routing::RoutingTable;

fuzz_target!(|body: &[u8]| {
    if let Ok(table) = RoutingTable::from_bytes(body) {
        assert_eq!(table.to_bytes(), body, "routing table re-encodes differently");
        if let Ok(grown) = table.with_manager("fuzz:1") {
            assert!(grown.validate().is_ok(), "adding a manager broke the table");
        }
        if let Ok(shrunk) = table.without_manager(&table.managers[0]) {
            assert!(shrunk.validate().is_ok(), "removing a manager broke the table");
        }
    }
    if let Ok((id, req)) = ManagerRequest::decode(body) {
        assert_eq!(req.encode(id), body, "request re-encodes differently");
        let _ = req.handles();
    }
    // The TRACED envelope (manager protocol version 3), as the manager reads every request.
    if let Ok((id, trace, req)) = ManagerRequest::decode_traced(body) {
        let again = match &trace {
            Some(t) => req.encode_traced(id, t),
            None => req.encode(id),
        };
        assert_eq!(again, body, "traced request re-encodes differently");
    }
    if let Ok((id, reply)) = ManagerReply::decode(body) {
        let again = match &reply {
            Ok(r) => r.encode(id),
            Err((status, message)) => ManagerReply::encode_error(id, *status, message),
        };
        assert_eq!(again, body, "reply re-encodes differently");
    }
});
