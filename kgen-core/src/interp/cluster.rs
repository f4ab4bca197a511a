//! Thread-block clusters in the interpreter: the blocks of one cluster run concurrently
//! (one OS thread each) and meet at every `cluster_gather`.
//!
//! Assumes: the kernel's `ClusterGather`s share one size C (validated IR) and grid axis 0
//! is a multiple of C (checked by `run`). Guarantees: each `cluster_gather` returns, in
//! every block of the cluster, the `[C]` tile of the blocks' values in rank order. A
//! cluster whose blocks do not all reach the same exchanges (one finishes or fails while
//! others wait) is reported as `InterpError::ClusterDiverged` instead of hanging, as
//! the GPU would. Memory accesses of the cluster's blocks are serialized one access at
//! a time (each holds the argument lock only for the access).

use super::value::{Data, Val};
use super::InterpError;
use std::sync::{Condvar, Mutex};

/// The meeting point of one cluster's blocks.
pub(super) struct ClusterSync {
    size: usize,
    state: Mutex<State>,
    cv: Condvar,
}

struct State {
    /// Values posted for the exchange in progress, by rank.
    posted: Vec<Option<Val>>,
    arrived: usize,
    /// Counts completed exchanges.
    generation: u64,
    /// The values of the last completed exchange.
    result: Vec<Val>,
    /// Blocks that have finished (normally or not).
    finished: usize,
    /// Set when the cluster cannot go on; every waiting block returns it.
    failure: Option<String>,
}

impl ClusterSync {
    pub(super) fn new(size: usize) -> ClusterSync {
        ClusterSync {
            size,
            state: Mutex::new(State {
                posted: vec![None; size],
                arrived: 0,
                generation: 0,
                result: Vec::new(),
                finished: 0,
                failure: None,
            }),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, State>, InterpError> {
        self.state
            .lock()
            .map_err(|_| InterpError::ClusterDiverged("a block of the cluster panicked".into()))
    }

    /// Posts `value` as block `rank`'s and waits for every block's: the `[C]` tile.
    pub(super) fn exchange(&self, rank: usize, value: Val) -> Result<Val, InterpError> {
        let mut st = self.lock()?;
        if let Some(f) = &st.failure {
            return Err(InterpError::ClusterDiverged(f.clone()));
        }
        if st.finished > 0 {
            let msg = "a block of the cluster finished without reaching this cluster_gather";
            st.failure = Some(msg.into());
            self.cv.notify_all();
            return Err(InterpError::ClusterDiverged(msg.into()));
        }
        let slot = st
            .posted
            .get_mut(rank)
            .ok_or_else(|| InterpError::Malformed("cluster rank out of range".into()))?;
        *slot = Some(value);
        st.arrived += 1;
        let generation = st.generation;
        if st.arrived == self.size {
            let vals: Option<Vec<Val>> = st.posted.iter_mut().map(|v| v.take()).collect();
            st.result =
                vals.ok_or_else(|| InterpError::Malformed("missing cluster value".into()))?;
            st.arrived = 0;
            st.generation += 1;
            self.cv.notify_all();
        } else {
            while st.generation == generation && st.failure.is_none() {
                st = self
                    .cv
                    .wait(st)
                    .map_err(|_| InterpError::ClusterDiverged("a block panicked".into()))?;
            }
            if st.generation == generation {
                let f = st.failure.clone().unwrap_or_default();
                return Err(InterpError::ClusterDiverged(f));
            }
        }
        stack(&st.result)
    }

    /// Block `rank` is done (`ok`: it ran to the end). Blocks still waiting fail.
    pub(super) fn finish(&self, ok: bool) {
        if let Ok(mut st) = self.state.lock() {
            st.finished += 1;
            if st.failure.is_none() && (st.arrived > 0 || !ok) {
                st.failure = Some(if ok {
                    "a block of the cluster finished while others waited in cluster_gather".into()
                } else {
                    "another block of the cluster failed".into()
                });
            }
            self.cv.notify_all();
        }
    }
}

/// The scalars `vals` (one dtype) as a 1-D tile.
pub(super) fn stack(vals: &[Val]) -> Result<Val, InterpError> {
    let first = vals
        .first()
        .ok_or_else(|| InterpError::Malformed("empty cluster".into()))?;
    let mut data = match &first.data {
        Data::Bool(_) => Data::Bool(Vec::new()),
        Data::I32(_) => Data::I32(Vec::new()),
        Data::U32(_) => Data::U32(Vec::new()),
        Data::I64(_) => Data::I64(Vec::new()),
        Data::F(_) => Data::F(Vec::new()),
    };
    for v in vals {
        match (&mut data, &v.data) {
            (Data::Bool(a), Data::Bool(b)) => a.extend_from_slice(b),
            (Data::I32(a), Data::I32(b)) => a.extend_from_slice(b),
            (Data::U32(a), Data::U32(b)) => a.extend_from_slice(b),
            (Data::I64(a), Data::I64(b)) => a.extend_from_slice(b),
            (Data::F(a), Data::F(b)) => a.extend_from_slice(b),
            _ => {
                return Err(InterpError::Malformed(
                    "cluster values differ in kind".into(),
                ))
            }
        }
    }
    Val::new(first.dtype, vec![vals.len() as u32], data)
}
