//! Tests of the wire format: known-answer vectors (the same hex is published in
//! docs/PROTOCOL.md), round-trip and canonicality properties, and one test per
//! rejection rule.
//!
//! The vectors are literals on purpose: any change to an encoding fails
//! `known_answer_vectors`. After an intentional, versioned format change, run
//! `cargo test -p nasd-proto print_vectors -- --ignored --nocapture` and update
//! both this file and docs/PROTOCOL.md.

use crate::codec::Writer;
use crate::limits::*;
use crate::*;
use proptest::prelude::*;
use proptest::strategy::{BoxedStrategy, Union};

const ZERO_DIGEST: [u8; DIGEST_LEN] = [0; DIGEST_LEN];

/// Every opcode `Request::decode` knows, plus the three reserved for key
/// management (which it must refuse).
const OPCODES: &[u16] = &[
    opcode::HELLO,
    opcode::CREATE,
    opcode::REMOVE,
    opcode::GETATTR,
    opcode::SETATTR,
    opcode::READ,
    opcode::WRITE,
    opcode::FASTCOPY,
    opcode::FLUSH,
    opcode::BLOCKS_REQUIRED,
    opcode::CREATE_PARTITION,
    opcode::REMOVE_PARTITION,
    opcode::RESIZE_PARTITION,
    opcode::FLUSH_PARTITION,
    opcode::SET_PARTITION_KEY,
    opcode::SET_WORKING_KEY,
    opcode::INITIALIZE,
    opcode::SET_DRIVE_KEY,
    opcode::INQUIRY,
    opcode::SET_MIN_PROTECTION,
    opcode::READ_AUDIT,
    opcode::SCRUB,
    opcode::TXN_BEGIN,
    opcode::TXN_END,
    opcode::TXN_LIST,
    opcode::SET_MAP_EPOCH,
    opcode::SET_PAL,
    opcode::GET_PAL,
    opcode::SET_AUTH_SCHEME,
    opcode::GET_AUTH_SCHEME,
    opcode::SET_SUPER_PAL,
    opcode::GET_SUPER_PAL,
    opcode::SET_IDENTITY_KEY,
    opcode::RETIRE_IDENTITY_KEY,
    opcode::EXTENTS,
    opcode::DIGESTS,
    opcode::EXTENSION,
];

// ---------------------------------------------------------------------------
// The single check helper: a decode result must be exactly this error, and the
// error must map to exactly this reply status.
// ---------------------------------------------------------------------------

#[track_caller]
fn check<T: std::fmt::Debug>(case: &str, got: Result<T, DecodeError>, want: DecodeError, status: Status) {
    match got {
        Ok(v) => panic!("{case}: decoded to {v:?}, expected {want:?}"),
        Err(e) => {
            assert_eq!(e, want, "{case}: wrong error");
            assert_eq!(e.status(), status, "{case}: wrong status for {e:?}");
        }
    }
}

fn over(field: &'static str, len: u64, max: u64) -> DecodeError {
    DecodeError::OverLimit { field, len, max }
}

// ---------------------------------------------------------------------------
// Known-answer vectors.
// ---------------------------------------------------------------------------

/// What a frame carries after its header.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Body {
    Request(Request),
    Reply(Reply),
    /// A failed reply: its status and message.
    Error(Status, String),
}

struct Vector {
    name: &'static str,
    /// The header; `capability_len`, `args_len` and (for errors) `status` are
    /// filled in when encoding.
    header: FrameHeader,
    body: Body,
    data: Vec<u8>,
    hex: &'static str,
}

fn request_header(op: u16, request_id: u64) -> FrameHeader {
    let mut h = FrameHeader::request(op, request_id);
    h.nonce = nonce(1_000_000_000, request_id);
    h
}

fn sample_attrs() -> Attributes {
    let mut fs_specific = [0u8; FS_SPECIFIC_LEN];
    fs_specific[..4].copy_from_slice(b"ino=");
    fs_specific[FS_SPECIFIC_LEN - 1] = 0xff;
    Attributes {
        access_control_version: 1,
        nearby_object: 0,
        copied_object: 0,
        logical_size: 5,
        blocks_allocated: 1,
        blocks_used: 1,
        block_size: 4096,
        create_time: 1_700_000_000_000_000_000,
        data_modify_time: 1_700_000_001_000_000_000,
        attribute_modify_time: 1_700_000_002_000_000_000,
        fs_data_modify_time: 0,
        fs_attribute_modify_time: 0,
        fs_specific,
    }
}

