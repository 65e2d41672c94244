//! Revocations racing requests in flight, and their checker.
//!
//! Now and then (times from the seed) a holder asks the manager for a read
//! capability to a client's file, and then uses it directly on one of the
//! file's drives, again and again at times drawn from the seed, while the
//! administrator — after a delay drawn from the seed, so the revocation
//! lands before, between or after the holder's requests — does one of:
//!
//! - a `chmod` of the file (its mode toggled between `0644` and `0600`);
//! - an ACL change of the file (a named user's entry set or dropped);
//! - two rotations of the working key of the drive the holder uses (the
//!   manager's `rotate`, as its maintenance does when keys age): the drive
//!   keeps a current and a previous working key, so the second rotation
//!   retires the key the holder's capability was minted with.
//!
//! The property (docs/SECURITY.md: chmod and ACL changes "before the
//! reply", working keys "current or previous"): once the revocation was
//! acknowledged, no request sent afterwards under the older capability is
//! served by the drive. A request sent before the acknowledgement may be
//! served or refused. A revocation that failed (the manager down, a drive
//! unreachable for the rotation) acknowledges nothing and is not judged.
//!
//! The holder's capability is obtained before the revocation is sent, so
//! it is older than the revocation whatever the network does. The races
//! run with every fault of the run, and their traffic reorders with the
//! workload's.

use super::*;
use nasd_client::{Auth, ClientError, Credential, DriveClient};
use nasd_crypto::{Key, MacAlgorithm};
use nasd_proto::acl::{AclEntry, AclWho, ACL_READ};
use nasd_proto::manager::{ComponentAccess, OpenMode};
use nasd_proto::{CapabilityArgs, Protection, Region};

/// The holder of the capabilities the races revoke.
const HOLDER_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 70, 1));
/// Most requests the holder sends under one capability.
const USES_MAX: u64 = 10;
/// Longest pause between two of the holder's requests.
const USE_PAUSE_MAX: Duration = Duration::from_millis(600);
/// Longest delay before the administrator revokes.
const REVOKE_DELAY_MAX: Duration = Duration::from_millis(1500);
/// The bytes each of the holder's reads asks for.
const USE_BYTES: u64 = 4096;
/// A uid that holds no file: the ACL races grant and take its read right.
const ACL_UID: u32 = 4242;
/// The share of races that retire a shared identity key (the others
/// revoke a capability).
const IDENTITY_RACES: f64 = 0.25;

/// What the administrator does to cut the holder off.
#[derive(Debug, Clone, Copy)]
enum Revocation {
    Chmod(u32),
    Acl,
    RotateTwice,
}

/// One request of the holder: when it was sent, and whether it was served.
struct Use {
    sent: Instant,
    served: bool,
}

