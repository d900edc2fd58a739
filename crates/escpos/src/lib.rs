//! ESC/POS as onceprint needs it, with no IO.
//!
//! This crate owns the byte-level facts of the protocol that both ends of a raw TCP 9100
//! connection must agree on: the real-time status request `DLE EOT n` and the meaning of
//! its answer bits ([`status`]), and the `GS ( H` fn 48 "process ID" request whose reply
//! `37 22 d1 d2 d3 d4 00` is the printer's own statement that everything sent before it has
//! been processed — onceprint's printed-ACK ([`ack`]). The store agent builds requests
//! and decodes replies with it; the printer simulator does the reverse. It also owns the
//! bytes of a plain-text job and their decoding ([`text`]), and a streaming parser of
//! ESC/POS command streams ([`parse`]) that the simulator reads its input with, the
//! single-byte code pages selected with `ESC t` ([`codepage`]), and a readable transcript
//! of a command stream built on the parser ([`transcript`]), which snapshot tests of
//! rendered receipts compare.
//!
//! It must never open sockets or files: the agent and the simulator own their IO, and
//! keeping the protocol pure keeps it testable byte for byte.

pub mod ack;
pub mod codepage;
pub mod parse;
pub mod status;
pub mod text;
pub mod transcript;
