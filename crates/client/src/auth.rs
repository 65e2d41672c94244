//! The client half of NASD frame protection (docs/SECURITY.md): which key
//! protects a request, how a request frame is sealed, and how a reply is
//! checked before anything in it is believed.
//!
//! All cryptography is `nasd_crypto::FrameKeys`, the one implementation the
//! drive uses too; this module only decides what goes into it.

use crate::ClientError;
use nasd_crypto::{identity_drive_key, DataProtector, FrameKeys, Key, MacAlgorithm, MacValue};
use nasd_proto::limits::{CAPABILITY_LEN_MAX, DIGEST_LEN, NONCE_LEN};
use nasd_proto::{
    decode_error_message, FrameHeader, FramePrefix, IdentityData, KeyType, Kind, Protection, Status, TraceId,
    CAPABILITY_FORMAT_SEALED,
};

/// The key a client protects its requests with (NASD Table 6), and what the
/// drive needs to find the same key.
#[derive(Clone)]
pub enum Credential {
    /// No key: requests go unprotected (key type `NONE`, protection `NONE`).
    /// Only a drive with security disabled accepts anything but `HELLO` and
    /// `INQUIRY` this way.
    None,
    /// A capability minted by a file manager: the token the drive reads (clear
    /// or sealed; opaque to the client) and the secret capability key.
    Capability {
        /// The capability token sent in every frame.
        token: Vec<u8>,
        /// The capability key (`nasd_crypto::mint_capability`); never sent,
        /// except as a bearer proof under protection `NONE`.
        key: Key,
        /// The capability's MAC algorithm (its `algorithm` argument).
        algorithm: MacAlgorithm,
    },
    /// The drive's master key.
    Master(Key),
    /// The drive key.
    Drive(Key),
    /// A partition key.
    Partition {
        /// The partition the key belongs to.
        partition: u64,
        /// The key.
        key: Key,
    },
    /// A partition's working key of one version.
    Working {
        /// The partition the key belongs to.
        partition: u64,
        /// Its version.
        key_version: u32,
        /// The key.
        key: Key,
    },
    /// An identity from the authentication server (DSFS): the public
    /// credential `K_data` the drive reads and the secret identity key
    /// `idkey = MAC(K, K_data)` (`nasd_crypto::identity_key`). The drive
    /// authorizes requests under it by the objects' pre-authorization lists.
    Identity {
        /// The credential sent in every frame.
        data: IdentityData,
        /// The identity key; never sent.
        key: Key,
    },
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Keys redact themselves; the token is public but only its size matters here.
        match self {
            Credential::None => f.write_str("None"),
            Credential::Capability { token, key, algorithm } => f
                .debug_struct("Capability")
                .field("token_len", &token.len())
                .field("key", key)
                .field("algorithm", algorithm)
                .finish(),
            Credential::Master(k) => f.debug_tuple("Master").field(k).finish(),
            Credential::Drive(k) => f.debug_tuple("Drive").field(k).finish(),
            Credential::Partition { partition, key } => {
                f.debug_struct("Partition").field("partition", partition).field("key", key).finish()
            }
            Credential::Working { partition, key_version, key } => f
                .debug_struct("Working")
                .field("partition", partition)
                .field("key_version", key_version)
                .field("key", key)
                .finish(),
            Credential::Identity { data, key } => {
                f.debug_struct("Identity").field("data", data).field("key", key).finish()
            }
        }
    }
}

impl Credential {
    /// The frame's `key_type` for this credential.
    pub fn key_type(&self) -> KeyType {
        match self {
            Credential::None => KeyType::None,
            Credential::Capability { .. } => KeyType::Capability,
            Credential::Master(_) => KeyType::Master,
            Credential::Drive(_) => KeyType::Drive,
            Credential::Partition { .. } => KeyType::Partition,
            Credential::Working { .. } => KeyType::Working,
            Credential::Identity { .. } => KeyType::Identity,
        }
    }

