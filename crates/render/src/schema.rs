//! The JSON Schema of the receipt document, checked into the repository as
//! `schema/receipt-document.schema.json` and compiled in, so the OpenAPI document and
//! the file can never disagree. A test holds it to the parser's field lists.

use std::sync::OnceLock;

use serde_json::Value;

const SCHEMA: &str = include_str!("../schema/receipt-document.schema.json");

/// The receipt document's JSON Schema (draft 2020-12), for embedding in OpenAPI.
pub fn schema() -> Value {
    static PARSED: OnceLock<Value> = OnceLock::new();
    // The file is checked by a test; should it ever not parse, `null` is a harmless
    // schema rather than a panic in the server.
    PARSED.get_or_init(|| serde_json::from_str(SCHEMA).unwrap_or(Value::Null)).clone()
}

/// [`schema()`] for embedding where `#` is not the schema itself, such as under
/// `components.schemas.ReceiptDocument` of an OpenAPI document: every internal
/// `"$ref": "#/$defs/…"` becomes `"{prefix}/$defs/…"`, e.g. with prefix
/// `#/components/schemas/ReceiptDocument`.
pub fn schema_with_ref_prefix(prefix: &str) -> Value {
    fn rewrite(v: &mut Value, prefix: &str) {
        match v {
            Value::Object(map) => {
                for (key, value) in map.iter_mut() {
                    match value {
                        Value::String(r) if key == "$ref" => {
                            if let Some(rest) = r.strip_prefix('#') {
                                *r = format!("{prefix}{rest}");
                            }
                        }
                        other => rewrite(other, prefix),
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|item| rewrite(item, prefix)),
            _ => {}
        }
    }
    let mut v = schema();
    rewrite(&mut v, prefix);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doc::{
        BLOCK_TYPES, COLUMN_FIELDS, DOCUMENT_FIELDS, PAPER_FIELDS, SPAN_FIELDS, STYLE_FIELDS, TEXT_FIELDS,
    };

    fn keys(v: &Value) -> Vec<String> {
        let mut k: Vec<String> = v["properties"].as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default();
        k.sort();
        k
    }

    fn sorted(fields: &[&str]) -> Vec<String> {
        let mut v: Vec<String> = fields.iter().map(|s| s.to_string()).collect();
        v.sort();
        v
    }

    #[test]
    fn the_schema_matches_the_parser() {
        let s = schema();
        assert_eq!(s["$schema"], "https://json-schema.org/draft/2020-12/schema");
        assert_eq!(keys(&s), sorted(DOCUMENT_FIELDS));
        assert_eq!(keys(&s["properties"]["paper"]["oneOf"][1]), sorted(PAPER_FIELDS));
        let defs = &s["$defs"];
        let refs: Vec<&str> =
            defs["block"]["oneOf"].as_array().unwrap().iter().map(|r| r["$ref"].as_str().unwrap()).collect();
        assert_eq!(refs.len(), BLOCK_TYPES.len());
        for (name, fields) in BLOCK_TYPES {
            assert!(refs.contains(&format!("#/$defs/{name}").as_str()), "{name} not in block oneOf");
            assert_eq!(keys(&defs[*name]), sorted(fields), "fields of {name}");
            assert_eq!(defs[*name]["properties"]["type"]["const"], *name);
            assert_eq!(defs[*name]["additionalProperties"], false);
        }
        assert_eq!(keys(&defs["span"]), sorted(SPAN_FIELDS));
        assert_eq!(keys(&defs["column"]), sorted(COLUMN_FIELDS));
        for f in STYLE_FIELDS {
            assert!(TEXT_FIELDS.contains(f));
        }
    }

    #[test]
    fn refs_can_be_rebased() {
        let v = schema_with_ref_prefix("#/components/schemas/ReceiptDocument");
        assert_eq!(v["properties"]["blocks"]["items"]["$ref"], "#/components/schemas/ReceiptDocument/$defs/block");
        assert_eq!(v["$defs"]["block"]["oneOf"][0]["$ref"], "#/components/schemas/ReceiptDocument/$defs/text");
        assert!(!v.to_string().contains("\"#/$defs"));
    }

    #[test]
    fn the_schema_example_is_a_valid_document() {
        for example in schema()["examples"].as_array().unwrap() {
            crate::parse_document(example).unwrap();
        }
    }
}
