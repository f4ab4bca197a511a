//! Deterministic mutation fuzzing of the front end.
//!
//! Assumes: `kgen_core::front::parse` and `kgen_core::compile_to_ir` take any UTF-8 text.
//! Guarantees checked here, on several thousand mutants of realistic kernels (every
//! truncation of one kernel, and seeded random token/char edits of all of them):
//! - neither function panics (each call runs inside `catch_unwind`);
//! - every parse failure carries at least one diagnostic whose primary span lies inside
//!   the text on char boundaries, and renders to non-empty text.
//!
//! The random generator is a fixed-seed xorshift, so a failure always reproduces; the
//! failing mutant is printed. Runs in a few seconds in debug builds. Set `KG_SHOW=1`
//! (with `--nocapture`) to print every rendered diagnostic, to review their wording.

use kgen_core::{compile_to_ir, front, Arch, CompileOptions, SourceFile};
use std::panic::{catch_unwind, AssertUnwindSafe};

const VEC_ADD: &str = r#"// c = a + b, one tile per block
kernel vec_add<T: float = f32, BLOCK: int = 1024>(
    x: tensor<T, 1, contiguous>,
    y: tensor<T, 1, contiguous>,
    out: tensor<T, 1, contiguous>,
) {
    let i = bid(0);
    let a = load(x, [i], [BLOCK]);
    let b = load(y, [i], [BLOCK]);
    store(out, [i], a + b);
}
"#;

const SOFTMAX: &str = r#"kernel softmax<T: float = bf16, BLOCK: int = 1024>(
    x: tensor<T, 2, contiguous>,
    y: tensor<T, 2, contiguous>,
    n: i32,
) {
    let row = bid(0);
    let mut m = full([1, BLOCK], -inf, f32);
    for k in 0..cdiv(n, BLOCK) {
        let v = load(x, [row, k], [1, BLOCK], pad = -inf) as f32;
        m = max(m, v);
    }
    let mx = m.max(1);
    let mut s = zeros([1, BLOCK], f32);
    for k in range(0, cdiv(n, BLOCK), 1) {
        let v = load(x, [row, k], [1, BLOCK], pad = -inf) as f32;
        s += exp(v - mx);
    }
    let total = s.sum(1);
    for k in 0..cdiv(n, BLOCK) {
        let v = load(x, [row, k], [1, BLOCK], pad = -inf) as f32;
        store(y, [row, k], (exp(v - mx) / total) as T);
    }
}
"#;

const RMSNORM: &str = r#"/* root-mean-square normalization of each row */
kernel rmsnorm<T: float = bf16, D: int = 4096, BLOCK: int = D>(
    x: tensor<T, [_, D], contiguous>,
    w: tensor<T, [D]>,
    out: tensor<T, [_, D], contiguous>,
    eps: f32,
) {
    static_assert(D % BLOCK == 0, "D must be a multiple of BLOCK");
    let row = bid(0);
    let v = load(x, [row, 0], [1, BLOCK]).reshape([BLOCK]) as f32;
    let ms = (v * v).sum(0) / (D as f32);
    let r = rsqrt(ms + eps);
    let g = load(w, [0], [BLOCK]) as f32;
    store(out, [row, 0], reshape((v * r * g) as T, [1, BLOCK]));
}
"#;

const ADAMW: &str = r#"kernel adamw<BLOCK: int = 512, DECAY: bool = true>(
    p: tensor<f32, 1, contiguous>, g: tensor<f32, 1>, m: tensor<f32, 1>, v: tensor<f32, 1>,
    lr: f32, beta1: f32, beta2: f32, eps: f32, wd: f32, step: i32,
) {
    let i = bid(0);
    let mut pp = load(p, [i], [BLOCK]);
    let gg = load(g, [i], [BLOCK]);
    let mm = beta1 * load(m, [i], [BLOCK]) + (1.0 - beta1) * gg;
    let vv = beta2 * load(v, [i], [BLOCK]) + (1.0 - beta2) * gg * gg;
    let bc1 = 1.0 - pow(beta1, step as f32);
    let bc2 = 1.0 - pow(beta2, step as f32);
    if DECAY && wd != 0.0 {
        pp -= lr * wd * pp;
    } else if wd < 0.0 {
        pp = pp;
    } else {
        let _unused = 0x10 | 3 << 2;
    }
    pp -= lr * (mm / bc1) / (sqrt(vv / bc2) + 1e-8);
    store(p, [i], pp);
    store(m, [i], mm);
    store(v, [i], vv);
}
"#;

