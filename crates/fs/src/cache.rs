//! The client's capability cache: the last [`FileAccess`] the manager handed
//! out per file (layout, bindings and one capability per component), bounded
//! — one entry per file used, so a long-running client that touches many files
//! would otherwise grow without limit.

use nasd_proto::fs::Ino;
use nasd_proto::manager::FileAccess;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Capability lifetime left at which the client refreshes before using it.
fn refresh_margin(lifetime: Duration) -> Duration {
    (lifetime / 4).max(Duration::from_millis(100))
}

/// A file's capabilities as held by the client.
#[derive(Clone)]
pub(crate) struct Held {
    pub(crate) access: Arc<FileAccess>,
    pub(crate) expires: Instant,
}

impl Held {
    pub(crate) fn new(access: FileAccess) -> Self {
        let expires = Instant::now() + Duration::from_millis(access.lifetime_ms as u64);
        Held { access: Arc::new(access), expires }
    }

    /// Whether the capabilities have more than the refresh margin left.
    pub(crate) fn fresh(&self) -> bool {
        let lifetime = Duration::from_millis(self.access.lifetime_ms as u64);
        Instant::now() + refresh_margin(lifetime) < self.expires
    }

    /// Whether they carry every right in `rights`.
    pub(crate) fn allows(&self, rights: u32) -> bool {
        self.access.rights & rights == rights
    }
}

/// Most files a client keeps capabilities cached for. An entry is a
/// `FileAccess`: ~200 bytes per component with its token, so the full cache
/// costs ~0.8 MiB of single-component files, ~5 MiB of `rs:4+2` files, and
/// at most ~52 MiB if every file had `COMPONENTS_MAX` (64) components.
/// When it is full, expired capabilities are dropped first, then the one
/// obtained longest ago; a file whose capability was dropped asks the
/// manager again when next used.
pub const HELD_CAPABILITIES_MAX: usize = 4096;

const _: () = assert!(HELD_CAPABILITIES_MAX > 0);

/// When `h` was obtained.
fn obtained(h: &Held) -> Instant {
    h.expires.checked_sub(Duration::from_millis(h.access.lifetime_ms as u64)).unwrap_or(h.expires)
}

/// Caches `h` for `ino`, evicting to stay within [`HELD_CAPABILITIES_MAX`].
/// Eviction scans the cache (O(n)), but it happens only when a capability
/// arrives from the manager, which costs a round trip anyway.
pub(crate) fn hold(held: &mut HashMap<Ino, Held>, ino: Ino, h: Held, now: Instant) {
    if !held.contains_key(&ino) && held.len() >= HELD_CAPABILITIES_MAX {
        held.retain(|_, h| h.expires > now);
        if held.len() >= HELD_CAPABILITIES_MAX {
            let oldest = held.iter().min_by_key(|(_, h)| obtained(h)).map(|(&ino, _)| ino);
            if let Some(oldest) = oldest {
                held.remove(&oldest);
            }
        }
    }
    held.insert(ino, h);
    assert!(held.len() <= HELD_CAPABILITIES_MAX, "capability cache over its bound");
}

#[cfg(test)]
mod tests {
    use super::*;
    use nasd_proto::fs::ObjectRef;
    use nasd_proto::layout::{ComponentState, Layout};
    use nasd_proto::manager::{ComponentAccess, FileAccess};

    fn held(obtained: Instant, lifetime_ms: u32) -> Held {
        let component = ComponentAccess {
            object: ObjectRef { drive: 0, partition: 1, object: 16 },
            state: ComponentState::Ok,
            drive_addr: "127.0.0.1:7401".into(),
            drive_id: [0; 16],
            token: vec![0; 88],
            key: [0; 32],
        };
        let access = FileAccess {
            layout: Layout::SINGLE,
            map_epoch: 0,
            rights: 0,
            lifetime_ms,
            min_protection: 0,
            algorithm: 1,
            small_threshold: 0,
            components: vec![component],
        };
        Held { access: Arc::new(access), expires: obtained + Duration::from_millis(lifetime_ms as u64) }
    }

    #[test]
    fn the_cache_stays_bounded_dropping_expired_then_oldest() {
        let t0 = Instant::now();
        let mut cache = HashMap::new();
        // Fill it: even inodes expire early, odd ones live long; later ones were obtained later.
        for ino in 0..HELD_CAPABILITIES_MAX as u64 {
            let lifetime = if ino % 2 == 0 { 1_000 } else { 300_000 };
            hold(&mut cache, ino, held(t0 + Duration::from_millis(ino), lifetime), t0);
        }
        assert_eq!(cache.len(), HELD_CAPABILITIES_MAX);
        // Refreshing a cached file evicts nothing.
        hold(&mut cache, 1, held(t0, 300_000), t0);
        assert_eq!(cache.len(), HELD_CAPABILITIES_MAX);

        // Later, a new file: every expired entry goes, nothing live does.
        let later = t0 + Duration::from_secs(60);
        hold(&mut cache, 1 << 40, held(later, 300_000), later);
        assert_eq!(cache.len(), HELD_CAPABILITIES_MAX / 2 + 1);
        assert!(cache.keys().all(|ino| ino % 2 == 1 || *ino == 1 << 40));

        // Full of live entries: the one obtained longest ago goes.
        let mut ino = 1 << 41;
        while cache.len() < HELD_CAPABILITIES_MAX {
            hold(&mut cache, ino, held(later, 300_000), later);
            ino += 1;
        }
        let oldest = *cache.keys().min_by_key(|i| obtained(&cache[i])).unwrap();
        hold(&mut cache, 7 << 40, held(later, 300_000), later);
        assert_eq!(cache.len(), HELD_CAPABILITIES_MAX);
        assert!(!cache.contains_key(&oldest), "the oldest capability was dropped");
        assert!(cache.contains_key(&(7 << 40)));

        // However many more files are used, it never grows past the bound.
        for ino in 0..100 {
            hold(&mut cache, (9 << 40) + ino, held(later, 300_000), later);
        }
        assert_eq!(cache.len(), HELD_CAPABILITIES_MAX);
    }
}
