//! The drive's side of NASD security: the key hierarchy it holds, and the
//! checks it makes on every request before anything else happens
//! (docs/SECURITY.md, "The drive's checks", in that order).
//!
//! State held here: the key ring (persisted as store settings; key changes
//! are serialized by their own lock and written to disk without the
//! ring's), each partition's minimum protection, authorization scheme
//! (`scheme.*`: capabilities, identities or both) and minimum cluster map
//! epoch (`SET_MAP_EPOCH` only raises it; a partition with one starts
//! fenced until the manager readmits it), the nonce window and replay cache,
//! the capability-key cache, and DSFS's identity keys by key id (at most
//! `IDENTITY_KEYS_MAX`, settings `idkey.*`) with the highest id ever
//! installed (ids only grow, so a missing id at or below it is retired, not
//! unknown; `INITIALIZE` forgets them all). No lock a request's checks take
//! is held across disk I/O.
//!
//! A request by identity carries the credential `K_data` where a capability
//! would be; the drive recomputes `idkey` from its shared key and binds it
//! to its own drive id (`identity_key`, `identity_drive_key`: two MACs, no
//! cache), so no request is valid on two drives, then checks the scheme,
//! the minimum protection and the expiry, and `Security::authorize_identity`
//! reads the object's PALs from the store (`nasd_store::Store::pal_view`)
//! in that same check — no decision is cached, so a PAL change applies to
//! the next request. A PAL is interpreted here and nowhere else. PAL sets
//! (`SET_PAL`, `SET_SUPER_PAL`) commit before they answer.

use nasd_crypto::{
    capability_key, ct_eq, identity_drive_key, identity_key, key_context, open_key, unseal_capability, FrameKeys, Key,
    MacAlgorithm, KEY_LEN,
};
use nasd_proto::limits::{IDENTITY_KEYS_MAX, NONCE_LEN};
use nasd_proto::{
    opcode, rights, AuthScheme, CapabilityArgs, FrameHeader, IdentityData, KeyType, Protection, Region, Request,
    SealedCapabilityPrefix, Status, ANY_OBJECT, CAPABILITY_ARGS_LEN, CAPABILITY_FORMAT_CLEAR, CAPABILITY_FORMAT_SEALED,
};
use nasd_store::{PalStamp, Store};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// Most nonces remembered (those inside the window). When full, requests are
/// refused with BUSY rather than forgetting a nonce that could be replayed.
pub const NONCE_CACHE_MAX: usize = 1 << 20;
/// Most computed capability keys cached.
pub const CAPABILITY_CACHE_MAX: usize = 4096;
/// How far ahead of the drive clock an authentic nonce is remembered (so it
/// cannot be replayed once the clock catches up). Farther nonces are refused
/// without being remembered: clients take their time from authenticated
/// replies, so only a clock wrong by more than this could produce one.
pub const FUTURE_NONCE_HORIZON_NS: u64 = 3600 * 1_000_000_000;
/// Most future nonces remembered, so that one key holder cannot fill the
/// replay cache with them.
pub const FUTURE_NONCES_MAX: usize = NONCE_CACHE_MAX / 4;
/// Protection every request needs unless an administrator lowers it.
pub const DEFAULT_MIN_PROTECTION: Protection = Protection::INTEGRITY_ARGS;

/// Prefix of the drive settings holding the partitions' minimum map epochs.
const MAP_EPOCH_SETTING: &str = "mapepoch.";
/// The drive setting holding the highest identity key id ever installed.
const IDENTITY_HIGH_SETTING: &str = "idkey.high";

/// A refusal: the status and a message that never contains key material.
pub type Refusal = (Status, String);

fn refuse<T>(status: Status, msg: impl Into<String>) -> Result<T, Refusal> {
    Err((status, msg.into()))
}

#[derive(Default)]
struct PartitionKeys {
    partition: Option<Key>,
    current: Option<(u32, Key)>,
    previous: Option<(u32, Key)>,
    min: Option<Protection>,
    /// Which credentials the partition accepts (None: the default, capabilities).
    scheme: Option<AuthScheme>,
}

#[derive(Default)]
struct KeyRing {
    master: Option<Key>,
    drive: Option<Key>,
    drive_min: Option<Protection>,
    partitions: HashMap<u64, PartitionKeys>,
    /// The live identity keys (DSFS's shared keys K), by key id; at most
    /// `IDENTITY_KEYS_MAX`.
    identity: BTreeMap<u32, Key>,
    /// The highest identity key id ever installed (since `INITIALIZE`): ids
    /// only grow, so an id at or below it that is not live is retired.
    identity_high: u32,
}

/// Nonces seen inside the window, ordered by time for eviction.
#[derive(Default)]
struct NonceCache {
    /// Nonces at or before the drive clock, inside the window.
    seen: BTreeSet<(u64, u64)>,
    /// Authentic nonces from the future, refused and remembered; they move
    /// to `seen` as the clock passes them.
    future: BTreeSet<(u64, u64)>,
}

/// The key that authenticated a request, and what it may do.
pub struct Authority {
    /// Frame keys for verifying data and protecting the reply (None: no key).
    pub keys: Option<FrameKeys>,
    /// The request's key type.
    pub key_type: KeyType,
    /// The capability, when the key type is CAPABILITY.
    pub capability: Option<CapabilityArgs>,
    /// For PARTITION/WORKING keys: the partition they are bound to.
    pub partition_scope: Option<u64>,
    /// The identity credential, when the key type is IDENTITY.
    pub identity: Option<IdentityData>,
    /// The request's protection (checked against the partition minimum
    /// once the partition is known, for identities).
    pub protection: Protection,
}

impl Authority {
    fn unkeyed(protection: Protection) -> Authority {
        Authority {
            keys: None,
            key_type: KeyType::None,
            capability: None,
            partition_scope: None,
            identity: None,
            protection,
        }
    }

    /// The capability's audit id; for an identity, its user (high 32 bits)
    /// and role (low 32 bits); 0 otherwise.
    pub fn audit_id(&self) -> u64 {
        match (&self.capability, &self.identity) {
            (Some(c), _) => c.audit_id,
            (None, Some(i)) => i.audit_id(),
            (None, None) => 0,
        }
    }
}

/// The key a request names, as found by `Security::resolve_key`.
struct Resolved {
    key: Key,
    alg: MacAlgorithm,
    capability: Option<CapabilityArgs>,
    scope: Option<u64>,
    identity: Option<IdentityData>,
}

impl Resolved {
    fn hierarchy(key: &Key, scope: Option<u64>) -> Resolved {
        Resolved { key: key.clone(), alg: MacAlgorithm::Blake3, capability: None, scope, identity: None }
    }
}

