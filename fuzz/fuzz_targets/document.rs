//! `parse_document` on any JSON (the fuzz input is parsed by serde_json; input that is not
//! JSON is skipped).
//!
//! Checks: a refusal is an `Invalid` error whose path names a place in the input (every
//! step but the last exists, the last may be the missing required field); an accepted
//! document is the same through `Deserialize`, reads back unchanged from its serialized
//! normal form, and prints (see `onceprint_fuzz::check_prints`).

#![no_main]

use libfuzzer_sys::fuzz_target;
use onceprint_fuzz::{builtin_profile, check_prints, check_round_trip};
use onceprint_render::{parse_document, Document, RenderError};
use serde_json::Value;

/// Whether `path` (`blocks[3].columns[1].width`) leads into `value`. Keys may themselves
/// hold `.` or `[` (an unknown field is named as it was spelt), so every key that fits
/// is tried. The last step may be missing: "required" names a field that is not there.
fn resolves(value: &Value, path: &str) -> bool {
    if path.is_empty() {
        return true;
    }
    if let (Some(rest), Some(items)) = (path.strip_prefix('['), value.as_array()) {
        let Some((index, after)) = rest.split_once(']') else { return false };
        let Some(item) = index.parse::<usize>().ok().and_then(|i| items.get(i)) else { return false };
        return resolves(item, after.strip_prefix('.').unwrap_or(after));
    }
    let Some(map) = value.as_object() else { return false };
    for (key, child) in map {
        if let Some(after) = path.strip_prefix(key.as_str()) {
            let next = if after.is_empty() || after.starts_with('[') { Some(after) } else { after.strip_prefix('.') };
            if next.is_some_and(|next| resolves(child, next)) {
                return true;
            }
        }
    }
    // A missing last field: a plain name with nothing after it.
    !path.contains(['.', '['])
}

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<Value>(data) else { return };
    match parse_document(&value) {
        Err(RenderError::Invalid { path, message }) => {
            if path.is_empty() {
                // The document itself, or a field whose name is empty.
                let top = value.as_object();
                assert!(top.is_none_or(|m| m.contains_key("")), "an error without a path: {message}");
            } else {
                assert!(resolves(&value, &path), "error path {path:?} is not in the input: {message}");
            }
        }
        Err(other) => panic!("a document refused with a non-validation error: {other:?}"),
        Ok(doc) => {
            let via_serde: Document = serde_json::from_value(value.clone()).expect("Deserialize agrees");
            assert_eq!(via_serde, doc);
            check_round_trip(&doc);
            check_prints(&doc, &builtin_profile(data.len()));
        }
    }
});
