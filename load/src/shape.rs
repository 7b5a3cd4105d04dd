//! The load client's shape (issue 49): no file over [`MAX_LINES`] lines, and no
//! file that reaches itself through its imports. A file imports another when it
//! names one of its items or the module itself: `crate::a::b`, `super::a`,
//! `self::a`, or a child module it declares (`mod a;` then `a::b`), in a `use` or
//! inline, outside comments and the `#[cfg(test)] mod tests` at a file's end. An
//! item of `main.rs`, the crate root, named from another file counts as an import
//! of `main.rs` (which imports every module it runs), so the root holds only what
//! runs the rest.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The most lines a file of the load client may have.
const MAX_LINES: usize = 400;

/// Every file of `src/` but this one, with its module path (`main.rs`: `[]`,
/// `a.rs` and `a/mod.rs`: `["a"]`, `a/b.rs`: `["a", "b"]`).
fn files() -> BTreeMap<Vec<String>, PathBuf> {
    fn visit(dir: &Path, under: &[String], out: &mut BTreeMap<Vec<String>, PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("read a directory of src/") {
            let path = entry.expect("a directory entry").path();
            let name = path
                .file_stem()
                .expect("a name")
                .to_string_lossy()
                .to_string();
            let mut module = under.to_vec();
            if path.is_dir() {
                module.push(name);
                visit(&path, &module, out);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") || (under.is_empty() && name == "shape") {
                continue;
            }
            if !(name == "mod" || under.is_empty() && name == "main") {
                module.push(name);
            }
            out.insert(module, path);
        }
    }
    let mut out = BTreeMap::new();
    visit(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &[],
        &mut out,
    );
    out
}

/// `text` without line comments (doc comments too) and from its
/// `#[cfg(test)]\nmod tests` on.
fn code(text: &str) -> String {
    let text = text
        .find("#[cfg(test)]\nmod tests")
        .map_or(text, |at| &text[..at]);
    text.lines()
        .map(|line| line.find("//").map_or(line, |at| &line[..at]))
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The paths that start at `rest` (just after `crate::`, `super::`, ...): `a::b`
/// gives `[a, b]`; `a::{b, c::d}` gives `[a, b]` and `[a, c, d]`.
fn paths(rest: &str) -> Vec<Vec<String>> {
    let mut path = Vec::new();
    let mut rest = rest;
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            // Each element of the group at depth 0, after the path so far.
            let mut out = Vec::new();
            let (mut depth, mut start) = (0, true);
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && depth == 0 && !c.is_whitespace() => {
                        start = false;
                        for tail in paths(&group[i..]) {
                            out.push([path.clone(), tail].concat());
                        }
                    }
                    _ => {}
                }
            }
            return out;
        }
        let ident: String = rest.chars().take_while(|c| is_ident(*c)).collect();
        if ident.is_empty() {
            break;
        }
        rest = &rest[ident.len()..];
        path.push(ident);
        match rest.strip_prefix("::") {
            Some(after) => rest = after,
            None => break,
        }
    }
    vec![path]
}

