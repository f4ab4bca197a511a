//! A kernel's arguments, spelled once: [`KernelArgs`] lists every argument of one launch
//! in the kernel's parameter order, each tensor with its parameter name.
//!
//! Assumes: the list is built in the kernel's parameter order (tensors and scalars), with
//! each tensor under the name the kernel gives its parameter (`kernels-src/*.kg`).
//! Guarantees: the same list gives both what a specialization depends on (each tensor's
//! name with its alignment: [`KernelArgs::tensors`], which [`super::Ops::kernel`] and its
//! variants compile for) and what the launch passes ([`KernelArgs::args`]), so the two
//! cannot disagree; [`KernelArgs::plan_key`] adds every tensor to an op's remembered-plan
//! key. Scalars do not select a kernel (an op whose scalar does, adds a word to its key).

use super::plan::PlanKey;
use kgen_runtime::{Arg, Tensor};

/// The arguments of one kernel launch, in parameter order, tensors named.
#[derive(Clone, Default)]
pub struct KernelArgs<'a> {
    /// Every argument, as the launch passes them.
    args: Vec<Arg<'a>>,
    /// The parameter name of each argument (scalars too), index for index.
    names: Vec<&'static str>,
}

impl<'a> KernelArgs<'a> {
    /// An empty list.
    pub fn new() -> KernelArgs<'a> {
        KernelArgs {
            // Most kernels of the op library take at most 8 arguments.
            args: Vec::with_capacity(8),
            names: Vec::with_capacity(8),
        }
    }

    /// Appends the tensor parameter `name`.
    pub fn tensor(mut self, name: &'static str, t: &'a Tensor) -> KernelArgs<'a> {
        self.push_tensor(name, t);
        self
    }

    /// Appends the scalar parameter `name` (f32, i32, u32, i64 or bool).
    pub fn scalar(mut self, name: &'static str, v: impl Into<Arg<'a>>) -> KernelArgs<'a> {
        self.push_scalar(name, v);
        self
    }

    /// [`KernelArgs::tensor`] in place (for parameters appended conditionally).
    pub fn push_tensor(&mut self, name: &'static str, t: &'a Tensor) {
        self.push(name, Arg::Tensor(t));
    }

    /// [`KernelArgs::scalar`] in place.
    pub fn push_scalar(&mut self, name: &'static str, v: impl Into<Arg<'a>>) {
        self.push(name, v.into());
    }

    /// Appends the parameter `name` as an [`Arg`] (a tensor or a scalar).
    pub fn push(&mut self, name: &'static str, arg: Arg<'a>) {
        self.args.push(arg);
        self.names.push(name);
    }

    /// The launch arguments, in parameter order.
    pub fn args(&self) -> &[Arg<'a>] {
        &self.args
    }

    /// The tensor parameters with their names, in order (what a specialization's
    /// alignments are computed from).
    pub fn tensors(&self) -> impl Iterator<Item = (&'static str, &'a Tensor)> + '_ {
        self.names
            .iter()
            .zip(&self.args)
            .filter_map(|(n, a)| match a {
                Arg::Tensor(t) => Some((*n, *t)),
                Arg::Scalar(_) => None,
            })
    }

    /// `key` with every tensor argument added (dtype, shape, strides, alignment).
    pub(crate) fn plan_key(&self, key: PlanKey) -> PlanKey {
        self.tensors().fold(key, |k, (_, t)| k.tensor(t))
    }
}

impl std::fmt::Debug for KernelArgs<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut l = f.debug_list();
        for (n, a) in self.names.iter().zip(&self.args) {
            match a {
                Arg::Tensor(t) => l.entry(&format_args!("{n}: {:?} {:?}", t.dtype(), t.shape())),
                Arg::Scalar(s) => l.entry(&format_args!("{n} = {s:?}")),
            };
        }
        l.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kgen_core::types::DType;
    use kgen_runtime::Device;

    #[test]
    fn one_list_gives_the_launch_and_the_specialization() {
        let d = Device::interpreter();
        let x = d.empty(DType::BF16, &[4, 7]).unwrap();
        let y = d.empty(DType::F32, &[4]).unwrap();
        let mut a = KernelArgs::new().tensor("x", &x).scalar("eps", 1e-6f32);
        a.push_tensor("y", &y);
        assert_eq!(a.args().len(), 3);
        assert!(matches!(a.args()[1], Arg::Scalar(_)));
        let names: Vec<&str> = a.tensors().map(|(n, _)| n).collect();
        assert_eq!(names, ["x", "y"]);
        assert_eq!(
            a.plan_key(PlanKey::new("op")),
            PlanKey::new("op").tensors(&[&x, &y])
        );
        assert!(format!("{a:?}").starts_with("[x: "), "{a:?}");
    }
}
