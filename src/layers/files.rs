//! No import loop between two files of `src/`, at any depth: the module check of
//! `layers/mod.rs` sees only top-level modules, so `sale/store.rs` importing
//! `sale/queue.rs` which imports `sale/store.rs` passed it. Here every file is a
//! node (`src/sale/store.rs` is `sale::store`, `src/sale/mod.rs` is `sale`), and an
//! edge is any path the file names that leads into another file: a `use` tree
//! (`crate::`, `super::`, `self::`, or a child module's name), an inline path
//! (`crate::sale::queue::restore::restore(..)`, `super::pending::count(..)`), or a child
//! module named inline from its parent (`store::list_page(..)` in `sale/mod.rs`).
//! A path leads to the longest module prefix it names, so a re-export counts as an
//! import of the file that re-exports it. The binaries (`main.rs`, `bin/`) are
//! crates of their own and are left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::source;

type Module = Vec<String>;

/// `src/sale/store.rs` -> `sale::store`; `src/sale/mod.rs` -> `sale`; `src/lib.rs` -> the root.
fn module_of(rel: &Path) -> Module {
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.strip_suffix(".rs").unwrap_or(&last);
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_string());
    }
    parts
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn segments(path: &str) -> Vec<String> {
    path.split("::")
        .map(|s| s.split_whitespace().next().unwrap_or("").to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// The top-level pieces of a `{...}` group, split at commas outside nested groups.
fn split_group(group: &str) -> Vec<&str> {
    let (mut depth, mut start, mut parts) = (0, 0, Vec::new());
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&group[start..]);
    parts
}

/// A `use` tree (what follows `use`, without the `;`) as the full paths it names;
/// `self` in a group names the group's prefix, `*` the prefix too.
fn use_tree_paths(tree: &str) -> Vec<Module> {
    let tree = tree.trim().trim_start_matches("::");
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or(tree);
        let mut segs = segments(path);
        if segs.last().is_some_and(|s| s == "*" || s == "self") {
            segs.pop();
        }
        return vec![segs];
    };
    let prefix = segments(tree[..open].trim_end().trim_end_matches("::"));
    let close = tree.rfind('}').unwrap_or(tree.len());
    let mut out = Vec::new();
    for part in split_group(&tree[open + 1..close]) {
        if part.trim().is_empty() {
            continue;
        }
        for rest in use_tree_paths(part) {
            let mut full = prefix.clone();
            full.extend(rest);
            out.push(full);
        }
    }
    out
}

/// Every path `text` names that may lead into a file of this crate: its `use`
/// trees, its inline `crate::` / `super::` / `self::` paths, and inline paths that
/// start with one of `children` (the file's own child modules).
fn paths_of(text: &str, children: &BTreeSet<String>) -> Vec<Module> {
    paths_at(text, children)
        .into_iter()
        .map(|(_, p)| p)
        .collect()
}

/// [`paths_of`], each with the inline modules (`mod tests { .. }`) it stands in,
/// outermost first, so that their `super::` is read from there.
fn paths_at(text: &str, children: &BTreeSet<String>) -> Vec<(Module, Module)> {
    let inline = inline_modules(text);
    let within = |i: usize| -> Module {
        inline
            .iter()
            .filter(|(start, end, _)| (*start..*end).contains(&i))
            .map(|(_, _, name)| name.clone())
            .collect()
    };
    let mut paths = Vec::new();
    let mut rest_of_text = String::with_capacity(text.len());
    // `use` statements, cut out of the text so their paths are not read twice.
    let mut at = 0;
    while let Some(found) = text[at..].find("use ") {
        let i = at + found;
        let before = text[..i].chars().next_back();
        if before.is_some_and(is_ident_char) {
            rest_of_text.push_str(&text[at..i + 4]);
            at = i + 4;
            continue;
        }
        let end = text[i..].find(';').map_or(text.len(), |e| i + e);
        let inside = within(i);
        paths.extend(
            use_tree_paths(&text[i + 4..end])
                .into_iter()
                .map(|p| (inside.clone(), p)),
        );
        // Keep the text's length, so positions stay those of `inline`.
        rest_of_text.push_str(&text[at..i]);
        rest_of_text.push_str(&" ".repeat(end - i));
        at = end;
    }
    rest_of_text.push_str(&text[at..]);
    let text = rest_of_text;
    let starts: Vec<String> = ["crate", "super", "self"]
        .into_iter()
        .map(String::from)
        .chain(children.iter().cloned())
        .collect();
    for start in &starts {
        let needle = format!("{start}::");
        for (i, _) in text.match_indices(&needle) {
            let before = text[..i].chars().next_back();
            if before.is_some_and(|c| is_ident_char(c) || c == '$' || c == ':') {
                continue; // `$crate::`, `my_crate::`, the middle of a longer path
            }
            let len = text[i..]
                .find(|c: char| !(is_ident_char(c) || c == ':'))
                .unwrap_or(text.len() - i);
            paths.push((within(i), segments(&text[i..i + len])));
        }
    }
    paths
}

/// The inline modules of a text (`mod name { .. }`, not `mod name;`): where each
/// starts and ends, and its name.
fn inline_modules(text: &str) -> Vec<(usize, usize, String)> {
    let mut found = Vec::new();
    for (i, _) in text.match_indices("mod ") {
        if text[..i].chars().next_back().is_some_and(is_ident_char) {
            continue;
        }
        let after = &text[i + 4..];
        let name: String = after.chars().take_while(|c| is_ident_char(*c)).collect();
        let rest = after[name.len()..].trim_start();
        if name.is_empty() || !rest.starts_with('{') {
            continue;
        }
        let open = i + 4 + (after.len() - rest.len());
        let mut depth = 0;
        let mut end = text.len();
        for (j, c) in text[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + j;
                        break;
                    }
                }
                _ => {}
            }
        }
        found.push((open, end, name));
    }
    found
}

