//! Every result code a printer protocol documents, classified once for every transport
//! (docs/RESULT-CODES.md): what it says about the printer ([`Outcome`]: ready, stopped for paper, its
//! cover or a jam, offline, another error) and what it proves about the paper of the job
//! it reports on ([`Proof`]). Each row names the vendor document it comes from; a code no
//! row covers may have printed.
//!
//! The transports (`engine::transport::cloudprnt`, `engine::transport::epson_sdp`, the
//! MQTT crate's protocols, the webhook transport) only read their wire format and look the
//! code up here, so that CloudPRNT over HTTP and over MQTT, which share Star's status
//! codes, can never disagree again. `docs/RESULT-CODES.md` is [`markdown`] of these
//! tables (a test keeps the two equal).

use crate::ack::Outcome;
use crate::proof::Proof;

/// One documented code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    /// The code as the vendor writes it; `4xx` and `41x` stand for a class of codes.
    pub code: &'static str,
    /// What the vendor says it means, shortly.
    pub meaning: &'static str,
    /// What it says about the printer (the lane pauses for `no_paper`, `cover_open`,
    /// `paper_jam` and `offline`).
    pub outcome: Outcome,
    /// What it proves about the paper of the job it reports on, once the job's data may
    /// have reached the printer.
    pub proof: Proof,
    /// Where the vendor documents it.
    pub source: &'static str,
}

/// A code looked up: the row that covers it, if any, and what follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Classified {
    pub outcome: Outcome,
    pub proof: Proof,
    pub row: Option<&'static Row>,
}

impl Classified {
    fn of(row: &'static Row) -> Classified {
        Classified { outcome: row.outcome, proof: row.proof, row: Some(row) }
    }

    /// A code no document covers: it may have printed.
    pub const UNKNOWN: Classified = Classified { outcome: Outcome::Error, proof: Proof::MayHavePrinted, row: None };
}

/// What a printer says about itself when it polls or reports its status (not about a job).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// It can print.
    Ready,
    /// It cannot print until a person fixes this: `no_paper`, `cover_open` or `paper_jam`.
    Stopped(Outcome),
    /// Another error: it gets no job until it reports itself ready again.
    Fault,
}

/// Star Micronics CloudPRNT (Version HTTP and Version MQTT share the status codes).
pub mod star {
    use super::{Classified, Condition, Row};
    use crate::ack::Outcome;
    use crate::proof::Proof;

    const CODES: &str = "Star CloudPRNT protocol reference, \"Printer Status Codes\"";
    const CONFIRM: &str = "Star CloudPRNT protocol reference, \"Print job confirmation (DELETE)\"";

