//! The floors check: no import circle between the workspace's files.
//!
//! A file imports another when it names an item the other defines: a `use`
//! (`crate::`, `super::`, `self::`, a child module's or a workspace crate's
//! name), or such a path in code (`crate::store::Tx::begin`), followed
//! through `pub use` re-exports to the file that defines the item (so
//! `use crate::Attestor` goes to attestor.rs, not lib.rs). `mod x;` alone is
//! no import, and neither is a module's use of its own submodules: a
//! folder's face (mod.rs, or foo.rs beside foo/) may name what its parts
//! define, its parts build on it. Test code (`#[cfg(test)]` modules and what only they reach) is
//! left out: the floors are the product's. Std only, so scripts/test
//! compiles and runs it with plain rustc before any build of the product:
//!
//!   rustc --edition 2021 --test -o target/import-cycles scripts/import_cycles.rs
//!   target/import-cycles            (from the workspace root)
//!
//! Each circle is reported with its files and, arrow by arrow, the items
//! that tie it.
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    Sep,
    Punct(char),
    Other,
}

/// Rust tokens, comments and literals skipped (string contents are kept:
/// `#[path = "…"]` needs them).
fn lex(src: &str) -> Vec<Tok> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let n = c.len();
    let ident_start = |ch: char| ch == '_' || ch.is_alphabetic();
    let ident_char = |ch: char| ch == '_' || ch.is_alphanumeric();
    while i < n {
        let ch = c[i];
        if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && c.get(i + 1) == Some(&'/') {
            while i < n && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < n {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if (ch == 'r' || (ch == 'b' && c.get(i + 1) == Some(&'r'))) && {
            let mut j = i + if ch == 'b' { 2 } else { 1 };
            while c.get(j) == Some(&'#') {
                j += 1;
            }
            c.get(j) == Some(&'"')
        } {
            // raw string r#"…"#
            let mut j = i + if ch == 'b' { 2 } else { 1 };
            let mut hashes = 0;
            while c[j] == '#' {
                hashes += 1;
                j += 1;
            }
            j += 1;
            let start = j;
            loop {
                if j >= n {
                    break;
                }
                if c[j] == '"' && (0..hashes).all(|k| c.get(j + 1 + k) == Some(&'#')) {
                    break;
                }
                j += 1;
            }
            out.push(Tok::Str(c[start..j.min(n)].iter().collect()));
            i = j + 1 + hashes;
        } else if ch == '"' || (ch == 'b' && c.get(i + 1) == Some(&'"')) {
            let mut j = if ch == 'b' { i + 2 } else { i + 1 };
            let mut s = String::new();
            while j < n && c[j] != '"' {
                if c[j] == '\\' {
                    j += 1;
                }
                if j < n {
                    s.push(c[j]);
                }
                j += 1;
            }
            out.push(Tok::Str(s));
            i = j + 1;
        } else if ch == '\'' || (ch == 'b' && c.get(i + 1) == Some(&'\'')) {
            let j = if ch == 'b' { i + 1 } else { i };
            if c.get(j + 1) == Some(&'\\') {
                // '\n', '\u{..}', '\''
                let mut k = j + 2;
                while k < n && c[k] != '\'' {
                    k += 1;
                }
                i = k + 1;
            } else if c.get(j + 2) == Some(&'\'') {
                i = j + 3;
            } else {
                // a lifetime or a label
                let mut k = j + 1;
                while k < n && ident_char(c[k]) {
                    k += 1;
                }
                i = k;
            }
            out.push(Tok::Other);
        } else if ident_start(ch) {
            let mut j = i;
            if ch == 'r' && c.get(i + 1) == Some(&'#') {
                j += 2;
            }
            let start = j;
            while j < n && ident_char(c[j]) {
                j += 1;
            }
            out.push(Tok::Ident(c[start..j].iter().collect()));
            i = j;
        } else if ch.is_ascii_digit() {
            let mut j = i;
            while j < n
                && (ident_char(c[j])
                    || (c[j] == '.' && c.get(j + 1).is_some_and(|d| d.is_ascii_digit())))
            {
                j += 1;
            }
            out.push(Tok::Other);
            i = j;
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push(Tok::Sep);
            i += 2;
        } else {
            out.push(Tok::Punct(ch));
            i += 1;
        }
    }
    out
}

type ModId = usize;

/// One `use` leaf: the path and the name it binds (`None` for a glob).
#[derive(Clone, Debug)]
struct Use {
    path: Vec<String>,
    name: Option<String>,
    test: bool,
}

#[derive(Debug, Default)]
struct Module {
    krate: usize,
    parent: Option<ModId>,
    file: PathBuf,
    /// Where `mod x;` inside this module looks for x.rs / x/mod.rs.
    dir: PathBuf,
    test: bool,
    children: BTreeMap<String, ModId>,
    uses: Vec<Use>,
    defs: BTreeSet<String>,
    /// Paths named in code (not in a `use`), and whether in test code.
    paths: Vec<(Vec<String>, bool)>,
}

struct Crate {
    root: ModId,
}

#[derive(Default)]
struct Tree {
    mods: Vec<Module>,
    crates: Vec<Crate>,
    /// Library crates by name.
    libs: HashMap<String, usize>,
    problems: Vec<String>,
}

fn is_kw_item(s: &str) -> bool {
    matches!(
        s,
        "fn" | "struct" | "enum" | "trait" | "type" | "const" | "static" | "union" | "mod"
    )
}

impl Tree {
    fn new_mod(&mut self, m: Module) -> ModId {
        self.mods.push(m);
        self.mods.len() - 1
    }

    /// Reads `file` as module `id` (its root module already made), with its
    /// inline modules, and loads the files its `mod x;` declare.
    fn load_file(&mut self, id: ModId) {
        let file = self.mods[id].file.clone();
        let Ok(src) = fs::read_to_string(&file) else {
            self.problems
                .push(format!("cannot read {}", file.display()));
            return;
        };
        let toks = lex(&src);
        // Stack of (module, brace depth of its body).
        let mut stack: Vec<(ModId, usize)> = vec![(id, 0)];
        let mut depth = 0usize;
        let mut attr_path: Option<String> = None;
        let mut attr_test = false;
        let mut i = 0;
        let ident = |i: usize| match toks.get(i) {
            Some(Tok::Ident(s)) => Some(s.as_str()),
            _ => None,
        };
        while i < toks.len() {
            let (cur, body) = *stack.last().unwrap();
            let test = self.mods[cur].test;
            match &toks[i] {
                Tok::Punct('#') => {
                    // #[..] or #![..]
                    let mut j = i + 1;
                    if toks.get(j) == Some(&Tok::Punct('!')) {
                        j += 1;
                    }
                    if toks.get(j) != Some(&Tok::Punct('[')) {
                        i += 1;
                        continue;
                    }
                    let start = j;
                    let mut d = 0;
                    while j < toks.len() {
                        match toks[j] {
                            Tok::Punct('[') => d += 1,
                            Tok::Punct(']') => {
                                d -= 1;
                                if d == 0 {
                                    break;
                                }
                            }
                            _ => {}
                        }
                        j += 1;
                    }
                    let attr = &toks[start + 1..j.min(toks.len())];
                    if let [Tok::Ident(p), Tok::Punct('='), Tok::Str(s)] = attr {
                        if p == "path" {
                            attr_path = Some(s.clone());
                        }
                    }
                    if attr
                        == [
                            Tok::Ident("cfg".into()),
                            Tok::Punct('('),
                            Tok::Ident("test".into()),
                            Tok::Punct(')'),
                        ]
                    {
                        attr_test = true;
                    }
                    i = j + 1;
                    continue;
                }
                Tok::Punct('{') => depth += 1,
                Tok::Punct('}') => {
                    depth = depth.saturating_sub(1);
                    if stack.len() > 1 && depth < body {
                        stack.pop();
                    }
                }
                Tok::Ident(kw) if kw == "pub" => {
                    // visibility: keep the pending attributes
                    if toks.get(i + 1) == Some(&Tok::Punct('(')) {
                        while i < toks.len() && toks[i] != Tok::Punct(')') {
                            i += 1;
                        }
                    }
                    i += 1;
                    continue;
                }
                Tok::Ident(kw) if kw == "mod" && ident(i + 1).is_some() => {
                    let name = ident(i + 1).unwrap().to_string();
                    let mtest = test || attr_test;
                    let parent_dir = self.mods[cur].dir.clone();
                    match toks.get(i + 2) {
                        Some(Tok::Punct(';')) => {
                            let path = match attr_path.take() {
                                Some(p) => file.parent().unwrap().join(p),
                                None => {
                                    let a = parent_dir.join(format!("{name}.rs"));
                                    if a.exists() {
                                        a
                                    } else {
                                        parent_dir.join(&name).join("mod.rs")
                                    }
                                }
                            };
                            let path = normalize(&path);
                            let dir = if path.file_name().is_some_and(|f| f == "mod.rs") {
                                path.parent().unwrap().to_path_buf()
                            } else {
                                path.with_extension("")
                            };
                            let krate = self.mods[cur].krate;
                            let child = self.new_mod(Module {
                                krate,
                                parent: Some(cur),
                                file: path,
                                dir,
                                test: mtest,
                                ..Default::default()
                            });
                            self.mods[cur].children.insert(name.clone(), child);
                            self.mods[cur].defs.insert(name);
                            self.load_file(child);
                            i += 3;
                        }
                        Some(Tok::Punct('{')) => {
                            let krate = self.mods[cur].krate;
                            let child = self.new_mod(Module {
                                krate,
                                parent: Some(cur),
                                file: file.clone(),
                                dir: parent_dir.join(&name),
                                test: mtest,
                                ..Default::default()
                            });
                            self.mods[cur].children.insert(name.clone(), child);
                            self.mods[cur].defs.insert(name);
                            depth += 1;
                            stack.push((child, depth));
                            i += 3;
                        }
                        _ => i += 1,
                    }
                    attr_path = None;
                    attr_test = false;
                    continue;
                }
                Tok::Ident(kw) if kw == "use" => {
                    let mut j = i + 1;
                    let mut leaves = Vec::new();
                    parse_use_tree(&toks, &mut j, Vec::new(), &mut leaves);
                    let t = test || attr_test;
                    for (path, name) in leaves {
                        self.mods[cur].uses.push(Use {
                            path,
                            name,
                            test: t,
                        });
                    }
                    attr_path = None;
                    attr_test = false;
                    i = j;
                    continue;
                }
                Tok::Ident(kw) if depth == body && is_kw_item(kw) => {
                    if let Some(name) = ident(i + 1) {
                        self.mods[cur].defs.insert(name.to_string());
                    }
                }
                Tok::Ident(kw)
                    if kw == "macro_rules" && toks.get(i + 1) == Some(&Tok::Punct('!')) =>
                {
                    if let Some(name) = ident(i + 2) {
                        self.mods[cur].defs.insert(name.to_string());
                    }
                }
                Tok::Ident(first)
                    if toks.get(i + 1) == Some(&Tok::Sep)
                        && toks.get(i.wrapping_sub(1)) != Some(&Tok::Sep) =>
                {
                    // A path in code: first::a::b…
                    let mut segs = vec![first.clone()];
                    let mut j = i + 1;
                    while toks.get(j) == Some(&Tok::Sep) {
                        match ident(j + 1) {
                            Some(s) => segs.push(s.to_string()),
                            None => break,
                        }
                        j += 2;
                    }
                    let t = test || attr_test;
                    self.mods[cur].paths.push((segs, t));
                    i = j;
                    continue;
                }
                _ => {}
            }
            // Attributes bind to the next item: any other token ends them,
            // but only once that item has started (`fn`, `struct`, `;`, …).
            if !matches!(toks[i], Tok::Punct('#')) {
                if let Tok::Ident(_) | Tok::Punct(';') | Tok::Punct('{') = toks[i] {
                    attr_path = None;
                    attr_test = false;
                }
            }
            i += 1;
        }
    }
}

/// Expands a use tree into its leaves: (path, bound name or None for `*`).
fn parse_use_tree(
    toks: &[Tok],
    j: &mut usize,
    prefix: Vec<String>,
    out: &mut Vec<(Vec<String>, Option<String>)>,
) {
    let mut path = prefix;
    if toks.get(*j) == Some(&Tok::Sep) {
        path.push(String::new()); // leading `::`: an extern crate
        *j += 1;
    }
    loop {
        match toks.get(*j) {
            Some(Tok::Ident(s)) => {
                let s = s.clone();
                *j += 1;
                if toks.get(*j) == Some(&Tok::Sep) {
                    path.push(s);
                    *j += 1;
                    continue;
                }
                let mut name = s.clone();
                if toks.get(*j) == Some(&Tok::Ident("as".into())) {
                    if let Some(Tok::Ident(a)) = toks.get(*j + 1) {
                        name = a.clone();
                    }
                    *j += 2;
                }
                if s == "self" {
                    let bound = if name == "self" {
                        path.last().cloned().unwrap_or_default()
                    } else {
                        name
                    };
                    out.push((path, Some(bound)));
                } else {
                    path.push(s);
                    out.push((path, Some(name)));
                }
                break;
            }
            Some(Tok::Punct('*')) => {
                *j += 1;
                out.push((path, None));
                break;
            }
            Some(Tok::Punct('{')) => {
                *j += 1;
                loop {
                    match toks.get(*j) {
                        Some(Tok::Punct('}')) => {
                            *j += 1;
                            break;
                        }
                        Some(Tok::Punct(',')) => *j += 1,
                        None => break,
                        _ => {
                            let before = *j;
                            parse_use_tree(toks, j, path.clone(), out);
                            if *j == before {
                                *j += 1;
                            }
                        }
                    }
                }
                break;
            }
            _ => break,
        }
    }
    if toks.get(*j) == Some(&Tok::Punct(';')) {
        *j += 1;
    }
}

fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

impl Tree {
    fn root_of(&self, mut m: ModId) -> ModId {
        while let Some(p) = self.mods[m].parent {
            m = p;
        }
        m
    }

    /// The module whose file holds `m` (m itself, or the one around an
    /// inline module).
    fn file_root(&self, mut m: ModId) -> ModId {
        while let Some(p) = self.mods[m].parent {
            if self.mods[p].file != self.mods[m].file {
                break;
            }
            m = p;
        }
        m
    }

    /// Whether `m` is a submodule of `outer`, at any depth.
    fn within(&self, mut m: ModId, outer: ModId) -> bool {
        while let Some(p) = self.mods[m].parent {
            if p == outer {
                return true;
            }
            m = p;
        }
        false
    }

    /// Where a path's first segment leaves off, seen from module `m`:
    /// the module it starts in and the segments still to walk.
    fn start<'a>(&self, m: ModId, path: &'a [String], depth: u32) -> Option<(ModId, &'a [String])> {
        let first = path.first()?;
        match first.as_str() {
            "crate" => Some((self.root_of(m), &path[1..])),
            "$crate" => Some((self.root_of(m), &path[1..])),
            "self" => Some((m, &path[1..])),
            "super" => {
                let mut cur = m;
                let mut k = 0;
                while path.get(k).map(String::as_str) == Some("super") {
                    cur = self.mods[cur].parent?;
                    k += 1;
                }
                Some((cur, &path[k..]))
            }
            "" => {
                let k = *self.libs.get(path.get(1)?)?;
                Some((self.crates[k].root, &path[2..]))
            }
            name => {
                if let Some(&c) = self.mods[m].children.get(name) {
                    return Some((c, &path[1..]));
                }
                // A name this module imports, when it is a module.
                if depth < 8 {
                    if let Some(u) = self.mods[m]
                        .uses
                        .iter()
                        .find(|u| u.name.as_deref() == Some(name))
                    {
                        if let Some(Target::Module(t)) = self.resolve(m, &u.path, depth + 1) {
                            return Some((t, &path[1..]));
                        }
                        return None;
                    }
                }
                let k = *self.libs.get(name)?;
                Some((self.crates[k].root, &path[1..]))
            }
        }
    }

    /// What a path names: a module, or an item (the module that defines it
    /// and its name).
    fn resolve(&self, m: ModId, path: &[String], depth: u32) -> Option<Target> {
        if depth > 16 {
            return None;
        }
        let (mut cur, rest) = self.start(m, path, depth)?;
        for (k, seg) in rest.iter().enumerate() {
            if let Some(&c) = self.mods[cur].children.get(seg) {
                cur = c;
                continue;
            }
            match self.item(cur, seg, depth + 1) {
                Some(Target::Module(t)) if k + 1 < rest.len() => cur = t,
                Some(t) => return Some(t),
                None => return Some(Target::Item(cur, seg.clone())),
            }
        }
        Some(Target::Module(cur))
    }

    /// Item `name` seen in module `m`: defined there, or imported (followed).
    fn item(&self, m: ModId, name: &str, depth: u32) -> Option<Target> {
        if depth > 16 {
            return None;
        }
        if self.mods[m].defs.contains(name) {
            return Some(Target::Item(m, name.to_string()));
        }
        for u in &self.mods[m].uses {
            if u.name.as_deref() == Some(name) && !u.test {
                if let Some(t) = self.resolve(m, &u.path, depth + 1) {
                    return Some(t);
                }
            }
        }
        for u in &self.mods[m].uses {
            if u.name.is_none() && !u.test {
                if let Some(Target::Module(g)) = self.resolve(m, &u.path, depth + 1) {
                    if g != m {
                        if let Some(t) = self.item(g, name, depth + 1) {
                            return Some(t);
                        }
                    }
                }
            }
        }
        None
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Target {
    Module(ModId),
    Item(ModId, String),
}

/// The workspace's import graph: file -> file -> names taken.
type Graph = BTreeMap<PathBuf, BTreeMap<PathBuf, BTreeSet<String>>>;

fn load(root: &Path) -> Tree {
    let mut tree = Tree::default();
    let manifest = fs::read_to_string(root.join("Cargo.toml")).unwrap_or_default();
    let members: Vec<String> = manifest
        .split("members")
        .nth(1)
        .and_then(|s| s.split_once('[').map(|(_, r)| r))
        .and_then(|s| s.split_once(']').map(|(l, _)| l))
        .map(|l| {
            l.split(',')
                .map(|s| s.trim().trim_matches('"').to_string())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default();
    for member in members {
        let dir = normalize(&root.join(&member));
        let Ok(toml) = fs::read_to_string(dir.join("Cargo.toml")) else {
            tree.problems
                .push(format!("no Cargo.toml in {}", dir.display()));
            continue;
        };
        let package = toml
            .lines()
            .find_map(|l| l.strip_prefix("name = \""))
            .map(|s| s.trim_end_matches('"').replace('-', "_"))
            .unwrap_or_default();
        let mut roots: Vec<(PathBuf, bool)> = vec![(dir.join("src/lib.rs"), true)];
        roots.push((dir.join("src/main.rs"), false));
        for sub in ["src/bin", "tests", "benches", "examples"] {
            if let Ok(rd) = fs::read_dir(dir.join(sub)) {
                let mut v: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
                v.sort();
                for p in v {
                    if p.extension().is_some_and(|e| e == "rs") {
                        roots.push((p, false));
                    } else if p.join("main.rs").exists() {
                        roots.push((p.join("main.rs"), false));
                    }
                }
            }
        }
        for (file, lib) in roots {
            if !file.exists() {
                continue;
            }
            let id = tree.new_mod(Module {
                krate: tree.crates.len(),
                file: file.clone(),
                dir: file.parent().unwrap().to_path_buf(),
                ..Default::default()
            });
            if lib {
                tree.libs.insert(package.clone(), tree.crates.len());
            }
            tree.crates.push(Crate { root: id });
        }
    }
    for k in 0..tree.crates.len() {
        let root = tree.crates[k].root;
        tree.load_file(root);
    }
    tree
}

fn graph(tree: &Tree, root: &Path) -> Graph {
    let mut g = Graph::new();
    let rel = |p: &Path| p.strip_prefix(root).unwrap_or(p).to_path_buf();
    for (m, module) in tree.mods.iter().enumerate() {
        if module.test {
            continue;
        }
        let refs = module
            .uses
            .iter()
            .filter(|u| !u.test)
            .map(|u| &u.path)
            .chain(module.paths.iter().filter(|(_, t)| !t).map(|(p, _)| p));
        for path in refs {
            let Some(target) = tree.resolve(m, path, 0) else {
                continue;
            };
            let (to, name) = match target {
                Target::Module(t) => (t, path.last().cloned().unwrap_or_default()),
                Target::Item(t, n) => (t, n),
            };
            if tree.mods[to].file == module.file
                || tree.mods[to].test
                || tree.within(to, tree.file_root(m))
            {
                continue;
            }
            g.entry(rel(&module.file))
                .or_default()
                .entry(rel(&tree.mods[to].file))
                .or_default()
                .insert(name);
        }
    }
    g
}

/// The graph's circles (strongly connected sets of two files or more),
/// Tarjan's algorithm, each sorted, in file order.
fn circles(g: &Graph) -> Vec<Vec<PathBuf>> {
    let nodes: BTreeSet<&PathBuf> = g.keys().chain(g.values().flat_map(|e| e.keys())).collect();
    let nodes: Vec<&PathBuf> = nodes.into_iter().collect();
    let index_of: HashMap<&PathBuf, usize> =
        nodes.iter().enumerate().map(|(i, p)| (*p, i)).collect();
    let succ: Vec<Vec<usize>> = nodes
        .iter()
        .map(|p| {
            g.get(*p)
                .map(|e| e.keys().map(|q| index_of[q]).collect())
                .unwrap_or_default()
        })
        .collect();
    let n = nodes.len();
    let (mut index, mut low, mut on) = (vec![usize::MAX; n], vec![0; n], vec![false; n]);
    let (mut stack, mut next, mut out) = (Vec::new(), 0, Vec::new());
    for s in 0..n {
        if index[s] != usize::MAX {
            continue;
        }
        // Iterative DFS: (node, next successor to visit).
        let mut work = vec![(s, 0usize)];
        index[s] = next;
        low[s] = next;
        next += 1;
        stack.push(s);
        on[s] = true;
        while let Some(&mut (v, ref mut k)) = work.last_mut() {
            if *k < succ[v].len() {
                let w = succ[v][*k];
                *k += 1;
                if index[w] == usize::MAX {
                    index[w] = next;
                    low[w] = next;
                    next += 1;
                    stack.push(w);
                    on[w] = true;
                    work.push((w, 0));
                } else if on[w] {
                    low[v] = low[v].min(index[w]);
                }
            } else {
                work.pop();
                if let Some(&(u, _)) = work.last() {
                    low[u] = low[u].min(low[v]);
                }
                if low[v] == index[v] {
                    let mut scc = Vec::new();
                    while let Some(w) = stack.pop() {
                        on[w] = false;
                        scc.push(nodes[w].clone());
                        if w == v {
                            break;
                        }
                    }
                    if scc.len() > 1 {
                        scc.sort();
                        out.push(scc);
                    }
                }
            }
        }
    }
    out.sort();
    out
}

/// The circles in words: files, then each arrow inside with its names.
fn report(g: &Graph, circles: &[Vec<PathBuf>]) -> String {
    let mut s = String::new();
    for (k, c) in circles.iter().enumerate() {
        s += &format!("circle {}: {} files\n", k + 1, c.len());
        let set: BTreeSet<&PathBuf> = c.iter().collect();
        for from in c {
            for (to, names) in g.get(from).into_iter().flatten() {
                if set.contains(to) {
                    let names: Vec<&str> = names.iter().map(String::as_str).collect();
                    s += &format!(
                        "  {} -> {}: {}\n",
                        from.display(),
                        to.display(),
                        names.join(", ")
                    );
                }
            }
        }
    }
    s
}

fn workspace() -> PathBuf {
    let root = std::env::var_os("BCD_WORKSPACE")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::current_dir().expect("current directory"));
    assert!(
        fs::read_to_string(root.join("Cargo.toml")).is_ok_and(|t| t.contains("[workspace]")),
        "run from the workspace root (or set BCD_WORKSPACE): no [workspace] Cargo.toml in {}",
        root.display()
    );
    root
}

#[test]
fn workspace_has_no_import_circle() {
    let root = workspace();
    let tree = load(&root);
    assert!(tree.problems.is_empty(), "{}", tree.problems.join("\n"));
    let files = tree
        .mods
        .iter()
        .filter(|m| !m.test)
        .map(|m| &m.file)
        .collect::<BTreeSet<_>>();
    // Not vacuous: every crate was read.
    assert!(files.len() > 100, "only {} files read", files.len());
    let g = graph(&tree, &root);
    let c = circles(&g);
    assert!(
        c.is_empty(),
        "{} import circle(s) between the workspace's files:\n{}",
        c.len(),
        report(&g, &c)
    );
}

#[cfg(test)]
mod checks {
    //! The checker on small made-up crates: it sees what it must see.
    use super::*;

    fn crate_of(files: &[(&str, &str)]) -> (PathBuf, Vec<Vec<PathBuf>>, Graph) {
        let dir = std::env::temp_dir().join(format!(
            "import-cycles-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("Cargo.toml"), "[workspace]\nmembers = [\"a\"]\n").unwrap();
        fs::create_dir_all(dir.join("a/src")).unwrap();
        fs::write(dir.join("a/Cargo.toml"), "[package]\nname = \"a-crate\"\n").unwrap();
        for (path, text) in files {
            let p = dir.join("a/src").join(path);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, text).unwrap();
        }
        let tree = load(&dir);
        assert!(tree.problems.is_empty(), "{:?}", tree.problems);
        let g = graph(&tree, &dir.join("a/src"));
        let c = circles(&g);
        (dir, c, g)
    }

    fn names(c: &[Vec<PathBuf>]) -> Vec<Vec<String>> {
        c.iter()
            .map(|v| v.iter().map(|p| p.display().to_string()).collect())
            .collect()
    }

    #[test]
    fn use_crate_both_ways_is_a_circle() {
        let (_, c, g) = crate_of(&[
            ("lib.rs", "pub mod a; pub mod b;"),
            ("a.rs", "use crate::b::B; pub struct A;"),
            (
                "b.rs",
                "pub struct B; fn f() -> crate::a::A { crate::a::A }",
            ),
        ]);
        assert_eq!(names(&c), [["a.rs", "b.rs"]], "{}", report(&g, &c));
    }

    #[test]
    fn a_declaration_alone_is_no_import() {
        let (_, c, _) = crate_of(&[
            ("lib.rs", "pub mod a;"),
            ("a.rs", "mod b; pub struct A;"),
            ("a/b.rs", "use super::A;"),
        ]);
        assert!(c.is_empty());
    }

    #[test]
    fn re_exports_lead_to_the_defining_file() {
        // lib.rs re-exports; the circle is a <-> c, not through lib.rs.
        let (_, c, g) = crate_of(&[
            (
                "lib.rs",
                "pub mod a; mod c; pub use c::{Cee as C};\n#[path = \"odd/place.rs\"] mod d;",
            ),
            ("a.rs", "use crate::C; pub struct A;"),
            ("c.rs", "pub struct Cee; use super::d::*; fn f(_: D) {}"),
            (
                "odd/place.rs",
                "pub struct D; pub fn g() { let _ = crate::a::A; }",
            ),
        ]);
        assert_eq!(
            names(&c),
            [["a.rs", "c.rs", "odd/place.rs"]],
            "{}",
            report(&g, &c)
        );
        assert_eq!(
            g["a.rs".as_ref() as &Path]["c.rs".as_ref() as &Path]
                .iter()
                .collect::<Vec<_>>(),
            ["Cee"]
        );
    }

    #[test]
    fn a_face_may_use_its_parts_but_siblings_tie() {
        // p/mod.rs uses its part q (no arrow), q builds on p: no circle;
        // q and r through super:: both ways: a circle.
        let (_, c, g) = crate_of(&[
            ("lib.rs", "pub mod p;"),
            ("p/mod.rs", "pub mod q; mod r; pub const X: u8 = q::Y;"),
            (
                "p/q.rs",
                "pub const Y: u8 = 1; fn f() -> u8 { super::X + super::r::Z }",
            ),
            ("p/r.rs", "pub const Z: u8 = 1; use super::q::Y as W;"),
        ]);
        assert_eq!(names(&c), [["p/q.rs", "p/r.rs"]], "{}", report(&g, &c));
    }

    #[test]
    fn test_code_and_comments_are_left_out() {
        let (_, c, _) = crate_of(&[
            (
                "lib.rs",
                "pub mod a; pub mod b;\n#[cfg(test)]\nmod support;",
            ),
            (
                "a.rs",
                "pub struct A; // crate::b::B\n#[cfg(test)] mod tests { use crate::b::B; }",
            ),
            (
                "b.rs",
                "use crate::a::A; pub struct B; const S: &str = \"crate::a::A\";",
            ),
            ("support.rs", "use crate::b::B; use crate::a::A;"),
        ]);
        assert!(c.is_empty());
    }
}