/// The drive's security state.
pub struct Security {
    store: Arc<Store>,
    enabled: bool,
    boot_ns: u64,
    /// Locked only briefly, never across disk I/O: every request reads it.
    keys: Mutex<KeyRing>,
    /// Serializes key changes, which are written to disk while holding it.
    admin: Mutex<()>,
    nonces: Mutex<NonceCache>,
    /// Where the capability-key cache counts its hits and misses.
    pub(crate) metrics: crate::DriveMetrics,
    capability_keys: Mutex<HashMap<[u8; CAPABILITY_ARGS_LEN], Key>>,
    /// Each partition's minimum cluster map epoch (absent: 0), persisted as
    /// the setting `mapepoch.<partition>` (u32, little-endian).
    map_epochs: Mutex<HashMap<u64, u32>>,
    /// Partitions fenced since this start: those with a minimum map epoch
    /// (a manager places their objects) refuse every capability until their
    /// manager readmits the drive with `SET_MAP_EPOCH` — after it finished
    /// what it logged for the drive while it was away (revocations,
    /// removals), so a returning drive never serves a removed or revoked
    /// file's old capabilities (docs/SECURITY.md, "Readmission").
    unadmitted: Mutex<HashSet<u64>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().expect("security state mutex poisoned")
}

fn key_from(bytes: &[u8]) -> Option<Key> {
    <[u8; KEY_LEN]>::try_from(bytes).ok().map(Key::from_bytes)
}

impl Security {
    /// The deliberate bug `nasd_env::Bug::AcceptStaleAcv` (cargo feature
    /// `sim-bugs`, armed only by a simulated world): a capability older than
    /// the object's access-control version passes.
    #[allow(unused_variables)]
    fn stale_acv_bug(&self, object_acv: u64, capability_acv: u64) -> bool {
        #[cfg(feature = "sim-bugs")]
        if capability_acv < object_acv && self.store.env().injected_bug(nasd_env::Bug::AcceptStaleAcv) {
            return true;
        }
        false
    }

    /// Loads the key hierarchy from the store. A drive with no master key yet
    /// takes `master` (provisioned out of band); `enabled: false` turns every
    /// check off (trusted networks and storage-only tests; never the default).
    pub fn open(store: Arc<Store>, master: Option<Key>, enabled: bool) -> Result<Security, String> {
        let mut ring = KeyRing::default();
        for (name, value) in store.settings("").map_err(|e| e.to_string())? {
            Self::load_setting(&mut ring, &name, &value);
        }
        if ring.master.is_none() {
            if let Some(m) = master {
                store
                    .put_settings(&[("key.master".into(), Some(m.expose().to_vec()))])
                    .map_err(|e| format!("cannot store the master key: {e}"))?;
                ring.master = Some(m);
            } else if enabled {
                return Err("the drive has no master key: provide one (--master-key-file)".into());
            }
        }
        let mut map_epochs = HashMap::new();
        for (name, value) in store.settings(MAP_EPOCH_SETTING).map_err(|e| e.to_string())? {
            let partition = name[MAP_EPOCH_SETTING.len()..].parse::<u64>();
            match (partition, <[u8; 4]>::try_from(value.as_slice())) {
                (Ok(p), Ok(v)) => {
                    map_epochs.insert(p, u32::from_le_bytes(v));
                }
                _ => return Err(format!("drive setting {name} is not a partition's map epoch")),
            }
        }
        let unadmitted = map_epochs.iter().filter(|(_, &e)| e > 0).map(|(&p, _)| p).collect();
        let boot_ns = store.nonce_now_ns();
        Ok(Security {
            store,
            enabled,
            boot_ns,
            keys: Mutex::new(ring),
            admin: Mutex::new(()),
            nonces: Mutex::new(NonceCache::default()),
            metrics: crate::DriveMetrics::default(),
            capability_keys: Mutex::new(HashMap::new()),
            map_epochs: Mutex::new(map_epochs),
            unadmitted: Mutex::new(unadmitted),
        })
    }

    fn load_setting(ring: &mut KeyRing, name: &str, value: &[u8]) {
        let part = |ring: &mut KeyRing, p: &str| -> Option<u64> {
            let p: u64 = p.parse().ok()?;
            ring.partitions.entry(p).or_default();
            Some(p)
        };
        match name.split('.').collect::<Vec<_>>().as_slice() {
            ["key", "master"] => ring.master = key_from(value),
            ["key", "drive"] => ring.drive = key_from(value),
            ["minprot", "drive"] => ring.drive_min = value.first().and_then(|b| Protection::from_bits(*b).ok()),
            ["key", "partition", p] => {
                if let Some(p) = part(ring, p) {
                    ring.partitions.get_mut(&p).expect("inserted").partition = key_from(value);
                }
            }
            ["key", "working", p] if value.len() == 2 * (4 + KEY_LEN) => {
                if let Some(p) = part(ring, p) {
                    let slot = |b: &[u8]| {
                        let v = u32::from_le_bytes(b[..4].try_into().expect("4 bytes"));
                        (v != 0).then(|| (v, key_from(&b[4..]).expect("32 bytes")))
                    };
                    let pk = ring.partitions.get_mut(&p).expect("inserted");
                    pk.current = slot(&value[..4 + KEY_LEN]);
                    pk.previous = slot(&value[4 + KEY_LEN..]);
                }
            }
            ["minprot", p] => {
                if let Some(p) = part(ring, p) {
                    ring.partitions.get_mut(&p).expect("inserted").min =
                        value.first().and_then(|b| Protection::from_bits(*b).ok());
                }
            }
            ["mapepoch", _] => {} // Security::open loads them into `map_epochs`
            ["idkey", "high"] => {
                ring.identity_high = <[u8; 4]>::try_from(value).map(u32::from_le_bytes).unwrap_or(u32::MAX);
            }
            ["idkey", id] => {
                if let (Ok(id), Some(k)) = (id.parse::<u32>(), key_from(value)) {
                    ring.identity.insert(id, k);
                }
            }
            ["scheme", p] => {
                if let Some(p) = part(ring, p) {
                    ring.partitions.get_mut(&p).expect("inserted").scheme =
                        value.first().and_then(|b| AuthScheme::from_bits(*b).ok());
                }
            }
            _ => tracing::warn!(setting = name, "unknown drive setting ignored"),
        }
    }

    /// True if checks are on.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Which credentials `partition` accepts for object operations.
    pub fn scheme(&self, partition: u64) -> AuthScheme {
        lock(&self.keys).partitions.get(&partition).and_then(|pk| pk.scheme).unwrap_or_default()
    }