    fn key(&self) -> Option<&Key> {
        match self {
            Credential::None => None,
            Credential::Capability { key, .. }
            | Credential::Master(key)
            | Credential::Drive(key)
            | Credential::Partition { key, .. }
            | Credential::Working { key, .. }
            | Credential::Identity { key, .. } => Some(key),
        }
    }

    /// The frame's capability field: the token, or the key selector that
    /// names a partition or working key.
    fn capability_field(&self) -> Vec<u8> {
        match self {
            Credential::Capability { token, .. } => token.clone(),
            Credential::Partition { partition, .. } => partition.to_le_bytes().to_vec(),
            Credential::Working { partition, key_version, .. } => {
                let mut s = partition.to_le_bytes().to_vec();
                s.extend_from_slice(&key_version.to_le_bytes());
                s
            }
            Credential::Identity { data, .. } => data.encode().to_vec(),
            Credential::None | Credential::Master(_) | Credential::Drive(_) => Vec::new(),
        }
    }

    fn algorithm(&self) -> MacAlgorithm {
        match self {
            Credential::Capability { algorithm, .. } => *algorithm,
            // An unknown id is refused by `Guard::new` before this is used.
            Credential::Identity { data, .. } => MacAlgorithm::from_id(data.algorithm).unwrap_or(MacAlgorithm::Blake3),
            _ => MacAlgorithm::Blake3,
        }
    }
}

/// What every request of a [`DriveClient`](crate::DriveClient) is protected
/// with: a credential and the protection options (NASD Table 7).
#[derive(Debug, Clone)]
pub struct Auth {
    /// The key.
    pub credential: Credential,
    /// The protection options.
    pub protection: Protection,
}

impl Default for Auth {
    /// No key, no protection (what `HELLO` always uses).
    fn default() -> Self {
        Auth { credential: Credential::None, protection: Protection::NONE }
    }
}

impl Auth {
    /// A credential with protection options.
    pub fn new(credential: Credential, protection: Protection) -> Self {
        Auth { credential, protection }
    }
}

/// Protection used by key-management requests: the digest covers the frame
/// and the arguments (which carry sealed keys and key versions) are encrypted.
pub fn key_management_protection() -> Protection {
    Protection::INTEGRITY_ARGS.union(Protection::PRIVACY_ARGS)
}

/// An [`Auth`] checked and ready to protect frames.
pub(crate) struct Guard {
    key_type: KeyType,
    protection: Protection,
    capability: Vec<u8>,
    keys: Option<FrameKeys>,
}

/// A reply whose digest (if any) verified, with its arguments decrypted.
pub(crate) struct CheckedReply {
    pub header: FrameHeader,
    /// Plaintext arguments (results, or the error message of a failure).
    pub args: Vec<u8>,
    pub digest: [u8; DIGEST_LEN],
    /// True if a key vouches for the reply: its digest is a MAC under the
    /// request's key that verified (not so under `NO_PROTECTION`).
    pub authenticated: bool,
}

impl CheckedReply {
    /// The refusal, for a reply with a status other than OK.
    pub fn refusal(&self) -> Result<(), ClientError> {
        if self.header.status == 0 {
            return Ok(());
        }
        let status = Status::from_code(self.header.status)
            .ok_or_else(|| ClientError::Protocol(format!("unknown status {}", self.header.status)))?;
        let message = decode_error_message(&self.args).unwrap_or_default();
        Err(ClientError::Status { status, message })
    }
}

fn bad_reply(msg: impl Into<String>) -> ClientError {
    ClientError::BadReply(msg.into())
}

impl Guard {
    /// No key, no protection.
    pub fn none() -> Guard {
        Guard { key_type: KeyType::None, protection: Protection::NONE, capability: Vec::new(), keys: None }
    }