const GATHER: &str = r#"kernel gather_scatter<BLOCK: int = 256>(
    src: tensor<f32, 2>, idx: tensor<i32, 1, contiguous>, dst: tensor<f32, 2>,
    hist: tensor<i32, 1>, n: i32, cols: i32,
) {
    let b = bid(0);
    let offs = b * BLOCK + arange(0, BLOCK);
    let mask = offs < n;
    let rows = gather(idx, [offs], mask = mask, other = 0);
    let c = arange(0, 32);
    let vals = gather(src, [expand_dims(rows, 1), expand_dims(c, 0)],
                      mask = expand_dims(mask, 1) && expand_dims(c < cols, 0), other = 0.0,);
    scatter(dst, [expand_dims(offs, 1), expand_dims(c, 0)], vals * 2.0, mask = expand_dims(mask, 1));
    let old = atomic_add(hist, [rows % 16], full([BLOCK], 1, i32), mask = mask);
    let worst = argmax(vals, 1);
    let flag = !(worst.min(0) >= 0) || -1_000 > 0;
}
"#;

const SOURCES: [&str; 5] = [VEC_ADD, SOFTMAX, RMSNORM, ADAMW, GATHER];

/// xorshift64*: small, deterministic, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.below(xs.len())]
    }
}

const INSERTS: &[&str] = &[
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    "<",
    ">",
    ",",
    ";",
    ":",
    "=",
    "==",
    "+",
    "-",
    "*",
    "/",
    "%",
    "&&",
    "||",
    "!",
    ".",
    "..",
    "_",
    "\"",
    "//",
    "/*",
    "*/",
    "@",
    "#",
    "$",
    "\\",
    "'",
    "kernel",
    "let",
    "mut",
    "for",
    "in",
    "if",
    "else",
    "as",
    "true",
    "false",
    "tensor",
    "contiguous",
    "static_assert",
    "range",
    "x",
    "0",
    "0x",
    "1e",
    "1.",
    "9999999999999999999999",
    "1e999",
    "é",
    "→",
    "😀",
    "\u{0}",
    "\t",
    "\n",
    " ",
    "<<=",
    "as f32",
    "f(",
    "tensor<",
    "else if",
];

/// Token boundaries of `s`: runs of word characters, or single other characters.
fn tokens(s: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut it = s.char_indices().peekable();
    while let Some((i, c)) = it.next() {
        let mut end = i + c.len_utf8();
        if c.is_alphanumeric() || c == '_' {
            while let Some(&(j, d)) = it.peek() {
                if d.is_alphanumeric() || d == '_' {
                    end = j + d.len_utf8();
                    it.next();
                } else {
                    break;
                }
            }
        }
        if !c.is_whitespace() {
            out.push((i, end));
        }
    }
    out
}

fn char_starts(s: &str) -> Vec<usize> {
    s.char_indices().map(|(i, _)| i).chain([s.len()]).collect()
}

fn mutate(src: &str, rng: &mut Rng) -> String {
    let toks = tokens(src);
    let n_edits = 1 + rng.below(3);
    let mut s = src.to_string();
    for _ in 0..n_edits {
        let toks_now = if s == src { toks.clone() } else { tokens(&s) };
        let cs = char_starts(&s);
        match rng.below(6) {
            // Delete a token.
            0 if !toks_now.is_empty() => {
                let (a, b) = toks_now[rng.below(toks_now.len())];
                s.replace_range(a..b, "");
            }
            // Duplicate a token.
            1 if !toks_now.is_empty() => {
                let (a, b) = toks_now[rng.below(toks_now.len())];
                let t = s[a..b].to_string();
                s.insert_str(b, &t);
            }
            // Replace a token by another one of the same text.
            2 if toks_now.len() > 1 => {
                let (a, b) = toks_now[rng.below(toks_now.len())];
                let (c, d) = toks_now[rng.below(toks_now.len())];
                let t = s[c..d].to_string();
                s.replace_range(a..b, &t);
            }
            // Swap two adjacent characters.
            3 if cs.len() > 2 => {
                let k = rng.below(cs.len() - 2);
                let (a, b, c) = (cs[k], cs[k + 1], cs[k + 2]);
                let first = s[a..b].to_string();
                let second = s[b..c].to_string();
                s.replace_range(a..c, &(second + &first));
            }
            // Delete one character.
            4 if cs.len() > 1 => {
                let k = rng.below(cs.len() - 1);
                s.replace_range(cs[k]..cs[k + 1], "");
            }
            // Insert punctuation, a keyword or odd unicode.
            _ => {
                let at = cs[rng.below(cs.len())];
                let ins = rng.pick(INSERTS);
                s.insert_str(at, ins);
            }
        }
    }
    s
}

