//! The layering rules of the workspace, checked on the sources themselves:
//! the core crate's modules import only from stages upstream of them (which
//! also rules out cycles), the DataFusion crate's modules have no import
//! cycle, and the core crate's normal dependencies exclude the application
//! stack (DataFusion, the CLI's crates, the benchmarks' data generator).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The core's top-level modules in data-flow order; a module may use only
/// modules ranked below it. `error`..`files` are the foundation; `cuda` is
/// the driver layer every stage stands on; then the stages, and `reader`
/// ties them together.
const CORE_RANKS: &[(&str, u32)] = &[
    ("error", 0),
    ("options", 1),
    ("stats", 2),
    ("files", 2),
    ("env", 2),
    ("cuda", 3),
    ("plan", 4),
    ("io", 5),
    ("gpu", 6),
    ("decode", 7),
    ("arrow", 8),
    ("reader", 9),
];

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            out.extend(rust_files(&p));
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// The top-level module a source file belongs to (`None` for the crate root
/// and for binaries in `src/bin`, which are crate roots of their own).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next()?.as_os_str().to_string_lossy().into_owned();
    let name = first.trim_end_matches(".rs").to_string();
    (name != "lib" && name != "main" && name != "bin").then_some(name)
}

/// Every `crate::<module>` a file names outside comments.
fn crate_references(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap();
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            let tail = &rest[i + "crate::".len()..];
            let name: String = tail.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            // `crate::{a, b}` groups are not used in this code base; a name is a module or a root item.
            if !name.is_empty() {
                out.insert(name);
            }
            rest = tail;
        }
    }
    out
}

/// Module -> modules it references, for one crate.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let modules: BTreeSet<String> = rust_files(src).iter().filter_map(|f| module_of(src, f)).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in rust_files(src) {
        let Some(module) = module_of(src, &file) else { continue };
        let text = std::fs::read_to_string(&file).unwrap();
        let refs = graph.entry(module.clone()).or_default();
        for r in crate_references(&text) {
            if r != module && modules.contains(&r) {
                refs.insert(r);
            }
        }
    }
    graph
}

fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(n) {
            Some(2) => return None,
            Some(1) => {
                let start = stack.iter().position(|s| s == n).unwrap();
                let mut cycle = stack[start..].to_vec();
                cycle.push(n.to_string());
                return Some(cycle);
            }
            _ => {}
        }
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for next in graph.get(n).into_iter().flatten() {
            if let Some(c) = visit(next, graph, state, stack) {
                return Some(c);
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    graph.keys().find_map(|n| visit(n, graph, &mut state, &mut Vec::new()))
}

#[test]
fn core_modules_only_use_upstream_stages() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = module_graph(&src);
    let rank = |m: &str| CORE_RANKS.iter().find(|(n, _)| *n == m).map(|(_, r)| *r);
    let mut problems = Vec::new();
    for (module, refs) in &graph {
        let Some(mine) = rank(module) else {
            problems.push(format!("module {module} has no place in CORE_RANKS: add it where it belongs in the data flow"));
            continue;
        };
        for r in refs {
            match rank(r) {
                Some(theirs) if theirs < mine => {}
                _ => problems.push(format!("{module} uses {r}, which is not upstream of it")),
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(graph.len() >= CORE_RANKS.len() - 1, "the parser found too few modules: {graph:?}");
    assert!(graph["reader"].contains("decode") && graph["io"].contains("plan"), "the parser found too few imports: {graph:?}");
}

#[test]
fn datafusion_modules_have_no_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/gpq-datafusion/src");
    let graph = module_graph(&src);
    assert!(graph.contains_key("scan") && graph["gpu"].contains("scan"), "the parser found too little: {graph:?}");
    if let Some(cycle) = find_cycle(&graph) {
        panic!("import cycle in gpq-datafusion: {}", cycle.join(" -> "));
    }
}

#[test]
fn the_cycle_finder_finds_cycles() {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    g.entry("a".into()).or_default().insert("b".into());
    g.entry("b".into()).or_default().insert("c".into());
    assert_eq!(find_cycle(&g), None);
    g.entry("c".into()).or_default().insert("a".into());
    assert_eq!(find_cycle(&g), Some(vec!["a".into(), "b".into(), "c".into(), "a".into()]));
}

#[test]
fn core_does_not_depend_on_the_application_stack() {
    let output = std::process::Command::new(env!("CARGO"))
        .args(["tree", "-p", "gpq", "-e", "normal", "--prefix", "none", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    assert!(output.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&output.stderr));
    let tree = String::from_utf8_lossy(&output.stdout);
    let crates: BTreeSet<&str> = tree.lines().filter_map(|l| l.split_whitespace().next()).collect();
    assert!(crates.contains("parquet") && crates.contains("cudarc"), "cargo tree printed too little: {tree}");
    let forbidden = [
        "datafusion",
        "clap",
        "indicatif",
        "tracing-subscriber",
        "serde_json",
        "tpchgen",
        "tpchgen-arrow",
        "tokio",
        "criterion",
        "gpq-bench",
        "gpq-datafusion",
    ];
    let found: Vec<&&str> = forbidden.iter().filter(|f| crates.contains(**f)).collect();
    assert!(found.is_empty(), "the core crate depends on {found:?}");
}
