//! The self-checks of the op library and the optimizers (`kgen selftest`'s op checks):
//! each op and optimizer step on random data against a float64 reference, on the
//! interpreter and, where there is one, the GPU. Test code beside the case table
//! (`cases/`): product code (`ops/`, `optim/`, `bench/`, `gpt/`) never imports either.

pub mod ops;
pub mod optim;