    /// Checks that `auth` can be used without harm and prepares its keys.
    ///
    /// Refused locally, before anything is sent: inconsistent protection
    /// options; a key of the hierarchy or an identity without
    /// `INTEGRITY_ARGS` (the digest would be the key itself, handed to every
    /// eavesdropper); an identity with `PRIVACY_CAPABILITY` or an unknown
    /// algorithm; protection
    /// without a key; `PRIVACY_CAPABILITY` with a clear capability token (it
    /// would expose what the caller asked to hide); an oversized token.
    ///
    /// `drive_id` is the drive the requests are for: an identity's frame
    /// key is bound to it (`nasd_crypto::identity_drive_key`); other
    /// credentials' keys are each one drive's already.
    pub fn new(auth: &Auth, drive_id: &[u8; 16]) -> Result<Guard, String> {
        let protection = auth.protection;
        if !protection.is_consistent() {
            return Err(format!("inconsistent protection options {:#04x} (see SECURITY.md)", protection.bits()));
        }
        let key_type = auth.credential.key_type();
        let capability = auth.credential.capability_field();
        let Some(key) = auth.credential.key() else {
            if protection != Protection::NONE {
                return Err("protection options need a key: the credential is None".into());
            }
            return Ok(Guard::none());
        };
        if key_type != KeyType::Capability && !protection.covers(Protection::INTEGRITY_ARGS) {
            return Err(format!(
                "key type {key_type:?} needs INTEGRITY_ARGS: without it the key itself would be sent in the clear"
            ));
        }
        if let Credential::Capability { token, .. } = &auth.credential {
            if token.is_empty() {
                // What a manager sends where the partition accepts PALs only (it mints nothing).
                return Err("no capability (an empty token): where a partition accepts PALs only the manager \
                            mints none; requests there go under an identity"
                    .into());
            }
            if token.len() > CAPABILITY_LEN_MAX {
                return Err(format!("capability token of {} bytes (1..={CAPABILITY_LEN_MAX} allowed)", token.len()));
            }
            if protection.covers(Protection::PRIVACY_CAPABILITY) && token[0] != CAPABILITY_FORMAT_SEALED {
                return Err("PRIVACY_CAPABILITY needs a sealed capability token; this one is clear".into());
            }
        }
        let frame_key = match &auth.credential {
            Credential::Identity { data, key: idkey } => {
                if protection.covers(Protection::PRIVACY_CAPABILITY) {
                    return Err("PRIVACY_CAPABILITY is for capabilities: an identity credential is public".into());
                }
                identity_drive_key(idkey, data, drive_id)
                    .ok_or_else(|| format!("identity credential with unknown MAC algorithm {}", data.algorithm))?
            }
            _ => key.clone(),
        };
        Ok(Guard {
            key_type,
            protection,
            capability,
            keys: Some(FrameKeys::new(auth.credential.algorithm(), &frame_key)),
        })
    }

    /// Bytes of tag after each data chunk of a frame under this guard.
    pub fn data_tag_len(&self) -> usize {
        self.protection.data_tag_len()
    }

    /// Encodes a request frame prefix: sets the header's key type and
    /// protection, encrypts the arguments under `PRIVACY_ARGS`, then computes
    /// the digest over every byte before it (encrypt-then-MAC). The header's
    /// nonce must already be set. Returns the bytes and the digest.
    #[cfg(test)]
    pub fn seal_request(&self, header: &mut FrameHeader, args: Vec<u8>) -> (Vec<u8>, [u8; DIGEST_LEN]) {
        self.seal_traced(header, None, args)
    }

    /// [`seal_request`](Self::seal_request) with the operation's trace id
    /// after the header (a version-2 header), covered by the digest.
    pub fn seal_traced(
        &self,
        header: &mut FrameHeader,
        trace: Option<&TraceId>,
        mut args: Vec<u8>,
    ) -> (Vec<u8>, [u8; DIGEST_LEN]) {
        header.key_type = self.key_type;
        header.protection = self.protection;
        let zero = [0u8; DIGEST_LEN];
        let Some(keys) = &self.keys else {
            return (FramePrefix::encode_traced(header, trace, &self.capability, &args, &zero), zero);
        };
        if self.protection.covers(Protection::PRIVACY_ARGS) {
            keys.crypt_args(Kind::Request, &header.nonce, &mut args);
        }
        let mut bytes = FramePrefix::encode_traced(header, trace, &self.capability, &args, &zero);
        let split = bytes.len() - DIGEST_LEN;
        let digest: MacValue = keys.digest(self.protection, &bytes[..split]);
        bytes[split..].copy_from_slice(&digest);
        (bytes, digest)
    }