    /// The drive minimum and the partition minimum (if the partition has one).
    fn minimum(&self, partition: Option<u64>) -> Protection {
        let ring = lock(&self.keys);
        let drive = ring.drive_min.unwrap_or(DEFAULT_MIN_PROTECTION);
        let part = partition.and_then(|p| ring.partitions.get(&p)).and_then(|pk| pk.min).unwrap_or(Protection::NONE);
        drive.union(part)
    }

    // ----------------------------------------------------------------- checks

    /// Checks 1–4 of SECURITY.md: protection options, the key, the digest.
    /// A refusal here goes back unprotected (the request did not prove a key).
    pub fn authenticate(
        &self,
        header: &FrameHeader,
        capability: &[u8],
        before_digest: &[u8],
        digest: &[u8],
    ) -> Result<Authority, Refusal> {
        let protection = header.protection;
        if !protection.is_consistent() {
            return refuse(Status::ProtectionUnsupported, "inconsistent protection options (see SECURITY.md)");
        }
        if header.key_type == KeyType::None {
            if protection != Protection::NONE || !capability.is_empty() {
                return refuse(Status::ProtectionUnsupported, "key type NONE carries no protection and no capability");
            }
            return Ok(Authority::unkeyed(protection));
        }
        if header.key_type != KeyType::Capability && !protection.covers(Protection::INTEGRITY_ARGS) {
            return refuse(Status::ProtectionUnsupported, "key-hierarchy and identity keys require INTEGRITY_ARGS");
        }
        if header.key_type == KeyType::Identity && protection.covers(Protection::PRIVACY_CAPABILITY) {
            return refuse(
                Status::ProtectionUnsupported,
                "an identity credential is public: PRIVACY_CAPABILITY is for capabilities",
            );
        }
        if header.key_type == KeyType::Capability
            && protection.covers(Protection::PRIVACY_CAPABILITY)
            && capability.first() != Some(&CAPABILITY_FORMAT_SEALED)
        {
            return refuse(Status::BadCapability, "PRIVACY_CAPABILITY needs a sealed capability");
        }
        let r = self.resolve_key(header, capability)?;
        let keys = FrameKeys::new(r.alg, &r.key);
        if !keys.verify_digest(protection, before_digest, digest) {
            return match r.identity {
                Some(_) => refuse(
                    Status::BadDigest,
                    "request digest does not verify (an identity request is MACed with a key bound to the drive \
                     it is meant for: this drive's id)",
                ),
                None => refuse(Status::BadDigest, "request digest does not verify"),
            };
        }
        if let Some(c) = &r.capability {
            self.remember_key(c, &r.key);
        }
        Ok(Authority {
            keys: Some(keys),
            key_type: header.key_type,
            capability: r.capability,
            partition_scope: r.scope,
            identity: r.identity,
            protection,
        })
    }

    /// Checks 5–8 of SECURITY.md on an authenticated request: protection
    /// levels and the nonce. A refusal here is protected like a reply.
    pub fn check_fresh(&self, auth: &Authority, header: &FrameHeader) -> Result<(), Refusal> {
        if auth.keys.is_none() {
            return Ok(());
        }
        let protection = header.protection;
        let minimum = self.minimum(auth.capability.as_ref().map(|c| c.partition).or(auth.partition_scope));
        if let Some(c) = &auth.capability {
            if !protection.covers(c.min_protection) {
                return refuse(Status::ProtectionTooWeak, "request protection is below the capability's minimum");
            }
            if !c.min_protection.covers(minimum) {
                return refuse(
                    Status::CapabilityBelowMinimum,
                    "capability minimum is below the drive or partition minimum",
                );
            }
        } else if !protection.covers(minimum) {
            return refuse(Status::ProtectionTooWeak, "request protection is below the drive or partition minimum");
        }
        self.check_nonce(&header.nonce)
    }

    /// Finds the key a request names (check 2–3): capability key (computed
    /// or cached), identity key (computed from the credential and the
    /// identity key it names), or a key of the hierarchy.
    fn resolve_key(&self, header: &FrameHeader, capability: &[u8]) -> Result<Resolved, Refusal> {
        let ring = lock(&self.keys);
        let not_set = |what: &str| refuse(Status::KeyNotSet, format!("the {what} key has not been set"));
        let selector = |len: usize| -> Result<u64, Refusal> {
            if capability.len() != len {
                return refuse(Status::BadCapability, format!("this key type needs a {len}-byte key selector"));
            }
            Ok(u64::from_le_bytes(capability[..8].try_into().expect("8 bytes")))
        };
        match header.key_type {
            KeyType::Master | KeyType::Drive => {
                if !capability.is_empty() {
                    return refuse(Status::BadCapability, "drive-level keys take no capability");
                }
                let k = if header.key_type == KeyType::Master { &ring.master } else { &ring.drive };
                match k {
                    Some(k) => Ok(Resolved::hierarchy(k, None)),
                    None => not_set(if header.key_type == KeyType::Master { "master" } else { "drive" }),
                }
            }
            KeyType::Partition => {
                let p = selector(8)?;
                match ring.partitions.get(&p).and_then(|pk| pk.partition.as_ref()) {
                    Some(k) => Ok(Resolved::hierarchy(k, Some(p))),
                    None => not_set("partition"),
                }
            }
            KeyType::Working => {
                let p = selector(12)?;
                let version = u32::from_le_bytes(capability[8..12].try_into().expect("4 bytes"));
                match Self::working_key(&ring, p, version) {
                    Some(k) => Ok(Resolved::hierarchy(&k, Some(p))),
                    None => refuse(
                        Status::KeyVersionRetired,
                        format!("working key version {version} is not current or previous"),
                    ),
                }
            }
            KeyType::Capability => {
                let args = self.open_capability(&ring, capability)?;
                let alg = MacAlgorithm::from_id(args.algorithm)
                    .ok_or((Status::BadCapability, "unknown MAC algorithm".into()))?;
                let working = Self::working_key(&ring, args.partition, args.key_version).ok_or((
                    Status::KeyVersionRetired,
                    format!("working key version {} is not current or previous", args.key_version),
                ))?;
                drop(ring);
                let key = self.cached_capability_key(&working, &args)?;
                Ok(Resolved { key, alg, capability: Some(args), scope: None, identity: None })
            }
            KeyType::Identity => {
                let data = IdentityData::decode(capability)
                    .map_err(|e| (Status::BadCapability, format!("malformed identity credential: {e}")))?;
                let shared = match ring.identity.get(&data.key_id) {
                    Some(k) => k.clone(),
                    None if data.key_id <= ring.identity_high => {
                        return refuse(
                            Status::KeyVersionRetired,
                            format!("identity key {} is retired: get a new identity key", data.key_id),
                        )
                    }
                    None => return refuse(Status::KeyNotSet, format!("identity key {} has not been set", data.key_id)),
                };
                drop(ring);
                let alg = MacAlgorithm::from_id(data.algorithm)
                    .ok_or((Status::BadCapability, "unknown MAC algorithm".into()))?;
                // The frame key is bound to this drive: a request MACed for another drive
                // (the same identity, object number and PAL there) fails the digest here.
                let key = identity_key(&shared, &data)
                    .and_then(|idkey| identity_drive_key(&idkey, &data, &self.store.drive_id()))
                    .ok_or((Status::BadCapability, "unknown MAC algorithm".into()))?;
                Ok(Resolved { key, alg, capability: None, scope: None, identity: Some(data) })
            }
            KeyType::None => unreachable!("handled by the caller"),
        }
    }

