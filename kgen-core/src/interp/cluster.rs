//! Thread-block clusters in the interpreter: the blocks of one cluster run concurrently
//! (one OS thread each) and meet at every `cluster_gather`. A kernel that calls
//! `grid_sync` runs the same way with the whole grid as the group (`Meet::Grid`), its
//! blocks meeting at every `grid_sync`.
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

/// Which collective a group of concurrently run blocks meets at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Meet {
    /// The blocks of one cluster, at `cluster_gather`.
    Cluster,
    /// Every block of the grid, at `grid_sync`.
    Grid,
}

impl Meet {
    fn group(self) -> &'static str {
        match self {
            Meet::Cluster => "cluster",
            Meet::Grid => "grid",
        }
    }

    fn op(self) -> &'static str {
        match self {
            Meet::Cluster => "cluster_gather",
            Meet::Grid => "grid_sync",
        }
    }
}

/// The meeting point of one cluster's blocks (or of a cooperative grid's).
pub(super) struct ClusterSync {
    size: usize,
    meet: Meet,
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
    pub(super) fn new(size: usize, meet: Meet) -> ClusterSync {
        ClusterSync {
            size,
            meet,
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

    /// The error for a group whose blocks did not all meet.
    pub(super) fn diverged(&self, msg: impl Into<String>) -> InterpError {
        match self.meet {
            Meet::Cluster => InterpError::ClusterDiverged(msg.into()),
            Meet::Grid => InterpError::GridDiverged(msg.into()),
        }
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, State>, InterpError> {
        self.state
            .lock()
            .map_err(|_| self.diverged(format!("a block of the {} panicked", self.meet.group())))
    }

    /// Block `rank` arrives at a `grid_sync` and waits for every block.
    pub(super) fn arrive(&self, rank: usize) -> Result<(), InterpError> {
        let token = Val::new(crate::types::DType::I32, vec![], Data::I32(vec![0]))?;
        self.exchange(rank, token).map(|_| ())
    }

    /// Posts `value` as block `rank`'s and waits for every block's: the `[C]` tile.
    pub(super) fn exchange(&self, rank: usize, value: Val) -> Result<Val, InterpError> {
        let mut st = self.lock()?;
        if let Some(f) = &st.failure {
            return Err(self.diverged(f.clone()));
        }
        if st.finished > 0 {
            let msg = format!(
                "a block of the {} finished without reaching this {}",
                self.meet.group(),
                self.meet.op()
            );
            st.failure = Some(msg.clone());
            self.cv.notify_all();
            return Err(self.diverged(msg));
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
                    .map_err(|_| self.diverged("a block panicked"))?;
            }
            if st.generation == generation {
                let f = st.failure.clone().unwrap_or_default();
                return Err(self.diverged(f));
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
                    format!(
                        "a block of the {} finished while others waited in {}",
                        self.meet.group(),
                        self.meet.op()
                    )
                } else {
                    format!("another block of the {} failed", self.meet.group())
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
