//! Unit tests of the store: the full suite lands with the model-based property test.

use super::*;

#[test]
fn block_sizes_are_sane() {
    assert!(BLOCK_SIZE_MIN <= BLOCK_SIZE_DEFAULT && BLOCK_SIZE_DEFAULT <= BLOCK_SIZE_MAX);
}