    fn working_key(ring: &KeyRing, partition: u64, version: u32) -> Option<Key> {
        let pk = ring.partitions.get(&partition)?;
        [&pk.current, &pk.previous].into_iter().flatten().find(|(v, _)| *v == version).map(|(_, k)| k.clone())
    }

    fn open_capability(&self, ring: &KeyRing, token: &[u8]) -> Result<CapabilityArgs, Refusal> {
        match token.first() {
            Some(&CAPABILITY_FORMAT_CLEAR) => {
                CapabilityArgs::decode(token).map_err(|e| (Status::BadCapability, format!("malformed capability: {e}")))
            }
            Some(&CAPABILITY_FORMAT_SEALED) => {
                let prefix = SealedCapabilityPrefix::decode(token)
                    .map_err(|e| (Status::BadCapability, format!("malformed sealed capability: {e}")))?;
                let working = Self::working_key(ring, prefix.partition, prefix.key_version).ok_or((
                    Status::KeyVersionRetired,
                    format!("working key version {} is not current or previous", prefix.key_version),
                ))?;
                unseal_capability(&working, token)
                    .ok_or((Status::BadCapability, "sealed capability does not open".into()))
            }
            _ => refuse(Status::BadCapability, "missing or unknown capability format"),
        }
    }

    /// The capability key from the cache, or computed (not cached yet: only
    /// keys whose request digest verified are cached, see [`Self::remember_key`]).
    fn cached_capability_key(&self, working: &Key, args: &CapabilityArgs) -> Result<Key, Refusal> {
        if let Some(k) = lock(&self.capability_keys).get(&args.encode()) {
            self.metrics.capability_key_cache(true);
            return Ok(k.clone());
        }
        self.metrics.capability_key_cache(false);
        capability_key(working, args).ok_or((Status::BadCapability, "unknown MAC algorithm".into()))
    }

    /// Caches a capability key that just authenticated a request, so forged
    /// requests cannot churn the cache.
    fn remember_key(&self, args: &CapabilityArgs, key: &Key) {
        let mut cache = lock(&self.capability_keys);
        if cache.len() >= CAPABILITY_CACHE_MAX {
            cache.clear();
        }
        cache.entry(args.encode()).or_insert_with(|| key.clone());
    }

    /// Checks 7–8: the nonce is inside the window, after the drive started,
    /// and new. Only called after the digest verified, so an attacker cannot
    /// fill the cache.
    fn check_nonce(&self, nonce: &[u8; NONCE_LEN]) -> Result<(), Refusal> {
        let time = u64::from_le_bytes(nonce[..8].try_into().expect("8 bytes"));
        let seq = u64::from_le_bytes(nonce[8..].try_into().expect("8 bytes"));
        // The nonce clock never steps back: the window never reopens below what the cache forgot.
        let now = self.store.nonce_now_ns();
        let skew = self.store.clock_skew_ns();
        let floor = now.saturating_sub(skew).max(self.boot_ns);
        let outside =
            || refuse(Status::NonceOutsideWindow, format!("nonce time is outside the drive's window ({skew} ns skew)"));
        if time < floor {
            return outside();
        }
        let mut cache = lock(&self.nonces);
        while cache.future.first().is_some_and(|f| f.0 <= now) {
            let f = cache.future.pop_first().expect("checked");
            cache.seen.insert(f);
        }
        while cache.seen.first().is_some_and(|f| f.0 < floor) {
            cache.seen.pop_first();
        }
        if cache.seen.contains(&(time, seq)) || cache.future.contains(&(time, seq)) {
            return refuse(Status::NonceReplayed, "nonce seen before: replayed request");
        }
        // Never accept a nonce ahead of the drive clock: everything executed
        // before a restart then carries a time before the next start, which
        // `floor` refuses without stored state. (With `now + skew` here, a
        // request stamped up to `skew` ahead could be replayed right after a
        // restart.) A client ahead of the drive learns its clock from this
        // authenticated refusal and retries.
        let ceiling = now;
        if time > ceiling {
            // An authentic nonce from the future is refused now but, within a
            // bounded horizon and number, remembered, so that the same request
            // cannot be replayed once the clock catches up.
            if time <= ceiling.saturating_add(FUTURE_NONCE_HORIZON_NS) && cache.future.len() < FUTURE_NONCES_MAX {
                cache.future.insert((time, seq));
            }
            return outside();
        }
        if cache.seen.len() >= NONCE_CACHE_MAX {
            return refuse(Status::Busy, "replay cache full; retry shortly");
        }
        cache.seen.insert((time, seq));
        Ok(())
    }

    /// Checks 9–14: the decoded request against its authority. Returns what
    /// the execution must still enforce.
    pub fn authorize(&self, auth: &Authority, req: &Request) -> Result<Grant, Refusal> {
        let full = Ok(Grant::default());
        let class = class_of(req);
        match (&class, auth.key_type) {
            (Class::Open, _) => full,
            (_, KeyType::None) if !self.enabled => full,
            (Class::Master, KeyType::Master) | (Class::Drive, KeyType::Drive) => full,
            (Class::Partition(_) | Class::Object { .. } | Class::ObjectOwner(_), KeyType::Drive) => full,
            (Class::Partition(p), KeyType::Partition)
            | (Class::Object { partition: p, .. } | Class::ObjectOwner(p), KeyType::Partition | KeyType::Working) => {
                if auth.partition_scope == Some(*p) {
                    full
                } else {
                    refuse(Status::WrongObject, "the key is for another partition")
                }
            }
            (Class::Object { .. }, KeyType::Capability) => self.authorize_capability(
                auth.capability.as_ref().expect("capability key type has a capability"),
                req,
                &class,
            ),
            (Class::Object { .. }, KeyType::Identity) => self.authorize_identity(
                auth.identity.as_ref().expect("identity key type has an identity"),
                auth.protection,
                req,
                &class,
            ),
            _ => refuse(Status::WrongKeyType, format!("key type {:?} may not authorize this operation", auth.key_type)),
        }
    }

