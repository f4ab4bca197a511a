//! Placeholder: cases for this kernel family are being written.

use super::*;

pub(crate) fn cases(_seed: u64, _sizes: SizeSet) -> Vec<Case> {
    Vec::new()
}
