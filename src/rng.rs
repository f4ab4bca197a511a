//! A small, seeded, dependency-free RNG (SplitMix64) for random inputs (the benchmarks',
//! the self-test cases', the training demo's): the same seed gives the same inputs on
//! every machine and in every build. Product code; the self-test re-exports it as
//! `cases::rng`.

/// SplitMix64 (Steele, Lea & Flood 2014): 64-bit state, full period, good enough for test
/// data and trivially reproducible.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    /// An independent stream for one case: mixes `seed` with a case tag so that adding
    /// or reordering cases does not change the data of the others.
    pub fn for_case(seed: u64, tag: &str) -> Rng {
        // FNV-1a over the tag, then one SplitMix step of the mix.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in tag.bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        let mut r = Rng::new(seed ^ h.rotate_left(17));
        r.next_u64();
        r
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A copy of this stream `n` draws ahead (SplitMix64's state advances by a constant
    /// per draw), so that a long sequence can be drawn in independent pieces.
    pub fn ahead(&self, n: u64) -> Rng {
        Rng {
            state: self
                .state
                .wrapping_add(n.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        }
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.next_f64()
    }

    /// A value whose magnitude is uniform in [lo, hi) (0 < lo), with a random sign: never
    /// zero, so a missing term or a dropped element shows up in the output.
    pub fn signed_magnitude(&mut self, lo: f64, hi: f64) -> f64 {
        let m = self.uniform(lo, hi);
        if self.next_u64() & 1 == 0 {
            m
        } else {
            -m
        }
    }

    /// Approximately standard normal (sum of 4 uniforms, rescaled): bounded to about
    /// ±3.5, which keeps softmax and norm inputs in a realistic range.
    pub fn normalish(&mut self) -> f64 {
        let s: f64 = (0..4).map(|_| self.next_f64()).sum::<f64>() - 2.0;
        s * (3.0f64).sqrt()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_in_range() {
        let mut a = Rng::new(42);
        let mut b = Rng::new(42);
        for _ in 0..1000 {
            let x = a.next_f64();
            assert_eq!(x, b.next_f64());
            assert!((0.0..1.0).contains(&x));
        }
        let mut far = a.ahead(17);
        for _ in 0..17 {
            b.next_u64();
        }
        assert_eq!(far.next_u64(), b.next_u64());
        let mut c = Rng::for_case(1, "x");
        let mut d = Rng::for_case(1, "y");
        assert_ne!(c.next_u64(), d.next_u64());
        let mut r = Rng::new(7);
        for _ in 0..1000 {
            let v = r.signed_magnitude(0.5, 1.0);
            assert!(v.abs() >= 0.5 && v.abs() < 1.0);
        }
    }
}
