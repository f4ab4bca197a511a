//! Which kernels the bundled files hold (the texts themselves are embedded by
//! `crate::bundled`), and where a case's kernel text comes from.

/// The source text of `kernels-src/<stem>.kg`, of the self-test kernel `<stem>`
/// (`src/cases/kernels/`), or of `src/cases/lang.kg` for `lang`.
pub fn kernel_source(stem: &str) -> Option<&'static str> {
    match stem {
        "lang" => Some(super::lang::SOURCE),
        _ => crate::bundled::source(stem).or_else(|| selftest_kernel_source(stem)),
    }
}

/// The file a case's kernel comes from, for messages.
pub fn kernel_file_name(stem: &str) -> String {
    if stem == "lang" {
        "src/cases/lang.kg".to_string()
    } else if crate::bundled::source(stem).is_some() {
        format!("kernels-src/{stem}.kg")
    } else {
        format!("src/cases/kernels/{stem}.kg")
    }
}

/// Kernels that only the self-test runs (`src/cases/kernels/`): they check the
/// language's semantics on the GPU against the interpreter, and are not ops (so not in
/// `kernels-src/`, the op library).
pub const SELFTEST_KERNELS: &[(&str, &str)] = &[("int_div", include_str!("kernels/int_div.kg"))];

/// The source text of the self-test kernel `<stem>` (`src/cases/kernels/<stem>.kg`).
pub fn selftest_kernel_source(stem: &str) -> Option<&'static str> {
    SELFTEST_KERNELS
        .iter()
        .find(|(s, _)| *s == stem)
        .map(|(_, t)| *t)
}

/// Every kernel in every bundled file with cases here: (file stem, kernel name). Files
/// with more than one kernel (`sumsq.kg` holds `sumsq` and `sumsq_finalize`) list each.
pub const BUNDLED_KERNELS: &[(&str, &str)] = &[
    ("adamw", "adamw"),
    ("cross_entropy", "ce_count"),
    ("cross_entropy", "cross_entropy"),
    ("cross_entropy", "cross_entropy_inplace"),
    ("cross_entropy", "ce_loss_mean"),
    ("cross_entropy_cached", "cross_entropy_cached"),
    ("cross_entropy_cached", "cross_entropy_cached_inplace"),
    ("cross_entropy_cluster", "cross_entropy_cluster"),
    ("cross_entropy_cluster", "cross_entropy_cluster_inplace"),
    ("cross_entropy_window", "cross_entropy_window"),
    ("cross_entropy_window", "cross_entropy_window_inplace"),
    ("gemm", "gemm"),
    ("layernorm", "layernorm"),
    ("layernorm", "layernorm_rows"),
    ("layernorm_bwd", "layernorm_bwd"),
    ("layernorm_bwd", "layernorm_bwd_dwdb"),
    ("linear_bwd", "linear_bwd"),
    ("linear_bwd", "linear_bwd_db"),
    ("matmul", "matmul"),
    ("optim", "adamw_multi"),
    ("optim", "grad_stats"),
    ("optim", "grad_stats_finalize"),
    ("optim", "scale_by"),
    ("relu", "relu"),
    ("relu", "relu_bwd"),
    ("rmsnorm", "rmsnorm"),
    ("rmsnorm", "rmsnorm_rows"),
    ("rmsnorm_bwd", "rmsnorm_bwd"),
    ("rmsnorm_bwd", "rmsnorm_bwd_dw"),
    ("rope", "rope"),
    ("scan", "scan_tile"),
    ("scan", "segment_offsets"),
    ("scan", "top_p"),
    ("softmax", "softmax"),
    ("softmax_bwd", "softmax_bwd"),
    ("sumsq", "sumsq"),
    ("sumsq", "sumsq_finalize"),
    ("swiglu", "swiglu"),
    ("swiglu", "swiglu_bwd"),
    ("vec_add", "vec_add"),
];
