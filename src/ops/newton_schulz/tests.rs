//! Newton–Schulz on the interpreter: against float64, the zero-copy path against the
//! `ns_prep` path, the emitting update against update-then-emit, every candidate built.

use super::*;
use kgen_runtime::Device;

/// f64 Newton–Schulz of one [r, c] matrix (row-major), as torch.optim.Muon.
fn ns_ref(x: &[f64], r: usize, c: usize, sched: &[(f32, f32, f32)]) -> Vec<f64> {
    let tall = r > c;
    let (m, n) = (r.min(c), r.max(c));
    let mut w = vec![0.0; m * n];
    for i in 0..r {
        for j in 0..c {
            let v = x[i * c + j];
            if tall {
                w[j * n + i] = v
            } else {
                w[i * n + j] = v
            }
        }
    }
    let nrm = w.iter().map(|v| v * v).sum::<f64>().sqrt().max(1e-7);
    w.iter_mut().for_each(|v| *v /= nrm);
    for &(a, b, cc) in sched {
        let (a, b, cc) = (a as f64, b as f64, cc as f64);
        let mut g = vec![0.0; m * m];
        for i in 0..m {
            for j in 0..m {
                g[i * m + j] = (0..n).map(|t| w[i * n + t] * w[j * n + t]).sum();
            }
        }
        let mut bb = vec![0.0; m * m];
        for i in 0..m {
            for j in 0..m {
                bb[i * m + j] = b * g[i * m + j]
                    + cc * (0..m).map(|t| g[i * m + t] * g[t * m + j]).sum::<f64>();
            }
        }
        let mut nw = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                nw[i * n + j] =
                    a * w[i * n + j] + (0..m).map(|t| bb[i * m + t] * w[t * n + j]).sum::<f64>();
            }
        }
        w = nw;
    }
    let mut out = vec![0.0; r * c];
    for i in 0..r {
        for j in 0..c {
            out[i * c + j] = if tall { w[j * n + i] } else { w[i * n + j] };
        }
    }
    out
}

/// Every candidate of both products compiles for the target it is offered on, at its
/// pipeline depth (the shared memory of its stages fits), and sm_80 gets no
/// two-blocks-per-SM cap (its SM does not hold two Gram blocks).
#[test]
fn every_candidate_compiles_for_its_target() {
    use kgen_core::{compile, Arch, CompileOptions, SourceFile};
    let src = SourceFile::new(
        "ns.kg",
        crate::bundled::source("ns").expect("kernels-src/ns.kg"),
    );
    for arch in [Arch::Sm90a, Arch::Sm80] {
        let gram = gram_candidates(arch);
        assert_eq!(
            gram.iter().any(|c| c.min_blocks.is_some()),
            arch == Arch::Sm90a,
            "{arch}"
        );
        let lists = [("ns_gram", gram), ("ns_update", update_candidates(arch))];
        for (kernel, cands) in lists {
            for c in cands {
                let kernel = if c.split { "ns_gram_split" } else { kernel };
                let mut o = CompileOptions::new(arch)
                    .kernel(kernel)
                    .define("BM", c.bm)
                    .define("BK", c.bk);
                if kernel == "ns_update" {
                    o = o.define("BN", c.bn).define("PERSISTENT", c.persistent);
                }
                o.num_warps = Some(c.warps);
                o.min_blocks_per_sm = c.min_blocks;
                o.num_stages = Some(c.stages);
                match compile(&src, &o) {
                    Err(d) => panic!("{kernel} {} on {arch}:\n{}", c.label(), d.render(&src)),
                    // A persistent update keeps its ring across tiles: its mbarriers
                    // are initialized once, before the loop over tiles.
                    Ok(k) if c.persistent => {
                        assert!(k.ptx.contains("%nctaid.x"), "{}", c.label());
                        let init = k.ptx.find("mbarrier.init").expect("a TMA ring");
                        let first_loop = k.ptx.find("$L1:").expect("a loop");
                        assert!(init < first_loop, "{}: init inside the loop", c.label());
                    }
                    Ok(_) => {}
                }
            }
        }
    }
}

/// The last update written straight into the output (`ns_update_emit`) gives the
/// same bits as writing the working buffer and then `ns_emit`: plain and transposed
/// outputs, with and without Muon's `p = decay p + scale X`, a batch split into two
/// targets, one step (the normalizing update) and three.
#[test]
fn emitting_update_matches_update_then_emit() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    for (k, r, c, steps) in [(3, 20, 70, 3), (3, 70, 20, 1), (2, 9, 9, 2)] {
        let mut rng = crate::rng::Rng::new(11);
        let mut rand =
            |n: usize| -> Vec<f64> { (0..n).map(|_| rng.next_f64() * 2.0 - 1.0).collect() };
        let x = d
            .from_f64(DType::F32, &[k, r, c], &rand(k * r * c))
            .unwrap();
        let p0 = rand(k * r * c);
        let hp = d.from_f64(DType::F32, &[k, 2], &rand(2 * k)).unwrap();
        let sched = ns_schedule(&[QUINTIC], steps).unwrap();
        for accum in [false, true] {
            let run = |fused: bool| -> Vec<f64> {
                let p = d.from_f64(DType::F32, &[k, r, c], &p0).unwrap();
                let mut w = NsWork::new(&ops, DType::BF16, k, r, c).unwrap();
                let xi = orient("t", &x).unwrap();
                ops.ns_prep_run(&w, 0, &xi, None).unwrap();
                let parts = [(0, 1), (1, k - 1)];
                let hps: Vec<Tensor> = parts
                    .iter()
                    .map(|&(f, n)| hp.narrow(0, f, n).unwrap())
                    .collect();
                let to: Vec<EmitTo> = parts
                    .iter()
                    .zip(&hps)
                    .map(|(&(f, n), h)| EmitTo {
                        first: f,
                        p: orient("t", &p.narrow(0, f, n).unwrap()).unwrap(),
                        hp: accum.then_some(h),
                    })
                    .collect();
                if fused {
                    ops.ns_iterate_into(&mut w, &sched, NS_EPS, &to).unwrap();
                } else {
                    ops.ns_iterate_into(&mut w, &sched, NS_EPS, &[]).unwrap();
                    for t in &to {
                        ops.ns_emit_run(&w, t.first, &t.p, t.hp).unwrap();
                    }
                }
                p.to_f64_vec().unwrap()
            };
            let (a, b) = (run(false), run(true));
            assert!(a.iter().all(|v| v.is_finite()));
            let same = a.iter().zip(&b).all(|(u, v)| u.to_bits() == v.to_bits());
            assert!(same, "{k}x{r}x{c} steps {steps} accum {accum}");
            if accum {
                // The update did change p.
                assert!(a.iter().zip(&p0).any(|(u, v)| u != v));
            }
        }
    }
}