    fn authorize_capability(&self, cap: &CapabilityArgs, req: &Request, class: &Class) -> Result<Grant, Refusal> {
        let Class::Object { partition, objects, right, regions } = class else { unreachable!("object class") };
        if !self.scheme(*partition).capabilities() {
            return refuse(
                Status::AuthSchemeRefused,
                format!("partition {partition} accepts identities and PALs only, not capabilities"),
            );
        }
        if self.store.now_ns() > cap.expiration_ns {
            return refuse(Status::CapabilityExpired, "capability expired");
        }
        if !ct_eq(&cap.drive_id, &self.store.drive_id()) {
            return refuse(Status::WrongDrive, "capability is for another drive");
        }
        if cap.partition != *partition {
            return refuse(Status::WrongObject, "capability is for another partition");
        }
        for &o in objects {
            if cap.object != ANY_OBJECT && cap.object != o {
                return refuse(Status::WrongObject, "capability is for another object");
            }
        }
        if matches!(req, Request::Create { .. }) && cap.object != ANY_OBJECT {
            return refuse(Status::WrongObject, "create needs a partition-wide capability (object 0)");
        }
        let min_epoch = self.min_map_epoch(*partition);
        if cap.map_epoch < min_epoch {
            return refuse(
                Status::MapEpochMoved,
                format!(
                    "the cluster map moved (capability epoch {}, partition minimum {min_epoch}): fetch new bindings from the manager",
                    cap.map_epoch
                ),
            );
        }
        if lock(&self.unadmitted).contains(partition) {
            return refuse(
                Status::MapEpochMoved,
                "the drive restarted and its manager has not readmitted it yet: fetch new bindings from the manager",
            );
        }
        let mut grant = Grant::default();
        if cap.object != ANY_OBJECT {
            // An object whose version cannot be read (gone, or its
            // partition) is refused here with that error: never a pass.
            let acv =
                self.store.access_control_version(*partition, cap.object).map_err(|e| (e.status(), e.to_string()))?;
            if acv != cap.access_control_version && !self.stale_acv_bug(acv, cap.access_control_version) {
                return refuse(
                    Status::AccessRevoked,
                    "the object's access control version changed: capability revoked",
                );
            }
            // Checked again where a write installs, under the object's lock.
            grant.access_control_version = Some(cap.access_control_version).filter(|&v| v == acv);
        }
        let mut needed = *right;
        if let Request::SetAttr { mask, .. } = req {
            if mask.contains(nasd_proto::AttrMask::ACCESS_CONTROL_VERSION) {
                needed |= rights::SET_ACV;
            }
        }
        if needed == rights::WRITE && cap.rights & rights::WRITE == 0 && cap.rights & rights::APPEND != 0 {
            // The store checks "at or past the end" under the object's lock.
            needed = rights::APPEND;
            grant.append_only = true;
        }
        if cap.rights & needed != needed {
            return refuse(Status::RightsInsufficient, "capability rights do not cover this operation");
        }
        if let Some(regions) = regions {
            if !regions.iter().all(|r| cap.covers(r)) {
                return refuse(Status::RegionNotInCapability, "a region lies outside the capability's region");
            }
        }
        Ok(grant)
    }

    /// Checks a request by identity (DSFS §3.2): the partition accepts
    /// identities, the request's protection covers the partition's minimum,
    /// the credential has not expired, and for every object the request
    /// names, the entries of its access PAL and its collection's super PAL
    /// that name the user or the role grant the operation's right. No
    /// capability and no manager: one lookup in the store's PALs.
    fn authorize_identity(
        &self,
        id: &IdentityData,
        protection: Protection,
        req: &Request,
        class: &Class,
    ) -> Result<Grant, Refusal> {
        let Class::Object { partition, objects, right, .. } = class else { unreachable!("object class") };
        if matches!(req, Request::Create { .. }) {
            return refuse(
                Status::WrongKeyType,
                "an identity does not create objects: the partition's manager does, and sets their PALs",
            );
        }
        if !self.scheme(*partition).pals() {
            return refuse(
                Status::AuthSchemeRefused,
                format!("partition {partition} accepts capabilities only, not identities"),
            );
        }
        if !protection.covers(self.minimum(Some(*partition))) {
            return refuse(Status::ProtectionTooWeak, "request protection is below the drive or partition minimum");
        }
        if self.store.now_ns() > id.expiration_ns {
            return refuse(
                Status::IdentityExpired,
                "identity key expired: get a new one from the authentication server",
            );
        }
        if objects.is_empty() {
            return refuse(Status::NotInPal, "a request by identity must name the objects whose PALs allow it");
        }
        let mut needed = *right;
        if let Request::SetAttr { mask, .. } = req {
            if mask.contains(nasd_proto::AttrMask::ACCESS_CONTROL_VERSION) {
                needed |= rights::SET_ACV;
            }
        }
        let mut grant = Grant::default();
        for &o in objects {
            // An object (or partition) that is gone is refused with that error: never a pass.
            let view = self.store.pal_view(*partition, o).map_err(|e| (e.status(), e.to_string()))?;
            let Some(have) = view.rights_for(id.user, id.role) else {
                return refuse(
                    Status::NotInPal,
                    format!("neither user {} nor role {} is in the PALs of object {o}", id.user, id.role),
                );
            };
            let mut need = needed;
            if need == rights::WRITE && have & rights::WRITE == 0 && have & rights::APPEND != 0 {
                // The store checks "at or past the end" under the object's lock.
                need = rights::APPEND;
                grant.append_only = true;
            }
            if have & need != need {
                return refuse(
                    Status::RightsInsufficient,
                    format!("the PALs of object {o} do not grant this operation"),
                );
            }
            // Checked again where a write installs, under the object's lock.
            grant.pal = Some(view.stamp);
        }
        Ok(grant)
    }

    // --------------------------------------------------------- key management
    //
    // Key changes are serialized by `admin` and written durably (an SQLite
    // commit with fsync) while only `admin` is held: the key ring itself is
    // locked only to read the keys a change needs and to install it after it
    // is on disk, so no request's key lookup waits for a disk write. All of
    // these run on blocking threads (`tasks::blocking`).