    /// A job's result: the `code` of a confirmation (`DELETE`, or `GET …&delete`), the
    /// `statusCode` of an MQTT `print-result` with `printSucceeded: false`, or the error
    /// status of a poll that names the job it fetched ("the server can assume that the
    /// print is in progress after the GET, until a DELETE, or POST with error code is
    /// received"). The most specific row wins (`410` before `41x` before `4xx`).
    pub const RESULTS: &[Row] = &[
        Row {
            code: "OK",
            meaning: "printing completed correctly",
            outcome: Outcome::Printed,
            proof: Proof::Printed,
            source: CONFIRM,
        },
        Row {
            code: "2xx",
            meaning: "printer is online (a job confirmed with a 2xx code printed)",
            outcome: Outcome::Printed,
            proof: Proof::Printed,
            source: CODES,
        },
        Row {
            code: "410",
            meaning: "out of paper; a roll that ends inside a slip cuts it short",
            outcome: Outcome::NoPaper,
            proof: Proof::MayHavePrinted,
            source: CODES,
        },
        Row {
            code: "411",
            meaning: "paper jam",
            outcome: Outcome::PaperJam,
            proof: Proof::MayHavePrinted,
            source: CODES,
        },
        Row {
            code: "412",
            meaning: "roll position error",
            outcome: Outcome::PaperJam,
            proof: Proof::MayHavePrinted,
            source: CODES,
        },
        Row {
            code: "41x",
            meaning: "paper error",
            outcome: Outcome::NoPaper,
            proof: Proof::MayHavePrinted,
            source: CODES,
        },
        Row {
            code: "420",
            meaning: "cover open",
            outcome: Outcome::CoverOpen,
            proof: Proof::MayHavePrinted,
            source: CODES,
        },
        Row {
            code: "42x",
            meaning: "cover open error",
            outcome: Outcome::CoverOpen,
            proof: Proof::MayHavePrinted,
            source: CODES,
        },
        Row {
            code: "4xx",
            meaning: "printer error",
            outcome: Outcome::Error,
            proof: Proof::MayHavePrinted,
            source: CODES,
        },
        Row {
            code: "510",
            meaning: "incompatible media type: the client does not support the data issued by the server",
            outcome: Outcome::Error,
            proof: Proof::Refused,
            source: CODES,
        },
        Row {
            code: "511",
            meaning: "media decoding error: the client supports the media type but failed to decode it",
            outcome: Outcome::Error,
            proof: Proof::Refused,
            source: CODES,
        },
        Row {
            code: "512",
            meaning: "unsupported media version",
            outcome: Outcome::Error,
            proof: Proof::Refused,
            source: CODES,
        },
        Row {
            code: "51x",
            meaning: "media compatibility error",
            outcome: Outcome::Error,
            proof: Proof::Refused,
            source: CODES,
        },
        Row {
            code: "520",
            meaning: "timeout: the client could not download the job",
            outcome: Outcome::Error,
            proof: Proof::NotPrinted,
            source: CODES,
        },
        Row {
            code: "521",
            meaning: "job too large for the client's download buffer",
            outcome: Outcome::Error,
            proof: Proof::Refused,
            source: CODES,
        },
        Row {
            code: "52x",
            meaning: "job download error",
            outcome: Outcome::Error,
            proof: Proof::NotPrinted,
            source: CODES,
        },
        Row {
            code: "5xx",
            meaning: "client error",
            outcome: Outcome::Error,
            proof: Proof::MayHavePrinted,
            source: CODES,
        },
    ];

    /// The digits a status code starts with (`200%20OK` is decoded by the caller; `410 Out
    /// of Paper` → `410`); `None` without three.
    fn digits(code: &str) -> Option<&str> {
        let code = code.trim();
        let n = code.bytes().take_while(u8::is_ascii_digit).count();
        (n >= 3).then(|| &code[..3])
    }

    fn row(code: &str) -> Option<&'static Row> {
        let code = code.trim();
        if code.eq_ignore_ascii_case("ok") {
            return RESULTS.iter().find(|r| r.code == "OK");
        }
        let d = digits(code)?;
        let class2 = format!("{}x", &d[..2]);
        let class1 = format!("{}xx", &d[..1]);
        RESULTS
            .iter()
            .find(|r| r.code == d)
            .or_else(|| RESULTS.iter().find(|r| r.code == class2))
            .or_else(|| RESULTS.iter().find(|r| r.code == class1))
    }

    /// A job's result code (percent-decoded), classified.
    pub fn job_result(code: &str) -> Classified {
        row(code).map_or(Classified::UNKNOWN, Classified::of)
    }

    /// What a status code of a poll or a `client-status` says about the printer: `2xx`
    /// ready, `41x` paper (`411`, `412` a jam), `42x` its cover, anything else a fault.
    pub fn condition(status: &str) -> Condition {
        match row(status).filter(|r| r.code != "OK") {
            Some(r) if r.outcome == Outcome::Printed => Condition::Ready,
            Some(r) if matches!(r.outcome, Outcome::NoPaper | Outcome::CoverOpen | Outcome::PaperJam) => {
                Condition::Stopped(r.outcome)
            }
            _ => Condition::Fault,
        }
    }
}

