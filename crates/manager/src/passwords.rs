//! Passwords at rest: argon2id hashes in PHC string form (salt and
//! parameters inside), verified in constant time by the argon2 crate.

use argon2::password_hash::{rand_core::OsRng, PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;

/// Shortest password an administrator may set.
pub const PASSWORD_MIN: usize = 8;

/// The argon2id PHC hash of `password` with a fresh random salt.
pub fn hash(password: &str) -> String {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default().hash_password(password.as_bytes(), &salt).expect("argon2 with default parameters").to_string()
}

/// True if `password` matches `phc`. A malformed stored hash never matches.
pub fn verify(password: &str, phc: &str) -> bool {
    match PasswordHash::new(phc) {
        Ok(parsed) => Argon2::default().verify_password(password.as_bytes(), &parsed).is_ok(),
        Err(_) => false,
    }
}

/// A hash no password matches in practice, verified for unknown user names
/// so that a login takes as long whether or not the name exists.
pub fn decoy() -> String {
    hash(&nasd_crypto::Key::random().to_hex())
}

#[cfg(test)]
mod tests {
    #[test]
    fn argon2id_hashes_verify_only_their_password() {
        let h = super::hash("correct horse");
        assert!(h.starts_with("$argon2id$"), "{h}");
        assert!(super::verify("correct horse", &h));
        assert!(!super::verify("correct horsf", &h));
        assert!(!super::verify("correct horse", "not a hash"));
        assert_ne!(super::hash("correct horse"), h, "salted");
    }
}