/// The zero-copy path (a bf16 input in the padded layout: no `ns_prep`, the norm from
/// the first Gram's trace) against float64 and against the `ns_prep` path on the
/// same values given as f32; one step in place (where X0 would be overwritten while
/// read) takes the `ns_prep` path and is right too.
#[test]
fn zero_copy_input_matches_f64_and_the_prep_path() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    for &(k, r, c, steps) in &[(2, 128, 136, 5), (1, 128, 256, 1), (1, 128, 128, 2)] {
        let mut rng = crate::rng::Rng::new(11 + r as u64);
        let data: Vec<f64> = (0..k * r * c).map(|_| rng.next_f64() * 2.0 - 1.0).collect();
        let xb = d.from_f64(DType::BF16, &[k, r, c], &data).unwrap();
        let vals = xb.to_f64_vec().unwrap();
        let xf = d.from_f64(DType::F32, &[k, r, c], &vals).unwrap();
        let mut w = NsWork::new(&ops, DType::BF16, k, r, c).unwrap();
        assert!(w.use_input(&ops, &orient("t", &xb).unwrap()).unwrap());
        let mut w = NsWork::new(&ops, DType::BF16, k, r, c).unwrap();
        assert!(!w.use_input(&ops, &orient("t", &xf).unwrap()).unwrap());
        let sched = ns_schedule(&[QUINTIC], steps).unwrap();
        let yz = ops.empty(DType::F32, &[k, r, c]).unwrap();
        ops.newton_schulz_with(&xb, &yz, steps, &[QUINTIC], Some(false))
            .unwrap();
        let yp = ops.empty(DType::F32, &[k, r, c]).unwrap();
        ops.newton_schulz_with(&xf, &yp, steps, &[QUINTIC], Some(false))
            .unwrap();
        let inplace = d.from_f64(DType::BF16, &[k, r, c], &vals).unwrap();
        ops.newton_schulz_into(&inplace, &inplace, steps, &[QUINTIC])
            .unwrap();
        let (gz, gp, gi) = (
            yz.to_f64_vec().unwrap(),
            yp.to_f64_vec().unwrap(),
            inplace.to_f64_vec().unwrap(),
        );
        let (mut wz, mut wp, mut wi, mut zp) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
        for b in 0..k {
            let want = ns_ref(&vals[b * r * c..(b + 1) * r * c], r, c, &sched);
            for (j, want) in want.iter().enumerate() {
                let e = b * r * c + j;
                wz = wz.max((gz[e] - want).abs());
                wp = wp.max((gp[e] - want).abs());
                wi = wi.max((gi[e] - want).abs());
                zp = zp.max((gz[e] - gp[e]).abs());
            }
        }
        eprintln!("{k}x{r}x{c} x{steps}: zero-copy {wz}, prep {wp}, in place {wi}, apart {zp}");
        assert!(
            wz < 0.1 && wp < 0.1 && wi < 0.1,
            "{k}x{r}x{c}: {wz} {wp} {wi}"
        );
        assert!(zp < 0.05, "{k}x{r}x{c}: the two paths {zp} apart");
    }
}

#[test]
fn interpreter_matches_f64() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let cases = [
        (1, 7, 5),
        (2, 5, 7),
        (1, 1, 1),
        (1, 20, 20),
        (2, 9, 33),
        (3, 130, 70),
    ];
    for (&(k, r, c), fused) in cases.iter().flat_map(|c| [(c, false), (c, true)]) {
        let mut rng = crate::rng::Rng::new(7);
        let data: Vec<f64> = (0..k * r * c).map(|_| rng.next_f64() * 2.0 - 1.0).collect();
        let x = d.from_f64(DType::F32, &[k, r, c], &data).unwrap();
        let y = ops.empty(DType::F32, &[k, r, c]).unwrap();
        ops.newton_schulz_with(&x, &y, 5, &[QUINTIC], Some(fused))
            .unwrap();
        let got = y.to_f64_vec().unwrap();
        let sched = ns_schedule(&[QUINTIC], 5).unwrap();
        let mut worst = 0.0f64;
        for b in 0..k {
            let want = ns_ref(&data[b * r * c..(b + 1) * r * c], r, c, &sched);
            for (g, w) in got[b * r * c..(b + 1) * r * c].iter().zip(&want) {
                worst = worst.max((g - w).abs());
            }
        }
        eprintln!("{k}x{r}x{c}: worst {worst}");
        if r * c < 40 {
            eprintln!(
                "got {:?}\nwant {:?}",
                &got[..r * c],
                ns_ref(&data[..r * c], r, c, &sched)
            );
        }
        assert!(worst < 0.1, "{k}x{r}x{c} (fused: {fused}): {worst}");
    }
}