    /// Executes a key-management request (already authenticated and
    /// authorized). Keys are opened with the key above them and stored
    /// durably before the drive uses them.
    pub fn manage(&self, req: &Request) -> Result<(), Refusal> {
        let _admin = lock(&self.admin);
        let Some(change) = self.plan(req)? else {
            return Ok(()); // nothing to change (a retired identity key retired again)
        };
        #[cfg(feature = "fault-injection")]
        crate::tasks::fault::settings_write();
        self.store.put_settings(&change.settings()).map_err(io_refusal)?;
        let mut ring = lock(&self.keys);
        #[cfg(feature = "sim-bugs")]
        let kept = self.retired_key_kept(&ring, &change);
        let clears_capability_keys = change.install(&mut ring);
        #[cfg(feature = "sim-bugs")]
        if let Some((partition, old)) = kept {
            ring.partitions.entry(partition).or_default().previous = Some(old);
        }
        drop(ring);
        if clears_capability_keys {
            lock(&self.capability_keys).clear();
        }
        Ok(())
    }

    /// The deliberate bug `nasd_env::Bug::KeepRetiredWorkingKey` (cargo
    /// feature `sim-bugs`, armed only by a simulated world): a new working
    /// key leaves the oldest one in place as previous, the one it should
    /// retire.
    #[cfg(feature = "sim-bugs")]
    fn retired_key_kept(&self, ring: &KeyRing, change: &KeyChange) -> Option<(u64, (u32, Key))> {
        let KeyChange::Working { partition, .. } = change else { return None };
        if !self.store.env().injected_bug(nasd_env::Bug::KeepRetiredWorkingKey) {
            return None;
        }
        ring.partitions.get(partition)?.previous.clone().map(|old| (*partition, old))
    }

    /// What `req` changes, checked against the ring (which only `admin`
    /// holders change, so it stays valid until installed); None if nothing.
    fn plan(&self, req: &Request) -> Result<Option<KeyChange>, Refusal> {
        let ring = lock(&self.keys);
        let bad_seal = || (Status::BadSealedKey, "sealed key does not open under the authorizing key".to_string());
        Ok(Some(match req {
            Request::SetDriveKey { sealed_key } => {
                let master = ring.master.as_ref().ok_or((Status::KeyNotSet, "no master key".into()))?;
                let k =
                    open_key(master, &key_context(opcode::SET_DRIVE_KEY, 0, 0), sealed_key).map_err(|_| bad_seal())?;
                KeyChange::Drive(k)
            }
            Request::SetPartitionKey { partition, sealed_key } => {
                let drive = ring.drive.as_ref().ok_or((Status::KeyNotSet, "no drive key".into()))?;
                let k = open_key(drive, &key_context(opcode::SET_PARTITION_KEY, *partition, 0), sealed_key)
                    .map_err(|_| bad_seal())?;
                KeyChange::Partition(*partition, k)
            }
            Request::SetWorkingKey { partition, key_version, sealed_key } => {
                let pk = ring.partitions.get(partition);
                let pkey =
                    pk.and_then(|pk| pk.partition.as_ref()).ok_or((Status::KeyNotSet, "no partition key".into()))?;
                let k = open_key(pkey, &key_context(opcode::SET_WORKING_KEY, *partition, *key_version), sealed_key)
                    .map_err(|_| bad_seal())?;
                let previous = pk.and_then(|pk| pk.current.clone());
                let current = previous.as_ref().map_or(0, |(v, _)| *v);
                if *key_version <= current {
                    return refuse(Status::BadArguments, format!("working key version must exceed {current}"));
                }
                KeyChange::Working { partition: *partition, current: (*key_version, k), previous }
            }
            Request::SetMinProtection { partition, protection } => {
                if !protection.is_consistent() {
                    return refuse(Status::BadArguments, "inconsistent protection options (see SECURITY.md)");
                }
                KeyChange::Minimum { partition: *partition, protection: *protection }
            }
            Request::SetIdentityKey { key_id, sealed_key } => {
                let drive = ring.drive.as_ref().ok_or((Status::KeyNotSet, "no drive key".into()))?;
                let k = open_key(drive, &key_context(opcode::SET_IDENTITY_KEY, 0, *key_id), sealed_key)
                    .map_err(|_| bad_seal())?;
                if *key_id <= ring.identity_high {
                    return refuse(
                        Status::BadArguments,
                        format!("identity key ids only grow: {key_id} is not above {}", ring.identity_high),
                    );
                }
                if ring.identity.len() >= IDENTITY_KEYS_MAX {
                    return refuse(
                        Status::TooMany,
                        format!("{IDENTITY_KEYS_MAX} identity keys are live: retire one first"),
                    );
                }
                KeyChange::Identity { key_id: *key_id, key: k }
            }
            Request::RetireIdentityKey { key_id } => {
                if *key_id == 0 || *key_id > ring.identity_high {
                    return refuse(Status::BadArguments, format!("identity key {key_id} was never installed"));
                }
                if !ring.identity.contains_key(key_id) {
                    return Ok(None);
                }
                KeyChange::RetireIdentity { key_id: *key_id }
            }
            Request::SetAuthScheme { partition, scheme } => {
                if *partition == 0 {
                    return refuse(Status::BadArguments, "partition 0 has no authorization scheme");
                }
                KeyChange::Scheme { partition: *partition, scheme: *scheme }
            }
            _ => unreachable!("not a key-management request"),
        }))
    }

    /// A partition's minimum cluster map epoch (0 until raised).
    pub fn min_map_epoch(&self, partition: u64) -> u32 {
        lock(&self.map_epochs).get(&partition).copied().unwrap_or(0)
    }

    /// `SET_MAP_EPOCH`: raises a partition's minimum cluster map epoch,
    /// durably before it applies, and readmits the partition (ends the
    /// fence a restart put up on its capabilities). It only grows: a lower
    /// epoch is `BAD_ARGUMENTS`, the same one only readmits. Partition 0 names no
    /// partition (`BAD_ARGUMENTS`); like the keys and minimum protections,
    /// the partition need not exist yet.
    pub fn set_map_epoch(&self, partition: u64, epoch: u32) -> Result<(), Refusal> {
        if partition == 0 {
            return refuse(Status::BadArguments, "partition 0 has no map epoch");
        }
        // Held across the durable write: concurrent setters are ordered.
        let mut epochs = lock(&self.map_epochs);
        let current = epochs.get(&partition).copied().unwrap_or(0);
        if epoch < current {
            return refuse(
                Status::BadArguments,
                format!("the map epoch only grows: partition {partition} is at {current}, not {epoch}"),
            );
        }
        if epoch > current {
            let name = format!("{MAP_EPOCH_SETTING}{partition}");
            self.store
                .put_settings(&[(name, Some(epoch.to_le_bytes().to_vec()))])
                .map_err(|e| (e.status(), e.to_string()))?;
            epochs.insert(partition, epoch);
        }
        lock(&self.unadmitted).remove(&partition);
        Ok(())
    }

