//! Lowering of blocks and control flow: a block's instructions in order (with the
//! reductions that may be batched across warps, and the deferred ring-buffer copies
//! issued before the first instruction that must not pass them), `for` loops (carried
//! values in fresh registers, moved at the back edge) and `if`s (both arms' yields moved
//! into the results' registers).
//!
//! A carried 16-bit tile read in the loop only as a product's left operand (attention's
//! `P`, carried to the next iteration's `P·V`) is carried *packed*: one `.b32` per two
//! elements (a column pair of one thread), packed at the back edge from the 16-bit halves
//! the cast kept (`Lowerer::halves`: one `mov.b32 %r, {lo, hi}` per pair; otherwise
//! `cvt.rn.bf16x2.f32` of the f32 source, rounding once as the cast does) and unpacked at
//! the loop's head with `packed_from` recorded, so the product's fragments are the carried
//! words themselves (`mma.rs`'s `pack_pair`); the unpacked registers are dead. Half the
//! registers across the back edge.
//!
//! Assumes: the values a block reads are bound (lowered earlier or arguments of the
//! block); every region ends with its `Yield`.
//! Guarantees: a loop's carried registers hold the yielded values at the back edge (a
//! permutation is moved through copies; a value yielded in place moves nothing); the
//! barrier tracker forgets what it knew at every label (`sync::Tracker::join`); a `wgmma`
//! group left in flight by the loop's `dot` is waited for at the loop's exit.

use super::*;

