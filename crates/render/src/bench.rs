//! A benchmark of the renderers on a typical receipt, for `onceprint bench render` and
//! `cargo run --release -p onceprint-render --example bench`.
//!
//! Each measurement renders the same document over and over on the calling thread for
//! about the given time and reports renders per second. The documents are built here,
//! so the figures in `BENCHMARKS.md` can be reproduced anywhere.

use std::hint::black_box;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::{parse_document, to_escpos, to_png, to_text, Document, Profile, RenderError};

/// A receipt of about forty printed lines: a double-size header, the shop's address,
/// order details, 24 item rows (a few of which wrap), totals and a footer. With
/// `chinese`, the item names and headings are Chinese (a restaurant ticket); otherwise
/// Latin with a few accented letters. With `qr`, a QR code for the e-receipt follows.
pub fn sample_receipt(chinese: bool, qr: bool) -> Value {
    let items_zh = [
        "宫保鸡丁",
        "鱼香肉丝",
        "麻婆豆腐",
        "回锅肉",
        "水煮牛肉（特辣）",
        "酸辣土豆丝",
        "清炒时蔬",
        "蛋炒饭",
        "扬州炒饭",
        "小笼包",
        "酸菜鱼",
        "红烧排骨",
        "糖醋里脊",
        "干煸四季豆",
        "地三鲜",
        "米饭",
        "可乐",
        "雪碧",
        "青岛啤酒",
        "酸梅汤",
        "担担面",
        "葱油饼",
        "红糖糍粑",
        "绿豆汤",
    ];
    let items_en = [
        "Margherita pizza",
        "Spaghetti carbonara",
        "Caesar salad",
        "Crème brûlée",
        "Espresso",
        "Cappuccino",
        "Sparkling water 0.5l",
        "House red wine (glass)",
        "Tiramisù",
        "Bruschetta",
        "Minestrone",
        "Garlic bread",
        "Lasagne al forno",
        "Risotto ai funghi porcini with truffle oil",
        "Panna cotta",
        "Lemonade",
        "Gnocchi",
        "Focaccia",
        "Affogato",
        "Penne arrabbiata",
        "Calzone",
        "Insalata mista",
        "Sorbetto",
        "Limoncello",
    ];
    let mut blocks = vec![
        json!({"type": "text", "text": if chinese { "老王川菜馆" } else { "Trattoria Da Marco" },
               "align": "center", "bold": true, "double_width": true, "double_height": true}),
        json!({"type": "text", "text": if chinese { "北京市朝阳区建国路88号 电话 010-12345678" }
               else { "Via Roma 12, 00184 Roma · Tel. 06 1234567" }, "align": "center"}),
        json!({"type": "rule"}),
        json!({"type": "row", "columns": [{"text": if chinese { "桌号：12" } else { "Table 12" }},
               {"text": "2026-11-29 19:42", "align": "right"}]}),
        json!({"type": "row", "columns": [{"text": if chinese { "单号：A1001" } else { "Order A1001" }},
               {"text": if chinese { "服务员：小李" } else { "Server: Giulia" }, "align": "right"}]}),
        json!({"type": "rule"}),
        json!({"type": "row", "bold": true, "columns": [
            {"text": if chinese { "品名" } else { "Item" }},
            {"text": if chinese { "数量" } else { "Qty" }, "width": 4, "align": "right"},
            {"text": if chinese { "金额" } else { "Amount" }, "width": 8, "align": "right"}]}),
    ];
    for i in 0..24 {
        let name = if chinese { items_zh[i] } else { items_en[i] };
        let qty = 1 + i % 3;
        let cents = 350 + (i * 137) % 2400;
        blocks.push(json!({"type": "row", "columns": [
            {"text": name},
            {"text": format!("{qty}"), "width": 4, "align": "right"},
            {"text": format!("{}.{:02}", cents * qty / 100, cents * qty % 100), "width": 8, "align": "right"}]}));
    }
    blocks.push(json!({"type": "rule"}));
    for (label_zh, label_en, amount) in [("小计", "Subtotal", "612.40"), ("服务费", "Service 10%", "61.24")] {
        blocks.push(json!({"type": "row", "columns": [{"text": if chinese { label_zh } else { label_en }},
            {"text": amount, "align": "right"}]}));
    }
    blocks.push(json!({"type": "row", "bold": true, "double_height": true, "columns": [
        {"text": if chinese { "合计" } else { "TOTAL" }}, {"text": if chinese { "¥673.64" } else { "€ 673,64" }, "align": "right"}]}));
    blocks.push(json!({"type": "rule", "char": "="}));
    blocks.push(json!({"type": "text", "text": if chinese { "谢谢惠顾，欢迎再次光临！" } else { "Grazie e arrivederci!" }, "align": "center"}));
    if qr {
        blocks.push(json!({"type": "qr", "data": "https://example.com/r/A1001?t=20261129194200", "size": 6}));
    }
    blocks.push(json!({"type": "cut"}));
    json!({"paper": "80mm", "blocks": blocks})
}