    /// Opens the new master key of an `initialize` (the current one if none
    /// is given) before anything is erased, so a bad request changes nothing.
    pub fn open_new_master(&self, sealed_master_key: &[u8]) -> Result<Key, Refusal> {
        let ring = lock(&self.keys);
        let master = ring.master.as_ref().ok_or((Status::KeyNotSet, "no master key".into()))?;
        if sealed_master_key.is_empty() {
            return Ok(master.clone());
        }
        open_key(master, &key_context(opcode::INITIALIZE, 0, 0), sealed_master_key)
            .map_err(|_| (Status::BadSealedKey, "sealed key does not open under the authorizing key".to_string()))
    }

    /// The key half of `initialize`: forgets every key and minimum, keeps
    /// `new_master` as the master key.
    pub fn reset(&self, new_master: Key) -> Result<(), Refusal> {
        let _admin = lock(&self.admin);
        let mut changes: Vec<(String, Option<Vec<u8>>)> =
            self.store.settings("").map_err(io_refusal)?.into_iter().map(|(k, _)| (k, None)).collect();
        changes.push(("key.master".into(), Some(new_master.expose().to_vec())));
        self.store.put_settings(&changes).map_err(io_refusal)?;
        *lock(&self.keys) = KeyRing { master: Some(new_master), ..KeyRing::default() };
        lock(&self.capability_keys).clear();
        lock(&self.map_epochs).clear();
        lock(&self.unadmitted).clear();
        Ok(())
    }

    /// Forgets a removed partition's keys and minimum.
    pub fn forget_partition(&self, partition: u64) -> Result<(), Refusal> {
        let _admin = lock(&self.admin);
        let changes = [
            (format!("key.partition.{partition}"), None),
            (format!("key.working.{partition}"), None),
            (format!("minprot.{partition}"), None),
            (format!("scheme.{partition}"), None),
            (format!("{MAP_EPOCH_SETTING}{partition}"), None),
        ];
        self.store.put_settings(&changes).map_err(io_refusal)?;
        lock(&self.keys).partitions.remove(&partition);
        lock(&self.capability_keys).clear();
        lock(&self.map_epochs).remove(&partition);
        lock(&self.unadmitted).remove(&partition);
        Ok(())
    }
}

fn io_refusal(e: nasd_store::StoreError) -> Refusal {
    (e.status(), e.to_string())
}

/// One key-management change, planned under the key ring's lock, written to
/// disk without it, then installed.
enum KeyChange {
    Drive(Key),
    Partition(u64, Key),
    Working { partition: u64, current: (u32, Key), previous: Option<(u32, Key)> },
    Minimum { partition: u64, protection: Protection },
    Identity { key_id: u32, key: Key },
    RetireIdentity { key_id: u32 },
    Scheme { partition: u64, scheme: AuthScheme },
}

impl KeyChange {
    /// The drive settings that record the change (written in one transaction).
    fn settings(&self) -> Vec<(String, Option<Vec<u8>>)> {
        match self {
            KeyChange::Identity { key_id, key } => vec![
                (format!("idkey.{key_id}"), Some(key.expose().to_vec())),
                (IDENTITY_HIGH_SETTING.into(), Some(key_id.to_le_bytes().to_vec())),
            ],
            KeyChange::RetireIdentity { key_id } => vec![(format!("idkey.{key_id}"), None)],
            KeyChange::Scheme { partition, scheme } => {
                vec![(format!("scheme.{partition}"), Some(vec![scheme.bits()]))]
            }
            other => vec![other.setting()],
        }
    }

    /// The one drive setting that records a change of the key hierarchy.
    fn setting(&self) -> (String, Option<Vec<u8>>) {
        match self {
            KeyChange::Identity { .. } | KeyChange::RetireIdentity { .. } | KeyChange::Scheme { .. } => {
                unreachable!("recorded by `settings`")
            }
            KeyChange::Drive(k) => ("key.drive".into(), Some(k.expose().to_vec())),
            KeyChange::Partition(p, k) => (format!("key.partition.{p}"), Some(k.expose().to_vec())),
            KeyChange::Working { partition, current, previous } => {
                let mut value = Vec::with_capacity(2 * (4 + KEY_LEN));
                for slot in [Some(current), previous.as_ref()] {
                    match slot {
                        Some((v, k)) => {
                            value.extend_from_slice(&v.to_le_bytes());
                            value.extend_from_slice(k.expose());
                        }
                        None => value.extend_from_slice(&[0u8; 4 + KEY_LEN]),
                    }
                }
                (format!("key.working.{partition}"), Some(value))
            }
            KeyChange::Minimum { partition: 0, protection } => ("minprot.drive".into(), Some(vec![protection.bits()])),
            KeyChange::Minimum { partition, protection } => {
                (format!("minprot.{partition}"), Some(vec![protection.bits()]))
            }
        }
    }

    /// Puts the change into the ring; true if cached capability keys must go
    /// (the working keys changed).
    fn install(self, ring: &mut KeyRing) -> bool {
        match self {
            KeyChange::Drive(k) => ring.drive = Some(k),
            KeyChange::Partition(p, k) => ring.partitions.entry(p).or_default().partition = Some(k),
            KeyChange::Working { partition, current, previous } => {
                let pk = ring.partitions.entry(partition).or_default();
                pk.previous = previous;
                pk.current = Some(current);
                return true;
            }
            KeyChange::Minimum { partition: 0, protection } => ring.drive_min = Some(protection),
            KeyChange::Minimum { partition, protection } => {
                ring.partitions.entry(partition).or_default().min = Some(protection)
            }
            KeyChange::Identity { key_id, key } => {
                ring.identity.insert(key_id, key);
                ring.identity_high = key_id;
            }
            KeyChange::RetireIdentity { key_id } => {
                ring.identity.remove(&key_id);
            }
            KeyChange::Scheme { partition, scheme } => {
                ring.partitions.entry(partition).or_default().scheme = Some(scheme)
            }
        }
        false
    }
}