/// Epson TM printers: ePOS-Print XML results, as Server Direct Print reports them.
pub mod epson {
    use super::{Classified, Row};
    use crate::ack::Outcome;
    use crate::proof::Proof;

    const RESPONSE: &str = "Epson ePOS-Print XML User's Manual, \"<response>\" (code)";
    const SDP: &str =
        "Epson Server Direct Print User's Manual, \"Request (Printing Result)\", PrintResponseInfo Version 3.00";

    /// `success="true"`: the one report that the job printed.
    pub const SUCCESS: Row = Row {
        code: "success=\"true\"",
        meaning: "print succeeded",
        outcome: Outcome::Printed,
        proof: Proof::Printed,
        source: RESPONSE,
    };

    /// The codes of a `<response success="false">`. The status bits (`status`) describe
    /// the printer after the job and prove nothing about its paper; they go into the
    /// audit trail ([`describe_status`]).
    pub const CODES: &[Row] = &[
        Row {
            code: "EPTR_AUTOMATICAL",
            meaning: "automatic recovery error occurred",
            outcome: Outcome::Error,
            proof: Proof::MayHavePrinted,
            source: RESPONSE,
        },
        Row {
            code: "EPTR_BATTERY_LOW",
            meaning: "battery has run out",
            outcome: Outcome::Offline,
            proof: Proof::MayHavePrinted,
            source: RESPONSE,
        },
        Row {
            code: "EPTR_COVER_OPEN",
            meaning: "cover open error occurred",
            outcome: Outcome::CoverOpen,
            proof: Proof::MayHavePrinted,
            source: RESPONSE,
        },
        Row {
            code: "EPTR_CUTTER",
            meaning: "auto cutter error occurred (the slip is printed, not cut)",
            outcome: Outcome::Error,
            proof: Proof::MayHavePrinted,
            source: RESPONSE,
        },
        Row {
            code: "EPTR_MECHANICAL",
            meaning: "mechanical error occurred",
            outcome: Outcome::Error,
            proof: Proof::MayHavePrinted,
            source: RESPONSE,
        },
        Row {
            code: "EPTR_REC_EMPTY",
            meaning: "no paper is left in the roll paper end detector; a roll that ends inside a slip cuts it short",
            outcome: Outcome::NoPaper,
            proof: Proof::MayHavePrinted,
            source: RESPONSE,
        },
        Row {
            code: "EPTR_UNRECOVERABLE",
            meaning: "unrecoverable error occurred",
            outcome: Outcome::Error,
            proof: Proof::MayHavePrinted,
            source: RESPONSE,
        },
        Row {
            code: "SchemaError",
            meaning: "error exists in the requested document syntax",
            outcome: Outcome::Error,
            proof: Proof::Refused,
            source: RESPONSE,
        },
        Row {
            code: "DeviceNotFound",
            meaning: "printer specified by the device ID does not exist",
            outcome: Outcome::Offline,
            proof: Proof::NotPrinted,
            source: RESPONSE,
        },
        Row {
            code: "PrintSystemError",
            meaning: "error occurred with the printing system",
            outcome: Outcome::Error,
            proof: Proof::MayHavePrinted,
            source: RESPONSE,
        },
        Row {
            code: "EX_BADPORT",
            meaning: "an error occurred with the communication port",
            outcome: Outcome::Error,
            proof: Proof::MayHavePrinted,
            source: RESPONSE,
        },
        Row {
            code: "EX_TIMEOUT",
            meaning: "print timeout occurred",
            outcome: Outcome::Error,
            proof: Proof::MayHavePrinted,
            source: RESPONSE,
        },
        Row {
            code: "EX_SPOOLER",
            meaning: "print queue is full (the job was not taken)",
            outcome: Outcome::Error,
            proof: Proof::NotPrinted,
            source: RESPONSE,
        },
        Row {
            code: "EX_DEVICE_BUSY",
            meaning: "the specified device is in process and the process cannot be executed",
            outcome: Outcome::Error,
            proof: Proof::NotPrinted,
            source: RESPONSE,
        },
        Row {
            code: "EX_ENPC_TIMEOUT",
            meaning: "status check failed",
            outcome: Outcome::Error,
            proof: Proof::MayHavePrinted,
            source: RESPONSE,
        },
        Row {
            code: "JobNotFound",
            meaning: "specified job ID does not exist",
            outcome: Outcome::Error,
            proof: Proof::MayHavePrinted,
            source: RESPONSE,
        },
        Row {
            code: "Printing",
            meaning: "printing in progress",
            outcome: Outcome::Error,
            proof: Proof::MayHavePrinted,
            source: RESPONSE,
        },
        Row {
            code: "JobSpooling",
            meaning: "spooling",
            outcome: Outcome::Error,
            proof: Proof::MayHavePrinted,
            source: RESPONSE,
        },
        Row {
            code: "TooManyRequests",
            meaning: "the number of print jobs sent to the printer has exceeded the allowable limit",
            outcome: Outcome::Error,
            proof: Proof::NotPrinted,
            source: RESPONSE,
        },
        Row {
            code: "RequestEntityTooLarge",
            meaning: "the size of the print job data exceeds the capacity of the printer",
            outcome: Outcome::Error,
            proof: Proof::Refused,
            source: RESPONSE,
        },
        Row {
            code: "ERROR_WAIT_EJECT",
            meaning: "waiting for paper removal",
            outcome: Outcome::Error,
            proof: Proof::MayHavePrinted,
            source: RESPONSE,
        },
    ];

