//! docs/CONFIGURATION.md and `onceprint serve --help` agree: every `--flag` and
//! `ONCEPRINT_*` variable the real binary shows is in the document, and every `--flag` the
//! document's `onceprint serve` section names is one the binary has.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_onceprint");

/// The heading of the section that documents `serve` alone.
const SERVE_SECTION: &str = "## `onceprint serve`";

/// Tokens `--name` (lower-case letters, digits, `-`) in `text`.
fn flags(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i + 2 < bytes.len() {
        let starts = bytes[i] == b'-' && bytes[i + 1] == b'-' && (i == 0 || !is_flag_char(bytes[i - 1]));
        if starts && (bytes[i + 2].is_ascii_lowercase() || bytes[i + 2].is_ascii_digit()) {
            let mut end = i + 2;
            while end < bytes.len() && is_flag_char(bytes[end]) {
                end += 1;
            }
            out.insert(text[i..end].trim_end_matches('-').to_owned());
            i = end;
        } else {
            i += 1;
        }
    }
    out
}

fn is_flag_char(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'
}

/// Tokens `ONCEPRINT_NAME` (upper-case letters, digits, `_`) in `text`.
fn env_vars(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(pos) = rest.find("ONCEPRINT_") {
        let before = rest[..pos].chars().next_back();
        let tail = &rest[pos..];
        let end =
            tail.find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')).unwrap_or(tail.len());
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            let name = tail[..end].trim_end_matches('_');
            if name.len() > "ONCEPRINT_".len() {
                out.insert(name.to_owned());
            }
        }
        rest = &tail[end.max(1)..];
    }
    out
}

fn serve_help() -> String {
    let out = Command::new(BIN).args(["serve", "--help"]).output().expect("run onceprint serve --help");
    assert!(out.status.success(), "serve --help failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

fn document() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/CONFIGURATION.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The text of the document's `serve` section: from its heading to the next `## ` heading.
fn serve_section(doc: &str) -> String {
    let start = doc.find(SERVE_SECTION).unwrap_or_else(|| panic!("docs/CONFIGURATION.md has no {SERVE_SECTION:?}"));
    let body = &doc[start + SERVE_SECTION.len()..];
    let end = body.find("\n## ").unwrap_or(body.len());
    body[..end].to_owned()
}

#[test]
fn every_serve_flag_and_variable_is_documented() {
    let help = serve_help();
    let doc = document();
    let help_flags = flags(&help);
    let help_vars = env_vars(&help);
    assert!(help_flags.contains("--listen") && help_flags.contains("--database"), "no flags parsed from:\n{help}");
    assert!(help_vars.contains("ONCEPRINT_LISTEN"), "no variables parsed from:\n{help}");

    let doc_flags = flags(&doc);
    let doc_vars = env_vars(&doc);
    let missing: Vec<_> = help_flags
        .iter()
        .filter(|f| !doc_flags.contains(*f))
        .chain(help_vars.iter().filter(|v| !doc_vars.contains(*v)))
        .collect();
    assert!(missing.is_empty(), "`onceprint serve --help` shows these, docs/CONFIGURATION.md does not: {missing:?}");
}

#[test]
fn every_serve_flag_documented_exists() {
    let help_flags = flags(&serve_help());
    let section = serve_section(&document());
    let unknown: Vec<_> = flags(&section).into_iter().filter(|f| !help_flags.contains(f)).collect();
    assert!(
        unknown.is_empty(),
        "docs/CONFIGURATION.md's {SERVE_SECTION:?} names flags `onceprint serve --help` does not have: {unknown:?}"
    );
}

#[test]
fn tokens_are_parsed_whole() {
    let text =
        "--listen, --db <DB>  [env: ONCEPRINT_DATABASE_URL=]\n --node-link=false a--b x-- -y ONCEPRINT_ ONCEPRINT_X_";
    assert_eq!(flags(text).into_iter().collect::<Vec<_>>(), ["--db", "--listen", "--node-link"]);
    assert_eq!(env_vars(text).into_iter().collect::<Vec<_>>(), ["ONCEPRINT_DATABASE_URL", "ONCEPRINT_X"]);
}