/// Parses (and compiles) one text; panics with the text if a guarantee is broken.
fn check(text: &str, with_checker: bool) -> bool {
    let file = SourceFile::new("fuzz.kg", text);
    let res = catch_unwind(AssertUnwindSafe(|| front::parse(&file)));
    let parsed = match res {
        Err(_) => panic!("front::parse panicked on:\n{text:?}"),
        Ok(r) => r,
    };
    let ok = match parsed {
        Ok(_) => true,
        Err(diags) => {
            assert!(!diags.0.is_empty(), "no diagnostics for:\n{text:?}");
            let any_inside = diags.0.iter().any(|d| {
                d.primary_span().is_some_and(|sp| {
                    let r = sp.range();
                    r.start <= r.end
                        && r.end <= text.len()
                        && text.is_char_boundary(r.start)
                        && text.is_char_boundary(r.end)
                })
            });
            assert!(
                any_inside,
                "no located diagnostic for:\n{text:?}\n{diags:?}"
            );
            let rendered = catch_unwind(AssertUnwindSafe(|| diags.render(&file)))
                .unwrap_or_else(|_| panic!("render panicked on:\n{text:?}"));
            assert!(!rendered.trim().is_empty(), "empty render for:\n{text:?}");
            if std::env::var("KG_SHOW").is_ok() {
                eprintln!("{rendered}");
            }
            false
        }
    };
    if with_checker {
        let opts = CompileOptions::new(Arch::Sm80);
        if catch_unwind(AssertUnwindSafe(|| compile_to_ir(&file, &opts))).is_err() {
            panic!("compile_to_ir panicked on:\n{text:?}");
        }
    }
    ok
}

#[test]
fn the_seed_kernels_parse() {
    for src in SOURCES {
        let file = SourceFile::new("seed.kg", src);
        if let Err(d) = front::parse(&file) {
            panic!("{}", d.render(&file));
        }
    }
    // All of them in one file, too.
    let all = SOURCES.concat();
    assert_eq!(
        front::parse(&SourceFile::new("all.kg", all.as_str()))
            .map(|m| m.kernels.len())
            .ok(),
        Some(SOURCES.len())
    );
}

#[test]
fn every_truncation_of_a_kernel() {
    let src = SOFTMAX;
    let mut n = 0;
    for cut in char_starts(src) {
        check(&src[..cut], cut % 8 == 0);
        n += 1;
    }
    assert!(n > 700, "{n} truncations");
}

#[test]
fn random_mutants() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut total = 0;
    let mut parsed = 0;
    for round in 0..3_000 {
        let src = SOURCES[round % SOURCES.len()];
        let m = mutate(src, &mut rng);
        if check(&m, round % 4 == 0) {
            parsed += 1;
        }
        total += 1;
    }
    assert_eq!(total, 3_000);
    // Some mutants are still valid (e.g. a duplicated `-` or a renamed variable): make
    // sure the mutator is not so destructive that nothing parses, nor so mild that
    // everything does.
    eprintln!("{parsed} of {total} mutants parsed");
    assert!(
        parsed > 30 && parsed < 2_500,
        "{parsed} of {total} mutants parsed"
    );
}

#[test]
fn hostile_inputs() {
    let deep = |open: &str, n: usize| open.repeat(n);
    let cases = [
        String::new(),
        "\u{0}".into(),
        "\u{feff}kernel k() {}".into(),
        "kernel".into(),
        "kernel k".into(),
        "kernel k<".into(),
        "kernel k<T".into(),
        "kernel k(x: tensor<".into(),
        "😀😀😀".into(),
        "kernel k() { let x = \"é".into(),
        "kernel k() { /* é".into(),
        "kernel k() { // é".into(),
        deep("(", 100_000),
        deep(")", 100_000),
        deep("{", 10_000),
        format!("kernel k() {{ let x = {}1; }}", deep("-", 100_000)),
        format!("kernel k() {{ let x = {}1; }}", deep("!", 100_000)),
        format!("kernel k() {{ let x = 1{}; }}", deep("+1", 50_000)),
        format!("kernel k() {{ let x = a{}; }}", deep(".b()", 20_000)),
        format!("kernel k() {{ {} }}", deep("let x = 1; ", 20_000)),
        format!("kernel k() {{ {} }}", deep(";", 50_000)),
        deep("kernel k() {} ", 5_000),
        format!("kernel k() {{ let x = {}; }}", deep("9", 10_000)),
        format!("kernel k() {{ let x = 1e{}; }}", deep("9", 1_000)),
    ];
    for c in &cases {
        check(c, true);
    }
}