fn vectors() -> Vec<Vector> {
    let getattr = request_header(opcode::GETATTR, 1);
    let hello = request_header(opcode::HELLO, 6);
    let inquiry = request_header(opcode::INQUIRY, 9);
    let txn_end = request_header(opcode::TXN_END, 11);
    let txn_list = request_header(opcode::TXN_LIST, 12);
    let mut write = request_header(opcode::WRITE, 2);
    write.data_len = 8;
    write.chunk_len = CHUNK_LEN_MIN;

    let mut create_attrs = Attributes { nearby_object: 17, ..Attributes::default() };
    create_attrs.fs_specific[..3].copy_from_slice(b"dir");
    let setattr_attrs =
        Attributes { logical_size: 4096, fs_data_modify_time: 1_700_000_000_000_000_000, ..Attributes::default() };

    vec![
        Vector {
            name: "getattr request",
            header: getattr.clone(),
            body: Body::Request(Request::GetAttr { partition: 7, object: 16 }),
            data: vec![],
            hex: "\
                4e41534401010301010000000000000000000000000000001000000000000000\
                000000000000000000ca9a3b0000000001000000000000000700000000000000\
                1000000000000000000000000000000000000000000000000000000000000000\
                0000000000000000",
        },
        Vector {
            name: "write request, 2 regions, 8 data bytes",
            header: write,
            body: Body::Request(Request::Write {
                partition: 7,
                object: 16,
                regions: vec![Region { offset: 0, length: 5 }, Region { offset: 4096, length: 3 }],
            }),
            data: b"helloabc".to_vec(),
            hex: "\
                4e41534401010601020000000000000000000000000000003200000000020000\
                080000000000000000ca9a3b0000000002000000000000000700000000000000\
                1000000000000000020000000000000000000500000000000000001000000000\
                0000030000000000000000000000000000000000000000000000000000000000\
                0000000000000000000068656c6c6f616263",
        },
        Vector {
            name: "create request, mask FS_SPECIFIC|NEARBY_OBJECT",
            header: request_header(opcode::CREATE, 3),
            body: Body::Request(Request::Create {
                partition: 7,
                mask: AttrMask::FS_SPECIFIC.union(AttrMask::NEARBY_OBJECT),
                attrs: create_attrs,
            }),
            data: vec![],
            hex: "\
                4e41534401010101030000000000000000000000000000006a01000000000000\
                000000000000000000ca9a3b0000000003000000000000000700000000000000\
                0210000000000000000011000000000000000000000000000000000000000000\
                0000000000000000000000000000000000000000000000000000000000000000\
                0000000000000000000000000000000000000000000000000000000000000000\
                0000646972000000000000000000000000000000000000000000000000000000\
                0000000000000000000000000000000000000000000000000000000000000000\
                0000000000000000000000000000000000000000000000000000000000000000\
                0000000000000000000000000000000000000000000000000000000000000000\
                0000000000000000000000000000000000000000000000000000000000000000\
                0000000000000000000000000000000000000000000000000000000000000000\
                0000000000000000000000000000000000000000000000000000000000000000\
                0000000000000000000000000000000000000000000000000000000000000000\
                0000000000000000000000000000000000000000000000000000000000000000\
                0000",
        },
        Vector {
            name: "setattr request, mask LOGICAL_SIZE|FS_DATA_MODIFY_TIME",
            header: request_header(opcode::SETATTR, 4),
            body: Body::Request(Request::SetAttr {
                partition: 7,
                object: 16,
                mask: AttrMask::LOGICAL_SIZE.union(AttrMask::FS_DATA_MODIFY_TIME),
                attrs: setattr_attrs,
            }),
            data: vec![],
            hex: "\
                4e41534401010401040000000000000000000000000000007201000000000000\
                000000000000000000ca9a3b0000000004000000000000000700000000000000\
                1000000000000000080400000000000000000000000000000000000000000000\
                0000001000000000000000000000000000000000000000000000000000000000\
                000000000000000000000000000000000000000000000000000000002a36fe9c\
                9717000000000000000000000000000000000000000000000000000000000000\
                0000000000000000000000000000000000000000000000000000000000000000\
                0000000000000000000000000000000000000000000000000000000000000000\
                0000000000000000000000000000000000000000000000000000000000000000\
                0000000000000000000000000000000000000000000000000000000000000000\
                0000000000000000000000000000000000000000000000000000000000000000\
                0000000000000000000000000000000000000000000000000000000000000000\
                0000000000000000000000000000000000000000000000000000000000000000\
                0000000000000000000000000000000000000000000000000000000000000000\
                00000000000000000000",
        },
        Vector {
            name: "flush request, 3 objects",
            header: request_header(opcode::FLUSH, 5),
            body: Body::Request(Request::Flush { partition: 7, objects: vec![16, 17, 18] }),
            data: vec![],
            hex: "\
                4e41534401010801050000000000000000000000000000002200000000000000\
                000000000000000000ca9a3b0000000005000000000000000700000000000000\
                0300100000000000000011000000000000001200000000000000000000000000\
                0000000000000000000000000000000000000000000000000000",
        },
        Vector {
            name: "hello request",
            header: hello.clone(),
            body: Body::Request(Request::Hello { min_version: 1, max_version: 1, client: "nasd-client".into() }),
            data: vec![],
            hex: "\
                4e41534401010100060000000000000000000000000000000f00000000000000\
                000000000000000000ca9a3b00000000060000000000000001010b006e617364\
                2d636c69656e7400000000000000000000000000000000000000000000000000\
                00000000000000",
        },
        Vector {
            name: "hello reply",
            header: FrameHeader::reply_to(&hello, Status::Ok),
            body: Body::Reply(Reply::Hello {
                version: 1,
                drive_id: std::array::from_fn(|i| i as u8),
                chunk_len_max: CHUNK_LEN_MAX,
                regions_max: REGIONS_MAX as u16,
                block_size: 65536,
            }),
            data: vec![],
            hex: "\
                4e41534401020100060000000000000000000000000000001b00000000000000\
                000000000000000000ca9a3b0000000006000000000000000100010203040506\
                0708090a0b0c0d0e0f0000400000040000010000000000000000000000000000\
                00000000000000000000000000000000000000",
        },
        Vector {
            name: "error reply to getattr: NO_SUCH_OBJECT",
            header: FrameHeader::reply_to(&getattr, Status::NoSuchObject),
            body: Body::Error(Status::NoSuchObject, "no such object 16 in partition 7".into()),
            data: vec![],
            hex: "\
                4e41534401020301010000000000000000000a00000000002200000000000000\
                000000000000000000ca9a3b00000000010000000000000020006e6f20737563\
                68206f626a65637420313620696e20706172746974696f6e2037000000000000\
                0000000000000000000000000000000000000000000000000000",
        },
        Vector {
            name: "attrs reply to getattr",
            header: FrameHeader::reply_to(&getattr, Status::Ok),
            body: Body::Reply(Reply::Attrs(sample_attrs())),
            data: vec![],
            hex: "\
                4e41534401020301010000000000000000000000000000006001000000000000\
                000000000000000000ca9a3b0000000001000000000000000100000000000000\
                0000000000000000000000000000000005000000000000000100000000000000\
                0100000000000000001000000000000000002a36fe9c971700cac471fe9c9717\
                00945fadfe9c971700000000000000000000000000000000696e6f3d00000000\
                0000000000000000000000000000000000000000000000000000000000000000\
                0000000000000000000000000000000000000000000000000000000000000000\
                0000000000000000000000000000000000000000000000000000000000000000\
                0000000000000000000000000000000000000000000000000000000000000000\
                0000000000000000000000000000000000000000000000000000000000000000\
                0000000000000000000000000000000000000000000000000000000000000000\
                0000000000000000000000000000000000000000000000000000000000000000\
                0000000000000000000000000000000000000000000000ff0000000000000000\
                000000000000000000000000000000000000000000000000",
        },
        Vector {
            name: "inquiry reply, 1 partition, 1 extension",
            header: FrameHeader::reply_to(&inquiry, Status::Ok),
            body: Body::Reply(Reply::Inquiry(DriveInfo {
                vendor: "nasd".into(),
                model: "nasd-object-drive".into(),
                firmware: "0.1.0".into(),
                drive_id: std::array::from_fn(|i| 0xa0 + i as u8),
                block_size: 4096,
                capacity_bytes: 1 << 30,
                used_bytes: 8192,
                partitions: vec![PartitionInfo { partition: 7, quota_bytes: 1 << 20, used_bytes: 8192, objects: 5 }],
                extensions: vec!["x-example".into()],
                failure_domain: "rack-1".into(),
            })),
            data: vec![],
            hex: "\
                4e41534401020303090000000000000000000000000000007b00000000000000\
                000000000000000000ca9a3b00000000090000000000000004006e6173641100\
                6e6173642d6f626a6563742d64726976650500302e312e30a0a1a2a3a4a5a6a7\
                a8a9aaabacadaeaf001000000000004000000000002000000000000001000700\
                0000000000000000100000000000002000000000000005000000000000000100\
                0900782d6578616d706c6506007261636b2d3100000000000000000000000000\
                00000000000000000000000000000000000000",
        },
        Vector {
            name: "set_map_epoch request",
            header: request_header(opcode::SET_MAP_EPOCH, 13),
            body: Body::Request(Request::SetMapEpoch { partition: 7, epoch: 4 }),
            data: vec![],
            hex: "\
                4e415344010109020d0000000000000000000000000000000c00000000000000\
                000000000000000000ca9a3b000000000d000000000000000700000000000000\
                0400000000000000000000000000000000000000000000000000000000000000\
                00000000",
        },
        Vector {
            name: "txn_begin request",
            header: request_header(opcode::TXN_BEGIN, 10),
            body: Body::Request(Request::TxnBegin { partition: 7, object: 16, txn: 0x0102_0304_0506_0708 }),
            data: vec![],
            hex: "\
                4e41534401010a010a0000000000000000000000000000001800000000000000\
                000000000000000000ca9a3b000000000a000000000000000700000000000000\
                1000000000000000080706050403020100000000000000000000000000000000\
                00000000000000000000000000000000",
        },
        Vector {
            name: "txn_end request, abort",
            header: txn_end.clone(),
            body: Body::Request(Request::TxnEnd {
                partition: 7,
                object: 16,
                txn: 0x0102_0304_0506_0708,
                commit: false,
            }),
            data: vec![],
            hex: "\
                4e41534401010b010b0000000000000000000000000000001900000000000000\
                000000000000000000ca9a3b000000000b000000000000000700000000000000\
                1000000000000000080706050403020100000000000000000000000000000000\
                0000000000000000000000000000000000",
        },
        Vector {
            name: "txn_end reply, was open",
            header: FrameHeader::reply_to(&txn_end, Status::Ok),
            body: Body::Reply(Reply::TxnEnded { was_open: true }),
            data: vec![],
            hex: "\
                4e41534401020b010b0000000000000000000000000000000100000000000000\
                000000000000000000ca9a3b000000000b000000000000000100000000000000\
                00000000000000000000000000000000000000000000000000",
        },
        Vector {
            name: "error reply to txn_end: TXN_CONFLICT",
            header: FrameHeader::reply_to(&txn_end, Status::TxnConflict),
            body: Body::Error(Status::TxnConflict, "object 16 in partition 7 has transaction 9 open".into()),
            data: vec![],
            hex: "\
                4e41534401020b010b0000000000000000002a00000000003100000000000000\
                000000000000000000ca9a3b000000000b000000000000002f006f626a656374\
                20313620696e20706172746974696f6e203720686173207472616e7361637469\
                6f6e2039206f70656e0000000000000000000000000000000000000000000000\
                000000000000000000",
        },
        Vector {
            name: "txn_list request",
            header: txn_list.clone(),
            body: Body::Request(Request::TxnList { partition: 7, after_object: 16, max: 1024 }),
            data: vec![],
            hex: "\
                4e415344010108020c0000000000000000000000000000001200000000000000\
                000000000000000000ca9a3b000000000c000000000000000700000000000000\
                1000000000000000000400000000000000000000000000000000000000000000\
                00000000000000000000",
        },
        Vector {
            name: "txn_list reply, 2 transactions",
            header: FrameHeader::reply_to(&txn_list, Status::Ok),
            body: Body::Reply(Reply::Txns {
                txns: vec![
                    OpenTxn { object: 17, txn: 5, begun_ns: 1_700_000_000_000_000_000 },
                    OpenTxn { object: 20, txn: 6, begun_ns: 1_700_000_001_000_000_000 },
                ],
            }),
            data: vec![],
            hex: "\
                4e415344010208020c0000000000000000000000000000003200000000000000\
                000000000000000000ca9a3b000000000c000000000000000200110000000000\
                0000050000000000000000002a36fe9c97171400000000000000060000000000\
                000000cac471fe9c971700000000000000000000000000000000000000000000\
                00000000000000000000",
        },
        Vector {
            name: "set_pal request, collection 9, 2 entries",
            header: request_header(opcode::SET_PAL, 20),
            body: Body::Request(Request::SetPal {
                partition: 7,
                object: 16,
                pal: ObjectPal {
                    collection: 9,
                    pal: Pal::new(vec![
                        role(7, rights::READ | rights::WRITE | rights::GETATTR),
                        user(1000, rights::READ | rights::GETATTR),
                    ]),
                },
            }),
            data: vec![],
            hex: "\
                4e41534401010c01140000000000000000000000000000002c00000000000000\
                000000000000000000ca9a3b0000000014000000000000000700000000000000\
                10000000000000000900000000000000020001e8030000090000000207000000\
                0b00000000000000000000000000000000000000000000000000000000000000\
                00000000",
        },
        Vector {
            name: "get_pal reply",
            header: FrameHeader::reply_to(&request_header(opcode::GET_PAL, 21), Status::Ok),
            body: Body::Reply(Reply::Pal(ObjectPal {
                collection: 9,
                pal: Pal::new(vec![user(1000, rights::READ | rights::GETATTR)]),
            })),
            data: vec![],
            hex: "\
                4e41534401020d01150000000000000000000000000000001300000000000000\
                000000000000000000ca9a3b0000000015000000000000000900000000000000\
                010001e803000009000000000000000000000000000000000000000000000000\
                0000000000000000000000",
        },
        Vector {
            name: "set_super_pal request, 1 entry",
            header: request_header(opcode::SET_SUPER_PAL, 22),
            body: Body::Request(Request::SetSuperPal {
                partition: 7,
                collection: 9,
                pal: Pal::new(vec![role(3, rights::READ)]),
            }),
            data: vec![],
            hex: "\
                4e41534401010c02160000000000000000000000000000001b00000000000000\
                000000000000000000ca9a3b0000000016000000000000000700000000000000\
                0900000000000000010002030000000100000000000000000000000000000000\
                00000000000000000000000000000000000000",
        },
        Vector {
            name: "set_auth_scheme request, PALs and capabilities",
            header: request_header(opcode::SET_AUTH_SCHEME, 23),
            body: Body::Request(Request::SetAuthScheme { partition: 7, scheme: AuthScheme::BOTH }),
            data: vec![],
            hex: "\
                4e41534401010a02170000000000000000000000000000000900000000000000\
                000000000000000000ca9a3b0000000017000000000000000700000000000000\
                0300000000000000000000000000000000000000000000000000000000000000\
                00",
        },
        Vector {
            name: "extension request, prefetch-v1 progress",
            header: request_header(opcode::EXTENSION, 25),
            body: Body::Request(Request::Extension {
                partition: 7,
                object: 9,
                name: "prefetch-v1".into(),
                args: vec![2, 1, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0],
            }),
            data: vec![],
            hex: "\
                4e41534401011001190000000000000000000000000000002c00000000000000\
                000000000000000000ca9a3b0000000019000000000000000700000000000000\
                09000000000000000b0070726566657463682d76310d00020100000000000000\
                0300000000000000000000000000000000000000000000000000000000000000\
                00000000",
        },
        Vector {
            name: "retire_identity_key request",
            header: request_header(opcode::RETIRE_IDENTITY_KEY, 24),
            body: Body::Request(Request::RetireIdentityKey { key_id: 2 }),
            data: vec![],
            hex: "\
                4e41534401010703180000000000000000000000000000000400000000000000\
                000000000000000000ca9a3b0000000018000000000000000200000000000000\
                00000000000000000000000000000000000000000000000000000000",
        },
        Vector {
            name: "error reply to set_pal: PAL_OVERFLOW",
            header: FrameHeader::reply_to(&request_header(opcode::SET_PAL, 25), Status::PalOverflow),
            body: Body::Error(Status::PalOverflow, "PAL of 33 entries, over the limit of 32".into()),
            data: vec![],
            hex: "\
                4e41534401020c01190000000000000000002e00000000002900000000000000\
                000000000000000000ca9a3b000000001900000000000000270050414c206f66\
                20333320656e74726965732c206f76657220746865206c696d6974206f662033\
                3200000000000000000000000000000000000000000000000000000000000000\
                00",
        },
        Vector {
            name: "set_pal request, owner and everyone",
            header: request_header(opcode::SET_PAL, 26),
            body: Body::Request(Request::SetPal {
                partition: 7,
                object: 16,
                pal: ObjectPal {
                    collection: 0,
                    pal: Pal::new(vec![
                        PalEntry { principal: Principal::Everyone, rights: rights::READ | rights::GETATTR },
                        user(1000, rights::READ | rights::WRITE | rights::APPEND | rights::FLUSH | rights::GETATTR),
                    ]),
                },
            }),
            data: vec![],
            hex: "\
                4e41534401010c011a0000000000000000000000000000002c00000000000000\
                000000000000000000ca9a3b000000001a000000000000000700000000000000\
                10000000000000000000000000000000020001e80300000f0200000300000000\
                0900000000000000000000000000000000000000000000000000000000000000\
                00000000",
        },
        Vector {
            name: "extents request",
            header: request_header(opcode::EXTENTS, 13),
            body: Body::Request(Request::Extents { partition: 7, object: 16, offset: 65536, max: 1024 }),
            data: vec![],
            hex: "\
                4e41534401010e010d0000000000000000000000000000001a00000000000000\
                000000000000000000ca9a3b000000000d000000000000000700000000000000\
                1000000000000000000001000000000000040000000000000000000000000000\
                000000000000000000000000000000000000",
        },
        Vector {
            name: "extents reply, 2 extents",
            header: FrameHeader::reply_to(&request_header(opcode::EXTENTS, 13), Status::Ok),
            body: Body::Reply(Reply::Extents {
                covered_end: 10_737_418_241,
                extents: vec![
                    Region { offset: 65536, length: 131072 },
                    Region { offset: 10_737_352_704, length: 65537 },
                ],
            }),
            data: vec![],
            hex: "\
                4e41534401020e010d0000000000000000000000000000002a00000000000000\
                000000000000000000ca9a3b000000000d000000000000000100008002000000\
                0200000001000000000000000200000000000000ff7f02000000010001000000\
                0000000000000000000000000000000000000000000000000000000000000000\
                0000",
        },
        Vector {
            name: "digests request",
            header: request_header(opcode::DIGESTS, 14),
            body: Body::Request(Request::Digests {
                partition: 7,
                object: 16,
                region: Region { offset: 65536, length: 67_108_864 },
            }),
            data: vec![],
            hex: "\
                4e41534401010f010e0000000000000000000000000000002000000000000000\
                000000000000000000ca9a3b000000000e000000000000000700000000000000\
                1000000000000000000001000000000000000004000000000000000000000000\
                000000000000000000000000000000000000000000000000",
        },
        Vector {
            name: "digests reply, 2 blocks",
            header: FrameHeader::reply_to(&request_header(opcode::DIGESTS, 14), Status::Ok),
            body: Body::Reply(Reply::Digests {
                logical_size: 196_608,
                digests: vec![[0x11; DIGEST_LEN], [0xab; DIGEST_LEN]],
            }),
            data: vec![],
            hex: "\
                4e41534401020f010e0000000000000000000000000000004a00000000000000\
                000000000000000000ca9a3b000000000e000000000000000000030000000000\
                0200111111111111111111111111111111111111111111111111111111111111\
                1111abababababababababababababababababababababababababababababab\
                abab000000000000000000000000000000000000000000000000000000000000\
                0000",
        },
    ]
}

/// Encodes a vector the way a sender would: header, capability (none), args,
/// digest (zero: protection NONE), data (no tags: protection NONE).
fn encode_vector(v: &Vector) -> Vec<u8> {
    let mut header = v.header.clone();
    let args = match &v.body {
        Body::Request(r) => r.encode_args(),
        Body::Reply(r) => r.encode(),
        Body::Error(status, message) => {
            header.status = *status as u16;
            encode_error_message(message)
        }
    };
    assert_eq!(header.data_len, v.data.len() as u64, "{}: data_len", v.name);
    let mut out = FramePrefix::encode(&header, &[], &args, &ZERO_DIGEST);
    out.extend_from_slice(&v.data);
    out
}