    /// `<ServerDirectPrint><Response Success="false">` (Version 3.00): the printer could
    /// not use the print data it fetched at all ("Invalid XML format", "Data size is
    /// exceeded", "ePOS-Print not activated"); the document has no job id, and it is about
    /// the job the printer was just given.
    pub const DATA_REFUSED: Row = Row {
        code: "ServerDirectPrint Response Success=\"false\"",
        meaning: "the printer cannot use the print data (ErrorSummary / ErrorDetail)",
        outcome: Outcome::Error,
        proof: Proof::Refused,
        source: SDP,
    };

    /// A job's `<response>`, classified: `success` is the only proof of paper.
    pub fn job_result(success: bool, code: &str) -> Classified {
        if success {
            return Classified::of(&SUCCESS);
        }
        CODES.iter().find(|r| r.code == code.trim()).map_or(Classified::UNKNOWN, Classified::of)
    }

    /// The ASB status bits of a `<response status="…">` (decimal), as the ePOS-Print XML
    /// User's Manual names them ("<response>", status).
    pub const STATUS_BITS: &[(u32, &str)] = &[
        (0x0000_0001, "no response from the TM printer"),
        (0x0000_0002, "printing completed"),
        (0x0000_0004, "drawer kick connector pin 3 high"),
        (0x0000_0008, "offline"),
        (0x0000_0020, "cover open"),
        (0x0000_0040, "paper fed by the paper feed switch"),
        (0x0000_0100, "waiting to be brought back online"),
        (0x0000_0200, "paper feed switch held down"),
        (0x0000_0400, "mechanical error"),
        (0x0000_0800, "autocutter error"),
        (0x0000_2000, "unrecoverable error"),
        (0x0000_4000, "automatically recoverable error"),
        (0x0002_0000, "roll paper near end"),
        (0x0008_0000, "roll paper end"),
        (0x0100_0000, "buzzer on"),
        (0x8000_0000, "spooler stopped"),
    ];

    /// The status bits in words, for the audit trail (`251658262` → "printing completed,
    /// drawer kick connector pin 3 high, …"); unreadable status as it was sent.
    pub fn describe_status(status: &str) -> String {
        let Ok(bits) = status.trim().parse::<u64>() else {
            return format!("status {status:?}");
        };
        let words: Vec<&str> =
            STATUS_BITS.iter().filter(|(bit, _)| bits & u64::from(*bit) != 0).map(|(_, w)| *w).collect();
        if words.is_empty() {
            format!("status {bits}")
        } else {
            format!("status {bits}: {}", words.join(", "))
        }
    }
}

