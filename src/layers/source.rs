//! Reading `src/` as the import checks see it: every source file, its text without
//! comments and without its `#[cfg(test)]` modules.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, depth first.
pub fn rust_files(dir: &Path) -> Vec<PathBuf> {
    fn visit(dir: &Path, files: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("read src/") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                visit(&path, files);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    let mut files = Vec::new();
    visit(dir, &mut files);
    files.sort();
    files
}

/// `src/` of this crate.
pub fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// A file's text as the checks read it: no comments, no test modules.
pub fn program_text(file: &Path) -> String {
    let text = std::fs::read_to_string(file).expect("read a source file");
    strip_test_modules(&strip_comments(&text))
}

/// `text` without comments (line, block, doc). String literals are kept as they
/// are: none in `src/` holds `crate::`.
pub fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("//") {
            rest = after.find('\n').map_or("", |i| &after[i..]);
        } else if let Some(after) = rest.strip_prefix("/*") {
            rest = after.find("*/").map_or("", |i| &after[i + 2..]);
        } else {
            let c = rest.chars().next().unwrap_or_default();
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// `text` without its `#[cfg(test)] mod name { ... }` blocks.
pub fn strip_test_modules(text: &str) -> String {
    let mut out = text.to_string();
    while let Some(start) = out.find("#[cfg(test)]") {
        let after = &out[start..];
        let Some(open) = after.find('{') else { break };
        let head = &after[..open];
        if !head.contains("mod ") || head.contains(';') {
            // `#[cfg(test)] mod x;` or an item that is not a module: drop the attribute.
            out.replace_range(start..start + "#[cfg(test)]".len(), "");
            continue;
        }
        let mut depth = 0;
        let mut end = out.len();
        for (i, c) in after[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = start + open + i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.replace_range(start..end, "");
    }
    out
}
