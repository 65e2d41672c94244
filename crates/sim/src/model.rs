//! What a client may read back from an object: the reference model the
//! checkers compare every read with.
//!
//! One writer per object, one request at a time, so the object's history is
//! a sequence of states. The model keeps the current state, the one
//! alternative an unanswered change may have left (a write whose reply was
//! lost may or may not have installed — never half: writes are atomic), and
//! every state a crash may fall back to: the state the last acknowledged
//! flush made durable, and each state after it (a background commit may
//! have made any of them durable; a commit is a consistent cut, so a crash
//! leaves one of them, never a mix).

/// The states an object may be in.
#[derive(Debug, Clone)]
pub struct ObjectModel {
    /// The state every acknowledged change leads to.
    pub current: Vec<u8>,
    /// The states unanswered changes lead to, if they installed (more than
    /// one only when a change that does not depend on the state it finds —
    /// a truncation to nothing — followed one).
    pub maybe: Vec<Vec<u8>>,
    /// States a crash of the drive may leave, oldest first; the first was
    /// made durable by an acknowledged flush (or read back after a restart).
    pub durable: Vec<Vec<u8>>,
    /// The drive restarted since the object was last read: it holds one of
    /// `durable`.
    pub crashed: bool,
}

/// A read the model cannot explain.
#[derive(Debug)]
pub struct Violation(pub String);

fn describe(bytes: &[u8]) -> String {
    format!("{} bytes, blake3 {}", bytes.len(), &blake3::hash(bytes).to_hex()[..16])
}

impl ObjectModel {
    /// A new, empty object (made durable by its creation's commit).
    pub fn new() -> Self {
        ObjectModel { current: Vec::new(), maybe: Vec::new(), durable: vec![Vec::new()], crashed: false }
    }

    /// True if the next request must be a read that settles the state.
    pub fn unsettled(&self) -> bool {
        self.crashed || !self.maybe.is_empty()
    }

    /// The state after writing `data` at `offset` to `base`.
    pub fn written(base: &[u8], offset: u64, data: &[u8]) -> Vec<u8> {
        let mut v = base.to_vec();
        let end = offset as usize + data.len();
        if v.len() < end {
            v.resize(end, 0);
        }
        v[offset as usize..end].copy_from_slice(data);
        v
    }

    /// The state after setting the size of `base` to `size`.
    pub fn resized(base: &[u8], size: u64) -> Vec<u8> {
        let mut v = base.to_vec();
        v.resize(size as usize, 0);
        v
    }

    /// A change to `next`, made on a settled object, was acknowledged.
    pub fn acknowledged(&mut self, next: Vec<u8>) {
        debug_assert!(self.maybe.is_empty(), "changes are made only on a settled object");
        self.durable.push(next.clone());
        self.current = next;
    }

    /// A change to `next` got no answer: it may have installed (and been
    /// committed, if its drive crashed meanwhile).
    pub fn unanswered(&mut self, next: Vec<u8>) {
        self.durable.push(next.clone());
        if !self.crashed {
            self.maybe.push(next);
        }
    }

    /// A change to `next` that does not depend on the state it found (a
    /// truncation to nothing) was acknowledged: whatever the object held,
    /// it holds `next` now.
    pub fn replaced(&mut self, next: Vec<u8>) {
        // A crash may still fall back to any state `durable` lists.
        self.crashed = false;
        self.maybe.clear();
        self.durable.push(next.clone());
        self.current = next;
    }

    /// An acknowledged flush, sent after every change above was answered:
    /// what the object holds now is durable.
    pub fn flushed(&mut self) {
        if self.crashed {
            return;
        }
        self.durable = std::iter::once(self.current.clone()).chain(self.maybe.iter().cloned()).collect();
    }

    /// The object's drive crashed.
    pub fn drive_crashed(&mut self) {
        self.crashed = true;
    }

    /// A whole read returned `got`; checks it is a state the history allows
    /// and settles the model on it.
    pub fn read(&mut self, got: &[u8]) -> Result<(), Violation> {
        let allowed = if self.crashed {
            self.durable.iter().any(|s| s == got)
        } else {
            got == self.current || self.maybe.iter().any(|s| s == got)
        };
        if !allowed {
            let mut known: Vec<String> = vec![format!("current {}", describe(&self.current))];
            known.extend(self.maybe.iter().map(|m| format!("maybe {}", describe(m))));
            if self.crashed {
                known.extend(self.durable.iter().map(|s| format!("durable {}", describe(s))));
            }
            return Err(Violation(format!(
                "read {} which no acknowledged history allows (crashed since: {}; allowed: {})",
                describe(got),
                self.crashed,
                known.join(", ")
            )));
        }
        if self.crashed {
            // After a restart the drive holds exactly its durable state.
            self.durable = vec![got.to_vec()];
        }
        // States of unanswered changes stay in `durable`: whether one that
        // did not show installed and was overwritten cannot be told.
        self.current = got.to_vec();
        self.maybe.clear();
        self.crashed = false;
        Ok(())
    }
}

impl Default for ObjectModel {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crash_falls_back_to_a_state_after_the_last_flush_and_never_before() {
        let mut m = ObjectModel::new();
        let a = ObjectModel::written(&m.current, 0, b"aaaa");
        m.acknowledged(a.clone());
        m.flushed();
        let b = ObjectModel::written(&m.current, 2, b"bb");
        m.acknowledged(b.clone());
        m.drive_crashed();
        assert!(m.clone().read(&a).is_ok(), "the flushed state");
        assert!(m.clone().read(&b).is_ok(), "a later state a background commit kept");
        assert!(m.clone().read(b"").is_err(), "a state before the flush is lost data");
        m.read(&b).unwrap();
        assert!(!m.unsettled());
        assert_eq!(m.durable, vec![b]);
    }

    #[test]
    fn an_unanswered_write_installed_whole_or_not_at_all() {
        let mut m = ObjectModel::new();
        let a = ObjectModel::written(&m.current, 0, b"aaaa");
        m.acknowledged(a.clone());
        let b = ObjectModel::written(&a, 1, b"bb");
        m.unanswered(b.clone());
        assert!(m.unsettled());
        assert!(m.clone().read(&a).is_ok());
        assert!(m.clone().read(&b).is_ok());
        assert!(m.clone().read(b"abaa").is_err(), "half a write");
        m.read(&a).unwrap();
        assert!(!m.unsettled());
        assert_eq!(m.current, a);
    }
}
