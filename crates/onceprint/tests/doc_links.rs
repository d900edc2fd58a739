//! Every relative link in README.md and docs/*.md resolves: the file or directory exists,
//! and a `#anchor` names a heading of the target (GitHub's slugs: lower case, spaces become
//! `-`, punctuation other than `-` and `_` dropped, a repeated heading numbered `-1`, `-2`).
//! External links (http, https, mailto) are not checked. Links inside fenced code blocks
//! and inline code are not links.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repository root")
}

/// The Markdown files whose links are checked.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// The text outside fenced code blocks, line by line, with inline code blanked out.
fn prose_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fence: Option<&str> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        let marker = if trimmed.starts_with("```") {
            Some("```")
        } else if trimmed.starts_with("~~~") {
            Some("~~~")
        } else {
            None
        };
        match (fence, marker) {
            (None, Some(m)) => {
                fence = Some(m);
                out.push(String::new());
                continue;
            }
            (Some(f), Some(m)) if f == m => {
                fence = None;
                out.push(String::new());
                continue;
            }
            (Some(_), _) => {
                out.push(String::new());
                continue;
            }
            (None, None) => {}
        }
        // Blank inline code spans (`…`), keeping the line's length.
        let mut clean = String::with_capacity(line.len());
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
                clean.push(' ');
            } else if in_code {
                clean.push(' ');
            } else {
                clean.push(c);
            }
        }
        out.push(clean);
    }
    out
}

/// GitHub's anchor of a heading's text.
fn slug(heading: &str) -> String {
    let mut s = String::new();
    for c in heading.trim().chars() {
        if c.is_alphanumeric() || c == '-' || c == '_' {
            s.extend(c.to_lowercase());
        } else if c == ' ' {
            s.push('-');
        }
    }
    s
}

/// The anchors of a Markdown file's headings (outside code blocks).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut fence = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            fence = !fence;
            continue;
        }
        if fence || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#');
        if !title.starts_with(' ') {
            continue;
        }
        let base = slug(title);
        let mut anchor = base.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

/// The targets of `[text](target)` and `![alt](target)` on one line.
fn link_targets(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = line.as_bytes();
    let mut i = 0;
    while let Some(pos) = line[i..].find("](") {
        let start = i + pos + 2;
        // The target runs to the matching ')', allowing balanced parentheses inside.
        let mut depth = 1;
        let mut end = start;
        while end < bytes.len() {
            match bytes[end] {
                b'(' => depth += 1,
                b')' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            end += 1;
        }
        if end >= bytes.len() {
            break;
        }
        let raw = line[start..end].trim();
        // `(path "title")` and `(<path with spaces>)`.
        let target = match raw.strip_prefix('<') {
            Some(rest) => rest.split('>').next().unwrap_or(""),
            None => raw.split_whitespace().next().unwrap_or(""),
        };
        if !target.is_empty() {
            out.push(target.to_owned());
        }
        i = end + 1;
    }
    out
}

fn is_external(target: &str) -> bool {
    let lower = target.to_ascii_lowercase();
    lower.starts_with("http://") || lower.starts_with("https://") || lower.starts_with("mailto:")
}

#[test]
fn every_relative_link_in_the_documents_resolves() {
    let root = repo_root();
    let mut problems = Vec::new();
    let mut checked = 0;
    for doc in documents(&root) {
        let text = std::fs::read_to_string(&doc).expect("read document");
        let shown = doc.strip_prefix(&root).unwrap_or(&doc).display().to_string();
        for (n, line) in prose_lines(&text).iter().enumerate() {
            for target in link_targets(line) {
                if is_external(&target) {
                    continue;
                }
                checked += 1;
                let (path, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a)),
                    None => (target.as_str(), None),
                };
                let file = if path.is_empty() { doc.clone() } else { doc.parent().expect("parent").join(path) };
                if !file.exists() {
                    problems.push(format!("{shown}:{}: {target}: no such file", n + 1));
                    continue;
                }
                let Some(anchor) = anchor else { continue };
                if file.is_dir() || file.extension().is_none_or(|x| x != "md") {
                    problems.push(format!("{shown}:{}: {target}: an anchor into a file that is not Markdown", n + 1));
                    continue;
                }
                let target_text = std::fs::read_to_string(&file).expect("read link target");
                if !anchors(&target_text).contains(&anchor.to_lowercase()) {
                    problems.push(format!("{shown}:{}: {target}: no heading with that anchor", n + 1));
                }
            }
        }
    }
    assert!(checked > 0, "no relative links found: is the scan broken?");
    assert!(problems.is_empty(), "links that do not resolve:\n{}", problems.join("\n"));
}

#[test]
fn slugs_follow_github() {
    assert_eq!(slug(" Several nodes: the shared first gate on Redis"), "several-nodes-the-shared-first-gate-on-redis");
    assert_eq!(slug(" Packages: image, services, shop machines"), "packages-image-services-shop-machines");
    assert_eq!(slug(" `onceprint serve`"), "onceprint-serve");
    assert_eq!(slug(" Operations: people solve the 1 %"), "operations-people-solve-the-1-");
    assert_eq!(slug(" max_wait_ms and A–Z"), "max_wait_ms-and-az");
    let text = "# A\n## B\n```\n# not a heading\n```\n## B\n";
    let found = anchors(text);
    assert!(found.contains("a") && found.contains("b") && found.contains("b-1"));
    assert!(!found.contains("not-a-heading"));
    assert_eq!(
        link_targets("see [x](a.md#b) and ![y](img.png \"t\") and [z](<c d.md>)"),
        ["a.md#b", "img.png", "c d.md"]
    );
}