/// The file a path leads to, seen from the file of module `here`: the longest
/// prefix of the full path that is a file's module. `None` for another crate.
fn resolve(path: &[String], here: &Module, modules: &BTreeSet<Module>) -> Option<Module> {
    let (mut base, mut rest) = (here.clone(), path);
    match rest.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &rest[1..];
        }
        Some("self") => rest = &rest[1..],
        Some("super") => {
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
        }
        Some(first) => {
            let mut child = here.clone();
            child.push(first.to_string());
            if !modules.contains(&child) {
                return None; // `std::`, `tokio::`, a type's associated item
            }
        }
        None => return None,
    }
    let mut full = base;
    full.extend(rest.iter().cloned());
    (0..=full.len())
        .rev()
        .map(|n| full[..n].to_vec())
        .find(|m| modules.contains(m))
}

/// Each file of `src/` (as its module) with the files it imports.
fn file_graph() -> BTreeMap<Module, BTreeSet<Module>> {
    let src = source::src_dir();
    let files: Vec<_> = source::rust_files(&src)
        .into_iter()
        .filter(|f| {
            let rel = f.strip_prefix(&src).expect("under src/");
            !(rel.starts_with("bin") || rel == Path::new("main.rs"))
        })
        .collect();
    let modules: BTreeSet<Module> = files
        .iter()
        .map(|f| module_of(f.strip_prefix(&src).expect("under src/")))
        .collect();
    let mut graph = BTreeMap::new();
    for file in &files {
        let here = module_of(file.strip_prefix(&src).expect("under src/"));
        let children: BTreeSet<String> = modules
            .iter()
            .filter(|m| m.len() == here.len() + 1 && m.starts_with(&here))
            .filter_map(|m| m.last().cloned())
            .collect();
        let imports: BTreeSet<Module> = paths_at(&source::program_text(file), &children)
            .iter()
            .filter_map(|(inside, p)| {
                let mut from = here.clone();
                from.extend(inside.iter().cloned());
                resolve(p, &from, &modules)
            })
            .filter(|m| *m != here)
            .collect();
        graph.insert(here, imports);
    }
    graph
}

/// The strongly connected components of more than one file (Tarjan's algorithm).
fn loops(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        on_stack: BTreeSet<&'a Module>,
        found: Vec<Vec<Module>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a Module) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                if !self.graph.contains_key(w) {
                    continue;
                }
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.found
}

#[test]
fn no_import_loop_between_files() {
    let graph = file_graph();
    let name = |m: &Module| {
        if m.is_empty() {
            "lib".to_string()
        } else {
            m.join("::")
        }
    };
    let described: Vec<String> = loops(&graph)
        .iter()
        .map(|component| {
            let members: BTreeSet<&Module> = component.iter().collect();
            let edges: Vec<String> = component
                .iter()
                .flat_map(|from| {
                    graph[from]
                        .iter()
                        .filter(|to| members.contains(to))
                        .map(move |to| format!("{} -> {}", name(from), name(to)))
                })
                .collect();
            edges.join(", ")
        })
        .collect();
    assert!(
        described.is_empty(),
        "files that import each other (move the shared piece to where it belongs):\n{}",
        described.join("\n")
    );
}

#[test]
fn the_file_reader_resolves_paths() {
    let modules: BTreeSet<Module> = [
        vec![],
        vec!["sale"],
        vec!["sale", "store"],
        vec!["sale", "queue"],
        vec!["batch"],
    ]
    .into_iter()
    .map(|m| m.into_iter().map(String::from).collect())
    .collect();
    let text = "use crate::{batch::{Call, Item}, sale::{self, queue}};\nuse super::store::Row as R;\n\
                use std::sync::Arc;\nfn f() { super::queue::restore(); crate::batch::x(); Self::new(); }\n";
    let here: Module = vec!["sale".into(), "store".into()];
    let found: BTreeSet<Module> = paths_of(text, &BTreeSet::new())
        .iter()
        .filter_map(|p| resolve(p, &here, &modules))
        .collect();
    let want: BTreeSet<Module> = [
        vec!["batch"],
        vec!["sale"],
        vec!["sale", "queue"],
        vec!["sale", "store"],
    ]
    .into_iter()
    .map(|m| m.into_iter().map(String::from).collect())
    .collect();
    assert_eq!(found, want);
    // From the parent, a child named inline is an import of the child.
    let children: BTreeSet<String> = ["store".to_string()].into();
    let from_parent: BTreeSet<Module> = paths_of("fn g() { store::list_page(); }", &children)
        .iter()
        .filter_map(|p| resolve(p, &vec!["sale".to_string()], &modules))
        .collect();
    assert_eq!(
        from_parent,
        [vec!["sale".to_string(), "store".to_string()]].into()
    );
    // `super` in an inline module (`mod millis { use super::*; }`) is the file itself.
    let found = paths_at("pub mod millis {\n    use super::*;\n}\n", &BTreeSet::new());
    assert_eq!(
        found,
        vec![(vec!["millis".to_string()], vec!["super".to_string()])]
    );
    let mut from = here.clone();
    from.push("millis".into());
    assert_eq!(resolve(&found[0].1, &from, &modules), Some(here));
}