/// Decodes a whole frame the way a receiver would: the fixed header first,
/// which says how long the rest of the prefix is, then the prefix, then the
/// data (which must be exactly `data_len` bytes under protection NONE).
fn decode_frame(bytes: &[u8]) -> Result<(FrameHeader, Body, Vec<u8>), DecodeError> {
    let head: &[u8; HEADER_LEN] = bytes.get(..HEADER_LEN).ok_or(DecodeError::Truncated)?.try_into().unwrap();
    let header = FrameHeader::decode(head)?;
    let prefix_len = HEADER_LEN + header.body_len();
    let prefix = FramePrefix::parse(bytes.get(..prefix_len).ok_or(DecodeError::Truncated)?)?;
    assert_eq!(prefix.header, header);
    assert!(prefix.capability.is_empty());
    assert_eq!(prefix.digest, ZERO_DIGEST);
    let body = match (header.kind, header.status) {
        (Kind::Request, _) => Body::Request(Request::decode(header.opcode, prefix.args)?),
        (Kind::Reply, 0) => Body::Reply(Reply::decode(header.opcode, prefix.args)?),
        (Kind::Reply, code) => {
            Body::Error(Status::from_code(code).expect("known status code"), decode_error_message(prefix.args)?)
        }
    };
    let data = bytes[prefix_len..].to_vec();
    assert_eq!(data.len() as u64, header.data_len, "data length");
    let tag = header.protection.data_tag_len() as u64;
    assert_eq!(header.data_len + header.chunk_count() * tag, data.len() as u64);
    Ok((header, body, data))
}

#[test]
fn known_answer_vectors() {
    for v in vectors() {
        let encoded = encode_vector(&v);
        assert_eq!(hex::encode(&encoded), v.hex, "{}: encoding changed", v.name);
        let bytes = hex::decode(v.hex).unwrap();
        let (header, body, data) = decode_frame(&bytes).unwrap_or_else(|e| panic!("{}: {e}", v.name));
        let mut want = v.header.clone();
        want.capability_len = 0;
        want.args_len = header.args_len;
        if let Body::Error(status, _) = &v.body {
            want.status = *status as u16;
        }
        assert_eq!(header, want, "{}: header", v.name);
        assert_eq!(body, v.body, "{}: body", v.name);
        assert_eq!(data, v.data, "{}: data", v.name);
    }
}

/// The capability's `map_epoch` is the `u32` at offset 68 (once a reserved
/// zero field): any value decodes and re-encodes to the same bytes.
#[test]
fn capability_map_epoch_is_bytes_68_to_72() {
    let args = CapabilityArgs {
        algorithm: 1,
        min_protection: Protection::INTEGRITY_ARGS,
        key_version: 1,
        drive_id: [0; 16],
        partition: 7,
        object: 16,
        region: Region { offset: 0, length: 4096 },
        access_control_version: 1,
        rights: rights::READ,
        map_epoch: 0x0a0b_0c0d,
        expiration_ns: 5,
        audit_id: 6,
    };
    let bytes = args.encode();
    assert_eq!(&bytes[64..68], &rights::READ.to_le_bytes());
    assert_eq!(&bytes[68..72], &[0x0d, 0x0c, 0x0b, 0x0a]);
    assert_eq!(&bytes[72..80], &5u64.to_le_bytes());
    assert_eq!(CapabilityArgs::decode(&bytes), Ok(args.clone()));
    for epoch in [0, 1, u32::MAX] {
        let a = CapabilityArgs { map_epoch: epoch, ..args.clone() };
        assert_eq!(CapabilityArgs::decode(&a.encode()), Ok(a));
    }
}

/// Every vector is published in docs/PROTOCOL.md, byte for byte (a code
/// block of hex lines, joined).
#[test]
fn vectors_are_published_in_protocol_md() {
    let published = published_blocks();
    for v in vectors() {
        assert!(published.iter().any(|b| *b == v.hex), "{}: not published in PROTOCOL.md as it is encoded", v.name);
    }
}

/// The code blocks of docs/PROTOCOL.md, each one string of its lines joined.
fn published_blocks() -> Vec<String> {
    let doc = include_str!("../../../docs/PROTOCOL.md");
    let mut published = Vec::new();
    let mut block: Option<String> = None;
    for line in doc.lines() {
        match (&mut block, line.trim()) {
            (None, "```") => block = Some(String::new()),
            (Some(b), "```") => {
                published.push(std::mem::take(b));
                block = None;
            }
            (Some(b), l) => b.push_str(l),
            (None, _) => {}
        }
    }
    published
}

/// Vector 30: the getattr request of vector 1 as version 2, carrying the
/// trace id `0123456789abcdef0123456789abcdef` between header and arguments.
#[test]
fn traced_request_vector() {
    let mut h = request_header(opcode::GETATTR, 1);
    h.version = VERSION_TRACE;
    let trace = TraceId::from_random(0x0123_4567_89ab_cdef, 0x0123_4567_89ab_cdef);
    let req = Request::GetAttr { partition: 7, object: 16 };
    let bytes = FramePrefix::encode_traced(&h, Some(&trace), &[], &req.encode_args(), &ZERO_DIGEST);
    let hex = hex::encode(&bytes);
    println!("{hex}");
    assert_eq!(bytes.len(), 136);
    assert!(published_blocks().contains(&hex), "vector 30 is not published in PROTOCOL.md as it is encoded: {hex}");
    let parsed = FramePrefix::parse(&bytes).unwrap();
    assert_eq!((parsed.header.version, parsed.trace), (2, Some(trace)));
    assert_eq!(Request::decode(parsed.header.opcode, parsed.args).unwrap(), req);
}

/// A header pinned field by field, as a cross-check of the offsets table in
/// PROTOCOL.md.
#[test]
fn header_field_offsets() {
    let mut h = request_header(opcode::WRITE, 0x0102_0304_0506_0708);
    h.key_type = KeyType::Capability;
    h.protection = Protection::INTEGRITY_ARGS.union(Protection::PRIVACY_DATA);
    h.capability_len = 0x1112;
    h.args_len = 0x2122_2324;
    h.chunk_len = 0x3132_3334;
    h.data_len = 0x4142_4344_4546_4748;
    let b = h.encode();
    assert_eq!(&b[0..4], b"NASD");
    assert_eq!(b[4], VERSION_MIN, "a request header is version 1 until a client sets another");
    assert_eq!(b[5], Kind::Request as u8);
    assert_eq!(&b[6..8], &opcode::WRITE.to_le_bytes());
    assert_eq!(&b[8..16], &0x0102_0304_0506_0708u64.to_le_bytes());
    assert_eq!(b[16], 5);
    assert_eq!(b[17], 0b1001);
    assert_eq!(&b[18..20], &[0, 0]);
    assert_eq!(&b[20..22], &0x1112u16.to_le_bytes());
    assert_eq!(&b[22..24], &[0, 0]);
    h.version = VERSION_TRACE;
    h.trace_len = 0x2a;
    let b = h.encode();
    assert_eq!((b[4], &b[22..24]), (2, &0x2au16.to_le_bytes()[..]), "version 2: trace_len at 22");
    assert_eq!(&b[24..28], &0x2122_2324u32.to_le_bytes());
    assert_eq!(&b[28..32], &0x3132_3334u32.to_le_bytes());
    assert_eq!(&b[32..40], &0x4142_4344_4546_4748u64.to_le_bytes());
    assert_eq!(&b[40..48], &1_000_000_000u64.to_le_bytes());
    assert_eq!(&b[48..56], &0x0102_0304_0506_0708u64.to_le_bytes());
    assert_eq!(ATTRIBUTES_LEN, 352);
}

/// Prints the vectors in the layout used above; run after an intentional
/// format change: `cargo test -p nasd-proto print_vectors -- --ignored --nocapture`.
#[test]
#[ignore]
fn print_vectors() {
    for v in vectors() {
        let hex = hex::encode(encode_vector(&v));
        println!("== {}", v.name);
        let lines: Vec<&str> = hex.as_bytes().chunks(64).map(|c| std::str::from_utf8(c).unwrap()).collect();
        println!("            hex: \"\\");
        for (i, l) in lines.iter().enumerate() {
            let end = if i + 1 == lines.len() { "\"," } else { "\\" };
            println!("                {l}{end}");
        }
    }
}

// ---------------------------------------------------------------------------
// Rejections.
// ---------------------------------------------------------------------------

/// A valid request header's bytes, then `patch` applied at byte offsets.
fn header_with(data_len: u64, chunk_len: u32, patches: &[(usize, &[u8])]) -> [u8; HEADER_LEN] {
    let mut h = request_header(opcode::GETATTR, 1);
    h.data_len = data_len;
    h.chunk_len = chunk_len;
    let mut b = h.encode();
    for (at, bytes) in patches {
        b[*at..*at + bytes.len()].copy_from_slice(bytes);
    }
    b
}

#[test]
fn header_rejections() {
    let nc = DecodeError::NotCanonical;
    let u16le = |v: u16| v.to_le_bytes();
    let u32le = |v: u32| v.to_le_bytes();
    let cases: Vec<(&str, [u8; HEADER_LEN], DecodeError, Status)> = vec![
        ("bad magic", header_with(0, 0, &[(0, b"NASE")]), DecodeError::BadMagic, Status::MalformedFrame),
        ("lowercase magic", header_with(0, 0, &[(0, b"nasd")]), DecodeError::BadMagic, Status::MalformedFrame),
        ("version 0", header_with(0, 0, &[(4, &[0])]), DecodeError::Version(0), Status::VersionUnsupported),
        ("version 3", header_with(0, 0, &[(4, &[3])]), DecodeError::Version(3), Status::VersionUnsupported),
        ("version 255", header_with(0, 0, &[(4, &[255])]), DecodeError::Version(255), Status::VersionUnsupported),
        ("kind 0", header_with(0, 0, &[(5, &[0])]), nc("unknown frame kind"), Status::BadArguments),
        ("kind 3", header_with(0, 0, &[(5, &[3])]), nc("unknown frame kind"), Status::BadArguments),
        ("key type 7", header_with(0, 0, &[(16, &[7])]), nc("unknown key type"), Status::BadArguments),
        (
            "protection bit 6",
            header_with(0, 0, &[(17, &[0x40])]),
            nc("undefined protection bits"),
            Status::BadArguments,
        ),
        (
            "protection bit 7",
            header_with(0, 0, &[(17, &[0x81])]),
            nc("undefined protection bits"),
            Status::BadArguments,
        ),
        (
            "request with status",
            header_with(0, 0, &[(18, &u16le(10))]),
            nc("request with a status"),
            Status::BadArguments,
        ),
        (
            "reserved field low byte",
            header_with(0, 0, &[(22, &[1, 0])]),
            nc("reserved header field is not zero"),
            Status::BadArguments,
        ),
        (
            "reserved field high byte",
            header_with(0, 0, &[(22, &[0, 0x80])]),
            nc("reserved header field is not zero"),
            Status::BadArguments,
        ),
        (
            "version 2: trace_len over max",
            header_with(0, 0, &[(4, &[2]), (22, &u16le(TRACE_ID_LEN_MAX as u16 + 1))]),
            over("trace_len", TRACE_ID_LEN_MAX as u64 + 1, TRACE_ID_LEN_MAX as u64),
            Status::LimitExceeded,
        ),
        (
            "version 2: reply with a trace id",
            header_with(0, 0, &[(4, &[2]), (5, &[2]), (22, &u16le(1))]),
            nc("reply with a trace id"),
            Status::BadArguments,
        ),
        (
            "capability_len over max",
            header_with(0, 0, &[(20, &u16le(CAPABILITY_LEN_MAX as u16 + 1))]),
            over("capability_len", CAPABILITY_LEN_MAX as u64 + 1, CAPABILITY_LEN_MAX as u64),
            Status::LimitExceeded,
        ),
        (
            "capability_len u16::MAX",
            header_with(0, 0, &[(20, &u16le(u16::MAX))]),
            over("capability_len", u16::MAX as u64, CAPABILITY_LEN_MAX as u64),
            Status::LimitExceeded,
        ),
        (
            "args_len over max",
            header_with(0, 0, &[(24, &u32le(ARGS_LEN_MAX as u32 + 1))]),
            over("args_len", ARGS_LEN_MAX as u64 + 1, ARGS_LEN_MAX as u64),
            Status::LimitExceeded,
        ),
        (
            "args_len u32::MAX",
            header_with(0, 0, &[(24, &u32le(u32::MAX))]),
            over("args_len", u32::MAX as u64, ARGS_LEN_MAX as u64),
            Status::LimitExceeded,
        ),
        (
            "data_len 2^63",
            header_with(1 << 63, CHUNK_LEN_DEFAULT, &[]),
            over("data_len", 1 << 63, DATA_LEN_MAX),
            Status::LimitExceeded,
        ),
        (
            "data_len one over max",
            header_with(DATA_LEN_MAX + 1, CHUNK_LEN_DEFAULT, &[]),
            over("data_len", DATA_LEN_MAX + 1, DATA_LEN_MAX),
            Status::LimitExceeded,
        ),
        (
            "data_len u64::MAX",
            header_with(u64::MAX, CHUNK_LEN_DEFAULT, &[]),
            over("data_len", u64::MAX, DATA_LEN_MAX),
            Status::LimitExceeded,
        ),
        // The decoder reports a too-small chunk_len as OverLimit with the
        // maximum as `max` (see the chunk_len note in PROTOCOL.md).
        (
            "chunk_len 0 with data",
            header_with(10, 0, &[]),
            over("chunk_len", 0, CHUNK_LEN_MAX as u64),
            Status::LimitExceeded,
        ),
        (
            "chunk_len below min with data",
            header_with(10, CHUNK_LEN_MIN - 1, &[]),
            over("chunk_len", CHUNK_LEN_MIN as u64 - 1, CHUNK_LEN_MAX as u64),
            Status::LimitExceeded,
        ),
        (
            "chunk_len over max",
            header_with(10, CHUNK_LEN_MAX + 1, &[]),
            over("chunk_len", CHUNK_LEN_MAX as u64 + 1, CHUNK_LEN_MAX as u64),
            Status::LimitExceeded,
        ),
        (
            "chunk_len with no data",
            header_with(0, CHUNK_LEN_MIN, &[]),
            nc("chunk_len without data"),
            Status::BadArguments,
        ),
        ("chunk_len 1 with no data", header_with(0, 1, &[]), nc("chunk_len without data"), Status::BadArguments),
    ];
    for (case, bytes, want, status) in cases {
        check(case, FrameHeader::decode(&bytes), want, status);
    }

    // Boundaries that must be accepted.
    let ok: &[(&str, [u8; HEADER_LEN])] = &[
        ("capability_len at max", header_with(0, 0, &[(20, &u16le(CAPABILITY_LEN_MAX as u16))])),
        ("args_len at max", header_with(0, 0, &[(24, &u32le(ARGS_LEN_MAX as u32))])),
        ("data_len at max", header_with(DATA_LEN_MAX, CHUNK_LEN_MAX, &[])),
        ("chunk_len min, 1 data byte", header_with(1, CHUNK_LEN_MIN, &[])),
        ("every protection bit", header_with(0, 0, &[(16, &[5, 0x1f])])),
        ("reply with any status", header_with(0, 0, &[(5, &[2]), (18, &u16le(u16::MAX))])),
    ];
    for (case, bytes) in ok {
        let h = FrameHeader::decode(bytes).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(&h.encode(), bytes, "{case}");
    }
}