/// Renders per second of each renderer.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchReport {
    pub name: String,
    pub profile: String,
    /// Printed lines of the document (as laid out for the profile).
    pub lines: usize,
    pub escpos_bytes: usize,
    pub png_bytes: usize,
    pub parse_per_sec: f64,
    pub escpos_per_sec: f64,
    pub text_per_sec: f64,
    pub png_per_sec: f64,
}

fn rate(budget: Duration, mut f: impl FnMut() -> Result<(), RenderError>) -> Result<f64, RenderError> {
    // Warm up: the first render loads the font and fills the glyph cache.
    f()?;
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < budget {
        for _ in 0..16 {
            f()?;
        }
        n += 16;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

/// Measures `doc` with `profile`, spending about `budget` on each renderer.
pub fn measure(name: &str, doc: &Value, profile: &Profile, budget: Duration) -> Result<BenchReport, RenderError> {
    let parsed: Document = parse_document(doc)?;
    let lines = to_text(&parsed, profile).lines().count();
    let escpos_bytes = to_escpos(&parsed, profile)?.bytes.len();
    let png_bytes = to_png(&parsed, profile)?.len();
    Ok(BenchReport {
        name: name.to_string(),
        profile: profile.name.clone(),
        lines,
        escpos_bytes,
        png_bytes,
        parse_per_sec: rate(budget, || parse_document(black_box(doc)).map(|d| drop(black_box(d))))?,
        escpos_per_sec: rate(budget, || to_escpos(black_box(&parsed), profile).map(|r| drop(black_box(r))))?,
        text_per_sec: rate(budget, || {
            black_box(to_text(black_box(&parsed), profile));
            Ok(())
        })?,
        png_per_sec: rate(budget, || to_png(black_box(&parsed), profile).map(|r| drop(black_box(r))))?,
    })
}

/// The standard set: the Latin and the Chinese receipt on an 80 mm printer, without and
/// with a QR code.
pub fn run(budget: Duration) -> Result<Vec<BenchReport>, RenderError> {
    let latin = Profile::builtin("escpos-80-cp858").unwrap_or_default();
    let chinese = Profile::default();
    Ok(vec![
        measure("latin receipt", &sample_receipt(false, false), &latin, budget)?,
        measure("chinese receipt", &sample_receipt(true, false), &chinese, budget)?,
        measure("latin receipt + QR", &sample_receipt(false, true), &latin, budget)?,
        measure("chinese receipt + QR", &sample_receipt(true, true), &chinese, budget)?,
    ])
}

impl std::fmt::Display for BenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:<22} {:<18} {:>3} lines  parse {:>9.0}/s  escpos {:>9.0}/s ({} B)  text {:>9.0}/s  png {:>7.0}/s ({} B)",
            self.name,
            self.profile,
            self.lines,
            self.parse_per_sec,
            self.escpos_per_sec,
            self.escpos_bytes,
            self.text_per_sec,
            self.png_per_sec,
            self.png_bytes
        )
    }
}