/// onceprint's own MQTT device protocol (docs/MQTT.md, "onceprint device protocol"):
/// the `result` words a device publishes.
pub mod device {
    use super::{Classified, Row};
    use crate::ack::Outcome;
    use crate::proof::Proof;

    const DOC: &str = "docs/MQTT.md, \"onceprint device protocol\", Result";

    pub const RESULTS: &[Row] = &[
        Row {
            code: "printed",
            meaning: "printed now; the journal says so",
            outcome: Outcome::Printed,
            proof: Proof::Printed,
            source: DOC,
        },
        Row {
            code: "no_paper",
            meaning: "checked before printing; nothing printed",
            outcome: Outcome::NoPaper,
            proof: Proof::NotPrinted,
            source: DOC,
        },
        Row {
            code: "cover_open",
            meaning: "checked before printing; nothing printed",
            outcome: Outcome::CoverOpen,
            proof: Proof::NotPrinted,
            source: DOC,
        },
        Row {
            code: "paper_jam",
            meaning: "checked before printing; nothing printed",
            outcome: Outcome::PaperJam,
            proof: Proof::NotPrinted,
            source: DOC,
        },
        Row {
            code: "offline",
            meaning: "the mechanism is off; nothing printed",
            outcome: Outcome::Offline,
            proof: Proof::NotPrinted,
            source: DOC,
        },
        Row {
            code: "rejected",
            meaning: "the device cannot use the job's data; nothing printed",
            outcome: Outcome::Error,
            proof: Proof::Refused,
            source: DOC,
        },
        Row {
            code: "error",
            meaning: "something failed; paper may or may not have come out",
            outcome: Outcome::Error,
            proof: Proof::MayHavePrinted,
            source: DOC,
        },
        Row {
            code: "duplicate (previous: printed)",
            meaning: "the journal has this key as printed; not printed again",
            outcome: Outcome::Printed,
            proof: Proof::Printed,
            source: DOC,
        },
        Row {
            code: "duplicate",
            meaning: "the journal has this key as started (or no record); not printed again",
            outcome: Outcome::InDoubt,
            proof: Proof::MayHavePrinted,
            source: DOC,
        },
    ];

    /// A device's `result` (with `previous` for a `duplicate`); `None` for a word the
    /// protocol does not have (the message is refused).
    pub fn result(result: &str, previous: Option<&str>) -> Option<Classified> {
        let code = match (result, previous) {
            ("duplicate", Some("printed")) => "duplicate (previous: printed)",
            (r, _) => r,
        };
        RESULTS.iter().find(|r| r.code == code).map(Classified::of)
    }
}

/// The store agent (`onceprint agent`, docs/API.md "The store agent protocol"): what its
/// printer driver reports for each thing that can happen to a job on an ESC/POS printer.
pub mod agent {
    use super::Row;
    use crate::ack::Outcome;
    use crate::proof::Proof;

    const STATUS: &str =
        "Epson ESC/POS Command Reference, DLE EOT (real-time status); docs/ARCHITECTURE.md, a delivery step 3";
    const ACK: &str = "Epson ESC/POS Command Reference, GS ( H <Function 48> (process ID response)";
    const AGENT: &str = "docs/API.md, the store agent protocol (acks); docs/ARCHITECTURE.md, a delivery step 3";