impl Cluster {
    /// Races revocations with requests in flight until shortly before the
    /// end (the faults' quiet time).
    pub(super) async fn revocation_races(self: Arc<Self>) {
        let node = Host::new(&self.core, "holder", HOLDER_IP, 1 << 20).boot();
        let fs = loop {
            match self.log_in(&node).await {
                Ok(fs) => break fs,
                Err(e) => {
                    self.core.log(format!("holder login failed: {}", short(&e)));
                    if Instant::now() >= self.end {
                        return;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        let quiet = self.end - Duration::from_secs(5);
        while Instant::now() < quiet {
            tokio::time::sleep(between(&self.core, Duration::from_secs(1), Duration::from_secs(6))).await;
            if self.core.chance(IDENTITY_RACES) {
                self.identity_race(&node, &fs).await;
            } else {
                self.race(&node, &fs).await;
            }
        }
    }

    /// One identity race: the holder logs in at the authentication server
    /// (its identity under the newest shared key) and opens a session with
    /// it at the manager, which it uses again and again while the
    /// administrator retires that shared key (a new one made first) and has
    /// the manager synchronize the identity keys. Once the synchronization
    /// returned, no request of the session sent afterwards is served, and
    /// no new session opens with the identity.
    async fn identity_race(&self, node: &Arc<Node>, fs: &FsClient) {
        let grant = match self.grant(node).await {
            Ok(g) => g,
            Err(e) => {
                self.core.log(format!("holder identity login failed: {}", short(&e)));
                return;
            }
        };
        let key_id = grant.0.key_id;
        // No renewal: the session keeps the identity it opened with.
        let config = FsConfig { identity: Some(grant), identity_source: None, ..self.fs_config(node) };
        let session = match FsClient::connect(&config).await {
            Ok(s) => s,
            Err(e) => {
                self.core.log(format!("holder identity session failed: {}", short(&e)));
                return;
            }
        };
        self.core.log(format!("identity race: a session under shared key {key_id} against its retirement"));
        let uses = async {
            let mut uses = Vec::new();
            for _ in 0..self.core.gen_range(1..USES_MAX + 1) {
                tokio::time::sleep(between(&self.core, Duration::ZERO, USE_PAUSE_MAX)).await;
                let sent = Instant::now();
                // One `WALK` at the manager: nothing cached answers it.
                let served = match session.lstat("/stripe").await {
                    Ok(_) => true,
                    Err(e) => {
                        self.core.log(format!("holder identity request refused: {}", short(&e)));
                        false
                    }
                };
                if served {
                    self.core.log("holder identity request served");
                }
                uses.push(Use { sent, served });
            }
            uses
        };
        let revoke = async {
            tokio::time::sleep(between(&self.core, Duration::ZERO, REVOKE_DELAY_MAX)).await;
            self.retire_shared_key(node, fs, key_id).await
        };
        let (uses, acknowledged) = tokio::join!(uses, revoke);
        let Some(at) = acknowledged else { return };
        for u in uses.iter().filter(|u| u.served && u.sent >= at) {
            self.fail(format!(
                "the holder's identity session under shared key {key_id} was served, sent {:?} after the key's retirement returned",
                u.sent - at
            ));
        }
    }

    /// The administrator makes a new shared key at the authentication
    /// server and retires `key_id`, then has the manager synchronize the
    /// identity keys; when that returned, if everything did.
    async fn retire_shared_key(&self, node: &Arc<Node>, fs: &FsClient, key_id: u32) -> Option<Instant> {
        let done = async {
            let mut admin = self.auth_session(node).await?;
            let new = admin.rotate_key().await.map_err(|e| format!("rotate: {:?}", e.status()))?;
            self.core.log(format!("shared key {new} made"));
            admin.retire_key(key_id).await.map_err(|e| format!("retire: {:?}", e.status()))?;
            self.core.log(format!("shared key {key_id} retired at the authentication server"));
            fs.sync_identity_keys().await.map_err(|e| format!("sync identity keys: {}", short(&e)))
        }
        .await;
        match done {
            Ok(()) => {
                self.core.log(format!("retirement of shared key {key_id} returned"));
                Some(Instant::now())
            }
            Err(e) => {
                self.core.log(format!("retirement of shared key {key_id} failed: {e}"));
                None
            }
        }
    }

    /// One race: a capability obtained, then used while it is revoked.
    async fn race(&self, node: &Arc<Node>, fs: &FsClient) {
        let c = self.core.gen_range(0..self.clients.len() as u64) as usize;
        let path = self.pick_path(c);
        let entry = match fs.walk(&path, OpenMode::Read).await {
            Ok(e) => e,
            Err(e) => {
                self.core.log(format!("holder walk {path}: {}", short(&e)));
                return;
            }
        };
        let handle = entry.handle();
        let Some(access) = entry.access else { return };
        let usable: Vec<&ComponentAccess> =
            access.components.iter().filter(|c| c.state == ComponentState::Ok && !c.token.is_empty()).collect();
        if usable.is_empty() {
            return;
        }
        let held = usable[self.core.gen_range(0..usable.len() as u64) as usize].clone();
        let Ok(args) = CapabilityArgs::decode(&held.token) else {
            self.fail(format!("the manager minted a capability for {path} that does not decode"));
            return;
        };
        let revocation = match self.core.gen_range(0..3) {
            0 => Revocation::Chmod(if entry.attr.mode & 0o777 == 0o600 { 0o644 } else { 0o600 }),
            1 => Revocation::Acl,
            _ => Revocation::RotateTwice,
        };
        self.core.log(format!(
            "race on {path}: object {} on drive {} (access-control version {}, working key {}) against {revocation:?}",
            held.object.object, held.object.drive, args.access_control_version, args.key_version
        ));
        let algorithm = MacAlgorithm::from_id(access.algorithm).unwrap_or(MacAlgorithm::Blake3);
        let protection = Protection::from_bits(access.min_protection)
            .unwrap_or(Protection::INTEGRITY_ARGS)
            .union(Protection::INTEGRITY_ARGS);
        let auth = Auth::new(
            Credential::Capability { token: held.token.clone(), key: Key::from_bytes(held.key), algorithm },
            protection,
        );
        let uses = self.use_capability(node, &held, auth);
        let revoke = async {
            tokio::time::sleep(between(&self.core, Duration::ZERO, REVOKE_DELAY_MAX)).await;
            self.revoke(fs, &path, handle, revocation, held.object.drive).await
        };
        let (uses, acknowledged) = tokio::join!(uses, revoke);
        let Some(at) = acknowledged else { return };
        for u in uses.iter().filter(|u| u.served && u.sent >= at) {
            self.fail(format!(
                "the holder's read of {path} (object {} on drive {}) under access-control version {} and working key {} was served, sent {:?} after {revocation:?} returned",
                held.object.object,
                held.object.drive,
                args.access_control_version,
                args.key_version,
                u.sent - at
            ));
        }
    }

    /// Reads with `auth` at times drawn from the seed; what was served.
    async fn use_capability(&self, node: &Arc<Node>, held: &ComponentAccess, auth: Auth) -> Vec<Use> {
        let Ok(addr) = held.drive_addr.parse::<SocketAddr>() else { return Vec::new() };
        let env = node.env();
        let mut conn: Option<DriveClient> = None;
        let mut uses = Vec::new();
        for _ in 0..self.core.gen_range(1..USES_MAX + 1) {
            tokio::time::sleep(between(&self.core, Duration::ZERO, USE_PAUSE_MAX)).await;
            if conn.is_none() {
                match DriveClient::connect_in(&env, addr, CLIENT_WAIT).await {
                    Ok(mut c) => {
                        c.set_auth(auth.clone());
                        conn = Some(c);
                    }
                    Err(e) => {
                        self.core.log(format!("holder cannot connect to drive {}: {e}", held.object.drive));
                        continue;
                    }
                }
            }
            let c = conn.as_mut().expect("just connected");
            let sent = Instant::now();
            let region = [Region { offset: 0, length: USE_BYTES }];
            let served = match c.read(held.object.partition, held.object.object, &region).await {
                Ok(_) => {
                    self.core.log("holder read served");
                    true
                }
                Err(ClientError::Status { status, .. }) => {
                    self.core.log(format!("holder read refused: {status}"));
                    // Refused for the revocation (or a fence, a moved map,
                    // an object gone): nothing was served.
                    false
                }
                Err(e) => {
                    self.core.log(format!("holder read failed: {e}"));
                    conn = None;
                    false
                }
            };
            uses.push(Use { sent, served });
        }
        uses
    }

    /// Carries out `revocation` on the file `handle` names (`path` when
    /// the race began: a rename since must not move the revocation to
    /// another file); when it was acknowledged, if it was.
    async fn revoke(
        &self,
        fs: &FsClient,
        path: &str,
        handle: nasd_fs::Handle,
        revocation: Revocation,
        drive: u32,
    ) -> Option<Instant> {
        let done = match revocation {
            Revocation::Chmod(mode) => {
                let change = nasd_fs::SetAttr { mode: Some(mode), ..Default::default() };
                fs.setattr(handle, &change).await.map(|_| ()).map_err(|e| short(&e))
            }
            Revocation::Acl => {
                let entries = if self.core.chance(0.5) {
                    vec![AclEntry { who: AclWho::User(ACL_UID), rights: ACL_READ, flags: 0 }]
                } else {
                    Vec::new()
                };
                fs.set_acl_of(handle, entries).await.map(|_| ()).map_err(|e| short(&e))
            }
            Revocation::RotateTwice => self.rotate_twice(drive).await,
        };
        match done {
            Ok(()) => {
                self.core.log(format!("{revocation:?} of {path} returned"));
                Some(Instant::now())
            }
            Err(e) => {
                self.core.log(format!("{revocation:?} of {path} failed: {e}"));
                None
            }
        }
    }

    /// Two rotations of `drive`'s working key by the running manager, each
    /// as a task of its node (a crash of the manager ends it).
    async fn rotate_twice(&self, drive: u32) -> Result<(), String> {
        for _ in 0..2 {
            let (node, manager) = match lock(&self.manager.running).as_ref() {
                Some(r) => (r.node.clone(), r.manager.clone()),
                None => return Err("the manager is down".into()),
            };
            let handle = manager
                .drives()
                .into_iter()
                .find(|h| h.drive == drive)
                .ok_or_else(|| format!("the manager has no drive {drive}"))?;
            let rotation = node.env().spawn(async move { manager.rotate(&handle).await });
            match rotation.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(format!("{:?}", e.status)),
                Err(_) => return Err("the manager died".into()),
            }
        }
        Ok(())
    }
}