/// Header checks run in this order: magic, version, then field values and
/// limits. The version comes first because a later version may lay out the
/// rest of the header differently: such a frame must get VERSION_UNSUPPORTED.
#[test]
fn header_check_order() {
    let bytes = header_with(0, 0, &[(0, b"XASD"), (4, &[9])]);
    check("magic before version", FrameHeader::decode(&bytes), DecodeError::BadMagic, Status::MalformedFrame);
    let bytes = header_with(0, 0, &[(4, &[9]), (5, &[7])]);
    check("version before kind", FrameHeader::decode(&bytes), DecodeError::Version(9), Status::VersionUnsupported);
    let bytes = header_with(0, 0, &[(4, &[9]), (20, &u16::MAX.to_le_bytes())]);
    check("version before limits", FrameHeader::decode(&bytes), DecodeError::Version(9), Status::VersionUnsupported);
    let bytes = header_with(0, 0, &[(5, &[7]), (20, &u16::MAX.to_le_bytes())]);
    check(
        "kind before limits",
        FrameHeader::decode(&bytes),
        DecodeError::NotCanonical("unknown frame kind"),
        Status::BadArguments,
    );
}

#[test]
fn frame_prefix_rejections() {
    let req = Request::GetAttr { partition: 7, object: 16 };
    let frame = FramePrefix::encode(&request_header(opcode::GETATTR, 1), &[], &req.encode_args(), &ZERO_DIGEST);
    assert_eq!(frame.len(), HEADER_LEN + 16 + DIGEST_LEN);
    let mut long = frame.clone();
    long.push(0);
    let cases: Vec<(&str, &[u8], DecodeError, Status)> = vec![
        ("empty", &[][..], DecodeError::Truncated, Status::BadArguments),
        ("truncated header", &frame[..HEADER_LEN - 1], DecodeError::Truncated, Status::BadArguments),
        ("header only", &frame[..HEADER_LEN], DecodeError::Truncated, Status::BadArguments),
        ("truncated args", &frame[..HEADER_LEN + 15], DecodeError::Truncated, Status::BadArguments),
        ("truncated digest", &frame[..frame.len() - 1], DecodeError::Truncated, Status::BadArguments),
        ("trailing byte after digest", &long[..], DecodeError::TrailingBytes(1), Status::BadArguments),
    ];
    for (case, bytes, want, status) in cases {
        check(case, FramePrefix::parse(bytes), want, status);
    }
    let p = FramePrefix::parse(&frame).unwrap();
    assert_eq!(Request::decode(p.header.opcode, p.args).unwrap(), req);

    // Version 2: the trace id sits between header and arguments, and must be one.
    let mut v2 = request_header(opcode::GETATTR, 1);
    v2.version = VERSION_TRACE;
    let trace = TraceId::from_bytes(b"op-1").unwrap();
    let frame = FramePrefix::encode_traced(&v2, Some(&trace), &[], &req.encode_args(), &ZERO_DIGEST);
    assert_eq!((frame.len(), &frame[HEADER_LEN..HEADER_LEN + 4]), (HEADER_LEN + 4 + 16 + DIGEST_LEN, &b"op-1"[..]));
    let p = FramePrefix::parse(&frame).unwrap();
    assert_eq!((p.trace.as_ref(), p.header.trace_len), (Some(&trace), 4));
    assert_eq!(FramePrefix::encode_traced(&p.header, p.trace.as_ref(), p.capability, p.args, &p.digest), frame);
    let mut spaced = frame.clone();
    spaced[HEADER_LEN + 2] = b' ';
    let want = DecodeError::NotCanonical("trace id has a byte outside [A-Za-z0-9._-]");
    check("a trace id with a space", FramePrefix::parse(&spaced), want, Status::BadArguments);
    check(
        "truncated trace id",
        FramePrefix::parse(&frame[..HEADER_LEN + 3]),
        DecodeError::Truncated,
        Status::BadArguments,
    );

    // args_len covering one byte too many: the prefix parses, the arguments do not.
    let mut args = req.encode_args();
    args.push(0);
    let frame = FramePrefix::encode(&request_header(opcode::GETATTR, 1), &[], &args, &ZERO_DIGEST);
    let p = FramePrefix::parse(&frame).unwrap();
    check(
        "trailing byte after args",
        Request::decode(p.header.opcode, p.args),
        DecodeError::TrailingBytes(1),
        Status::BadArguments,
    );
}

/// Argument bytes built field by field.
fn args(f: impl FnOnce(&mut Writer)) -> Vec<u8> {
    let mut w = Writer::default();
    f(&mut w);
    w.into_vec()
}

#[test]
fn request_rejections() {
    use opcode::*;
    let nc = DecodeError::NotCanonical;
    let po = |w: &mut Writer| {
        w.u64(7).u64(16);
    };
    // Create/SetAttr arguments whose mask is `mask` but whose attributes set `set`.
    let masked = |mask: u16, set: AttrMask| {
        let a = sample_attrs().masked(set);
        args(|w| {
            w.u64(7).u64(16).u16(mask);
            a.encode(w);
        })
    };
    let mut reserved_attr = masked(AttrMask::BLOCK_SIZE.0, AttrMask::BLOCK_SIZE);
    reserved_attr[18 + 52] = 1;
    let mut getattr_trailing = args(po);
    getattr_trailing.push(0);
    let regions = |n: u16| {
        args(|w| {
            po(w);
            w.u16(n);
            for i in 0..n as u64 {
                w.u64(i * 10).u64(1);
            }
        })
    };
    let cases: Vec<(&str, u16, Vec<u8>, DecodeError, Status)> = vec![
        ("unknown opcode 0x7777", 0x7777, vec![], DecodeError::UnknownOpcode(0x7777), Status::UnknownOperation),
        ("opcode 0", 0, vec![], DecodeError::UnknownOpcode(0), Status::UnknownOperation),
        ("setpartitionkey empty", SET_PARTITION_KEY, vec![], DecodeError::Truncated, Status::BadArguments),
        ("setworkingkey empty", SET_WORKING_KEY, vec![], DecodeError::Truncated, Status::BadArguments),
        ("setdrivekey empty", SET_DRIVE_KEY, vec![], DecodeError::Truncated, Status::BadArguments),
        (
            "setdrivekey sealed key over limit",
            SET_DRIVE_KEY,
            args(|w| {
                w.bytes(&[0; SEALED_KEY_LEN_MAX + 1]);
            }),
            DecodeError::OverLimit {
                field: "sealed key",
                len: SEALED_KEY_LEN_MAX as u64 + 1,
                max: SEALED_KEY_LEN_MAX as u64,
            },
            Status::LimitExceeded,
        ),
        (
            "readaudit max over limit",
            READ_AUDIT,
            args(|w| {
                w.u64(0).u16(AUDIT_RECORDS_PER_REPLY_MAX as u16 + 1);
            }),
            DecodeError::OverLimit {
                field: "audit records",
                len: AUDIT_RECORDS_PER_REPLY_MAX as u64 + 1,
                max: AUDIT_RECORDS_PER_REPLY_MAX as u64,
            },
            Status::LimitExceeded,
        ),
        (
            "setminprotection undefined bits",
            SET_MIN_PROTECTION,
            args(|w| {
                w.u64(1).u8(0x80);
            }),
            DecodeError::NotCanonical("undefined protection bits"),
            Status::BadArguments,
        ),
        (
            "txnlist max over limit",
            TXN_LIST,
            args(|w| {
                w.u64(7).u64(0).u16(TXN_LIST_MAX as u16 + 1);
            }),
            over("transactions", TXN_LIST_MAX as u64 + 1, TXN_LIST_MAX as u64),
            Status::LimitExceeded,
        ),
        (
            "txnend commit 2",
            TXN_END,
            args(|w| {
                w.u64(7).u64(16).u64(1).u8(2);
            }),
            nc("boolean other than 0 or 1"),
            Status::BadArguments,
        ),
        ("txnbegin truncated", TXN_BEGIN, vec![0; 23], DecodeError::Truncated, Status::BadArguments),
        ("setmapepoch truncated", SET_MAP_EPOCH, vec![0; 11], DecodeError::Truncated, Status::BadArguments),
        ("setmapepoch trailing byte", SET_MAP_EPOCH, vec![0; 13], DecodeError::TrailingBytes(1), Status::BadArguments),
        ("getattr empty", GETATTR, vec![], DecodeError::Truncated, Status::BadArguments),
        ("getattr truncated", GETATTR, vec![0; 15], DecodeError::Truncated, Status::BadArguments),
        ("getattr trailing byte", GETATTR, getattr_trailing, DecodeError::TrailingBytes(1), Status::BadArguments),
        ("inquiry with args", INQUIRY, vec![0], DecodeError::TrailingBytes(1), Status::BadArguments),
        (
            "removepartition bool 2",
            REMOVE_PARTITION,
            args(|w| {
                w.u64(7).u8(2);
            }),
            nc("boolean other than 0 or 1"),
            Status::BadArguments,
        ),
        (
            "removepartition bool 0xff",
            REMOVE_PARTITION,
            args(|w| {
                w.u64(7).u8(0xff);
            }),
            nc("boolean other than 0 or 1"),
            Status::BadArguments,
        ),
        (
            "read regions over max",
            READ,
            regions(REGIONS_MAX as u16 + 1),
            over("regions", REGIONS_MAX as u64 + 1, REGIONS_MAX as u64),
            Status::LimitExceeded,
        ),
        (
            "write regions u16::MAX",
            WRITE,
            args(|w| {
                po(w);
                w.u16(u16::MAX);
            }),
            over("regions", u16::MAX as u64, REGIONS_MAX as u64),
            Status::LimitExceeded,
        ),
        (
            "blocksrequired regions over max",
            BLOCKS_REQUIRED,
            regions(REGIONS_MAX as u16 + 1),
            over("regions", REGIONS_MAX as u64 + 1, REGIONS_MAX as u64),
            Status::LimitExceeded,
        ),
        (
            "extents max over EXTENTS_MAX",
            EXTENTS,
            args(|w| {
                po(w);
                w.u64(0).u16(EXTENTS_MAX as u16 + 1);
            }),
            over("extents", EXTENTS_MAX as u64 + 1, EXTENTS_MAX as u64),
            Status::LimitExceeded,
        ),
        (
            "digests region over DIGESTS_REGION_LEN_MAX",
            DIGESTS,
            args(|w| {
                po(w);
                w.u64(0).u64(DIGESTS_REGION_LEN_MAX + 1);
            }),
            over("digests region", DIGESTS_REGION_LEN_MAX + 1, DIGESTS_REGION_LEN_MAX),
            Status::LimitExceeded,
        ),
        (
            "read regions count says 2, has 1",
            READ,
            args(|w| {
                po(w);
                w.u16(2).u64(0).u64(1);
            }),
            DecodeError::Truncated,
            Status::BadArguments,
        ),
        (
            "flush objects over max",
            FLUSH,
            args(|w| {
                w.u64(7).u16(FLUSH_OBJECTS_MAX as u16 + 1);
            }),
            over("flush objects", FLUSH_OBJECTS_MAX as u64 + 1, FLUSH_OBJECTS_MAX as u64),
            Status::LimitExceeded,
        ),
        (
            "setattr attribute outside mask",
            SETATTR,
            masked(AttrMask::LOGICAL_SIZE.0, AttrMask::LOGICAL_SIZE.union(AttrMask::ACCESS_CONTROL_VERSION)),
            nc("attribute outside the mask is not zero"),
            Status::BadArguments,
        ),
        (
            "setattr fs_specific outside mask",
            SETATTR,
            masked(0, AttrMask::FS_SPECIFIC),
            nc("attribute outside the mask is not zero"),
            Status::BadArguments,
        ),
        (
            "setattr undefined mask bit 13",
            SETATTR,
            masked(1 << 13, AttrMask::default()),
            nc("undefined attribute mask bits"),
            Status::BadArguments,
        ),
        (
            "setattr undefined mask bit 15",
            SETATTR,
            masked(AttrMask::ALL.0 | 1 << 15, AttrMask::ALL),
            nc("undefined attribute mask bits"),
            Status::BadArguments,
        ),
        (
            "setattr reserved attribute field",
            SETATTR,
            reserved_attr,
            nc("reserved attribute field is not zero"),
            Status::BadArguments,
        ),
        (
            "create attribute outside mask",
            CREATE,
            masked(AttrMask::NEARBY_OBJECT.0, AttrMask::LOGICAL_SIZE).split_off(8),
            nc("attribute outside the mask is not zero"),
            Status::BadArguments,
        ),
        (
            "hello client name over max",
            HELLO,
            args(|w| {
                w.u8(1).u8(1).str(&"x".repeat(NAME_LEN_MAX + 1));
            }),
            over("client name", NAME_LEN_MAX as u64 + 1, NAME_LEN_MAX as u64),
            Status::LimitExceeded,
        ),
        (
            "hello client name not UTF-8",
            HELLO,
            args(|w| {
                w.u8(1).u8(1).bytes(&[0xc3, 0x28]);
            }),
            nc("string is not UTF-8"),
            Status::BadArguments,
        ),
    ];
    for (case, op, bytes, want, status) in cases {
        check(case, Request::decode(op, &bytes), want, status);
    }
    // Counts at their limit are accepted.
    let list = args(|w| {
        w.u64(7).u64(0).u16(TXN_LIST_MAX as u16);
    });
    assert_eq!(
        Request::decode(TXN_LIST, &list),
        Ok(Request::TxnList { partition: 7, after_object: 0, max: TXN_LIST_MAX as u16 })
    );
    assert!(
        matches!(Request::decode(READ, &regions(REGIONS_MAX as u16)), Ok(Request::Read { regions, .. }) if regions.len() == REGIONS_MAX)
    );
}

