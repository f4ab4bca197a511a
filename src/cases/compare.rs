//! Comparing kernel outputs with expected values (the float64 reference, or another
//! run's outputs) under a case's [`Tolerance`].

use super::{Case, Tolerance};
use kgen_core::host::ArgValue;
use std::fmt;

/// The first element of one output that failed the tolerance.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mismatch {
    /// Row-major index into the output's view.
    pub index: usize,
    pub got: f64,
    pub want: f64,
}

/// The comparison of one output tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct OutputCompare {
    /// Index of the output in the case's `args`.
    pub arg: usize,
    /// Number of elements compared.
    pub len: usize,
    /// Largest `|got - want|` over elements where both are finite.
    pub max_abs_err: f64,
    /// Largest `|got - want| / |want|` over elements where both are finite and want ≠ 0.
    pub max_rel_err: f64,
    /// Elements outside the tolerance (NaN/inf mismatches included).
    pub num_failed: usize,
    /// Elements that are NaN where the reference is finite: never written (the poison
    /// pattern survived) or computed as NaN.
    pub nan_where_finite: usize,
    pub first_failure: Option<Mismatch>,
}

/// The comparison of every output of one case.
#[derive(Clone, Debug, PartialEq)]
pub struct CompareResult {
    pub tolerance: Tolerance,
    pub outputs: Vec<OutputCompare>,
    /// A structural problem (wrong number of outputs, wrong lengths, an output that is
    /// not a tensor); `passed()` is false when set.
    pub error: Option<String>,
}

impl CompareResult {
    pub fn passed(&self) -> bool {
        self.error.is_none() && self.outputs.iter().all(|o| o.num_failed == 0)
    }

    pub fn max_abs_err(&self) -> f64 {
        self.outputs
            .iter()
            .map(|o| o.max_abs_err)
            .fold(0.0, f64::max)
    }

    pub fn max_rel_err(&self) -> f64 {
        self.outputs
            .iter()
            .map(|o| o.max_rel_err)
            .fold(0.0, f64::max)
    }

    pub fn num_failed(&self) -> usize {
        self.outputs.iter().map(|o| o.num_failed).sum()
    }

    pub fn nan_where_finite(&self) -> usize {
        self.outputs.iter().map(|o| o.nan_where_finite).sum()
    }

    /// The first failing element: (argument index, mismatch).
    pub fn first_failure(&self) -> Option<(usize, Mismatch)> {
        self.outputs
            .iter()
            .find_map(|o| o.first_failure.map(|m| (o.arg, m)))
    }
}

impl fmt::Display for CompareResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(e) = &self.error {
            return write!(f, "error: {e}");
        }
        write!(
            f,
            "{} max_abs={:.3e} max_rel={:.3e} failed={} nan={}",
            if self.passed() { "ok" } else { "FAIL" },
            self.max_abs_err(),
            self.max_rel_err(),
            self.num_failed(),
            self.nan_where_finite()
        )?;
        if let Some((arg, m)) = self.first_failure() {
            write!(
                f,
                " first: arg{arg}[{}] got {:e} want {:e}",
                m.index, m.got, m.want
            )?;
        }
        Ok(())
    }
}

/// Whether `got` is within `tol` of `want`. NaN passes only against NaN; an infinity
/// only against the same infinity.
pub fn within(got: f64, want: f64, tol: Tolerance) -> bool {
    if want.is_nan() {
        return got.is_nan();
    }
    if want.is_infinite() || got.is_infinite() {
        return got == want;
    }
    if got.is_nan() {
        return false;
    }
    (got - want).abs() <= tol.abs + tol.rel * want.abs()
}

/// Compares one output against expected values.
pub fn compare_values(arg: usize, got: &[f64], want: &[f64], tol: Tolerance) -> OutputCompare {
    let mut r = OutputCompare {
        arg,
        len: got.len().min(want.len()),
        max_abs_err: 0.0,
        max_rel_err: 0.0,
        num_failed: 0,
        nan_where_finite: 0,
        first_failure: None,
    };
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if g.is_finite() && w.is_finite() {
            let d = (g - w).abs();
            r.max_abs_err = r.max_abs_err.max(d);
            if w != 0.0 {
                r.max_rel_err = r.max_rel_err.max(d / w.abs());
            }
        }
        if g.is_nan() && w.is_finite() {
            r.nan_where_finite += 1;
        }
        if !within(g, w, tol) {
            r.num_failed += 1;
            if r.first_failure.is_none() {
                r.first_failure = Some(Mismatch {
                    index: i,
                    got: g,
                    want: w,
                });
            }
        }
    }
    r
}

