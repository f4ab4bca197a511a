//! The bundled kernel sources, `kernels-src/*.kg`, embedded into the crate by `build.rs`
//! (the list is discovered at build time: adding a `.kg` file needs no code change).

include!(concat!(env!("OUT_DIR"), "/bundled_kernels.rs"));

/// (file stem, source text) of every `kernels-src/*.kg`, sorted by stem.
pub fn sources() -> &'static [(&'static str, &'static str)] {
    BUNDLED_SOURCES
}

/// The text of `kernels-src/<stem>.kg`, if bundled.
pub fn source(stem: &str) -> Option<&'static str> {
    BUNDLED_SOURCES
        .iter()
        .find(|(s, _)| *s == stem)
        .map(|(_, t)| *t)
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_kernels_src_file_is_bundled() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels-src");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "kg"))
                    .filter_map(|p| p.file_stem().and_then(|s| s.to_str()).map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        on_disk.sort();
        let bundled: Vec<String> = super::sources()
            .iter()
            .map(|(s, _)| s.to_string())
            .collect();
        assert_eq!(on_disk, bundled);
        for (stem, text) in super::sources() {
            assert_eq!(super::source(stem), Some(*text));
            assert!(!text.is_empty(), "{stem}");
        }
    }
}