#[test]
fn reply_rejections() {
    use opcode::*;
    let nc = DecodeError::NotCanonical;
    let mut attrs = args(|w| sample_attrs().encode(w));
    attrs[52] = 1;
    let cases: Vec<(&str, u16, Vec<u8>, DecodeError, Status)> = vec![
        ("unknown opcode 0x7777", 0x7777, vec![], DecodeError::UnknownOpcode(0x7777), Status::UnknownOperation),
        ("setdrivekey done with a byte", SET_DRIVE_KEY, vec![0], DecodeError::TrailingBytes(1), Status::BadArguments),
        ("done with a byte", REMOVE, vec![0], DecodeError::TrailingBytes(1), Status::BadArguments),
        ("txnbegin done with a byte", TXN_BEGIN, vec![0], DecodeError::TrailingBytes(1), Status::BadArguments),
        ("txnend was_open 2", TXN_END, vec![2], nc("boolean other than 0 or 1"), Status::BadArguments),
        (
            "txnlist count over max",
            TXN_LIST,
            args(|w| {
                w.u16(TXN_LIST_MAX as u16 + 1);
            }),
            over("transactions", TXN_LIST_MAX as u64 + 1, TXN_LIST_MAX as u64),
            Status::LimitExceeded,
        ),
        (
            "txnlist count says 1, has none",
            TXN_LIST,
            args(|w| {
                w.u16(1);
            }),
            DecodeError::Truncated,
            Status::BadArguments,
        ),
        ("attrs reserved field", GETATTR, attrs, nc("reserved attribute field is not zero"), Status::BadArguments),
        ("attrs truncated", GETATTR, vec![0; ATTRIBUTES_LEN - 1], DecodeError::Truncated, Status::BadArguments),
        (
            "read lengths over max",
            READ,
            args(|w| {
                w.u16(REGIONS_MAX as u16 + 1);
            }),
            over("read lengths", REGIONS_MAX as u64 + 1, REGIONS_MAX as u64),
            Status::LimitExceeded,
        ),
        (
            "inquiry vendor over max",
            INQUIRY,
            args(|w| {
                w.str(&"v".repeat(NAME_LEN_MAX + 1));
            }),
            over("vendor", NAME_LEN_MAX as u64 + 1, NAME_LEN_MAX as u64),
            Status::LimitExceeded,
        ),
        (
            "inquiry partitions over max",
            INQUIRY,
            args(|w| {
                w.str("").str("").str("").raw(&[0; 16]).u32(0).u64(0).u64(0).u16(PARTITIONS_MAX as u16 + 1);
            }),
            over("partitions", PARTITIONS_MAX as u64 + 1, PARTITIONS_MAX as u64),
            Status::LimitExceeded,
        ),
        (
            "inquiry extensions over max",
            INQUIRY,
            args(|w| {
                w.str("").str("").str("").raw(&[0; 16]).u32(0).u64(0).u64(0).u16(0).u16(EXTENSIONS_MAX as u16 + 1);
            }),
            over("extensions", EXTENSIONS_MAX as u64 + 1, EXTENSIONS_MAX as u64),
            Status::LimitExceeded,
        ),
        (
            "inquiry failure domain over max",
            INQUIRY,
            args(|w| {
                w.str("").str("").str("").raw(&[0; 16]).u32(0).u64(0).u64(0).u16(0).u16(0);
                w.str(&"f".repeat(NAME_LEN_MAX + 1));
            }),
            over("failure domain", NAME_LEN_MAX as u64 + 1, NAME_LEN_MAX as u64),
            Status::LimitExceeded,
        ),
        (
            "inquiry without a failure domain",
            INQUIRY,
            args(|w| {
                w.str("").str("").str("").raw(&[0; 16]).u32(0).u64(0).u64(0).u16(0).u16(0);
            }),
            DecodeError::Truncated,
            Status::BadArguments,
        ),
        (
            "extents over max",
            EXTENTS,
            args(|w| {
                w.u64(0).u16(EXTENTS_MAX as u16 + 1);
            }),
            over("extents", EXTENTS_MAX as u64 + 1, EXTENTS_MAX as u64),
            Status::LimitExceeded,
        ),
        (
            "extents: an empty one",
            EXTENTS,
            args(|w| {
                w.u64(100).u16(1).u64(10).u64(0);
            }),
            DecodeError::NotCanonical("extents: empty, overlapping, touching, or past covered_end"),
            Status::BadArguments,
        ),
        (
            "extents: two touching",
            EXTENTS,
            args(|w| {
                w.u64(100).u16(2).u64(0).u64(10).u64(10).u64(5);
            }),
            DecodeError::NotCanonical("extents: empty, overlapping, touching, or past covered_end"),
            Status::BadArguments,
        ),
        (
            "extents: past covered_end",
            EXTENTS,
            args(|w| {
                w.u64(100).u16(1).u64(90).u64(11);
            }),
            DecodeError::NotCanonical("extents: empty, overlapping, touching, or past covered_end"),
            Status::BadArguments,
        ),
        (
            "extents: past u64",
            EXTENTS,
            args(|w| {
                w.u64(u64::MAX).u16(1).u64(u64::MAX).u64(2);
            }),
            DecodeError::NotCanonical("extents: empty, overlapping, touching, or past covered_end"),
            Status::BadArguments,
        ),
        (
            "digests over max",
            DIGESTS,
            args(|w| {
                w.u64(0).u16(DIGESTS_MAX as u16 + 1);
            }),
            over("digests", DIGESTS_MAX as u64 + 1, DIGESTS_MAX as u64),
            Status::LimitExceeded,
        ),
        (
            "digests: count says 2, has 1",
            DIGESTS,
            args(|w| {
                w.u64(0).u16(2).raw(&[7; DIGEST_LEN]);
            }),
            DecodeError::Truncated,
            Status::BadArguments,
        ),
    ];
    for (case, op, bytes, want, status) in cases {
        check(case, Reply::decode(op, &bytes), want, status);
    }

    let msgs: Vec<(&str, Vec<u8>, DecodeError, Status)> = vec![
        ("empty", vec![], DecodeError::Truncated, Status::BadArguments),
        (
            "over max",
            args(|w| {
                w.str(&"e".repeat(ERROR_MESSAGE_LEN_MAX + 1));
            }),
            over("error message", ERROR_MESSAGE_LEN_MAX as u64 + 1, ERROR_MESSAGE_LEN_MAX as u64),
            Status::LimitExceeded,
        ),
        (
            "not UTF-8",
            args(|w| {
                w.bytes(&[0xff]);
            }),
            nc("string is not UTF-8"),
            Status::BadArguments,
        ),
        (
            "trailing byte",
            args(|w| {
                w.str("x").u8(0);
            }),
            DecodeError::TrailingBytes(1),
            Status::BadArguments,
        ),
    ];
    for (case, bytes, want, status) in msgs {
        check(case, decode_error_message(&bytes), want, status);
    }
}

#[test]
fn error_message_truncation() {
    let long = "é".repeat(ERROR_MESSAGE_LEN_MAX); // 2 bytes per char
    let enc = encode_error_message(&long);
    assert_eq!(enc.len(), 2 + ERROR_MESSAGE_LEN_MAX);
    assert_eq!(decode_error_message(&enc).unwrap(), "é".repeat(ERROR_MESSAGE_LEN_MAX / 2));
    // 511 ASCII bytes then a 2-byte char: the char does not fit and is dropped.
    let s = format!("{}é", "a".repeat(ERROR_MESSAGE_LEN_MAX - 1));
    assert_eq!(decode_error_message(&encode_error_message(&s)).unwrap(), "a".repeat(ERROR_MESSAGE_LEN_MAX - 1));
}

#[test]
fn control_object_rejections() {
    let nc = DecodeError::NotCanonical;
    let dc = DriveControl {
        block_size: 4096,
        capacity_bytes: 1 << 30,
        allocated_bytes: 8192,
        partitions: 1,
        clock_ns: 5,
        clock_skew_ns: 6,
        extensions: vec!["x".into()],
    };
    let mut bytes = dc.encode();
    assert_eq!(DriveControl::decode(&bytes).unwrap(), dc);
    assert_eq!(bytes.len(), 4 + 4 + 8 + 8 + 4 + 8 + 8 + 2 + 3);
    bytes.push(0);
    check("drive control trailing", DriveControl::decode(&bytes), DecodeError::TrailingBytes(1), Status::BadArguments);
    bytes.pop();
    bytes[0] = 2;
    check("drive control version 2", DriveControl::decode(&bytes), nc("unknown control format"), Status::BadArguments);

    let pc = PartitionControl { quota_bytes: 1 << 20, used_bytes: 8192, objects_in_use: 5, objects_max: 1 << 20 };
    let mut bytes = pc.encode();
    assert_eq!(bytes.len(), 36);
    assert_eq!(PartitionControl::decode(&bytes).unwrap(), pc);
    bytes[0] = 0;
    check(
        "partition control version 0",
        PartitionControl::decode(&bytes),
        nc("unknown control format"),
        Status::BadArguments,
    );
    check(
        "partition control truncated",
        PartitionControl::decode(&pc.encode()[..35]),
        DecodeError::Truncated,
        Status::BadArguments,
    );
}

#[test]
fn protection_bits() {
    for bits in 0..=u8::MAX {
        let p = Protection::from_bits(bits);
        if bits < 0x40 {
            assert_eq!(p.unwrap().bits(), bits);
        } else {
            assert_eq!(p, Err(DecodeError::NotCanonical("undefined protection bits")));
        }
    }
    let cases = [
        (Protection::NONE, 0),
        (Protection::INTEGRITY_ARGS, 0),
        (Protection::PRIVACY_ARGS, 0),
        (Protection::PRIVACY_CAPABILITY, 0),
        (Protection::INTEGRITY_DATA, DATA_TAG_LEN),
        (Protection::PRIVACY_DATA, DATA_TAG_LEN),
        (Protection::INTEGRITY_DATA.union(Protection::PRIVACY_DATA), DATA_TAG_LEN),
    ];
    for (p, tag) in cases {
        assert_eq!(p.data_tag_len(), tag, "{p:?}");
    }
    assert!(Protection::from_bits(0x1f).unwrap().covers(Protection::PRIVACY_DATA));
    assert!(!Protection::INTEGRITY_ARGS.covers(Protection::INTEGRITY_DATA));
}