    pub const RESULTS: &[Row] = &[
        Row {
            code: "printed",
            meaning: "the printer answered the job's GS ( H process id (or, for a printer without it, a clean status after the job)",
            outcome: Outcome::Printed,
            proof: Proof::Printed,
            source: ACK,
        },
        Row {
            code: "no_paper",
            meaning: "DLE EOT 4 before any byte of the job was sent: paper end",
            outcome: Outcome::NoPaper,
            proof: Proof::NotPrinted,
            source: STATUS,
        },
        Row {
            code: "cover_open",
            meaning: "DLE EOT 2 before any byte of the job was sent: cover open",
            outcome: Outcome::CoverOpen,
            proof: Proof::NotPrinted,
            source: STATUS,
        },
        Row {
            code: "paper_jam",
            meaning: "DLE EOT 3 before any byte of the job was sent: a mechanism error",
            outcome: Outcome::PaperJam,
            proof: Proof::NotPrinted,
            source: STATUS,
        },
        Row {
            code: "offline",
            meaning: "no connection, or no status answer, before any byte of the job was sent",
            outcome: Outcome::Offline,
            proof: Proof::NotPrinted,
            source: STATUS,
        },
        Row {
            code: "error",
            meaning: "the job could not be started (content the agent cannot print, the journal not writable); nothing sent",
            outcome: Outcome::Error,
            proof: Proof::NotPrinted,
            source: AGENT,
        },
        Row {
            code: "in_doubt",
            meaning: "anything after the first byte of the job: a write or read that failed, no GS ( H reply in time, a stop reported after the job, a journal that says started",
            outcome: Outcome::InDoubt,
            proof: Proof::MayHavePrinted,
            source: AGENT,
        },
    ];
}

/// Printers behind a webhook (the receiver prints once per `Idempotency-Key`, README
/// "Webhook printers"): the status words of a callback or of the status URL, and the
/// answer to the POST of a job.
pub mod webhook {
    use super::{Classified, Row};
    use crate::ack::Outcome;
    use crate::proof::Proof;

    const DOC: &str = "README, \"Webhook printers\" (onceprint's webhook protocol)";

    const fn row(code: &'static str, meaning: &'static str, outcome: Outcome, proof: Proof) -> Row {
        Row { code, meaning, outcome, proof, source: DOC }
    }

    /// The words of a callback's or the status URL's `status` (`done` and `success` are
    /// read as `printed`), then what the answer to a job's POST proves.
    pub const RESULTS: &[Row] = &[
        row("printed", "the receiver printed the job (also `done`, `success`)", Outcome::Printed, Proof::Printed),
        row("no_paper", "the receiver's printer has no paper; the job was not started", Outcome::NoPaper, Proof::NotPrinted),
        row("cover_open", "the receiver's printer is open; the job was not started", Outcome::CoverOpen, Proof::NotPrinted),
        row("paper_jam", "the receiver's printer is jammed; the job was not started", Outcome::PaperJam, Proof::NotPrinted),
        row("offline", "the receiver's printer is off; the job was not started", Outcome::Offline, Proof::NotPrinted),
        row("error", "the receiver could not start the job; nothing printed", Outcome::Error, Proof::NotPrinted),
        row("rejected", "the receiver cannot use the job's data; nothing printed", Outcome::Error, Proof::Refused),
        row(
            "in_doubt",
            "the job failed after it was started (also `failed`); paper may have come out",
            Outcome::InDoubt,
            Proof::MayHavePrinted,
        ),
        row("connection refused", "the job never reached the receiver", Outcome::Offline, Proof::NotPrinted),
        row("HTTP 4xx but 408, 429", "the receiver refused the job; nothing printed", Outcome::Error, Proof::NotPrinted),
        row(
            "HTTP 408, 429, 5xx, no answer",
            "the job may have reached the receiver: it is asked about, or sent again with the same key, at its deadline",
            Outcome::Error,
            Proof::MayHavePrinted,
        ),
    ];

    /// A status word of a callback or of the status URL; `None` for a word the protocol
    /// does not have.
    pub fn status(word: &str) -> Option<Classified> {
        let word = match word {
            "done" | "success" => "printed",
            "failed" => "in_doubt",
            w => w,
        };
        RESULTS[..8].iter().find(|r| r.code == word).map(Classified::of)
    }
}