    /// The protector of a data section (request data when `kind` is
    /// `Request`, reply data when `Reply`), seeded with its frame's digest;
    /// `None` without a key.
    pub fn data(&self, kind: Kind, nonce: &[u8; NONCE_LEN], digest: &[u8; DIGEST_LEN]) -> Option<DataProtector> {
        self.keys.as_ref().map(|k| k.data(kind, nonce, self.protection, digest))
    }

    /// The Hash-and-MAC checker of a read reply's data under `HASH_AND_MAC`
    /// (seeded with the reply's digest); `None` otherwise. `units` is only
    /// evaluated when it is needed.
    pub fn unit_mac(
        &self,
        digest: &[u8; DIGEST_LEN],
        units: impl FnOnce() -> nasd_crypto::Units,
    ) -> Option<nasd_crypto::UnitMac> {
        match &self.keys {
            Some(k) if self.protection.covers(Protection::HASH_AND_MAC) => Some(k.unit_mac(digest, units())),
            _ => None,
        }
    }

    /// Checks a reply prefix (`frame` = header, capability, arguments,
    /// digest, exactly as received) against the request it must answer.
    ///
    /// - It must be a reply with the request's id and opcode.
    /// - A failure may come back unprotected (key type `NONE`, protection
    ///   `NONE`): the drive could not authenticate the request. It is
    ///   returned unauthenticated; the caller reports its status only.
    /// - Anything else must carry the request's key type and protection and
    ///   a digest that verifies under the request's key; its arguments are
    ///   then decrypted under `PRIVACY_ARGS`.
    pub fn check_reply(
        &self,
        request: &FrameHeader,
        request_digest: &[u8; DIGEST_LEN],
        frame: &[u8],
    ) -> Result<CheckedReply, ClientError> {
        let prefix = FramePrefix::parse(frame)?;
        let header = prefix.header.clone();
        if header.kind != Kind::Reply || header.request_id != request.request_id || header.opcode != request.opcode {
            return Err(bad_reply("the reply does not answer the request (kind, request id or opcode differ)"));
        }
        let unprotected = header.key_type == KeyType::None && header.protection == Protection::NONE;
        if self.keys.is_some() && unprotected && header.status != 0 {
            return Ok(CheckedReply {
                header,
                args: prefix.args.to_vec(),
                digest: prefix.digest,
                authenticated: false,
            });
        }
        if header.key_type != self.key_type || header.protection != self.protection {
            return Err(bad_reply(format!(
                "reply protection ({:?}, {:#04x}) differs from the request's ({:?}, {:#04x})",
                header.key_type,
                header.protection.bits(),
                self.key_type,
                self.protection.bits()
            )));
        }
        let Some(keys) = &self.keys else {
            return Ok(CheckedReply {
                header,
                args: prefix.args.to_vec(),
                digest: prefix.digest,
                authenticated: false,
            });
        };
        let split = frame.len() - DIGEST_LEN;
        if !keys.verify_reply_digest(self.protection, request_digest, &frame[..split], &prefix.digest) {
            return Err(bad_reply(
                "reply digest does not verify: the reply was altered or not made with the request's key",
            ));
        }
        let mut args = prefix.args.to_vec();
        if self.protection.covers(Protection::PRIVACY_ARGS) {
            keys.crypt_args(Kind::Reply, &header.nonce, &mut args);
        }
        // Under NO_PROTECTION the reply's digest is zero: it proves nothing.
        let authenticated = self.protection.covers(Protection::INTEGRITY_ARGS);
        Ok(CheckedReply { header, args, digest: prefix.digest, authenticated })
    }
}