#[test]
fn chunking() {
    // (data_len, chunk_len, chunk sizes)
    let cases: &[(u64, u32, &[u32])] = &[
        (0, 0, &[]),
        (1, 512, &[1]),
        (512, 512, &[512]),
        (513, 512, &[512, 1]),
        (1000, 512, &[512, 488]),
        (8, CHUNK_LEN_DEFAULT, &[8]),
    ];
    for &(data_len, chunk_len, sizes) in cases {
        let mut h = request_header(opcode::WRITE, 1);
        h.data_len = data_len;
        h.chunk_len = chunk_len;
        assert_eq!(h.chunk_count(), sizes.len() as u64);
        let got: Vec<u32> = (0..h.chunk_count()).map(|i| h.chunk_size(i)).collect();
        assert_eq!(got, sizes);
    }
}

#[test]
fn status_codes() {
    for (i, s) in Status::ALL.iter().enumerate() {
        assert_eq!(*s as u16, i as u16, "codes are dense from 0");
        assert_eq!(Status::from_code(i as u16), Some(*s));
    }
    assert_eq!(Status::ALL.len(), 48);
    assert_eq!(Status::UnknownExtension as u16, 47);
    assert_eq!(Status::UnknownExtension.name(), "UNKNOWN_EXTENSION");
    assert_eq!(Status::MapEpochMoved as u16, 41);
    assert_eq!(Status::TxnConflict as u16, 42);
    assert_eq!(Status::AuthSchemeRefused as u16, 43);
    assert_eq!(Status::IdentityExpired as u16, 44);
    assert_eq!(Status::NotInPal as u16, 45);
    assert_eq!(Status::PalOverflow as u16, 46);
    assert_eq!(Status::PalOverflow.name(), "PAL_OVERFLOW");
    assert_eq!(Status::TxnConflict.name(), "TXN_CONFLICT");
    assert_eq!(Status::from_code(Status::ALL.len() as u16), None);
    assert_eq!(Status::NoSuchObject.to_string(), "NO_SUCH_OBJECT (10)");
}

// ---------------------------------------------------------------------------
// validate_regions.
// ---------------------------------------------------------------------------

fn reg(offset: u64, length: u64) -> Region {
    Region { offset, length }
}

#[test]
fn region_validation() {
    let m = OBJECT_SIZE_MAX;
    let many = |n: usize| (0..n as u64).map(|i| reg(i * 2, 1)).collect::<Vec<_>>();
    let cases: Vec<(&str, Vec<Region>, Result<u64, Status>)> = vec![
        ("no regions", vec![], Err(Status::LimitExceeded)),
        ("one region", vec![reg(0, 10)], Ok(10)),
        ("REGIONS_MAX regions", many(REGIONS_MAX), Ok(REGIONS_MAX as u64)),
        ("REGIONS_MAX + 1 regions", many(REGIONS_MAX + 1), Err(Status::LimitExceeded)),
        ("adjacent", vec![reg(0, 10), reg(10, 10)], Ok(20)),
        ("out of order, disjoint", vec![reg(100, 1), reg(0, 1), reg(50, 50)], Ok(52)),
        ("overlap", vec![reg(0, 10), reg(9, 10)], Err(Status::RegionsOverlap)),
        ("overlap out of order", vec![reg(20, 5), reg(0, 21)], Err(Status::RegionsOverlap)),
        ("identical", vec![reg(5, 5), reg(5, 5)], Err(Status::RegionsOverlap)),
        ("contained", vec![reg(0, 100), reg(40, 1), reg(200, 1)], Err(Status::RegionsOverlap)),
        ("same offset", vec![reg(7, 1), reg(7, 3)], Err(Status::RegionsOverlap)),
        ("zero length", vec![reg(0, 0)], Err(Status::RegionOutOfRange)),
        ("zero length among others", vec![reg(0, 1), reg(5, 0)], Err(Status::RegionOutOfRange)),
        ("ends at OBJECT_SIZE_MAX", vec![reg(m - 10, 10)], Ok(10)),
        ("whole object range is over DATA_LEN_MAX", vec![reg(0, m)], Err(Status::LimitExceeded)),
        ("exactly DATA_LEN_MAX", vec![reg(0, DATA_LEN_MAX)], Ok(DATA_LEN_MAX)),
        ("total over DATA_LEN_MAX", vec![reg(0, DATA_LEN_MAX), reg(DATA_LEN_MAX, 1)], Err(Status::LimitExceeded)),
        ("past OBJECT_SIZE_MAX", vec![reg(m - 10, 11)], Err(Status::RegionOutOfRange)),
        ("starts at OBJECT_SIZE_MAX", vec![reg(m, 1)], Err(Status::RegionOutOfRange)),
        ("offset u64::MAX", vec![reg(u64::MAX, 1)], Err(Status::RegionOutOfRange)),
        ("offset near u64::MAX", vec![reg(u64::MAX - 1, 2)], Err(Status::RegionOutOfRange)),
        ("length u64::MAX", vec![reg(1, u64::MAX)], Err(Status::RegionOutOfRange)),
        ("both u64::MAX", vec![reg(u64::MAX, u64::MAX)], Err(Status::RegionOutOfRange)),
        // Range errors are reported before overlaps.
        ("overlap and out of range", vec![reg(0, 10), reg(5, 10), reg(m, 1)], Err(Status::RegionOutOfRange)),
    ];
    for (case, regions, want) in cases {
        assert_eq!(validate_regions(&regions), want, "{case}");
    }
}

// ---------------------------------------------------------------------------
// Property tests.
// ---------------------------------------------------------------------------

fn arb_kind() -> impl Strategy<Value = Kind> {
    prop_oneof![Just(Kind::Request), Just(Kind::Reply)]
}

fn arb_key_type() -> impl Strategy<Value = KeyType> {
    prop_oneof![
        Just(KeyType::None),
        Just(KeyType::Master),
        Just(KeyType::Drive),
        Just(KeyType::Partition),
        Just(KeyType::Working),
        Just(KeyType::Capability),
        Just(KeyType::Identity),
    ]
}

/// Valid headers only: every field within its limits.
fn arb_header() -> impl Strategy<Value = FrameHeader> {
    (
        (VERSION_MIN..=VERSION, arb_kind(), any::<u16>(), any::<u64>(), arb_key_type(), 0u8..0x20, any::<u16>()),
        (
            0..=TRACE_ID_LEN_MAX as u16,
            0..=CAPABILITY_LEN_MAX as u16,
            0..=ARGS_LEN_MAX as u32,
            prop_oneof![Just(0u64), 1..=DATA_LEN_MAX, Just(DATA_LEN_MAX)],
            CHUNK_LEN_MIN..=CHUNK_LEN_MAX,
            prop::array::uniform16(any::<u8>()),
        ),
    )
        .prop_map(
            |(
                (version, kind, opcode, request_id, key_type, protection, status),
                (trace_len, capability_len, args_len, data_len, chunk_len, nonce),
            )| FrameHeader {
                version,
                kind,
                opcode,
                request_id,
                key_type,
                protection: Protection::from_bits(protection).unwrap(),
                status: if kind == Kind::Request { 0 } else { status },
                trace_len: if kind == Kind::Request && version >= VERSION_TRACE { trace_len } else { 0 },
                capability_len,
                args_len,
                chunk_len: if data_len == 0 { 0 } else { chunk_len },
                data_len,
                nonce,
            },
        )
}

fn arb_attrs() -> impl Strategy<Value = Attributes> {
    (prop::array::uniform11(any::<u64>()), any::<u32>(), prop::collection::vec(any::<u8>(), FS_SPECIFIC_LEN)).prop_map(
        |(v, block_size, fs)| Attributes {
            access_control_version: v[0],
            nearby_object: v[1],
            copied_object: v[2],
            logical_size: v[3],
            blocks_allocated: v[4],
            blocks_used: v[5],
            block_size,
            create_time: v[6],
            data_modify_time: v[7],
            attribute_modify_time: v[8],
            fs_data_modify_time: v[9],
            fs_attribute_modify_time: v[10],
            fs_specific: fs.try_into().unwrap(),
        },
    )
}

/// A mask of defined bits and attributes zero outside it (the canonical form).
fn arb_masked_attrs() -> impl Strategy<Value = (AttrMask, Attributes)> {
    (0..=AttrMask::ALL.0, arb_attrs()).prop_map(|(m, a)| (AttrMask(m), a.masked(AttrMask(m))))
}

fn arb_regions() -> impl Strategy<Value = Vec<Region>> {
    prop::collection::vec((any::<u64>(), any::<u64>()).prop_map(|(offset, length)| Region { offset, length }), 0..=24)
}

fn arb_name() -> impl Strategy<Value = String> {
    // At most 16 characters of at most 4 bytes: within NAME_LEN_MAX.
    "\\PC{0,16}"
}

fn arb_request() -> impl Strategy<Value = Request> {
    let u = any::<u64>;
    let arms: Vec<BoxedStrategy<Request>> = vec![
        (any::<u8>(), any::<u8>(), arb_name())
            .prop_map(|(min_version, max_version, client)| Request::Hello { min_version, max_version, client })
            .boxed(),
        (u(), arb_masked_attrs())
            .prop_map(|(partition, (mask, attrs))| Request::Create { partition, mask, attrs })
            .boxed(),
        (u(), u()).prop_map(|(partition, object)| Request::Remove { partition, object }).boxed(),
        (u(), u()).prop_map(|(partition, object)| Request::GetAttr { partition, object }).boxed(),
        (u(), u(), arb_masked_attrs())
            .prop_map(|(partition, object, (mask, attrs))| Request::SetAttr { partition, object, mask, attrs })
            .boxed(),
        (u(), u(), arb_regions())
            .prop_map(|(partition, object, regions)| Request::Read { partition, object, regions })
            .boxed(),
        (u(), u(), arb_regions())
            .prop_map(|(partition, object, regions)| Request::Write { partition, object, regions })
            .boxed(),
        (u(), u()).prop_map(|(partition, source)| Request::FastCopy { partition, source }).boxed(),
        (u(), prop::collection::vec(u(), 0..=40))
            .prop_map(|(partition, objects)| Request::Flush { partition, objects })
            .boxed(),
        (u(), u(), arb_regions())
            .prop_map(|(partition, object, regions)| Request::BlocksRequired { partition, object, regions })
            .boxed(),
        (u(), u(), u(), 0..=EXTENTS_MAX as u16)
            .prop_map(|(partition, object, offset, max)| Request::Extents { partition, object, offset, max })
            .boxed(),
        (u(), u(), u(), 0..=DIGESTS_REGION_LEN_MAX)
            .prop_map(|(partition, object, offset, length)| Request::Digests {
                partition,
                object,
                region: Region { offset, length },
            })
            .boxed(),
        u().prop_map(|partition| Request::CreatePartition { partition }).boxed(),
        (u(), any::<bool>()).prop_map(|(partition, force)| Request::RemovePartition { partition, force }).boxed(),
        (u(), u()).prop_map(|(partition, quota_bytes)| Request::ResizePartition { partition, quota_bytes }).boxed(),
        u().prop_map(|partition| Request::FlushPartition { partition }).boxed(),
        (u(), u(), proptest::collection::vec(any::<u8>(), 0..=SEALED_KEY_LEN_MAX))
            .prop_map(|(clock_ns, clock_skew_ns, sealed_master_key)| Request::Initialize {
                clock_ns,
                clock_skew_ns,
                sealed_master_key,
            })
            .boxed(),
        Just(Request::Inquiry).boxed(),
        (u(), u(), u()).prop_map(|(partition, object, txn)| Request::TxnBegin { partition, object, txn }).boxed(),
        (u(), u(), u(), any::<bool>())
            .prop_map(|(partition, object, txn, commit)| Request::TxnEnd { partition, object, txn, commit })
            .boxed(),
        (u(), u(), 0..=TXN_LIST_MAX as u16)
            .prop_map(|(partition, after_object, max)| Request::TxnList { partition, after_object, max })
            .boxed(),
        (u(), any::<u32>()).prop_map(|(partition, epoch)| Request::SetMapEpoch { partition, epoch }).boxed(),
        (u(), u(), arb_object_pal())
            .prop_map(|(partition, object, pal)| Request::SetPal { partition, object, pal })
            .boxed(),
        (u(), u()).prop_map(|(partition, object)| Request::GetPal { partition, object }).boxed(),
        (u(), arb_scheme()).prop_map(|(partition, scheme)| Request::SetAuthScheme { partition, scheme }).boxed(),
        u().prop_map(|partition| Request::GetAuthScheme { partition }).boxed(),
        (u(), u(), arb_pal())
            .prop_map(|(partition, collection, pal)| Request::SetSuperPal { partition, collection, pal })
            .boxed(),
        (u(), u()).prop_map(|(partition, collection)| Request::GetSuperPal { partition, collection }).boxed(),
        (any::<u32>(), proptest::collection::vec(any::<u8>(), 0..=SEALED_KEY_LEN_MAX))
            .prop_map(|(key_id, sealed_key)| Request::SetIdentityKey { key_id, sealed_key })
            .boxed(),
        any::<u32>().prop_map(|key_id| Request::RetireIdentityKey { key_id }).boxed(),
        (u(), u(), arb_name(), proptest::collection::vec(any::<u8>(), 0..=256))
            .prop_map(|(partition, object, name, args)| Request::Extension { partition, object, name, args })
            .boxed(),
    ];
    Union::new(arms)
}