/// The values of the case's outputs in `args` (a full argument list after a run), as
/// f64, row-major. Useful to compare two runs (GPU vs interpreter) with
/// [`compare_against`].
pub fn output_values(args: &[ArgValue], case: &Case) -> Result<Vec<Vec<f64>>, String> {
    outputs_of(args, case).map(|ts| ts.into_iter().map(|t| t.to_f64_vec()).collect())
}

fn outputs_of<'a>(
    args: &'a [ArgValue],
    case: &Case,
) -> Result<Vec<&'a kgen_core::host::HostTensor>, String> {
    // Either the full argument list (indexed by `case.outputs`) or just the outputs.
    let picked: Vec<&ArgValue> = if args.len() == case.args.len() {
        case.outputs.iter().map(|&i| &args[i]).collect()
    } else if args.len() == case.outputs.len() {
        args.iter().collect()
    } else {
        return Err(format!(
            "got {} values: expected the {} arguments or the {} outputs",
            args.len(),
            case.args.len(),
            case.outputs.len()
        ));
    };
    picked
        .into_iter()
        .zip(&case.outputs)
        .map(|(a, &i)| match a {
            ArgValue::Tensor(t) => Ok(t),
            ArgValue::Scalar(_) => Err(format!("output arg{i} is a scalar, not a tensor")),
        })
        .collect()
}

/// Compares a run's outputs with the case's float64 reference.
///
/// `outputs` is either the whole argument list after the run (same length as
/// `case.args`; the outputs are picked by `case.outputs`) or just the output tensors in
/// `case.outputs` order. The reference is computed from `case.args`, which still hold
/// the original inputs.
pub fn compare(outputs: &[ArgValue], case: &Case) -> CompareResult {
    let want = (case.reference)(&case.args);
    compare_against(outputs, &want, case)
}

/// Like [`compare`], against given expected values (one Vec per output).
pub fn compare_against(outputs: &[ArgValue], want: &[Vec<f64>], case: &Case) -> CompareResult {
    let mut res = CompareResult {
        tolerance: case.tolerance,
        outputs: Vec::new(),
        error: None,
    };
    let got = match outputs_of(outputs, case) {
        Ok(g) => g,
        Err(e) => {
            res.error = Some(e);
            return res;
        }
    };
    if want.len() != got.len() {
        res.error = Some(format!(
            "{} expected outputs for {} outputs",
            want.len(),
            got.len()
        ));
        return res;
    }
    for ((t, w), &arg) in got.iter().zip(want).zip(&case.outputs) {
        let g = t.to_f64_vec();
        if g.len() != w.len() {
            res.error = Some(format!(
                "arg{arg}: {} elements, reference has {}",
                g.len(),
                w.len()
            ));
            return res;
        }
        res.outputs.push(compare_values(arg, &g, w, case.tolerance));
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tolerance_rules() {
        let t = Tolerance {
            rel: 1e-3,
            abs: 1e-6,
        };
        assert!(within(1.0005, 1.0, t));
        assert!(!within(1.002, 1.0, t));
        assert!(within(5e-7, 0.0, t));
        assert!(!within(f64::NAN, 0.0, t));
        assert!(within(f64::NAN, f64::NAN, t));
        assert!(!within(1.0, f64::NAN, t));
        assert!(within(f64::INFINITY, f64::INFINITY, t));
        assert!(!within(f64::INFINITY, 1e300, t));
        let r = compare_values(3, &[1.0, f64::NAN, 2.0], &[1.0, 1.0, 2.5], t);
        assert_eq!(r.num_failed, 2);
        assert_eq!(r.nan_where_finite, 1);
        assert_eq!(r.first_failure.unwrap().index, 1);
        assert!((r.max_abs_err - 0.5).abs() < 1e-12);
    }
}