/// What an authorized request may do beyond what its class implies, and
/// what its execution must check again where it changes the object.
#[derive(Debug, Clone, Copy, Default)]
pub struct Grant {
    /// A write allowed only at or past the object's end (`APPEND` right).
    pub append_only: bool,
    /// The access control version of the capability (for one object) that
    /// authorized the request: a write installs only if the object still
    /// has it, checked under the object's lock (`nasd_store::WriteCheck`), so
    /// a revocation that completed while its data streamed refuses it.
    pub access_control_version: Option<u64>,
    /// The PALs a request by identity was authorized against: a write
    /// installs only if they are still the same (`nasd_store::WriteCheck`),
    /// so a PAL replaced while its data streamed refuses it.
    pub pal: Option<PalStamp>,
}

/// What authority an operation needs.
pub enum Class {
    /// Anyone (HELLO, INQUIRY).
    Open,
    /// The master key.
    Master,
    /// The drive key.
    Drive,
    /// The partition key of this partition (or the drive key).
    Partition(u64),
    /// The owner of an object's security attribute: the drive key, or the
    /// partition or working key of this partition — never a capability or
    /// an identity (PALs are the manager's decisions, DSFS §3.2).
    ObjectOwner(u64),
    /// A capability (or a working, partition or drive key) for these objects.
    Object {
        /// The partition.
        partition: u64,
        /// Objects the request names (empty for create).
        objects: Vec<u64>,
        /// The right needed.
        right: u32,
        /// Regions the capability must cover.
        regions: Option<Vec<Region>>,
    },
}

/// The authority `req` needs.
pub fn class_of(req: &Request) -> Class {
    use Request::*;
    let obj = |partition: u64, objects: Vec<u64>, right: u32, regions: Option<&Vec<Region>>| Class::Object {
        partition,
        objects,
        right,
        regions: regions.cloned(),
    };
    match req {
        Hello { .. } | Inquiry | GetAuthScheme { .. } => Class::Open,
        Initialize { .. } | SetDriveKey { .. } => Class::Master,
        SetIdentityKey { .. } | RetireIdentityKey { .. } => Class::Drive,
        SetAuthScheme { partition, .. } | SetSuperPal { partition, .. } | GetSuperPal { partition, .. } => {
            Class::Partition(*partition)
        }
        SetPal { partition, .. } | GetPal { partition, .. } => Class::ObjectOwner(*partition),
        CreatePartition { .. }
        | RemovePartition { .. }
        | ResizePartition { .. }
        | FlushPartition { .. }
        | SetPartitionKey { .. }
        | ReadAudit { .. }
        | Scrub { .. } => Class::Drive,
        SetMinProtection { partition: 0, .. } => Class::Drive,
        SetMinProtection { partition, .. }
        | SetWorkingKey { partition, .. }
        | TxnBegin { partition, .. }
        | TxnEnd { partition, .. }
        | TxnList { partition, .. }
        | SetMapEpoch { partition, .. } => Class::Partition(*partition),
        Create { partition, .. } => obj(*partition, vec![], rights::CREATE, None),
        Extension { partition, object, .. } => obj(*partition, vec![*object], rights::READ, None),
        Remove { partition, object } => obj(*partition, vec![*object], rights::REMOVE, None),
        GetAttr { partition, object } => obj(*partition, vec![*object], rights::GETATTR, None),
        SetAttr { partition, object, .. } => obj(*partition, vec![*object], rights::SETATTR, None),
        Read { partition, object, regions } => obj(*partition, vec![*object], rights::READ, Some(regions)),
        Write { partition, object, regions } => obj(*partition, vec![*object], rights::WRITE, Some(regions)),
        BlocksRequired { partition, object, regions } => obj(*partition, vec![*object], rights::GETATTR, Some(regions)),
        // What follows `offset` is described: the capability must cover it all.
        Extents { partition, object, offset, .. } => {
            obj(*partition, vec![*object], rights::READ, Some(&vec![extents_span(*offset)]))
        }
        // A block's digest confirms a guess of its bytes: the data's business.
        Digests { partition, object, region } => obj(*partition, vec![*object], rights::READ, Some(&vec![*region])),
        FastCopy { partition, source } => obj(*partition, vec![*source], rights::FASTCOPY, None),
        Flush { partition, objects } => obj(*partition, objects.clone(), rights::FLUSH, None),
    }
}

/// The bytes an `EXTENTS` from `offset` may describe: all from there to
/// `OBJECT_SIZE_MAX` (empty at or past it).
fn extents_span(offset: u64) -> Region {
    let max = nasd_proto::limits::OBJECT_SIZE_MAX;
    Region { offset: offset.min(max), length: max - offset.min(max) }
}

/// The partition, object and first region a request names, for the audit trail.
pub fn audit_target(req: &Request) -> (u64, u64, Region) {
    use Request::*;
    let none = Region { offset: 0, length: 0 };
    match req {
        Read { partition, object, regions }
        | Write { partition, object, regions }
        | BlocksRequired { partition, object, regions } => {
            (*partition, *object, regions.first().copied().unwrap_or(none))
        }
        Remove { partition, object }
        | GetAttr { partition, object }
        | SetAttr { partition, object, .. }
        | TxnBegin { partition, object, .. }
        | TxnEnd { partition, object, .. }
        | SetPal { partition, object, .. }
        | GetPal { partition, object } => (*partition, *object, none),
        Extension { partition, object, .. } => (*partition, *object, none),
        FastCopy { partition, source } => (*partition, *source, none),
        Extents { partition, object, offset, .. } => (*partition, *object, Region { offset: *offset, length: 0 }),
        Digests { partition, object, region } => (*partition, *object, *region),
        Flush { partition, objects } => (*partition, objects.first().copied().unwrap_or(0), none),
        Create { partition, .. }
        | CreatePartition { partition }
        | RemovePartition { partition, .. }
        | ResizePartition { partition, .. }
        | FlushPartition { partition }
        | SetPartitionKey { partition, .. }
        | SetWorkingKey { partition, .. }
        | SetMinProtection { partition, .. }
        | TxnList { partition, .. }
        | SetMapEpoch { partition, .. }
        | SetAuthScheme { partition, .. }
        | GetAuthScheme { partition } => (*partition, 0, none),
        SetSuperPal { partition, collection, .. } | GetSuperPal { partition, collection } => {
            (*partition, *collection, none)
        }
        Hello { .. }
        | Inquiry
        | Initialize { .. }
        | SetDriveKey { .. }
        | ReadAudit { .. }
        | Scrub { .. }
        | SetIdentityKey { .. }
        | RetireIdentityKey { .. } => (0, 0, none),
    }
}