fn arb_scheme() -> impl Strategy<Value = AuthScheme> {
    prop_oneof![Just(AuthScheme::CAPABILITIES), Just(AuthScheme::PALS), Just(AuthScheme::BOTH)]
}

/// Valid PALs only: up to `PAL_ENTRIES_MAX` entries, each with rights
/// within `PAL_RIGHTS`, roles other than 0, in canonical order.
fn arb_pal() -> impl Strategy<Value = Pal> {
    let entry = (0..5u8, 1..=u32::MAX, 1..=PAL_RIGHTS).prop_map(|(kind, id, rights)| PalEntry {
        principal: match kind {
            0 => Principal::Everyone,
            1 | 2 => Principal::User(id),
            _ => Principal::Role(id),
        },
        rights: rights & PAL_RIGHTS | rights::READ,
    });
    prop::collection::vec(entry, 0..=PAL_ENTRIES_MAX).prop_map(Pal::new)
}

fn arb_object_pal() -> impl Strategy<Value = ObjectPal> {
    (any::<u64>(), arb_pal()).prop_map(|(collection, pal)| ObjectPal { collection, pal })
}

fn arb_drive_info() -> impl Strategy<Value = DriveInfo> {
    let partition = (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(
        |(partition, quota_bytes, used_bytes, objects)| PartitionInfo { partition, quota_bytes, used_bytes, objects },
    );
    (
        (arb_name(), arb_name(), arb_name(), prop::array::uniform16(any::<u8>())),
        (any::<u32>(), any::<u64>(), any::<u64>()),
        prop::collection::vec(partition, 0..=8),
        prop::collection::vec(arb_name(), 0..=EXTENSIONS_MAX),
        arb_name(),
    )
        .prop_map(
            |(
                (vendor, model, firmware, drive_id),
                (block_size, capacity_bytes, used_bytes),
                partitions,
                extensions,
                failure_domain,
            )| {
                DriveInfo {
                    vendor,
                    model,
                    firmware,
                    drive_id,
                    block_size,
                    capacity_bytes,
                    used_bytes,
                    partitions,
                    extensions,
                    failure_domain,
                }
            },
        )
}

/// A reply with an opcode it can answer.
fn arb_reply() -> impl Strategy<Value = (u16, Reply)> {
    use opcode::*;
    let u = any::<u64>;
    let done_ops = prop::sample::select(vec![
        REMOVE,
        FLUSH,
        CREATE_PARTITION,
        REMOVE_PARTITION,
        RESIZE_PARTITION,
        FLUSH_PARTITION,
        INITIALIZE,
        TXN_BEGIN,
        SET_MAP_EPOCH,
        SET_PAL,
        SET_AUTH_SCHEME,
        SET_SUPER_PAL,
        SET_IDENTITY_KEY,
        RETIRE_IDENTITY_KEY,
    ]);
    let arms: Vec<BoxedStrategy<(u16, Reply)>> = vec![
        (any::<u8>(), prop::array::uniform16(any::<u8>()), any::<u32>(), any::<u16>(), any::<u32>())
            .prop_map(|(version, drive_id, chunk_len_max, regions_max, block_size)| {
                (HELLO, Reply::Hello { version, drive_id, chunk_len_max, regions_max, block_size })
            })
            .boxed(),
        (prop::sample::select(vec![CREATE, FASTCOPY]), u(), arb_attrs())
            .prop_map(|(op, object, attrs)| (op, Reply::Created { object, attrs }))
            .boxed(),
        (prop::sample::select(vec![GETATTR, SETATTR]), arb_attrs()).prop_map(|(op, a)| (op, Reply::Attrs(a))).boxed(),
        prop::collection::vec(u(), 0..=40).prop_map(|lengths| (READ, Reply::Read { lengths })).boxed(),
        u().prop_map(|length| (WRITE, Reply::Written { length })).boxed(),
        (u(), u())
            .prop_map(|(estimated, maximum)| (BLOCKS_REQUIRED, Reply::BlocksRequired { estimated, maximum }))
            .boxed(),
        arb_drive_info().prop_map(|d| (INQUIRY, Reply::Inquiry(d))).boxed(),
        done_ops.prop_map(|op| (op, Reply::Done)).boxed(),
        any::<bool>().prop_map(|was_open| (TXN_END, Reply::TxnEnded { was_open })).boxed(),
        prop::collection::vec((u(), u(), u()), 0..=40)
            .prop_map(|v| {
                let txns = v.into_iter().map(|(object, txn, begun_ns)| OpenTxn { object, txn, begun_ns }).collect();
                (TXN_LIST, Reply::Txns { txns })
            })
            .boxed(),
        arb_object_pal().prop_map(|p| (GET_PAL, Reply::Pal(p))).boxed(),
        arb_pal().prop_map(|p| (GET_SUPER_PAL, Reply::SuperPal(p))).boxed(),
        arb_scheme().prop_map(|s| (GET_AUTH_SCHEME, Reply::AuthScheme(s))).boxed(),
        proptest::collection::vec(any::<u8>(), 0..=EXTENSION_RESULT_MAX)
            .prop_map(|result| (EXTENSION, Reply::Extension { result }))
            .boxed(),
        (u(), prop::collection::vec((1..1_000_000u64, 1..1_000_000u64), 0..=40))
            .prop_map(|(start, gaps_and_lengths)| {
                // Ascending, with gaps, within covered_end.
                let mut at = start % (1 << 40);
                let extents: Vec<Region> = gaps_and_lengths
                    .into_iter()
                    .map(|(gap, length)| {
                        let e = Region { offset: at + gap, length };
                        at = e.end();
                        e
                    })
                    .collect();
                (EXTENTS, Reply::Extents { covered_end: at + start % 3, extents })
            })
            .boxed(),
        (u(), prop::collection::vec(any::<[u8; DIGEST_LEN]>(), 0..=40))
            .prop_map(|(logical_size, digests)| (DIGESTS, Reply::Digests { logical_size, digests }))
            .boxed(),
    ];
    Union::new(arms)
}

/// Valid bytes with one byte changed, bytes cut off, or bytes appended.
fn mutate(mut bytes: Vec<u8>, how: u8, at: usize, value: u8) -> Vec<u8> {
    match how % 3 {
        0 if !bytes.is_empty() => {
            let i = at % bytes.len();
            bytes[i] = value;
        }
        1 => bytes.truncate(at % (bytes.len() + 1)),
        _ => bytes.resize(bytes.len() + 1 + at % 3, value),
    }
    bytes
}

/// Decodes `bytes` as every opcode's request and reply; whatever decodes must
/// re-encode to exactly `bytes` (one encoding per value).
fn decode_everything(extra_opcode: u16, bytes: &[u8]) -> Result<(), TestCaseError> {
    for &op in OPCODES.iter().chain([extra_opcode].iter()) {
        if let Ok(r) = Request::decode(op, bytes) {
            prop_assert_eq!(r.opcode(), op);
            prop_assert_eq!(r.encode_args(), bytes);
        }
        if let Ok(r) = Reply::decode(op, bytes) {
            prop_assert_eq!(r.encode(), bytes);
        }
    }
    if let Ok(m) = decode_error_message(bytes) {
        prop_assert_eq!(encode_error_message(&m), bytes);
    }
    if let Ok(d) = DriveControl::decode(bytes) {
        prop_assert_eq!(d.encode(), bytes);
    }
    if let Ok(p) = PartitionControl::decode(bytes) {
        prop_assert_eq!(p.encode(), bytes);
    }
    if let Ok(p) = FramePrefix::parse(bytes) {
        prop_assert_eq!(FramePrefix::encode(&p.header, p.capability, p.args, &p.digest), bytes);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn header_round_trip(h in arb_header()) {
        let bytes = h.encode();
        prop_assert_eq!(bytes.len(), HEADER_LEN);
        prop_assert_eq!(FrameHeader::decode(&bytes), Ok(h));
    }

    #[test]
    fn request_round_trip(req in arb_request(), request_id in any::<u64>()) {
        let args = req.encode_args();
        prop_assert_eq!(Request::decode(req.opcode(), &args), Ok(req.clone()));
        // And inside a whole frame prefix.
        let frame = FramePrefix::encode(&FrameHeader::request(req.opcode(), request_id), &[], &args, &ZERO_DIGEST);
        let p = FramePrefix::parse(&frame).unwrap();
        prop_assert_eq!(p.header.request_id, request_id);
        prop_assert_eq!(Request::decode(p.header.opcode, p.args), Ok(req));
    }

    #[test]
    fn reply_round_trip((op, reply) in arb_reply()) {
        prop_assert_eq!(Reply::decode(op, &reply.encode()), Ok(reply));
    }

    #[test]
    fn error_message_round_trip(message in "\\PC{0,600}") {
        let decoded = decode_error_message(&encode_error_message(&message)).unwrap();
        if message.len() <= ERROR_MESSAGE_LEN_MAX {
            prop_assert_eq!(decoded, message);
        } else {
            prop_assert!(message.starts_with(&decoded));
            prop_assert!(decoded.len() > ERROR_MESSAGE_LEN_MAX - 4 && decoded.len() <= ERROR_MESSAGE_LEN_MAX);
        }
    }

    #[test]
    fn control_objects_round_trip(
        v in prop::array::uniform8(any::<u64>()),
        block_size in any::<u32>(),
        partitions in any::<u32>(),
        extensions in prop::collection::vec(arb_name(), 0..=EXTENSIONS_MAX),
    ) {
        let d = DriveControl {
            block_size,
            capacity_bytes: v[0],
            allocated_bytes: v[1],
            partitions,
            clock_ns: v[2],
            clock_skew_ns: v[3],
            extensions,
        };
        prop_assert_eq!(DriveControl::decode(&d.encode()), Ok(d));
        let p = PartitionControl { quota_bytes: v[4], used_bytes: v[5], objects_in_use: v[6], objects_max: v[7] };
        prop_assert_eq!(PartitionControl::decode(&p.encode()), Ok(p));
    }

    /// Arbitrary bytes, decoded as every opcode, never panic; whatever decodes
    /// is canonical.
    #[test]
    fn random_bytes_never_panic(op in any::<u16>(), bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        decode_everything(op, &bytes)?;
    }

    /// Arbitrary header bytes (random, or with valid magic and version so the
    /// later checks run) never panic; whatever decodes re-encodes identically.
    #[test]
    fn random_header_never_panics(bytes in prop::array::uniform32(any::<u8>()), tail in prop::array::uniform24(any::<u8>()), fix in any::<bool>()) {
        let mut head = [0u8; HEADER_LEN];
        head[..32].copy_from_slice(&bytes);
        head[32..].copy_from_slice(&tail);
        if fix {
            head[..4].copy_from_slice(&MAGIC);
            head[4] = VERSION;
        }
        if let Ok(h) = FrameHeader::decode(&head) {
            prop_assert_eq!(h.encode(), head);
        }
    }

    /// Valid encodings with one byte changed, cut short or extended never
    /// panic any decoder; whatever decodes is canonical.
    #[test]
    fn mutated_requests_never_panic(req in arb_request(), how in any::<u8>(), at in any::<usize>(), value in any::<u8>()) {
        let bytes = mutate(req.encode_args(), how, at, value);
        decode_everything(req.opcode(), &bytes)?;
    }

    #[test]
    fn mutated_replies_never_panic((op, reply) in arb_reply(), how in any::<u8>(), at in any::<usize>(), value in any::<u8>()) {
        let bytes = mutate(reply.encode(), how, at, value);
        decode_everything(op, &bytes)?;
    }

    #[test]
    fn mutated_headers_never_panic(h in arb_header(), at in 0..HEADER_LEN, value in any::<u8>()) {
        let mut head = h.encode();
        head[at] = value;
        if let Ok(h) = FrameHeader::decode(&head) {
            prop_assert_eq!(h.encode(), head);
        }
        let frame = FramePrefix::encode(&FrameHeader { capability_len: 0, args_len: 0, ..h }, &[1, 2], &[3], &ZERO_DIGEST);
        decode_everything(0x7777, &frame)?;
    }

    /// validate_regions never panics, and agrees with a brute-force oracle.
    #[test]
    fn regions_match_oracle(regions in prop::collection::vec(
        (prop_oneof![any::<u64>(), 0..64u64, OBJECT_SIZE_MAX - 64..OBJECT_SIZE_MAX + 64],
         prop_oneof![any::<u64>(), 0..64u64]).prop_map(|(offset, length)| Region { offset, length }),
        0..8,
    )) {
        let want = if regions.is_empty() {
            Err(Status::LimitExceeded)
        } else if regions.iter().any(|r| r.length == 0 || !matches!(r.offset.checked_add(r.length), Some(e) if e <= OBJECT_SIZE_MAX)) {
            Err(Status::RegionOutOfRange)
        } else if (0..regions.len()).any(|i| (0..i).any(|j| {
            let (a, b) = (regions[i], regions[j]);
            a.offset < b.end() && b.offset < a.end()
        })) {
            Err(Status::RegionsOverlap)
        } else {
            Ok(regions.iter().map(|r| r.length).sum())
        };
        prop_assert_eq!(validate_regions(&regions), want);
    }
}

#[test]
fn hash_and_mac_needs_data_integrity_and_no_data_privacy() {
    let p = |b: u8| Protection::from_bits(b).unwrap();
    assert!(p(0x23).is_consistent(), "INTEGRITY_ARGS | INTEGRITY_DATA | HASH_AND_MAC");
    assert!(p(0x27).is_consistent(), "with PRIVACY_ARGS");
    assert!(p(0x33).is_consistent(), "with PRIVACY_CAPABILITY");
    assert!(!p(0x21).is_consistent(), "without INTEGRITY_DATA");
    assert!(!p(0x20).is_consistent(), "alone");
    assert!(!p(0x2b).is_consistent(), "with PRIVACY_DATA");
    let consistent: Vec<u8> = (0..0x40u8).filter(|b| p(*b).is_consistent()).collect();
    assert_eq!(consistent.len(), 13 + 4, "13 values without HASH_AND_MAC, 4 with");
}

// ---------------------------------------------------------------------------
// Identity credentials and pre-authorization lists (DSFS).
// ---------------------------------------------------------------------------

fn user(id: u32, rights: u32) -> PalEntry {
    PalEntry { principal: Principal::User(id), rights }
}

fn role(id: u32, rights: u32) -> PalEntry {
    PalEntry { principal: Principal::Role(id), rights }
}

/// A PAL list's raw bytes: `u16` count, then (kind, id, rights) entries.
fn raw_pal(count: u16, entries: &[(u8, u32, u32)]) -> Vec<u8> {
    args(|w| {
        w.u16(count);
        for &(kind, id, rights) in entries {
            w.u8(kind).u32(id).u32(rights);
        }
    })
}

#[test]
fn pal_rejections() {
    let nc = DecodeError::NotCanonical;
    let r = rights::READ;
    let overflow = |n: u64| DecodeError::PalOverflow { entries: n, max: PAL_ENTRIES_MAX as u64 };
    let many = |n: u32| -> Vec<(u8, u32, u32)> { (1..=n).map(|i| (PAL_KIND_USER, i, r)).collect() };
    let cases: Vec<(&str, Vec<u8>, DecodeError, Status)> = vec![
        ("33 entries", raw_pal(33, &many(33)), overflow(33), Status::PalOverflow),
        // The count is checked before any entry is read: no entry need follow.
        ("count u16::MAX", raw_pal(u16::MAX, &[]), overflow(u16::MAX as u64), Status::PalOverflow),
        ("kind 0", raw_pal(1, &[(0, 1, r)]), nc("unknown PAL entry kind"), Status::BadArguments),
        ("kind 4", raw_pal(1, &[(4, 0, r)]), nc("unknown PAL entry kind"), Status::BadArguments),
        (
            "everyone with an id",
            raw_pal(1, &[(PAL_KIND_EVERYONE, 1, r)]),
            nc("PAL everyone entry with an id"),
            Status::BadArguments,
        ),
        (
            "everyone before a role",
            raw_pal(2, &[(PAL_KIND_EVERYONE, 0, r), (PAL_KIND_ROLE, 1, r)]),
            nc("PAL entries out of order or repeated"),
            Status::BadArguments,
        ),
        (
            "everyone twice",
            raw_pal(2, &[(PAL_KIND_EVERYONE, 0, r), (PAL_KIND_EVERYONE, 0, rights::WRITE)]),
            nc("PAL entries out of order or repeated"),
            Status::BadArguments,
        ),
        ("role 0", raw_pal(1, &[(PAL_KIND_ROLE, 0, r)]), nc("PAL entry for role 0"), Status::BadArguments),
        ("no rights", raw_pal(1, &[(PAL_KIND_USER, 1, 0)]), nc("PAL entry grants no rights"), Status::BadArguments),
        (
            "CREATE right",
            raw_pal(1, &[(PAL_KIND_USER, 1, rights::CREATE | r)]),
            nc("undefined or ungrantable PAL rights"),
            Status::BadArguments,
        ),
        (
            "undefined right",
            raw_pal(1, &[(PAL_KIND_USER, 1, 1 << 10 | r)]),
            nc("undefined or ungrantable PAL rights"),
            Status::BadArguments,
        ),
        (
            "role before user",
            raw_pal(2, &[(PAL_KIND_ROLE, 1, r), (PAL_KIND_USER, 1, r)]),
            nc("PAL entries out of order or repeated"),
            Status::BadArguments,
        ),
        (
            "users descending",
            raw_pal(2, &[(PAL_KIND_USER, 2, r), (PAL_KIND_USER, 1, r)]),
            nc("PAL entries out of order or repeated"),
            Status::BadArguments,
        ),
        (
            "user twice",
            raw_pal(2, &[(PAL_KIND_USER, 5, r), (PAL_KIND_USER, 5, rights::WRITE)]),
            nc("PAL entries out of order or repeated"),
            Status::BadArguments,
        ),
        ("count says 2, has 1", raw_pal(2, &[(PAL_KIND_USER, 1, r)]), DecodeError::Truncated, Status::BadArguments),
    ];
    for (case, bytes, want, status) in &cases {
        check(case, Pal::from_bytes(bytes), want.clone(), *status);
        // The same list inside every message that carries one.
        let mut set_pal = args(|w| {
            w.u64(7).u64(16).u64(0);
        });
        set_pal.extend_from_slice(bytes);
        check(case, Request::decode(opcode::SET_PAL, &set_pal), want.clone(), *status);
        let mut set_super = args(|w| {
            w.u64(7).u64(9);
        });
        set_super.extend_from_slice(bytes);
        check(case, Request::decode(opcode::SET_SUPER_PAL, &set_super), want.clone(), *status);
        check(case, Reply::decode(opcode::GET_SUPER_PAL, bytes), want.clone(), *status);
    }
    // Boundaries that must be accepted: exactly PAL_ENTRIES_MAX entries, every grantable right.
    let full = raw_pal(PAL_ENTRIES_MAX as u16, &many(PAL_ENTRIES_MAX as u32));
    assert_eq!(Pal::from_bytes(&full).unwrap().entries.len(), PAL_ENTRIES_MAX);
    assert_eq!(full.len(), PAL_LEN_MAX);
    let all = raw_pal(
        3,
        &[(PAL_KIND_USER, u32::MAX, PAL_RIGHTS), (PAL_KIND_ROLE, 1, PAL_RIGHTS), (PAL_KIND_EVERYONE, 0, PAL_RIGHTS)],
    );
    assert_eq!(Pal::from_bytes(&all).unwrap().to_bytes(), all);
    let mut trailing = raw_pal(0, &[]);
    trailing.push(0);
    check("trailing byte", Pal::from_bytes(&trailing), DecodeError::TrailingBytes(1), Status::BadArguments);
    check(
        "object PAL trailing byte",
        ObjectPal::from_bytes(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
        DecodeError::TrailingBytes(1),
        Status::BadArguments,
    );
}

#[test]
fn pal_new_is_canonical_and_rights_are_the_union_of_user_and_role() {
    let (r, w, g) = (rights::READ, rights::WRITE, rights::GETATTR);
    let pal = Pal::new(vec![role(7, w), user(1000, r), role(3, g), user(1000, g), user(2, r)]);
    assert_eq!(pal.entries, vec![user(2, r), user(1000, r | g), role(3, g), role(7, w)]);
    assert_eq!(Pal::from_bytes(&pal.to_bytes()).unwrap(), pal, "Pal::new gives a list the decoder accepts");
    assert_eq!(pal.rights_for(1000, 7), Some(r | g | w), "user and role entries add up");
    assert_eq!(pal.rights_for(1000, 9), Some(r | g), "a role not in the list adds nothing");
    assert_eq!(pal.rights_for(5, 7), Some(w), "the role alone");
    assert_eq!(pal.rights_for(5, 9), None, "neither user nor role");
    assert_eq!(pal.rights_for(5, ROLE_NONE), None, "no role matches nothing");
    let with_role_0 = Pal { entries: vec![role(ROLE_NONE, r)] };
    assert_eq!(with_role_0.rights_for(5, ROLE_NONE), None, "ROLE_NONE never matches, even a (refused) role-0 entry");
    assert_eq!(Pal::default().rights_for(0, 0), None);
    // The everyone entry: every identity, joined with its own entries; last in canonical order.
    let everyone = PalEntry { principal: Principal::Everyone, rights: r };
    let pal = Pal::new(vec![everyone, role(7, w), user(1000, g)]);
    assert_eq!(pal.entries, vec![user(1000, g), role(7, w), everyone]);
    assert_eq!(Pal::from_bytes(&pal.to_bytes()).unwrap(), pal);
    let [r0, r1, r2, r3] = r.to_le_bytes();
    assert_eq!(&pal.to_bytes()[2 + 2 * PAL_ENTRY_LEN..], &[PAL_KIND_EVERYONE, 0, 0, 0, 0, r0, r1, r2, r3]);
    assert_eq!(pal.rights_for(5, ROLE_NONE), Some(r), "anyone at all");
    assert_eq!(pal.rights_for(1000, 7), Some(r | w | g), "user, role and everyone add up");
    assert_eq!(Pal::new(vec![everyone]).rights_for(u32::MAX, 9), Some(r));
}

#[test]
fn identity_credential_encoding_and_rejections() {
    let id = IdentityData { algorithm: 1, key_id: 2, user: 1000, role: 7, expiration_ns: 0x0102_0304_0506_0708 };
    let bytes = id.encode();
    assert_eq!(bytes.len(), IDENTITY_DATA_LEN);
    assert_eq!(hex::encode(bytes), "0301000002000000e8030000070000000807060504030201");
    assert_eq!(&bytes[0..4], &[IDENTITY_FORMAT, 1, 0, 0]);
    assert_eq!(&bytes[4..8], &2u32.to_le_bytes());
    assert_eq!(&bytes[8..12], &1000u32.to_le_bytes());
    assert_eq!(&bytes[12..16], &7u32.to_le_bytes());
    assert_eq!(&bytes[16..24], &0x0102_0304_0506_0708u64.to_le_bytes());
    assert_eq!(IdentityData::decode(&bytes), Ok(id));
    assert_eq!(id.audit_id(), 1000 << 32 | 7);
    let nc = DecodeError::NotCanonical;
    let patched = |at: usize, v: u8| {
        let mut b = bytes;
        b[at] = v;
        b.to_vec()
    };
    let cases: Vec<(&str, Vec<u8>, DecodeError)> = vec![
        ("23 bytes", bytes[..23].to_vec(), nc("identity credential is not 24 bytes")),
        ("25 bytes", [&bytes[..], &[0]].concat(), nc("identity credential is not 24 bytes")),
        ("empty", vec![], nc("identity credential is not 24 bytes")),
        ("format 1 (a clear capability)", patched(0, 1), nc("not an identity credential")),
        ("format 2 (a sealed capability)", patched(0, 2), nc("not an identity credential")),
        ("reserved byte 2", patched(2, 1), nc("reserved identity bytes are not zero")),
        ("reserved byte 3", patched(3, 0x80), nc("reserved identity bytes are not zero")),
        ("algorithm 0", patched(1, 0), nc("unknown identity algorithm")),
        ("algorithm 3", patched(1, 3), nc("unknown identity algorithm")),
        ("key id 0", IdentityData { key_id: 0, ..id }.encode().to_vec(), nc("identity key id 0")),
    ];
    for (case, b, want) in cases {
        check(case, IdentityData::decode(&b), want, Status::BadArguments);
    }
    let hmac = IdentityData { algorithm: 2, ..id };
    assert_eq!(IdentityData::decode(&hmac.encode()), Ok(hmac));
}

#[test]
fn auth_scheme_rejections() {
    let nc = DecodeError::NotCanonical;
    for (bits, want) in [
        (0u8, nc("an authorization scheme accepts at least one kind")),
        (4, nc("undefined authorization scheme bits")),
        (0x83, nc("undefined authorization scheme bits")),
    ] {
        let req = args(|w| {
            w.u64(7).u8(bits);
        });
        check("set_auth_scheme", Request::decode(opcode::SET_AUTH_SCHEME, &req), want.clone(), Status::BadArguments);
        check("auth scheme reply", Reply::decode(opcode::GET_AUTH_SCHEME, &[bits]), want, Status::BadArguments);
    }
    assert_eq!(AuthScheme::default(), AuthScheme::CAPABILITIES);
    assert!(AuthScheme::BOTH.capabilities() && AuthScheme::BOTH.pals());
    assert!(!AuthScheme::PALS.capabilities() && !AuthScheme::CAPABILITIES.pals());
    assert_eq!(AuthScheme::from_bits(3), Ok(AuthScheme::BOTH));
}
