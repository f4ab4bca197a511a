//! Barriers as entities, and the tracker that decides where a block must synchronize
//! around shared memory.
//!
//! A [`Barrier`] is the whole block (`bar.sync 0`), a named barrier over a subset of the
//! block's warps (`bar.sync id, threads`, ids 1–15, handed out by [`NamedBarriers`]), or
//! (part 2) an mbarrier object in shared memory.
//!
//! [`Tracker`] records, since the last block barrier, which byte ranges of shared memory
//! this block wrote or read *through a layout that crosses threads* (a thread reads what
//! another wrote). Lowering declares each such access before emitting it; the tracker
//! answers whether a block barrier must come first:
//! - a read of bytes written since the barrier (read after write between threads);
//! - a write of bytes read or written since the barrier (write after read / write);
//! - asynchronous copies (`cp.async`) are checked like writes when issued, but their
//!   bytes count as written only when a wait completes them ([`Tracker::async_done`]),
//!   so the barrier that makes them visible comes after the wait.
//!
//! Assumes: every cross-thread shared-memory access of the lowered code is declared, and
//! every block barrier is reported ([`Tracker::barrier`]); thread-private accesses (a
//! thread reads back only what it wrote: `scratch` slots) need nothing and are not
//! declared. At a control-flow join or loop head ([`Tracker::join`]) the tracker does not
//! know which path ran, so it assumes any byte may have been read and written.
//! Guarantees: following its answers, no two threads' accesses to one byte race unless
//! one is a read and the other a read.

use std::ops::Range;

/// A synchronization object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Barrier {
    /// Every thread of the block (`bar.sync 0`; `__syncthreads()`).
    Cta,
    /// Barrier `id` (1..=15) over `threads` threads (a multiple of 32): the warps that
    /// take part call it, the others never do (`bar.sync id, threads`).
    Named { id: u32, threads: u32 },
}

impl Barrier {
    /// The `bar.sync` operands (`0`, or `id, threads`).
    pub fn sync_operands(self) -> Vec<i64> {
        match self {
            Barrier::Cta => vec![0],
            Barrier::Named { id, threads } => vec![id as i64, threads as i64],
        }
    }

    /// The `bar.arrive` operands (a named barrier only: a producer that signals without
    /// waiting); `None` for the CTA barrier.
    pub fn arrive_operands(self) -> Option<Vec<i64>> {
        match self {
            Barrier::Cta => None,
            Barrier::Named { id, threads } => Some(vec![id as i64, threads as i64]),
        }
    }
}

/// Hands out named barrier ids (1..=15; 0 is the CTA barrier).
#[derive(Clone, Debug, Default)]
pub struct NamedBarriers {
    next: u32,
}

impl NamedBarriers {
    /// A fresh named barrier over `warps` warps, or `None` when all 15 are taken or the
    /// warp count is 0.
    pub fn alloc(&mut self, warps: u32) -> Option<Barrier> {
        if warps == 0 || self.next >= 15 {
            return None;
        }
        self.next += 1;
        Some(Barrier::Named {
            id: self.next,
            threads: warps * 32,
        })
    }
}

/// What the block may have done to shared memory since its last block barrier.
#[derive(Clone, Debug, Default)]
pub struct Tracker {
    written: Vec<Range<u32>>,
    read: Vec<Range<u32>>,
    /// Issued asynchronous copies not yet completed by a wait.
    in_flight: Vec<Range<u32>>,
    /// After a join: anything may have been read and written.
    unknown: bool,
}

fn overlaps(a: &Range<u32>, b: &Range<u32>) -> bool {
    a.start < b.end && b.start < a.end
}

impl Tracker {
    pub fn new() -> Tracker {
        Tracker::default()
    }

    /// A block barrier was emitted: everything before it is ordered before what follows.
    pub fn barrier(&mut self) {
        self.written.clear();
        self.read.clear();
        self.unknown = false;
    }

    /// A loop head or a join of branches: which accesses came last is unknown.
    pub fn join(&mut self) {
        self.unknown = true;
    }

    /// Before reading `r` through a cross-thread layout: whether a block barrier must come
    /// first. Records the read (after the barrier, if one is needed).
    pub fn before_read(&mut self, r: Range<u32>) -> bool {
        let need = self.unknown || self.written.iter().any(|w| overlaps(w, &r));
        if need {
            self.barrier();
        }
        self.read.push(r);
        need
    }