/// The files `module`'s code imports (module paths of `known`, never itself).
fn imports(module: &[String], code: &str, known: &BTreeSet<Vec<String>>) -> BTreeSet<Vec<String>> {
    // The child modules it declares: `mod a;`, `pub mod a;`.
    let children: Vec<String> = code
        .lines()
        .filter_map(|l| {
            let l = l.trim().trim_start_matches("pub ");
            l.strip_prefix("mod ")?.strip_suffix(';').map(String::from)
        })
        .collect();
    let mut found = BTreeSet::new();
    for (at, _) in code.match_indices("::") {
        // The first `::` of a path: its head is the word before it.
        let head_start = code[..at]
            .char_indices()
            .rev()
            .take_while(|(_, c)| is_ident(*c))
            .last()
            .map_or(at, |(i, _)| i);
        let head = &code[head_start..at];
        let before = code[..head_start].chars().next_back();
        if head.is_empty() || before.is_some_and(|c| is_ident(c) || c == ':' || c == '$') {
            continue;
        }
        let mut base = match head {
            "crate" => Vec::new(),
            "self" => module.to_vec(),
            "super" => module[..module.len().saturating_sub(1)].to_vec(),
            child if children.iter().any(|c| c == child) => {
                [module.to_vec(), vec![child.to_string()]].concat()
            }
            _ => continue, // another crate's path (`std::`, `stampede::`, ...)
        };
        let mut rest = &code[at + 2..];
        while let Some(after) = rest.strip_prefix("super::") {
            base.pop();
            rest = after;
        }
        for path in paths(rest) {
            let full = [base.clone(), path].concat();
            // The longest prefix that is a file: the module named, or the one
            // holding the item named (the crate root at least).
            let file = (0..=full.len())
                .rev()
                .map(|n| full[..n].to_vec())
                .find(|p| known.contains(p))
                .unwrap_or_default();
            if file != module {
                found.insert(file);
            }
        }
    }
    found
}

/// Each file's module path with the files it imports.
fn graph() -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let files = files();
    let known: BTreeSet<Vec<String>> = files.keys().cloned().collect();
    files
        .iter()
        .map(|(module, path)| {
            let text = std::fs::read_to_string(path).expect("read a source file");
            (module.clone(), imports(module, &code(&text), &known))
        })
        .collect()
}

fn show(module: &[String]) -> String {
    match module {
        [] => "main".to_string(),
        _ => module.join("::"),
    }
}

#[test]
fn no_file_is_over_the_line_limit() {
    let long: Vec<String> = files()
        .values()
        .filter_map(|path| {
            let lines = std::fs::read_to_string(path).ok()?.lines().count();
            (lines > MAX_LINES).then(|| format!("{} ({lines} lines)", path.display()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "over {MAX_LINES} lines: {long:?} (split them by responsibility)"
    );
}

#[test]
fn no_file_reaches_itself_through_its_imports() {
    // Peel off the files that import none of those left; what stays imports
    // another file that stays: a loop, or a file that leads into one.
    let mut left = graph();
    assert!(left.len() > 10, "read too few files: {:?}", left.keys());
    loop {
        let free: Vec<Vec<String>> = left
            .iter()
            .filter(|(_, imports)| imports.iter().all(|i| !left.contains_key(i)))
            .map(|(module, _)| module.clone())
            .collect();
        if free.is_empty() {
            break;
        }
        for module in free {
            left.remove(&module);
        }
    }
    let tangled: Vec<String> = left
        .iter()
        .map(|(module, imports)| {
            let within: Vec<String> = imports
                .iter()
                .filter(|i| left.contains_key(*i))
                .map(|i| show(i))
                .collect();
            format!("{} -> {}", show(module), within.join(", "))
        })
        .collect();
    assert!(tangled.is_empty(), "an import loop among: {tangled:#?}");
}

#[test]
fn the_reader_finds_imports() {
    let known: BTreeSet<Vec<String>> = [
        &[][..],
        &["a"],
        &["a", "b"],
        &["a", "b", "e"],
        &["c"],
        &["d"],
    ]
    .iter()
    .map(|m| m.iter().map(|s| s.to_string()).collect())
    .collect();
    let module = vec!["a".to_string(), "b".to_string()];
    let text = "use crate::c::Item;\nuse super::{x, b};\nfn f() { crate::Root; d::y(); }\n\
                mod e;\nfn g() { e::z(); std::mem::drop(1); }\n// crate::d\n\
                #[cfg(test)]\nmod tests { use crate::d; }\n";
    let found = imports(&module, &code(text), &known);
    let show_all: Vec<String> = found.iter().map(|m| show(m)).collect();
    // `super::x` is an item of `a`, `super::b` this file; `d::y` is not a child
    // of this file (no `mod d;`), `e::z` is; a test module's imports are not read.
    assert_eq!(show_all, ["main", "a", "a::b::e", "c"]);
}