/// The tables as `docs/RESULT-CODES.md` shows them.
pub fn markdown() -> String {
    let mut out = String::new();
    let mut table = |title: &str, rows: &[Row]| {
        out.push_str(&format!("### {title}\n\n| code | meaning | printer | paper | source |\n|---|---|---|---|---|\n"));
        for r in rows {
            out.push_str(&format!(
                "| `{}` | {} | `{}` | {} | {} |\n",
                r.code,
                r.meaning,
                r.outcome.as_str(),
                match r.proof {
                    Proof::Printed => "printed",
                    Proof::NotPrinted => "**nothing printed**: delivered again",
                    Proof::Refused => "**nothing printed**, data refused: fails",
                    Proof::MayHavePrinted => "may have printed: in doubt",
                },
                r.source.replace('|', "\\|")
            ));
        }
        out.push('\n');
    };
    table("Star CloudPRNT (HTTP and MQTT): a job's result", star::RESULTS);
    let mut epson_rows = vec![epson::SUCCESS];
    epson_rows.extend_from_slice(epson::CODES);
    epson_rows.push(epson::DATA_REFUSED);
    table("Epson Server Direct Print / ePOS-Print: a job's result", &epson_rows);
    table("onceprint MQTT devices: `result`", device::RESULTS);
    table("Store agent (ESC/POS over TCP, USB, serial): ack outcomes", agent::RESULTS);
    table("Webhook printers", webhook::RESULTS);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn star_codes_take_the_most_specific_row() {
        let p = |c: &str| star::job_result(c).proof;
        let o = |c: &str| star::job_result(c).outcome;
        for printed in ["OK", "ok", "200 OK", "201", "211 Paper low", "220"] {
            assert_eq!((o(printed), p(printed)), (Outcome::Printed, Proof::Printed), "{printed}");
        }
        assert_eq!((o("410 Out of Paper"), p("410")), (Outcome::NoPaper, Proof::MayHavePrinted));
        assert_eq!(o("411"), Outcome::PaperJam);
        assert_eq!(o("413"), Outcome::NoPaper, "41x");
        assert_eq!(o("420"), Outcome::CoverOpen);
        assert_eq!((o("430"), p("430")), (Outcome::Error, Proof::MayHavePrinted), "4xx");
        for refused in ["510", "511", "512", "519", "521"] {
            assert_eq!(p(refused), Proof::Refused, "{refused}");
        }
        assert_eq!(p("520"), Proof::NotPrinted);
        assert_eq!(p("529"), Proof::NotPrinted, "52x");
        assert_eq!(p("599"), Proof::MayHavePrinted, "5xx");
        for unknown in ["", "xyz", "12", "300", "999 Whatever", "600"] {
            assert_eq!(star::job_result(unknown), Classified::UNKNOWN, "{unknown:?}");
        }
    }

    #[test]
    fn star_status_codes_say_how_the_printer_is() {
        assert_eq!(star::condition("200 OK"), Condition::Ready);
        assert_eq!(star::condition("211"), Condition::Ready);
        assert_eq!(star::condition("410"), Condition::Stopped(Outcome::NoPaper));
        assert_eq!(star::condition("411"), Condition::Stopped(Outcome::PaperJam));
        assert_eq!(star::condition("420 Cover Open"), Condition::Stopped(Outcome::CoverOpen));
        for fault in ["430", "510", "OK", "", "nonsense"] {
            assert_eq!(star::condition(fault), Condition::Fault, "{fault}");
        }
    }

    #[test]
    fn epson_success_is_the_only_proof_of_paper_and_errors_after_printing_are_doubt() {
        assert_eq!(epson::job_result(true, "").proof, Proof::Printed);
        for after in ["EPTR_CUTTER", "EPTR_AUTOMATICAL", "EPTR_MECHANICAL", "EPTR_UNRECOVERABLE", "EX_TIMEOUT"] {
            assert_eq!(epson::job_result(false, after).proof, Proof::MayHavePrinted, "{after}");
        }
        assert_eq!(epson::job_result(false, "EPTR_REC_EMPTY").outcome, Outcome::NoPaper);
        assert_eq!(epson::job_result(false, "EPTR_COVER_OPEN").outcome, Outcome::CoverOpen);
        assert_eq!(epson::job_result(false, "SchemaError").proof, Proof::Refused);
        assert_eq!(epson::job_result(false, "EX_SPOOLER").proof, Proof::NotPrinted);
        assert_eq!(epson::job_result(false, ""), Classified::UNKNOWN);
        assert_eq!(epson::job_result(false, "EPTR_NEW_THING"), Classified::UNKNOWN);
        assert!(epson::describe_status("251658262").contains("printing completed"));
        assert_eq!(epson::describe_status("x"), "status \"x\"");
    }

    #[test]
    fn device_words() {
        assert_eq!(device::result("printed", None).map(|c| c.proof), Some(Proof::Printed));
        assert_eq!(device::result("duplicate", Some("printed")).map(|c| c.proof), Some(Proof::Printed));
        assert_eq!(device::result("duplicate", Some("started")).map(|c| c.proof), Some(Proof::MayHavePrinted));
        assert_eq!(device::result("duplicate", None).map(|c| c.proof), Some(Proof::MayHavePrinted));
        assert_eq!(device::result("error", None).map(|c| c.proof), Some(Proof::MayHavePrinted));
        assert_eq!(device::result("rejected", None).map(|c| c.proof), Some(Proof::Refused));
        assert_eq!(device::result("no_paper", None).map(|c| c.proof), Some(Proof::NotPrinted));
        assert_eq!(device::result("whatever", None), None);
    }

    #[test]
    fn the_agent_table_is_what_the_agent_protocol_means() {
        for r in agent::RESULTS {
            let o = Outcome::parse(r.code).expect("an agent outcome");
            assert_eq!(o, r.outcome);
            assert_eq!(Proof::of_agent_outcome(o), r.proof, "{}", r.code);
        }
        assert_eq!(agent::RESULTS.len(), Outcome::ALL.len(), "every outcome has its row");
    }

    #[test]
    fn every_row_names_its_source_and_is_consistent() {
        let mut all: Vec<Row> = Vec::new();
        all.extend_from_slice(star::RESULTS);
        all.push(epson::SUCCESS);
        all.extend_from_slice(epson::CODES);
        all.push(epson::DATA_REFUSED);
        all.extend_from_slice(device::RESULTS);
        all.extend_from_slice(agent::RESULTS);
        all.extend_from_slice(webhook::RESULTS);
        for r in all {
            assert!(!r.source.is_empty() && !r.meaning.is_empty(), "{}", r.code);
            // Printed only with the printer's own word, and the printer's word is a print.
            assert_eq!(r.proof == Proof::Printed, r.outcome == Outcome::Printed, "{}", r.code);
            assert!(r.outcome != Outcome::InDoubt || r.proof == Proof::MayHavePrinted, "{}", r.code);
        }
    }

    #[test]
    fn the_document_shows_the_tables() {
        let doc = include_str!("../../../docs/RESULT-CODES.md");
        let tables = markdown();
        assert!(
            doc.contains(&tables),
            "docs/RESULT-CODES.md is out of date: replace its tables with `onceprint_core::results::markdown()`:\n{tables}"
        );
    }

    proptest! {
        /// A code no document lists is never taken as proof that nothing printed.
        #[test]
        fn unknown_codes_may_have_printed(code in "[A-Za-z_0-9 %]{0,24}") {
            let documented = |rows: &[Row], c: &str| rows.iter().any(|r| r.code == c.trim());
            let e = epson::job_result(false, &code);
            if !documented(epson::CODES, &code) {
                prop_assert_eq!(e, Classified::UNKNOWN);
            }
            let s = star::job_result(&code);
            if s.row.is_none() {
                prop_assert_eq!(s.proof, Proof::MayHavePrinted);
            }
            // Star's "nothing printed" rows are all 5xx media and download errors.
            if matches!(s.proof, Proof::NotPrinted | Proof::Refused) {
                prop_assert!(code.trim().starts_with('5'), "{}", code);
            }
        }
    }
}
