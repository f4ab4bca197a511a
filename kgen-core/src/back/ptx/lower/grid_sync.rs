//! Lowering of `grid_sync(counter)`: a barrier across every block of a cooperative grid.
//!
//! Assumes: the kernel is launched cooperatively (`LaunchHints::cooperative`: every block
//! resident at once), every block reaches each `grid_sync` alike (the checker's
//! `uniform.rs`), and `counter` holds 0 or what an earlier `grid_sync` left, with no
//! other grid using it at the same time. Not in a warp-specialized kernel (its producer
//! warpgroup runs a loop of its own and would never arrive).
//!
//! Guarantees: every access to global memory that any thread of any block made before
//! the `grid_sync` (generic stores and atomics, TMA stores) happens before every access
//! after it, including TMA and `cp.async` reads. The arrival count is the sign-bit scheme
//! of CUDA's cooperative groups, which needs no reset: block 0 adds `2^31 - (n - 1)`, the
//! others 1, so the counter's sign bit flips exactly when the last of the `n` blocks
//! arrives and its other bits return to what they were. One thread per block:
//!
//! ```text
//!   cp.async.bulk.wait_group 0        (sm_90a: this thread's TMA stores complete)
//!   fence.proxy.async.global          (sm_90a: its generic writes ordered with async-proxy reads)
//!   bar.sync 0
//!   thread 0: atom.global.release.gpu.add.u32 old, [counter], add
//!             spin: ld.global.acquire.gpu.u32 now, [counter]   until sign(old ^ now)
//!             fence.acq_rel.gpu
//!   bar.sync 0
//!   fence.proxy.async.global          (sm_90a: TMA reads after it see the other blocks' data)
//! ```
//!
//! The acquire invalidates the multiprocessor's L1, so the block's later `ld.global`s
//! read the other blocks' writes (the cooperative-groups implementation relies on the
//! same); `ld.global.nc` is never used for a tensor the kernel writes.

use super::*;

impl Lowerer<'_> {
    pub(super) fn lower_grid_sync(&mut self, counter: u32, span: crate::span::Span) -> R<()> {
        if self.ws != ws::WsMode::Off {
            return Err(unsupported(
                span,
                "`grid_sync` in a warp-specialized kernel (its producer warpgroup never arrives); compile without --ws",
            ));
        }
        let (t, _) = self.tensor(counter, span)?;
        self.comment("grid_sync");
        // sm_80 has neither TMA stores nor the async proxy.
        let async_proxy = self.target.caps.tma;
        if async_proxy {
            self.emit("cp.async.bulk.wait_group", vec![Operand::Imm(0)]);
            self.emit("fence.proxy.async.global", vec![]);
        }
        self.emit("bar.sync", vec![Operand::Imm(0)]);
        let tid = self.tid();
        let leader = self.op1(
            RegClass::Pred,
            "setp.eq.u32",
            vec![tid.into(), Operand::Imm(0)],
        );
        let skip = self.new_label();
        // `(p, true)` guards with `@!p`: threads other than 0 skip to the second barrier.
        self.emit_if(Some((leader, true)), "bra", vec![Operand::Label(skip)]);
        // Block 0 (all three coordinates 0) adds 2^31 - (n - 1); the others 1.
        let sym = |s: &str| Operand::Sym(s.into());
        let mut n: Option<Reg> = None;
        let mut first: Option<Reg> = None;
        for axis in ["x", "y", "z"] {
            let id = self.op1(
                RegClass::B32,
                "mov.u32",
                vec![sym(&format!("%ctaid.{axis}"))],
            );
            let len = self.op1(
                RegClass::B32,
                "mov.u32",
                vec![sym(&format!("%nctaid.{axis}"))],
            );
            n = Some(match n {
                None => len,
                Some(m) => self.op1(RegClass::B32, "mul.lo.u32", vec![m.into(), len.into()]),
            });
            first = Some(match first {
                None => id,
                Some(f) => self.op1(RegClass::B32, "or.b32", vec![f.into(), id.into()]),
            });
        }
        let (n, first) = match (n, first) {
            (Some(n), Some(f)) => (n, f),
            _ => return Err(unsupported(span, "grid_sync: no grid axes")),
        };
        let is_first = self.op1(
            RegClass::Pred,
            "setp.eq.u32",
            vec![first.into(), Operand::Imm(0)],
        );
        // 2^31 - (n - 1) = 2^31 + 1 - n (mod 2^32).
        let big = self.op1(
            RegClass::B32,
            "sub.u32",
            vec![Operand::Imm(0x8000_0001), n.into()],
        );
        let add = self.op1(
            RegClass::B32,
            "selp.b32",
            vec![big.into(), Operand::Imm(1), is_first.into()],
        );
        let mem = Operand::Mem(Addr::Reg(t.base), 0);
        let old = self.op1(
            RegClass::B32,
            "atom.global.release.gpu.add.u32",
            vec![mem.clone(), add.into()],
        );
        let top = self.new_label();
        self.place_label(top);
        let now = self.op1(RegClass::B32, "ld.global.acquire.gpu.u32", vec![mem]);
        let diff = self.op1(RegClass::B32, "xor.b32", vec![old.into(), now.into()]);
        let sign = self.op1(
            RegClass::B32,
            "and.b32",
            vec![diff.into(), Operand::Imm(0x8000_0000)],
        );
        let waiting = self.op1(
            RegClass::Pred,
            "setp.eq.u32",
            vec![sign.into(), Operand::Imm(0)],
        );
        self.emit_if(Some((waiting, false)), "bra", vec![Operand::Label(top)]);
        self.emit("fence.acq_rel.gpu", vec![]);
        self.place_label(skip);
        self.emit("bar.sync", vec![Operand::Imm(0)]);
        if async_proxy {
            self.emit("fence.proxy.async.global", vec![]);
        }
        Ok(())
    }
}
