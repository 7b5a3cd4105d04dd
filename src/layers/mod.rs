//! Who may import whom (ARCHITECTURE.md, "Who may import whom"), checked against
//! the source: every top-level module of `src/` has a layer, a module imports only
//! modules of its own layer or below, and no module reaches itself through its
//! imports. An import is a `crate::<module>` path (in a `use` or inline) outside
//! comments and `#[cfg(test)]` modules.

mod files;
mod source;

use std::collections::{BTreeMap, BTreeSet};

/// The layers, lowest first. Composition modules are ordered among themselves too
/// (each may import only those before it), so the order is a total one there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Layer {
    /// Hold data or wrap one external thing; import only other leaves.
    Leaf,
    /// What the service can do; import leaves and each other, never composition.
    Capability,
    /// Put it together: the state, the HTTP routes, the pages, the server.
    Composition(u8),
}

use Layer::{Capability, Composition, Leaf};

/// Every top-level module of `src/` (not `lib.rs`, nor the binaries: `main.rs`,
/// `bin/`) with its layer.
const LAYERS: &[(&str, Layer)] = &[
    ("error", Leaf),
    ("domain", Leaf),
    ("keys", Leaf),
    ("config", Leaf),
    ("redis_conn", Leaf),
    ("lua", Leaf),
    ("metrics", Leaf),
    ("conn", Leaf),
    ("random", Leaf),
    ("telemetry", Leaf),
    ("paging", Leaf),
    ("csv", Leaf),
    ("audit", Capability),
    ("auth", Capability),
    ("gate", Capability),
    ("limit", Capability),
    ("lock", Capability),
    ("cache", Capability),
    ("batch", Capability),
    ("live", Capability),
    ("sale", Capability),
    ("vote", Capability),
    ("settle", Capability),
    ("recover", Capability),
    ("restore", Capability),
    ("roster", Capability),
    ("seed", Capability),
    ("state", Composition(0)),
    ("observe", Composition(1)),
    ("routes", Composition(2)),
    ("web", Composition(3)),
    ("openapi", Composition(4)),
    ("startup", Composition(5)),
    // What the load client (`load/`) asks of the stores; its cleanup connects as
    // the other commands do, through `startup`.
    ("rehearse", Composition(6)),
];

/// What the walk of `src/` passes over: the crate root, the binaries (`main.rs`,
/// `bin/`: crates of their own, which name the library `stampede::` and sit above
/// every layer), and this test, which is not part of the program.
const SKIPPED: &[&str] = &["lib", "main", "bin", "layers"];

fn layer(module: &str) -> Option<Layer> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|(_, l)| *l)
}

/// The top-level modules `text` names through `crate::`: `crate::a::b`,
/// `use crate::{a, b::c}`.
fn imports_of(text: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut found = BTreeSet::new();
    for (i, _) in text.match_indices("crate::") {
        let before = text[..i].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue; // `$crate::`, `my_crate::`
        }
        let rest = &text[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && !c.is_whitespace() => {
                        found.insert(ident(&group[j..]));
                        start = false;
                    }
                    _ => {}
                }
            }
        } else {
            found.insert(ident(rest));
        }
    }
    found
}

/// Each top-level module of `src/` with the modules it imports.
fn import_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = source::src_dir();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in source::rust_files(&src) {
        let rel = file.strip_prefix(&src).expect("under src/");
        let first = rel.components().next().expect("a component");
        let first = first.as_os_str().to_string_lossy();
        let module = first.strip_suffix(".rs").unwrap_or(&first).to_string();
        if SKIPPED.contains(&module.as_str()) {
            continue;
        }
        let imports = imports_of(&source::program_text(&file));
        let entry = graph.entry(module.clone()).or_default();
        entry.extend(imports.into_iter().filter(|m| *m != module));
    }
    graph
}

#[test]
fn every_module_has_a_layer() {
    let unplaced: Vec<_> = import_graph()
        .into_keys()
        .filter(|m| layer(m).is_none())
        .collect();
    assert!(
        unplaced.is_empty(),
        "modules without a layer (add them to LAYERS and to ARCHITECTURE.md): {unplaced:?}"
    );
}

#[test]
fn no_module_imports_a_higher_layer() {
    let mut wrong = Vec::new();
    for (module, imports) in import_graph() {
        let Some(own) = layer(&module) else { continue };
        for import in imports {
            let Some(theirs) = layer(&import) else {
                continue; // not a module of ours (`crate::foo!` macro, a re-export)
            };
            let allowed = match (own, theirs) {
                (Leaf, Leaf) | (Capability, Leaf | Capability) => true,
                (Composition(a), Composition(b)) => b < a,
                (Composition(_), _) => true,
                _ => false,
            };
            if !allowed {
                wrong.push(format!("{module} ({own:?}) imports {import} ({theirs:?})"));
            }
        }
    }
    assert!(wrong.is_empty(), "imports against the layers: {wrong:#?}");
}

#[test]
fn no_import_cycle() {
    let graph = import_graph();
    // Depth-first search; a module met again while still on the path closes a cycle.
    fn visit<'a>(
        module: &'a str,
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|m| *m == module) {
            let mut cycle: Vec<String> = path[at..].iter().map(|m| m.to_string()).collect();
            cycle.push(module.to_string());
            return Some(cycle);
        }
        if !done.insert(module) {
            return None;
        }
        path.push(module);
        for next in graph.get(module).into_iter().flatten() {
            if graph.contains_key(next)
                && let Some(cycle) = visit(next, graph, path, done)
            {
                return Some(cycle);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    for module in graph.keys() {
        if let Some(cycle) = visit(module, &graph, &mut Vec::new(), &mut done) {
            panic!("import cycle: {}", cycle.join(" -> "));
        }
    }
}

#[test]
fn the_reader_finds_imports() {
    let text = "use crate::a::b;\nuse crate::{c, d::{e, f}, g};\nfn x() { crate::h::i(); $crate::j; }\n\
                // crate::k\n#[cfg(test)]\nmod tests { use crate::l; }\n";
    let found = imports_of(&source::strip_test_modules(&source::strip_comments(text)));
    let want: BTreeSet<String> = ["a", "c", "d", "g", "h"].map(String::from).into();
    assert_eq!(found, want);
}