    /// Before writing `r` for other threads to read: whether a block barrier must come
    /// first. Records the write.
    pub fn before_write(&mut self, r: Range<u32>) -> bool {
        let need = self.unknown
            || self.written.iter().any(|w| overlaps(w, &r))
            || self.read.iter().any(|x| overlaps(x, &r));
        if need {
            self.barrier();
        }
        self.written.push(r);
        need
    }

    /// Before issuing an asynchronous copy into `r`: like a write for the hazards it must
    /// not create, but its bytes count as written only once [`Tracker::async_done`].
    pub fn before_async_write(&mut self, r: Range<u32>) -> bool {
        let need = self.unknown
            || self.written.iter().any(|w| overlaps(w, &r))
            || self.read.iter().any(|x| overlaps(x, &r));
        if need {
            self.barrier();
        }
        self.in_flight.push(r);
        need
    }

    /// Records a read of `r` that needs no barrier before it (its visibility comes from
    /// elsewhere, an mbarrier phase), so a later write into `r` still waits for it.
    pub fn note_read(&mut self, r: Range<u32>) {
        self.read.push(r);
    }

    /// Before a bulk copy (TMA) into `r` whose completion every reader observes itself
    /// (an mbarrier phase): checked like a write for write-after-read and write-after-
    /// write, but never recorded as written, since no block barrier is needed to see it.
    pub fn before_bulk_write(&mut self, r: Range<u32>) -> bool {
        let need = self.unknown
            || self.written.iter().any(|w| overlaps(w, &r))
            || self.read.iter().any(|x| overlaps(x, &r));
        if need {
            self.barrier();
        }
        need
    }

    /// A wait completed the block's asynchronous copies (conservatively all of them: a
    /// copy still in flight is never read by a valid program).
    pub fn async_done(&mut self) {
        let done = std::mem::take(&mut self.in_flight);
        self.written.extend(done);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_after_a_write_waits_and_a_second_read_does_not() {
        let mut t = Tracker::new();
        assert!(!t.before_write(0..256), "nothing happened before");
        assert!(t.before_read(0..256), "RAW between threads");
        assert!(!t.before_read(128..512), "reads do not conflict with reads");
    }

    #[test]
    fn a_write_into_bytes_read_since_the_barrier_waits() {
        let mut t = Tracker::new();
        t.before_write(0..256);
        t.before_read(0..256);
        assert!(t.before_write(0..64), "WAR");
        let mut t = Tracker::new();
        t.before_write(0..256);
        t.before_read(0..256);
        assert!(!t.before_write(256..512), "disjoint bytes need no barrier");
    }

    #[test]
    fn async_copies_become_visible_after_the_wait_and_one_barrier() {
        // The pipelined loop body: wait; fetch the next stage; read this stage.
        let ring = 0..3 * 8192;
        let mut t = Tracker::new();
        assert!(!t.before_async_write(ring.clone()), "prologue fetches");
        t.join(); // loop head
        t.async_done(); // cp.async.wait_group
        assert!(
            t.before_async_write(ring.clone()),
            "WAR against last iteration's reads"
        );
        assert!(
            !t.before_read(ring.clone()),
            "that barrier came after the wait"
        );
        // Without a fetch in between, the read itself needs the barrier.
        let mut t = Tracker::new();
        t.before_async_write(ring.clone());
        t.async_done();
        assert!(t.before_read(ring.clone()));
    }

    #[test]
    fn a_join_forgets() {
        let mut t = Tracker::new();
        t.join();
        assert!(t.before_read(0..4));
        assert!(!t.before_read(0..4));
    }

    #[test]
    fn named_barriers_are_numbered_from_one_to_fifteen() {
        let mut n = NamedBarriers::default();
        let b = n.alloc(4).unwrap();
        assert_eq!(
            b,
            Barrier::Named {
                id: 1,
                threads: 128
            }
        );
        assert_eq!(b.sync_operands(), vec![1, 128]);
        assert_eq!(Barrier::Cta.sync_operands(), vec![0]);
        for _ in 2..=15 {
            assert!(n.alloc(1).is_some());
        }
        assert!(n.alloc(1).is_none());
        assert!(NamedBarriers::default().alloc(0).is_none());
    }
}