impl Lowerer<'_> {
    /// Lowers a block; returns the values its `Yield` yields.
    pub(super) fn block(&mut self, b: &Block) -> R<Vec<ValueId>> {
        let mut local = HashMap::new();
        for &i in &b.insts {
            for v in crate::ir::operands(&self.func.insts[i].op) {
                *local.entry(v).or_insert(0) += 1;
            }
        }
        self.block_uses.push(local);
        self.fetch_scopes.push(scratch::FetchScope::default());
        let r = self.block_insts(b);
        // Every fetch of the block that is still pending completes at its end.
        let flushed = self.flush_fetches(Span::DUMMY, |_| true);
        self.fetch_scopes.pop();
        self.block_uses.pop();
        flushed?;
        r
    }

    /// Whether every use of `v` is an instruction of the block being lowered (none is
    /// inside a nested region).
    pub fn all_uses_in_current_block(&self, v: ValueId) -> bool {
        let total = self.uses.get(&v).copied().unwrap_or(0);
        let local = self
            .block_uses
            .last()
            .and_then(|m| m.get(&v))
            .copied()
            .unwrap_or(0);
        total > 0 && local == total
    }

    pub(super) fn block_insts(&mut self, b: &Block) -> R<Vec<ValueId>> {
        let mut batched: std::collections::HashSet<InstId> = std::collections::HashSet::new();
        for (k, &i) in b.insts.iter().enumerate() {
            if !self.may_pass_deferred_copies(i) {
                self.drain_copies();
            }
            if self.ws_split_here(i) {
                self.ws_split(b, k);
            }
            self.shared_alloc_before(i);
            let r = self.block_inst(b, k, i, &mut batched);
            self.shared_free_after(i);
            if let Some(vs) = r? {
                return Ok(vs);
            }
        }
        self.drain_copies();
        if self.ws == ws::WsMode::Consumer && self.fetch_scopes.len() == 1 {
            self.ws_producer(b)?;
        }
        Ok(Vec::new())
    }

    /// Whether instruction `i` may be lowered before the deferred ring-buffer copies are
    /// issued: pure arithmetic, another ring-buffer fetch, a staged `scratch_load` (no
    /// code), a transpose of one, or a tensor-core `dot` (which issues them itself).
    pub(super) fn may_pass_deferred_copies(&self, i: InstId) -> bool {
        if self.deferred_copies.is_empty() {
            return true;
        }
        let inst = &self.func.insts[i];
        match &inst.op {
            Op::ScratchFetch { buf, .. } => self.is_shared(*buf),
            Op::ScratchLoad { .. } | Op::Permute(..) => inst
                .results
                .first()
                .is_some_and(|r| self.asg.staged.contains(r)),
            Op::Dot { .. } => inst.results.first().is_some_and(|&r| {
                matches!(self.asg.layout(r), crate::back::ptx::layout::Layout::Mma(_))
            }),
            Op::For { .. } | Op::If { .. } | Op::Yield(_) => false,
            op => crate::ir::props(op).is_pure(),
        }
    }

    /// Issues every deferred ring-buffer copy now.
    pub(super) fn drain_copies(&mut self) {
        let q = std::mem::take(&mut self.deferred_copies);
        for s in q {
            self.push(s);
        }
    }

    /// Issues the first `n` deferred copies (all when fewer remain).
    pub(super) fn drain_some_copies(&mut self, n: usize) {
        let n = n.min(self.deferred_copies.len());
        let q: Vec<Stmt> = self.deferred_copies.drain(..n).collect();
        for s in q {
            self.push(s);
        }
    }

    /// Lowers instruction `i` (the `k`-th of `b`), or the batch it starts; `Some` with the
    /// yielded values at the block's `Yield`.
    pub(super) fn block_inst(
        &mut self,
        b: &Block,
        k: usize,
        i: InstId,
        batched: &mut std::collections::HashSet<InstId>,
    ) -> R<Option<Vec<ValueId>>> {
        {
            if batched.contains(&i) {
                return Ok(None);
            }
            if let Op::Yield(vs) = &self.func.insts[i].op {
                return Ok(Some(vs.clone()));
            }
            let gathers = self.cluster_batch(&b.insts[k..]);
            if !gathers.is_empty() {
                batched.extend(gathers.iter().copied());
                self.lower_cluster_gathers(&gathers)?;
                return Ok(None);
            }
            let (batch, hoisted) = self.reduction_batch(&b.insts[k..]);
            if batch.len() > 1 {
                // The element-wise work a later reduction of the batch reads, first.
                for &h in &hoisted {
                    self.inst(h)?;
                }
                batched.extend(hoisted);
                batched.extend(batch.iter().map(|r| r.0));
                self.lower_reduce_batch(&batch)?;
                return Ok(None);
            }
            let (waits, fetches) = scratch::region_scratch_ops(self.func, i);
            if waits {
                // A wait inside may need this block's pending fetches complete.
                self.flush_fetches(self.func.insts[i].span, |_| true)?;
            }
            self.inst(i)?;
            if fetches {
                // It fetched an unknown number of times: later waits complete everything.
                if let Some(s) = self.fetch_scopes.last_mut() {
                    s.count = s.count.saturating_add(u64::from(u32::MAX));
                }
            }
        }
        Ok(None)
    }

    /// When `insts[0]` is a reduction across warps: it and the cross-warp reductions
    /// among the next [`REDUCE_BATCH_WINDOW`] instructions of the block (stopping at
    /// control flow) whose operands are computed already or by pure instructions of the
    /// window that need nothing else (the window's element-wise and shape instructions
    /// whose operands are so available, not the batch's own results), so they can share
    /// one shared-memory exchange: `sum(d, 0)` then `sum(d * d, 0)` batch although
    /// `d * d` comes after the first. Returns the batch and the pure instructions to
    /// lower before it, in program order (both empty when `insts[0]` is not such a
    /// reduction; the second empty when the batch has one reduction).
    pub(super) fn reduction_batch(&self, insts: &[InstId]) -> (Vec<BatchedReduction>, Vec<InstId>) {
        let func = self.func;
        let cross_warp = |op: &Op| match op {
            Op::Reduce { op, value, axis } => {
                let lin = self.lin(*value);
                (!lin.warp_bits_of(*axis as usize).is_empty()).then_some((
                    *op,
                    *value,
                    *axis as usize,
                ))
            }
            _ => None,
        };
        let Some(&first) = insts.first() else {
            return (Vec::new(), Vec::new());
        };
        let Some((op, value, axis)) = cross_warp(&func.insts[first].op) else {
            return (Vec::new(), Vec::new());
        };
        let mut batch = vec![(first, op, value, axis)];
        // Pure instructions of the window whose operands are available, by result.
        let mut pure: HashMap<ValueId, InstId> = HashMap::new();
        let available = |v: ValueId, pure: &HashMap<ValueId, InstId>| {
            self.is_computed(v) || pure.contains_key(&v)
        };
        for &j in insts.iter().skip(1).take(REDUCE_BATCH_WINDOW) {
            let inst = &func.insts[j];
            // Nor across a barrier: what the kernel placed after it stays there.
            if matches!(
                inst.op,
                Op::For { .. } | Op::If { .. } | Op::Yield(_) | Op::Barrier
            ) {
                break;
            }
            if let Some((op, value, axis)) = cross_warp(&inst.op) {
                if available(value, &pure) {
                    batch.push((j, op, value, axis));
                }
                continue;
            }
            if crate::ir::props(&inst.op).is_movable_value()
                && crate::ir::operands(&inst.op)
                    .iter()
                    .all(|&o| available(o, &pure))
            {
                if let [r] = inst.results[..] {
                    pure.insert(r, j);
                }
            }
        }
        if batch.len() < 2 {
            return (batch, Vec::new());
        }
        // The pure instructions the batch's operands need, transitively, in order.
        let mut needed: std::collections::HashSet<InstId> = std::collections::HashSet::new();
        let mut work: Vec<ValueId> = batch.iter().map(|b| b.2).collect();
        while let Some(v) = work.pop() {
            if let Some(&j) = pure.get(&v) {
                if needed.insert(j) {
                    work.extend(crate::ir::operands(&func.insts[j].op));
                }
            }
        }
        let hoisted = insts
            .iter()
            .copied()
            .filter(|j| needed.contains(j))
            .collect();
        (batch, hoisted)
    }

    /// A region's body with its own conversion cache.
    pub(super) fn region(&mut self, b: &Block) -> R<Vec<ValueId>> {
        self.conv_cache.push(HashMap::new());
        let r = self.block(b);
        self.conv_cache.pop();
        r
    }

    /// Moves the yielded `values` (converted to the layouts `lins`) into `dst`, as a
    /// parallel copy; a slot with register pairs in `packs` is packed first (one word
    /// per pair, `dst` holding the words).
    pub(super) fn move_into(
        &mut self,
        values: &[ValueId],
        lins: &[Linear],
        packs: &[Option<Vec<(usize, usize)>>],
        dst: &[Vec<Reg>],
        span: Span,
    ) -> R<()> {
        let mut srcs = Vec::new();
        for (k, &v) in values.iter().enumerate() {
            let lin = lins
                .get(k)
                .ok_or_else(|| unsupported(span, "yield arity"))?;
            let regs = self.operand_in(v, lin, span)?;
            srcs.push(match packs.get(k) {
                Some(Some(pairs)) => self.pack_pairs(self.dtype(v), &regs, pairs),
                _ => regs,
            });
        }
        // A source that is some other destination must be read before that one is
        // written (a permutation): copy every source first. A source that is its own
        // destination (an accumulator updated in place) moves nothing.
        let dst_set: std::collections::HashSet<Reg> = dst.iter().flatten().copied().collect();
        let overlap = srcs
            .iter()
            .zip(dst)
            .flat_map(|(s, d)| s.iter().zip(d))
            .any(|(r, d)| r != d && dst_set.contains(r));
        if overlap {
            for s in srcs.iter_mut() {
                for r in s.iter_mut() {
                    *r = self.copy(*r);
                }
            }
        }
        for (s, d) in srcs.iter().zip(dst) {
            for (&sr, &dr) in s.iter().zip(d) {
                if sr != dr {
                    self.mov(dr, sr.into());
                }
            }
        }
        Ok(())
    }

    pub(super) fn lower_for(&mut self, id: InstId) -> R<()> {
        let func = self.func;
        let inst = &func.insts[id];
        let span = inst.span;
        let Op::For {
            lower,
            upper,
            step,
            inits,
            body,
        } = &inst.op
        else {
            return Ok(());
        };
        let (lo, up, st) = (
            self.scalar(*lower, span)?,
            self.scalar(*upper, span)?,
            self.scalar(*step, span)?,
        );
        let iv = self.copy(lo);
        let Some(&iv_arg) = body.args.first() else {
            return Err(unsupported(span, "for loop without an induction variable"));
        };
        self.bind(iv_arg, vec![iv]);
        let rotation_plan = self.rotation_plan(id);
        let mut lins = Vec::new();
        let mut carried = Vec::new();
        let mut packs = Vec::new();
        for (k, &init) in inits.iter().enumerate() {
            let arg = *body
                .args
                .get(k + 1)
                .ok_or_else(|| unsupported(span, "loop arity"))?;
            let lin = self.lin(arg);
            let regs = self.operand_in(init, &lin, span)?;
            let pairs = match rotation_plan {
                None => self.packed_pairs(body, arg, &lin),
                Some(_) => None,
            };
            let fresh: Vec<Reg> = match &pairs {
                Some(pairs) => {
                    let words = self.pack_pairs(self.dtype(arg), &regs, pairs);
                    words.iter().map(|&r| self.copy(r)).collect()
                }
                None => {
                    let fresh: Vec<Reg> = regs.iter().map(|&r| self.copy(r)).collect();
                    self.bind(arg, fresh.clone());
                    fresh
                }
            };
            lins.push(lin);
            carried.push(fresh);
            packs.push(pairs);
        }
        // A pipelined mma.sync loop carries its first fragments (`mma_rotate.rs`).
        let rotation = match rotation_plan {
            Some(plan) => {
                let init = *inits
                    .get(plan.slot_arg - 1)
                    .ok_or_else(|| unsupported(span, "loop arity"))?;
                self.drain_copies();
                let carried = self.rotation_prologue(&plan, init)?;
                Some(super::mma_rotate::Rotation {
                    plan,
                    carried,
                    next: None,
                })
            }
            None => None,
        };
        let rotated = rotation.is_some();
        self.turns_before_loop(id, (lo, iv, up, st), span)?;
        let head = self.new_label();
        let end = self.new_label();
        self.place_label(head);
        if rotated {
            self.rotation_head();
        } else {
            self.sync.join();
        }
        let p = self.op1(RegClass::Pred, "setp.ge.s32", vec![iv.into(), up.into()]);
        self.emit_if(Some((p, false)), "bra.uni", vec![Operand::Label(end)]);
        // Packed arguments: unpacked here, each iteration (dead where only products
        // read them: the fragments are the words).
        for (k, pairs) in packs.iter().enumerate() {
            if let Some(pairs) = pairs {
                let arg = body.args[k + 1];
                let regs =
                    self.unpack_pairs(self.dtype(arg), &carried[k], pairs, lins[k].num_regs());
                self.bind(arg, regs);
            }
        }
        self.rotation = rotation;
        let yields = self.region(body)?;
        self.move_into(&yields, &lins, &packs, &carried, span)?;
        self.rotation_back_edge(span)?;
        self.emit("add.s32", vec![iv.into(), iv.into(), st.into()]);
        self.emit("bra.uni", vec![Operand::Label(head)]);
        self.place_label(end);
        self.sync.join();
        if std::mem::take(&mut self.wgmma_in_flight) {
            self.emit("wgmma.wait_group.sync.aligned", vec![Operand::Imm(0)]);
        }
        self.turns_after_loop(id);
        for (k, &r) in inst.results.iter().enumerate() {
            match (carried.get(k), packs.get(k)) {
                (Some(c), Some(Some(pairs))) => {
                    let regs = self.unpack_pairs(self.dtype(r), c, pairs, lins[k].num_regs());
                    self.bind(r, regs);
                }
                (Some(c), _) => self.bind(r, c.clone()),
                _ => {}
            }
        }
        Ok(())
    }

    /// The register pairs `(low, high)` of loop argument `arg` (layout `lin`) when it is
    /// carried packed (module docs): a 16-bit tile whose every use in `body` is a
    /// product's left operand or a yield, and whose layout holds each even column's right
    /// neighbour in the same thread's registers.
    fn packed_pairs(
        &self,
        body: &Block,
        arg: ValueId,
        lin: &Linear,
    ) -> Option<Vec<(usize, usize)>> {
        if !matches!(self.dtype(arg), DType::F16 | DType::BF16)
            || !matches!(self.func.value_type(arg), crate::types::ValueType::Tile(..))
            || !only_left_operand(self.func, body, arg)
        {
            return None;
        }
        let n = lin.num_regs();
        let mut pairs = Vec::with_capacity(n / 2);
        for r in 0..n {
            let mut c = lin.reg_coord(r);
            let last = c.last_mut()?;
            if *last % 2 == 0 {
                *last += 1;
                pairs.push((r, lin.reg_index(&c)?));
            }
        }
        let mut seen = vec![false; n];
        for &(lo, hi) in &pairs {
            for x in [lo, hi] {
                if std::mem::replace(seen.get_mut(x)?, true) {
                    return None;
                }
            }
        }
        (pairs.len() * 2 == n && n > 0).then_some(pairs)
    }

    /// One `.b32` word per register pair of `regs` (16-bit values of format `dt`): the
    /// pair's 16-bit halves moved together where the cast that rounded them kept them
    /// (rounded where the cast stands, before any wait the back edge needs, and held in
    /// half registers until then), else packed from their f32 source.
    fn pack_pairs(&mut self, dt: DType, regs: &[Reg], pairs: &[(usize, usize)]) -> Vec<Reg> {
        pairs
            .iter()
            .map(|&(lo, hi)| {
                let (l, h) = (regs[lo], regs[hi]);
                match (self.halves.get(&l), self.halves.get(&h)) {
                    (Some(&hl), Some(&hh)) => {
                        self.op1(RegClass::B32, "mov.b32", vec![Operand::Vec(vec![hl, hh])])
                    }
                    _ => self.pack(dt, &[l, h]).0[0],
                }
            })
            .collect()
    }

    /// The `n` widened registers of packed `words` (`packed_from` recorded); `pairs`
    /// covers every register (`packed_pairs`), so no placeholder survives.
    fn unpack_pairs(
        &mut self,
        dt: DType,
        words: &[Reg],
        pairs: &[(usize, usize)],
        n: usize,
    ) -> Vec<Reg> {
        let mut regs = vec![self.zero16(); n];
        for (&w, &(lo, hi)) in words.iter().zip(pairs) {
            let two = self.unpack(dt, 2, &[w]);
            regs[lo] = two[0];
            regs[hi] = two[1];
        }
        regs
    }

    pub(super) fn lower_if(&mut self, id: InstId) -> R<()> {
        let func = self.func;
        let inst = &func.insts[id];
        let span = inst.span;
        let Op::If {
            cond,
            then_body,
            else_body,
        } = &inst.op
        else {
            return Ok(());
        };
        let c = self.scalar(*cond, span)?;
        let lins: Vec<Linear> = inst.results.iter().map(|&r| self.lin(r)).collect();
        let outs: Vec<Vec<Reg>> = inst
            .results
            .iter()
            .zip(&lins)
            .map(|(&r, l)| {
                let class = class_of(self.dtype(r));
                (0..l.num_regs()).map(|_| self.reg(class)).collect()
            })
            .collect();
        let else_l = self.new_label();
        let end = self.new_label();
        self.emit_if(Some((c, true)), "bra.uni", vec![Operand::Label(else_l)]);
        let y = self.region(then_body)?;
        self.move_into(&y, &lins, &[], &outs, span)?;
        self.emit("bra.uni", vec![Operand::Label(end)]);
        self.place_label(else_l);
        self.sync.join();
        let y = self.region(else_body)?;
        self.move_into(&y, &lins, &[], &outs, span)?;
        self.place_label(end);
        self.sync.join();
        for (&r, o) in inst.results.iter().zip(outs) {
            self.bind(r, o);
        }
        Ok(())
    }
}

/// Whether every use of `v` in `b` (nested blocks included) is a product's left operand
/// or a yield.
fn only_left_operand(func: &Function, b: &Block, v: ValueId) -> bool {
    b.insts.iter().all(|&i| {
        let inst = &func.insts[i];
        let used = crate::ir::operands(&inst.op).contains(&v);
        let ok = !used
            || match &inst.op {
                Op::Dot { a, b, acc, .. } => *a == v && *b != v && *acc != v,
                Op::Yield(_) => true,
                _ => false,
            };
        ok && crate::ir::regions(&inst.op)
            .into_iter()
            .all(|r| only_left_operand(func, r, v))
    })
}
